"""Levers: exactly one knob, one value, with the arithmetic behind it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from builders import make_event, make_window

from preemptdiag.diagnose.advice import choose_lever
from preemptdiag.model.config import Thresholds
from preemptdiag.model.records import Class, Confidence, EngineInfo, Event, Kind, Verdict, Window
from preemptdiag.timeline.knobs import Facts

T0 = datetime(2025, 1, 1, tzinfo=UTC)
V0 = EngineInfo("vllm", "v0", "0.6.3")


def verdict(cls: Class, evidence: tuple[Event, ...] = ()) -> Verdict:
    return Verdict(
        cls=cls,
        confidence=Confidence.HIGH,
        start=T0,
        end=T0,
        replica="a",
        why="",
        evidence=evidence,
    )


def thrash_window(kv: float, running: int) -> Window:
    return make_window(
        0,
        preemptions=10.0,
        kv_max=kv,
        kv_mean=kv,
        running_max=running,
        running_mean=float(running),
        waiting_last=9,
        waiting_max=9,
        cls=Class.THRASH_LOOP,
        kv_peak_running=running,
    )


def test_single_request_can_fill_the_pool_means_max_model_len() -> None:
    facts = Facts(knobs={"max_model_len": "131072"}, kv_tokens=200_000, max_concurrency=1.53)
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(99.0, 2)], [], facts, V0, Thresholds()
    )
    assert (lever.knob, lever.current, lever.proposed) == ("--max-model-len", "131072", "100000")
    assert "1.53x < 2x" in lever.arithmetic[0]


def test_thrash_without_capacity_caps_below_what_ran() -> None:
    # Cap 96, but at most 80 ran: halving to 48 would bite, but the smallest change
    # that does is below the peak: floor(0.9 x 80) = 72.
    facts = Facts(knobs={"max_num_seqs": "96"})
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(99.0, 80)], [], facts, V0, Thresholds()
    )
    assert (lever.knob, lever.current, lever.proposed) == ("--max-num-seqs", "96", "72")
    assert "a cap must be below 80 to bite: floor(0.9 × 80) = 72" in lever.arithmetic[-1]


def test_thrash_without_capacity_at_the_cap_halves_it() -> None:
    facts = Facts(knobs={"max_num_seqs": "96"})
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(99.0, 96)], [], facts, V0, Thresholds()
    )
    assert (lever.current, lever.proposed) == ("96", "48")
    assert "Running reached the cap (96, the log shows it): halve it -> 48" in lever.arithmetic[-1]


def test_a_v0_log_running_far_below_the_default_gets_a_cap_that_bites() -> None:
    # Running 34-37 under the default 256: "256 -> 128" would change nothing.
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(99.0, 37)], [], Facts(), V0, Thresholds()
    )
    assert (lever.current, lever.proposed) == (None, "33")  # 256 is assumed, not shown
    assert "current --max-num-seqs: default 256 (assumed: not in the log)" in lever.arithmetic
    assert int(lever.proposed or 0) < 37


def test_demand_above_the_cap_falls_back_to_below_what_ran() -> None:
    # 50% of 100k tokens over 10 running = 5k per seq -> floor(0.9*100k/5k) = 18 >= cap 16.
    facts = Facts(knobs={"max_num_seqs": "16"}, kv_tokens=100_000)
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(50.0, 10)], [], facts, V0, Thresholds()
    )
    assert (lever.current, lever.proposed) == ("16", "9")
    assert any("not below the current cap 16" in line for line in lever.arithmetic)


def test_runtime_cuda_oom_at_default_utilisation_halves_batched_tokens() -> None:
    oom = make_event(Kind.ALLOC_FAILURE, {"subtype": "cuda_oom", "phase": "runtime"})
    facts = Facts(knobs={"gpu_memory_utilization": "0.9", "max_num_batched_tokens": "16384"})
    lever = choose_lever(
        verdict(Class.ALLOCATION_FAILURE, (oom,)), [], [oom], facts, V0, Thresholds()
    )
    assert (lever.knob, lever.current, lever.proposed) == (
        "--max-num-batched-tokens",
        "16384",
        "8192",
    )


def test_sglang_weights_leave_no_kv_raises_mem_fraction() -> None:
    ev = make_event(
        Kind.ALLOC_FAILURE, {"subtype": "weights_leave_no_kv", "mem_fraction_static": 0.88}
    )
    lever = choose_lever(
        verdict(Class.ALLOCATION_FAILURE, (ev,)),
        [],
        [ev],
        Facts(),
        EngineInfo("sglang", None, None),
        Thresholds(),
    )
    assert (lever.knob, lever.current, lever.proposed) == ("--mem-fraction-static", "0.88", "0.92")


def test_swap_warning_host_pressure_lowers_swap_space() -> None:
    ev = make_event(Kind.SWAP_WARNING, {"swap_gib": 4.0, "total_gib": 7.74, "severity": "warning"})
    lever = choose_lever(verdict(Class.HOST_PRESSURE), [], [ev], Facts(), V0, Thresholds())
    assert (lever.knob, lever.current, lever.proposed) == ("--swap-space", "4", "1")


def test_no_change_classes_still_say_how_to_verify() -> None:
    for cls in (
        Class.HEALTHY,
        Class.QUEUEING,
        Class.BENIGN_PREEMPTION,
        Class.INSUFFICIENT_EVIDENCE,
    ):
        lever = choose_lever(verdict(cls), [], [], Facts(), V0, Thresholds())
        assert lever.knob is None and lever.proposed is None
        assert lever.verify and lever.do_not


def test_max_model_len_at_least_the_pool_means_max_model_len() -> None:
    facts = Facts(knobs={"max_model_len": "131072"}, kv_tokens=86_432, max_concurrency=None)
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(99.0, 2)], [], facts, V0, Thresholds()
    )
    assert (lever.knob, lever.current, lever.proposed) == ("--max-model-len", "131072", "43216")
    assert lever.arithmetic[0].startswith("max_model_len 131,072 >= KV tokens 86,432")


def test_sglang_lever_speaks_sglang_all_the_way_through() -> None:
    facts = Facts(knobs={"max_running_requests": "2048"}, kv_tokens=210_968)
    sglang = EngineInfo(engine="sglang", generation=None, version=None)
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(99.0, 58)], [], facts, sglang, Thresholds()
    )
    text = " ".join([*lever.arithmetic, lever.verify, lever.do_not])
    assert lever.knob == "--max-running-requests"
    assert lever.arithmetic[-2].startswith("--max-running-requests = floor(0.9 × 210,968 /")
    for vllm_word in ("--max-num-seqs", "vllm:", "--gpu-memory-utilization", "Preemptions:"):
        assert vllm_word not in text
    assert "--mem-fraction-static" in lever.do_not


def test_every_lever_says_how_to_apply_and_when_to_roll_back() -> None:
    facts = Facts(knobs={"max_num_seqs": "96"})
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(99.0, 96)], [], facts, V0, Thresholds()
    )
    assert lever.apply.startswith("`vllm serve MODEL ... --max-num-seqs 48`")
    assert "container's `args`" in lever.apply
    assert lever.rollback.startswith("restore `--max-num-seqs 96` if completed requests")
    calm = choose_lever(verdict(Class.HEALTHY), [], [], Facts(), V0, Thresholds())
    assert (calm.apply, calm.rollback) == ("", "")


def test_an_assumed_default_rolls_back_by_dropping_the_flag() -> None:
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(99.0, 37)], [], Facts(), V0, Thresholds()
    )
    assert lever.rollback.startswith("restore the launch command without --max-num-seqs")


V1_CPU = EngineInfo("vllm", "v1", "0.32.0")
CPU_LINE = make_event(Kind.CAPACITY, {"kv_tokens": 4096, "kv_device": "CPU"})


def test_a_cpu_backend_log_assumes_the_cpu_default_cap() -> None:
    # vLLM's CPU backend defaults --max-num-seqs to 128 x world size (0.32.0-0.34.0
    # engine/arg_utils.py), not the GPU's 256: 200 ran with 2-way tensor parallelism.
    facts = Facts(knobs={"tensor_parallel_size": "2"})
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(99.0, 200)], [CPU_LINE], facts, V1_CPU,
        Thresholds(),
    )  # fmt: skip
    assert lever.arithmetic[0] == (
        "current --max-num-seqs: vLLM 0.32.0's CPU-backend default 128 × tensor_parallel_size "
        "2 (assumed: not in the log)"
    )
    assert (lever.current, lever.proposed) == (None, "180")
    # A configured default is the user's word for their fleet: it wins.
    mine = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(99.0, 50)], [CPU_LINE], Facts(), V1_CPU,
        Thresholds(default_max_num_seqs=64),
    )  # fmt: skip
    assert mine.arithmetic[0] == "current --max-num-seqs: default 64 (assumed: not in the log)"
    # Before 0.32 the CPU default is not known here: the threshold.
    old = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(99.0, 50)], [CPU_LINE], Facts(),
        EngineInfo("vllm", "v1", "0.10.0"), Thresholds(),
    )  # fmt: skip
    assert old.arithmetic[0] == "current --max-num-seqs: default 256 (assumed: not in the log)"


def test_more_running_than_the_assumed_default_means_a_higher_cap() -> None:
    # 600 ran on a GPU: the cap was not 256 (an H100's default is 1024). The demand-based
    # 300 is below what ran, so it bites; "not below the cap 256" would have dropped it.
    facts = Facts(kv_tokens=100_000)
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(100.0, 600)], [], facts,
        EngineInfo("vllm", "v1", "0.32.0"), Thresholds(),
    )  # fmt: skip
    assert lever.arithmetic[1] == (
        "current --max-num-seqs: not in the log, and Running reached 600 > default 256: the "
        "cap is at least 600 (vLLM's default is 1024 on a GPU of 70 GiB or more)"
    )
    assert (lever.current, lever.proposed) == (None, "540")


def test_aggregated_engines_size_a_cap_per_engine() -> None:
    # `2 Engines Aggregated: ... Running: 12 reqs, ... KV cache usage: 100.0%` (a real
    # 0.32.0 with --aggregate-engine-logging): Running over both pools, KV usage their
    # mean. 12 sequences fill 2 x 4,096 tokens: 682.67 a sequence, 5 a pool, as one
    # engine's own lines (`Running: 6 reqs, ... 100.0%`) size it.
    line = make_event(Kind.STATS, {"engines_aggregated": 2, "kv_usage": 100.0, "running": 12})
    line = replace(line, replica="a", ts=T0 + timedelta(seconds=20))
    # the window's own peak is a /metrics scrape's (one engine full, its 4 running): the
    # aggregated lines' pairs size the cap, in their units
    window = replace(thrash_window(100.0, 4), start=T0, end=T0 + timedelta(minutes=1), replica="a")
    lever = choose_lever(
        verdict(Class.THRASH_LOOP), [window], [line], Facts(kv_tokens=4096), V1_CPU, Thresholds()
    )
    assert lever.arithmetic[0] == (
        "KV tokens = 4,096 (start-up lines) a pool × 2 engines = 8,192: the stats lines are "
        "2 Engines Aggregated (Running their sum, KV usage their pools' mean)"
    )
    assert lever.arithmetic[-1] == "--max-num-seqs (a cap per engine) = floor(10 / 2) = 5"
    assert lever.proposed == "5"
    per_engine = choose_lever(
        verdict(Class.THRASH_LOOP), [thrash_window(100.0, 6)], [], Facts(kv_tokens=4096),
        V1_CPU, Thresholds(),
    )  # fmt: skip
    assert per_engine.proposed == "5"
