from __future__ import annotations

from datetime import UTC, datetime

import pytest

from preemptdiag.ingest.promscrape import histogram_quantile, looks_like_prometheus, parse_scrapes
from preemptdiag.ingest.scrape_series import deltas, summarize
from preemptdiag.model.errors import DiagError

T0 = datetime(2025, 8, 19, 18, 34, 30, tzinfo=UTC)
T1 = datetime(2025, 8, 19, 18, 39, 30, tzinfo=UTC)


def v1_scrape(stamp: str, pre0: int, pre1: int, ok0: int, ok1: int, kv0: float, kv1: float) -> str:
    """A vLLM V1 (~v0.10) scrape with two engines, as prometheus_client writes it."""
    return f"""# scrape_time: {stamp}
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}} 61.0
vllm:num_requests_running{{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"}} 58.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}} 40.0
vllm:num_requests_waiting{{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"}} 33.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {kv0}
vllm:kv_cache_usage_perc{{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {kv1}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {pre0}.0
vllm:num_preemptions_total{{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {pre1}.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}} 1.7556e+09
vllm:num_preemptions_created{{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"}} 1.7556e+09
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {ok0}.0
vllm:request_success_total{{engine="0",finished_reason="length",model_name="meta-llama/Llama-3.1-8B-Instruct"}} 10.0
vllm:request_success_total{{engine="1",finished_reason="stop",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {ok1}.0
vllm:request_success_total{{engine="1",finished_reason="abort",model_name="meta-llama/Llama-3.1-8B-Instruct"}} 0.0
"""


TWO_V1 = v1_scrape("2025-08-19T18:34:30Z", 700, 500, 100, 90, 0.91, 0.87) + v1_scrape(
    "2025-08-19T18:39:30Z", 3000, 2350, 130, 100, 0.97, 0.995
)


def test_two_v1_scrapes_sum_engines_and_give_the_preemption_rate() -> None:
    first, second = parse_scrapes(TWO_V1, "t.prom", None)
    assert (first.ts, second.ts) == (T0, T1)
    assert first.engine == second.engine == "vllm"
    assert first.values["preemptions_total"] == 1200.0
    assert second.values["preemptions_total"] == 5350.0
    assert second.values["running"] == 119.0  # 61 + 58
    assert second.values["waiting"] == 73.0
    assert second.values["kv_usage_perc"] == pytest.approx(99.5)  # max over engines
    assert second.values["request_success_total"] == 240.0  # 130 + 10 + 100 + 0
    (d,) = deltas([first, second])
    assert d.seconds == 300.0
    assert d.preemptions == 4150.0
    assert d.preemptions_per_min == 830.0
    assert d.completed == 40.0
    assert d.counter_reset is False
    assert d.prompt_tokens is None  # not exposed in these scrapes


def test_created_series_are_not_values() -> None:
    (scrape,) = parse_scrapes(v1_scrape("2025-08-19T18:34:30Z", 7, 5, 1, 1, 0.5, 0.5), "a", None)
    assert dict(scrape.values) == {
        "preemptions_total": 12.0,
        "kv_usage_perc": 50.0,
        "running": 119.0,
        "waiting": 73.0,
        "request_success_total": 12.0,
        "peak_running": 58.0,  # both at 0.5: the fewer running of the two
    }


def test_deltas_follow_time_not_file_order() -> None:
    later, earlier = parse_scrapes(
        v1_scrape("2025-08-19T18:39:30Z", 3000, 2350, 130, 100, 0.97, 0.995)
        + v1_scrape("2025-08-19T18:34:30Z", 700, 500, 100, 90, 0.91, 0.87),
        "t.prom",
        None,
    )
    (d,) = deltas([later, earlier])
    assert (d.start.ts, d.end.ts, d.preemptions) == (T0, T1, 4150.0)


HIST = """# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 20.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.5",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="2.5",model_name="m"} 9.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="5.0",model_name="m"} 12.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 12.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 12.0
vllm:e2e_request_latency_seconds_sum{engine="1",model_name="m"} 14.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="0.5",model_name="m"} 0.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="1.0",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="2.5",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="5.0",model_name="m"} 8.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 8.0
vllm:e2e_request_latency_seconds_count{engine="1",model_name="m"} 8.0
# HELP vllm:e2e_request_latency_seconds_created Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds_created gauge
vllm:e2e_request_latency_seconds_created{engine="0",model_name="m"} 1.7556e+09
vllm:e2e_request_latency_seconds_created{engine="1",model_name="m"} 1.7556e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 90.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 100.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 100.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 100.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 12.5
"""


def test_histogram_quantiles_pool_engines_and_interpolate() -> None:
    # Pooled cumulative buckets: 0.5:2, 1:8, 2.5:14, 5:20, +Inf:20.
    # p50: rank 10 falls in (1, 2.5] holding 6 -> 1 + 1.5 * (10 - 8) / 6 = 1.5
    # p95: rank 19 falls in (2.5, 5] holding 6 -> 2.5 + 2.5 * (19 - 14) / 6 = 4.5833...
    # TTFT p95: rank 95 falls in (0.1, 1] holding 10 -> 0.1 + 0.9 * 5 / 10 = 0.55
    (s,) = parse_scrapes(HIST, "h.prom", T0)
    assert s.values["e2e_count"] == 20.0
    assert s.values["e2e_sum"] == 34.0
    assert s.values["e2e_p50"] == pytest.approx(1.5)
    assert s.values["e2e_p95"] == pytest.approx(2.5 + 2.5 * 5 / 6)
    assert s.values["ttft_p95"] == pytest.approx(0.55)
    assert s.ts == T0  # no timestamp in the file: the caller's mtime


def test_histogram_quantile_edges_match_promql() -> None:
    inf = float("inf")
    assert histogram_quantile(0.5, [(1.0, 4.0), (inf, 4.0)]) == 0.5  # from 0 in bucket one
    # Rank beyond the last finite bucket: its upper bound, as PromQL returns.
    assert histogram_quantile(0.95, [(1.0, 4.0), (2.0, 9.0), (inf, 10.0)]) == 2.0
    assert histogram_quantile(0.5, [(1.0, 4.0), (2.0, 9.0)]) is None  # no +Inf bucket
    assert histogram_quantile(0.5, [(1.0, 0.0), (inf, 0.0)]) is None  # no observations
    # A scrape taken mid-update (non-monotonic) is evened out as PromQL does:
    # 2:1 becomes 2:2, so rank 4 interpolates (2, 4] holding 6: 2 + 2 * 2 / 6.
    assert histogram_quantile(
        0.5, [(1.0, 2.0), (2.0, 1.0), (4.0, 8.0), (inf, 8.0)]
    ) == pytest.approx(2.0 + 2.0 / 3.0)


def test_counter_decrease_is_a_restart_and_counts_from_zero() -> None:
    text = (
        "# scrape_time: 2025-08-19T18:34:30Z\n"
        'vllm:num_preemptions_total{engine="0",model_name="m"} 5000.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 12.0\n'
        "# scrape_time: 2025-08-19T18:39:30Z\n"
        'vllm:num_preemptions_total{engine="0",model_name="m"} 300.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
    )
    (d,) = deltas(parse_scrapes(text, "r.prom", None))
    assert d.counter_reset is True
    assert d.preemptions == 300.0
    assert d.preemptions_per_min == 60.0


def test_new_process_start_time_means_restart_even_if_counter_grew() -> None:
    text = (
        "# scrape_time: 2025-08-19T18:34:30Z\n"
        "process_start_time_seconds 1755620000.0\n"
        'vllm:num_preemptions_total{engine="0",model_name="m"} 100.0\n'
        "# scrape_time: 2025-08-19T18:39:30Z\n"
        "process_start_time_seconds 1755628600.0\n"
        'vllm:num_preemptions_total{engine="0",model_name="m"} 150.0\n'
    )
    first, second = parse_scrapes(text, "r.prom", None)
    assert second.values["process_start_time_seconds"] == 1755628600.0
    (d,) = deltas([first, second])
    assert (d.counter_reset, d.preemptions) == (True, 150.0)


SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{engine_type="unified",model_name="Qwen/Qwen2.5-7B",tp_rank="0"}} 31.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{engine_type="unified",model_name="Qwen/Qwen2.5-7B",tp_rank="0"}} 12.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{engine_type="unified",model_name="Qwen/Qwen2.5-7B",tp_rank="0"}} 0.93
# HELP {name} The number of retracted requests.
# TYPE {name} {typ}
{exposed}{{engine_type="unified",model_name="Qwen/Qwen2.5-7B",tp_rank="0"}} 17.0
"""


@pytest.mark.parametrize(
    ("name", "typ", "exposed"),
    [
        ("sglang:num_retracted_requests_total", "counter", "sglang:num_retracted_requests_total"),
        ("sglang:total_retracted_reqs", "gauge", "sglang:total_retracted_reqs"),
        ("sglang:total_retracted_reqs", "counter", "sglang:total_retracted_reqs_total"),
    ],
)
def test_sglang_names(name: str, typ: str, exposed: str) -> None:
    (s,) = parse_scrapes(SGLANG.format(name=name, typ=typ, exposed=exposed), "s.prom", T0)
    assert s.engine == "sglang"
    assert dict(s.values) == {
        "preemptions_total": 17.0,
        "kv_usage_perc": pytest.approx(93.0),
        "running": 31.0,
        "waiting": 12.0,
    }


V0 = """# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="facebook/opt-125m"} 48.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="facebook/opt-125m"} 6.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="facebook/opt-125m"} 31.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.995
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="facebook/opt-125m"} 151.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="facebook/opt-125m"} 812345.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="facebook/opt-125m"} 45678.0
"""


def test_v0_names_gpu_cache_and_swapped() -> None:
    (s,) = parse_scrapes(V0, "v0.prom", T0)
    assert s.engine == "vllm"
    assert dict(s.values) == {
        "preemptions_total": 151.0,
        "kv_usage_perc": pytest.approx(99.5),
        "cpu_kv_usage_perc": 25.0,
        "running": 48.0,
        "waiting": 31.0,
        "swapped": 6.0,
        "prompt_tokens_total": 812345.0,
        "generation_tokens_total": 45678.0,
    }


def test_deprecated_and_new_kv_gauge_together_use_the_new_one() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42\n'
    )
    (s,) = parse_scrapes(text, "x.prom", T0)
    assert s.values["kv_usage_perc"] == pytest.approx(42.0)


@pytest.mark.parametrize(
    "text",
    [
        # declared without _total: prometheus_client adds the suffix on a counter
        '# TYPE vllm:num_preemptions counter\nvllm:num_preemptions{engine="0"} 7\n',
        # ... and an untyped series keeps the bare name
        'vllm:num_preemptions{engine="0"} 7\n',
    ],
)
def test_preemption_counter_declared_without_total(text: str) -> None:
    (s,) = parse_scrapes(text, "x.prom", T0)
    assert s.values["preemptions_total"] == 7.0


def test_per_sample_timestamps_split_concatenated_scrapes() -> None:
    text = (
        "# TYPE vllm:num_preemptions_total counter\n"
        'vllm:num_preemptions_total{engine="0"} 10 1755628470000\n'
        'vllm:num_requests_waiting{engine="0"} 4 1755628470000\n'
        "# TYPE vllm:num_preemptions_total counter\n"
        'vllm:num_preemptions_total{engine="0"} 70 1755628530000\n'
        'vllm:num_requests_waiting{engine="0"} 9 1755628530500\n'
    )
    a, b = parse_scrapes(text, "fed.prom", datetime(2030, 1, 1, tzinfo=UTC))
    assert a.ts == datetime(2025, 8, 19, 18, 34, 30, tzinfo=UTC)
    assert b.ts == datetime(2025, 8, 19, 18, 35, 30, 500000, tzinfo=UTC)  # latest sample
    (d,) = deltas([a, b])
    assert (d.seconds, d.preemptions) == (60.5, 60.0)


def test_bare_date_lines_from_a_shell_loop_stamp_scrapes() -> None:
    text = (
        "Tue Aug 19 18:34:30 UTC 2025\n"
        'vllm:num_preemptions_total{engine="0"} 10\n'
        "1755628530\n"
        'vllm:num_preemptions_total{engine="0"} 40\n'
        "2025-08-19T18:36:30+02:00\n"
        'vllm:num_preemptions_total{engine="0"} 40\n'
    )
    stamps = [s.ts for s in parse_scrapes(text, "loop.prom", None)]
    assert stamps == [
        T0,
        datetime(2025, 8, 19, 18, 35, 30, tzinfo=UTC),
        datetime(2025, 8, 19, 16, 36, 30, tzinfo=UTC),
    ]


def test_unreadable_scrape_time_is_a_user_error() -> None:
    with pytest.raises(DiagError) as err:
        parse_scrapes("# scrape_time: yesterday\nfoo 1\n", "m.prom", None)
    assert err.value.message == (
        "m.prom:1: cannot read scrape timestamp 'yesterday'; "
        "use ISO-8601 (2025-08-19T18:34:30Z) or `date -u`"
    )


def test_malformed_exposition_names_file_and_line() -> None:
    text = (
        "# scrape_time: 2025-08-19T18:34:30Z\n"
        "# HELP vllm:num_requests_running Number of requests.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 3.0\n'
        'vllm:num_requests_waiting{engine="0} 1.0\n'
        'vllm:num_preemptions_total{engine="0"} 1.0\n'
    )
    with pytest.raises(DiagError) as err:
        parse_scrapes(text, "t1.prom", None)
    # The line is named, never quoted (it may be a piece of a multi-line prompt).
    assert err.value.message == (
        "t1.prom:5: not valid Prometheus text exposition "
        "(a sample line is `name{labels} value [timestamp]`)"
    )
    assert "\n" not in err.value.message


def test_malformed_value_line_number_in_second_block() -> None:
    text = TWO_V1.replace("} 130.0", "} 13O.0")  # letter O, in the second scrape
    bad_line = text.splitlines().index(next(ln for ln in text.splitlines() if "13O.0" in ln)) + 1
    with pytest.raises(DiagError) as err:
        parse_scrapes(text, "t.prom", None)
    assert err.value.message.startswith(f"t.prom:{bad_line}: not valid Prometheus")


def test_summarize() -> None:
    assert summarize(parse_scrapes(TWO_V1, "t.prom", None)) == {
        "scrapes": 2,
        "engine": "vllm",
        "span_seconds": 300.0,
        "preemptions": 4150.0,
        "preemptions_per_min": 830.0,
        "preemptions_total_last": 5350.0,
        "counter_reset": False,
        "kv_usage_max": pytest.approx(99.5),
        "waiting_max": 73.0,
        "completed": 40.0,
        "e2e_p95_last": None,
        "with_engine_series": 2,
    }


def test_summarize_single_scrape_has_no_rate() -> None:
    (s,) = parse_scrapes(HIST, "h.prom", T0)
    summary = summarize([s])
    assert summary["scrapes"] == 1
    assert summary["span_seconds"] == 0.0
    assert summary["preemptions"] is None
    assert summary["preemptions_per_min"] is None
    assert summary["e2e_p95_last"] == pytest.approx(2.5 + 2.5 * 5 / 6)


def test_scrape_without_any_time_has_none() -> None:
    (s,) = parse_scrapes(V0, "v0.prom", None)
    assert s.ts is None


LOG_HEAD = b"""INFO 09-11 17:20:01 api_server.py:495] vLLM API server version 0.6.1
INFO 09-11 17:21:19 metrics.py:351] Avg prompt throughput: 1520.3 tokens/s, Avg generation throughput: 48.1 tokens/s, Running: 48 reqs, Swapped: 0 reqs, Pending: 31 reqs, GPU KV cache usage: 99.4%, CPU KV cache usage: 0.0%.
WARNING 09-11 17:21:29 scheduler.py:1560] Sequence group cmpl-71c6-0 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space.
"""


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (TWO_V1.encode(), True),  # scrape_time comment, then HELP
        (V0.encode(), True),
        (V0.encode()[:300], True),  # cut mid-line by the sniffer
        (b'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_waiting 1\n', True),
        (LOG_HEAD, False),
        (b"Loading 5\n", False),  # one lone name-value line is not a scrape
        (b"# Incident notes\n\nWe saw 5 preemptions\n", False),
        (b"", False),
        (b"\xff\xfe\x00garbage", False),
    ],
)
def test_looks_like_prometheus(head: bytes, expected: bool) -> None:
    assert looks_like_prometheus(head) is expected


@pytest.mark.parametrize(
    "marker", ["# scraped_at: 9999-12-31 23:59:59.404Z", "# scraped_at: 253402300799000"]
)
def test_a_scrape_time_no_window_can_end_after_is_one_line(marker: str) -> None:
    # Found by bench/fuzz.py: year 9999 was read, and the window's end then
    # overflowed datetime (an internal error).
    text = f"{marker}\n# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total 1\n"
    with pytest.raises(DiagError, match=r"t\.prom:1: cannot read scrape timestamp"):
        parse_scrapes(text, "t.prom", None)


def test_a_sample_timestamp_past_any_real_time_is_no_time() -> None:
    text = "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total 1 99999999999999999\n"
    (scrape,) = parse_scrapes(text, "t.prom", None)
    assert scrape.ts is None


@pytest.mark.parametrize(
    "sample",
    [
        "vllm:num_preemptions_total " + "9" * 400,
        'vllm:kv_cache_usage_perc{engine="0"} ' + "9" * 400,
    ],
)
def test_a_number_past_any_float_is_one_line_not_an_internal_error(sample: str) -> None:
    # Found by bench/fuzz.py (seed 3031, input 438): the parser keeps a 400-digit
    # integer literal as an int, and float() of it raised OverflowError (exit 3).
    text = f"# TYPE vllm:num_preemptions_total counter\n{sample}\n"
    with pytest.raises(DiagError, match=r"^t\.prom: sample \S+ has a value or timestamp too large"):
        parse_scrapes(text, "t.prom", None)


def test_a_scrape_time_dateutil_cannot_divide_is_one_line() -> None:
    # Found by bench/fuzz.py (seed 8081, input 10575): dateutil raises
    # decimal.InvalidOperation (no ValueError) on a 40-digit minute.
    text = (
        "# scraped_at: 2026-12-01T23:" + "9" * 41 + ":41.696Z\n"
        "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total 1\n"
    )
    with pytest.raises(DiagError, match=r"^t\.prom:1: cannot read scrape timestamp"):
        parse_scrapes(text, "t.prom", None)


def test_several_engines_keep_the_running_of_the_fullest() -> None:
    # KV usage is the fullest engine's (max) but Running the engines' sum: with both,
    # a sequence would look twice too small. The running of the engine whose KV usage
    # it is goes beside them.
    first, _ = parse_scrapes(TWO_V1, "t.prom", None)
    assert (first.values["kv_usage_perc"], first.values["running"]) == (pytest.approx(91.0), 119.0)
    assert first.values["peak_running"] == 61.0  # engine 0: 0.91
    flipped = TWO_V1.replace(" 0.91\n", " 0.5\n", 1)
    assert parse_scrapes(flipped, "t.prom", None)[0].values["peak_running"] == 58.0  # engine 1
    tied = TWO_V1.replace(" 0.91\n", " 0.87\n", 1)
    assert parse_scrapes(tied, "t.prom", None)[0].values["peak_running"] == 58.0  # fewest
    one = "\n".join(ln for ln in TWO_V1.splitlines() if 'engine="1"' not in ln) + "\n"
    assert "peak_running" not in parse_scrapes(one, "t.prom", None)[0].values


def test_sglang_retraction_counter_absent_until_the_first_is_zero() -> None:
    # A real 0.5.23 before any retraction: the per-step gauge, no counter sample yet.
    labels = 'engine_type="unified",model_name="tiny-llama",moe_ep_rank="0",pp_rank="0"'
    before = (
        "# scraped_at: 2026-12-06T06:33:49.536Z\n"
        f'sglang:num_running_reqs{{{labels},tp_rank="0"}} 0.0\n'
        f'sglang:num_retracted_reqs{{{labels},pid="1346",tp_rank="0"}} 0.0\n'
    )
    (scrape,) = parse_scrapes(before, "t1.prom", None)
    assert scrape.values["preemptions_total"] == 0.0
    assert scrape.lines["preemptions_total"] == 3  # the gauge's line: the counter has none
    # Without the gauge (a release without retraction metrics) nothing is made up.
    (bare,) = parse_scrapes(before.replace("num_retracted_reqs", "other_gauge"), "t.prom", None)
    assert "preemptions_total" not in bare.values
