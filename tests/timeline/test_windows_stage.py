"""timeline.windows: events to per-replica windows (features only; rules classify)."""

from __future__ import annotations

from dataclasses import replace

from builders import make_event

from preemptdiag.model.config import Thresholds
from preemptdiag.model.records import Kind
from preemptdiag.timeline.windows import build_windows


def _stats(minute: int, kv: float, running: int, waiting: int, replica: str = "a") -> object:
    e = make_event(
        Kind.STATS, {"kv_usage": kv, "running": running, "waiting": waiting}, minute=minute
    )
    return replace(e, replica=replica)


def test_one_window_per_replica_and_minute_with_its_features() -> None:
    events = [
        _stats(0, 40.0, 10, 2),
        _stats(0, 60.0, 12, 5),
        _stats(1, 99.0, 30, 9),
        _stats(0, 10.0, 1, 0, replica="b"),
    ]
    ws = build_windows(events, 60, Thresholds())  # type: ignore[arg-type]
    by = {(w.replica, w.start.minute if w.start else None): w for w in ws}
    assert set(by) == {("a", 0), ("a", 1), ("b", 0)}
    a0 = by[("a", 0)]
    assert (a0.n_stats, a0.kv_max, a0.kv_mean, a0.running_max) == (2, 60.0, 50.0, 12)
    assert (a0.waiting_first, a0.waiting_last, a0.waiting_max) == (2, 5, 5)
    assert a0.waiting_share == 1.0
    assert by[("a", 1)].kv_peak_running == 30
    assert by[("b", 0)].waiting_share == 0.0


def test_a_v0_counter_delta_is_spread_over_the_pinned_windows_between_warnings() -> None:
    warn = make_event(Kind.PREEMPTION, {"cumulative": 1}, minute=0)
    later = replace(make_event(Kind.PREEMPTION, {"cumulative": 51}, minute=3), preemptions=50)
    events = [
        replace(warn, preemptions=1),
        _stats(0, 99.0, 50, 10),
        _stats(1, 99.5, 50, 20),
        _stats(2, 40.0, 50, 0),  # not pinned: no preemption can happen here
        later,
        _stats(3, 99.9, 50, 30),
    ]
    events = [replace(e, replica="a") for e in events]  # type: ignore[type-var]
    ws = build_windows(events, 60, Thresholds())  # type: ignore[arg-type]
    per_minute = {w.start.minute: w.preemptions for w in ws if w.start}
    assert per_minute[2] == 0
    assert round(sum(per_minute.values())) == 51


def test_a_spread_count_says_over_how_many_windows() -> None:
    warn = replace(make_event(Kind.PREEMPTION, {"cumulative": 1}, minute=0), preemptions=1)
    later = replace(make_event(Kind.PREEMPTION, {"cumulative": 51}, minute=2), preemptions=50)
    events = [warn, _stats(0, 99.0, 50, 1), _stats(1, 99.0, 50, 2), later, _stats(2, 99.0, 50, 3)]
    events = [replace(e, replica="a") for e in events]  # type: ignore[type-var]
    ws = build_windows(events, 60, Thresholds())  # type: ignore[arg-type]
    assert [w.preemptions_spread_over for w in ws] == [3, 3, 3]
    assert [w.preemptions for w in ws] == [17.67, 16.67, 16.67]  # 1 + 50/3, 50/3, 50/3
