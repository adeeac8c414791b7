"""timeline.windows: events to per-replica windows (features only; rules classify)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from builders import T0, make_event

from preemptdiag.model.config import Thresholds
from preemptdiag.model.records import Kind, Rollup, RollupStats
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


def _scrape(minute: int, total: int, rise: int) -> object:
    e = make_event(Kind.PREEMPTION, {"cumulative": total}, minute=minute)
    return replace(e, preemptions=rise, engine="prometheus", replica="a")


def test_a_single_pinned_window_takes_a_later_count() -> None:
    # a real 0.20.2: 3 preemptions counted at a scrape with KV at 0 %, a minute after
    # the one window with the pool pinned
    events = [_scrape(0, 0, 0), _stats(0, 96.8, 6, 3), _stats(1, 0.0, 0, 0), _scrape(1, 3, 3)]
    ws = build_windows(events, 60, Thresholds())  # type: ignore[arg-type]
    assert [(w.preemptions, w.preemptions_spread_over) for w in ws] == [(3.0, 1), (0.0, None)]


def test_a_late_v1_count_reaches_back_to_the_last_empty_queue() -> None:
    # V1 counts a preemption when its request runs again: the 60 read at minute 3 may
    # be minute 1's, whose pool was pinned with the queue never empty since minute 0
    events = [
        _scrape(0, 0, 0),
        _stats(0, 50.0, 40, 0),
        _stats(1, 100.0, 40, 30),
        _scrape(2, 0, 0),
        _stats(2, 100.0, 20, 50),
        _stats(3, 100.0, 30, 10),
        _scrape(3, 60, 60),
    ]
    since = {("a", T0 + timedelta(minutes=2)): T0}

    def counted_since(replica: str, before: datetime) -> datetime:
        return since.get((replica, before), before)

    plain = build_windows(events, 60, Thresholds())  # type: ignore[arg-type]
    late = build_windows(events, 60, Thresholds(), counted_since)  # type: ignore[arg-type]
    assert [w.preemptions for w in plain] == [0.0, 0.0, 30.0, 30.0]
    assert [w.preemptions for w in late] == [0.0, 20.0, 20.0, 20.0]


# KV usages (percent, two decimals as engines print them) whose mean, 60.0903125, is a
# tie at 6 decimals; found by search, the kind of window fuzz seed 5051 input 1417 had.
_TIED = [74.49, 75.53, 57.47, 93.01, 91.35, 74.80, 79.72, 36.34, 53.19, 27.20, 43.93,
         78.60, 50.71, 49.69, 82.61, 92.10, 84.82, 83.12, 96.32, 66.62, 51.09, 34.04,
         80.10, 83.86, 60.06, 12.34, 55.94, 1.37, 31.35, 17.39, 9.62, 94.11]  # fmt: skip


def _rollup(values: list[float]) -> object:
    """One event standing for `values`' stats lines, summed as rollup.Builder sums."""
    first, last = (make_event(Kind.STATS, {"kv_usage": v}) for v in (values[0], values[-1]))
    total = 0.0
    for v in values:
        total += v
    n, none = len(values), (None,) * 5
    stats = RollupStats(n, 0, False, (total, *(0.0,) * 5), (n, *(0,) * 5),
                        (max(values), *none), 0, max(values), None)  # fmt: skip
    return replace(first, rollup=Rollup(stats, last, first, ()))


def test_seed_5051_index_1417_a_mean_at_a_rounding_tie_is_the_same_from_partial_sums() -> None:
    # Found by bench/fuzz.py (seed 5051, input 1417): a --jobs range cut a rollup, and
    # the two partial sums added up to a hair below the line-by-line sum: the mean,
    # rounded to 6 decimals, came out 7.179687 one way and 7.179688 the other. The
    # sum is snapped to 6 decimals before the division (2432f28).
    lines = [make_event(Kind.STATS, {"kv_usage": v}) for v in _TIED]
    halves = [_rollup(_TIED[:16]), _rollup(_TIED[16:])]
    means = [
        [w.kv_mean for w in build_windows(evs, 60, Thresholds())]  # type: ignore[arg-type]
        for evs in (lines, halves)
    ]
    assert means == [[60.090312], [60.090312]]
