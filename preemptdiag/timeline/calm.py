"""Calm minutes -> windows, without a hit, an event or a rollup each.

A month of a quiet server's log is 43,200 stream-minutes of stats lines in which
nothing waits and nothing is preempted. scan/lane.py keeps such a minute as numbers
(records.CalmMinute); here each gets its time and replica from the hit before it in
its file (its anchor: the lane makes the first segment of every clock a hit), and the
minutes of one window become that window, as build_windows aggregates their lines.
Everything after sees the windows (the rules find them healthy: PD110), and the
minutes' lines where it counts lines (detect_engine).

Exact, or not used: `place` gives None, and analyze scans again without calm minutes,
when a minute has no anchor of its clock before it, when its anchor was not timed from
its own stamp's date, or when a calm minute would come after every hit of its file (a
year-less log is moved back a year by its last stamp: events.resolve_times).
`windows` gives None when a calm window shares its (replica, start) with a window of
events; analyze does the same when the replica's preemption count is a late V1 one
(visibility.Settled reads every stats line's Waiting). tests/timeline/test_calm.py
holds the report to the one made without calm minutes, byte for byte, in every format;
bench/fuzz.py and bench/lane_fuzz.py do on damaged logs.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from preemptdiag.model.records import CalmMinute, Event, FieldValue, Hit, RollupStats, Window
from preemptdiag.scan.rollup import AGG_FIELDS, number, stamp
from preemptdiag.timeline.events import stamp_event
from preemptdiag.timeline.windows import snap6, window_start

_KV, _RUNNING, _WAITING, _PROMPT, _GEN, _SWAPPED = (
    AGG_FIELDS.index(k)
    for k in ("kv_usage", "running", "waiting", "prompt_tput", "gen_tput", "swapped")
)


@dataclass(frozen=True, slots=True)
class Placed:
    """A calm minute on the timeline: its replica, its first line's time, its window."""

    minute: CalmMinute
    replica: str
    ts: datetime
    wstart: int


def place(
    minutes: Sequence[CalmMinute], hits: Sequence[Hit], events: Sequence[Event], seconds: int
) -> list[Placed] | None:
    """The calm minutes of one file on the timeline (see the module docstring); `hits`:
    the file's hits, `events`: what build_events made of every file's."""
    if not minutes:
        return []
    source = minutes[0].peak.source
    timed = {(e.line, e.pos, e.sig): e for e in events if e.source == source}
    # Every hit that can move its file's clock (a stamp of any kind); the one just
    # before a calm minute must be a plain stamp of the minute's clock.
    anchors = sorted(
        (h for h in hits if h.ts_engine or h.ts_wrapper), key=lambda h: (h.line, h.pos)
    )
    lines = [h.line for h in anchors]
    latest = max((e.ts for e in timed.values() if e.ts is not None), default=None)
    out: list[Placed] = []
    for m in minutes:
        k = bisect_left(lines, m.first_line)
        if not k:
            return None
        h = anchors[k - 1]
        e = timed.get((h.line, h.pos, h.sig))
        clock, minute, _ = stamp(h)
        if (
            h.pod is not None
            or minute is None
            or clock != m.clock
            or e is None
            or e.ts is None
            or not _same_day(e.ts, m.clock)
        ):
            return None
        ts = e.ts.replace(hour=m.hour, minute=m.minute, second=m.first_second, microsecond=0)
        if latest is None or ts > latest:
            return None
        start = window_start(ts, seconds)
        assert start is not None
        out.append(Placed(m, e.replica, ts, start))
    return out


def _same_day(ts: datetime, clock: tuple[str, str]) -> bool:
    """Whether a time resolved from a stamp of `clock` kept that stamp's date."""
    kind, day = clock
    if kind == "e":
        return f"{ts.month:02d}-{ts.day:02d}" == day
    return ts.date().isoformat() == day


# (replica, what detect_engine reads of a line's fields, its engine) -> lines
Weights = dict[tuple[str, tuple[tuple[str, FieldValue], ...], str], int]


def weights(placed: Iterable[Placed]) -> Weights:
    """The calm minutes' lines by replica and by what detect_engine counts a line as:
    all it needs of them once their windows are made (a month's minutes hold ~40 MB)."""
    out: Weights = {}
    for p in placed:
        h = p.minute.peak
        read = tuple((k, h.fields[k]) for k in ("engine", "generation") if k in h.fields)
        key = (p.replica, read, h.engine)
        out[key] = out.get(key, 0) + p.minute.stats.n
    return out


def lines(
    counted: Weights, replica: str | None = None
) -> list[tuple[Mapping[str, FieldValue], str, int]]:
    """(fields, engine, lines) of the calm minutes (of `replica`, given one), for
    detect_engine."""
    return [
        (dict(read), engine, n)
        for (name, read, engine), n in counted.items()
        if replica is None or name == replica
    ]


def windows(
    placed: Sequence[Placed], others: Sequence[Window], seconds: int
) -> list[Window] | None:
    """The calm minutes' windows merged into `others`, build_windows' windows of the
    events (its order: by replica, then start, undated last); None when a calm window
    would share its replica and start with one of them."""
    if not placed:
        return list(others)
    groups: dict[tuple[str, int], list[Placed]] = {}
    for p in placed:
        groups.setdefault((p.replica, p.wstart), []).append(p)
    taken = {(w.replica, _epoch(w.start)) for w in others}
    if not taken.isdisjoint(groups):
        return None
    calm = [_window(key, ps, seconds) for key, ps in sorted(groups.items())]
    return list(heapq.merge(others, calm, key=_order))


def _order(w: Window) -> tuple[str, bool, datetime]:
    return (w.replica, w.start is None, w.start or _EPOCH)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _epoch(ts: datetime | None) -> int | None:
    return None if ts is None else int(ts.timestamp())


def _window(key: tuple[str, int], ps: list[Placed], seconds: int) -> Window:
    """The window of these calm minutes, as build_windows aggregates their lines."""
    replica, wstart = key
    start = datetime.fromtimestamp(wstart, tz=UTC)
    if len(ps) == 1:
        return _one_minute(replica, start, ps[0], seconds)
    stats = [p.minute.stats for p in ps]
    n = sum(s.n for s in stats)
    kv_max, running_max = _most(stats, _KV), _most(stats, _RUNNING)
    top = max(s.peak_kv for s in stats)
    at_peak = [s.peak_running for s in stats if s.peak_kv == top and s.peak_running is not None]
    return Window(
        replica=replica,
        start=start,
        end=start + timedelta(seconds=seconds),
        n_events=n,
        n_stats=n,
        preemptions=0.0,
        preemptions_lower_bound=False,
        max_cumulative=None,
        kv_max=kv_max,
        kv_mean=_mean(stats, _KV),
        running_max=None if running_max is None else int(running_max),
        running_mean=_mean(stats, _RUNNING),
        waiting_first=0,
        waiting_last=0,
        waiting_max=0,
        swapped_first=_swapped_first(ps),
        swapped_last=_swapped_last(ps),
        swapped_max=_swapped_max(ps),
        prompt_tput=_mean(stats, _PROMPT),
        gen_tput=_mean(stats, _GEN),
        alloc_failures=0,
        host_ooms=0,
        engine_deaths=0,
        swap_warnings=0,
        evidence=(_evidence(ps),),
        kv_peak_running=min(at_peak) if at_peak else None,
        waiting_share=0.0,  # (every line of a calm minute says Waiting: 0)
    )


def _one_minute(replica: str, start: datetime, p: Placed, seconds: int) -> Window:
    """_window of a window of one calm minute (a replica of one stream: the usual),
    the same numbers without the lists (a month of windows: ~40 % of this stage)."""
    m = p.minute
    s = m.stats
    maxes, sums, counts = s.maxes, s.sums, s.counts

    def mean(i: int) -> float | None:
        # (as _mean: 0.0 + the sum, so a -0.0 sum is snapped as 0.0 there)
        return snap6(snap6(0.0 + sums[i]) / counts[i]) if counts[i] else None

    running_max, swapped_max = maxes[_RUNNING], maxes[_SWAPPED]
    return Window(
        replica=replica,
        start=start,
        end=start + timedelta(seconds=seconds),
        n_events=s.n,
        n_stats=s.n,
        preemptions=0.0,
        preemptions_lower_bound=False,
        max_cumulative=None,
        kv_max=maxes[_KV],
        kv_mean=mean(_KV),
        running_max=None if running_max is None else int(running_max),
        running_mean=mean(_RUNNING),
        waiting_first=0,
        waiting_last=0,
        waiting_max=0,
        swapped_first=m.swapped[0],
        swapped_last=m.swapped[1],
        swapped_max=None if swapped_max is None else int(swapped_max),
        prompt_tput=mean(_PROMPT),
        gen_tput=mean(_GEN),
        alloc_failures=0,
        host_ooms=0,
        engine_deaths=0,
        swap_warnings=0,
        evidence=(_evidence([p]),),
        # (as _window's: no peak line when the peak is not equal to itself, a NaN)
        kv_peak_running=s.peak_running if s.peak_kv == s.peak_kv else None,
        waiting_share=0.0,
    )


def _most(stats: list[RollupStats], i: int) -> float | None:
    values = [v for s in stats if (v := s.maxes[i]) is not None]
    return max(values) if values else None


def _mean(stats: list[RollupStats], i: int) -> float | None:
    """windows.snapped_mean over the minutes' sums (added in their order, snapped)."""
    count, total = 0, 0.0
    for s in stats:
        if s.counts[i]:
            count += s.counts[i]
            total += s.sums[i]
    return snap6(snap6(total) / count) if count else None


def _swapped_first(ps: list[Placed]) -> int | None:
    # (the events table's order: by first line's time, file, line)
    if len(ps) == 1:
        return ps[0].minute.swapped[0]
    for p in sorted(ps, key=lambda p: (p.ts, p.minute.peak.source, p.minute.first_line)):
        if p.minute.swapped[0] is not None:
            return p.minute.swapped[0]
    return None


def _swapped_last(ps: list[Placed]) -> int | None:
    # (the order of last lines: windows._LAST_ORDER)
    def key(p: Placed) -> tuple[datetime, str, int, int, str]:
        m = p.minute
        return (
            p.ts.replace(second=m.last_second),
            m.peak.source,
            m.last_line,
            m.last_pos,
            m.peak.sig,
        )

    if len(ps) == 1:
        return ps[0].minute.swapped[1]
    for p in sorted(ps, key=key, reverse=True):
        if p.minute.swapped[1] is not None:
            return p.minute.swapped[1]
    return None


def _swapped_max(ps: list[Placed]) -> int | None:
    values = [v for p in ps if (v := p.minute.stats.maxes[_SWAPPED]) is not None]
    return int(max(values)) if values else None


def _evidence(ps: list[Placed]) -> Event:
    """The window's stats line with the highest KV usage, the first such in log order
    (windows._pick_evidence over the minutes' peak lines)."""
    if len(ps) == 1:
        p = ps[0]
        return stamp_event(p.minute.peak, p.ts.replace(second=_second(p.minute.peak)), p.replica)
    made = [
        stamp_event(p.minute.peak, p.ts.replace(second=_second(p.minute.peak)), p.replica)
        for p in ps
    ]
    made.sort(key=lambda e: (e.ts, e.source, e.line, e.pos, e.sig))
    return max(made, key=lambda e: number(e.fields.get("kv_usage")) or -1.0)


def _second(h: Hit) -> int:
    """The seconds of a lane line's stamp (`MM-DD HH:MM:SS`, SGLang's `YYYY-MM-DD
    HH:MM:SS`): a member of the minute is timed by them (rollup.member_time)."""
    text = h.ts_wrapper.text if h.ts_wrapper else h.ts_engine
    assert text is not None
    return int(text[-2:])
