"""Episodes: runs of same-class windows, so a report scales with the incident, not the log.

A month of a healthy server is 43,200 one-minute windows; printed one row each, the
report is longer than anyone reads. The human formats therefore collapse each run of
windows of one class (one replica) into one episode row with its peaks, and show in full
only the windows of the verdict's episode and a few around it (`--timeline episodes`,
their default). `--timeline full` prints every window; JSON keeps every window unless
asked for episodes. Every format selects the same windows (`shown_mask`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from itertools import groupby
from typing import Any

from preemptdiag.model.records import (
    NO_TIME,
    Class,
    Confidence,
    Verdict,
    Window,
    micros,
    window_columns,
    window_micros,
)
from preemptdiag.render.common import kept_runs


class TimelineMode(StrEnum):
    FULL = "full"  # every window, one row each
    EPISODES = "episodes"  # runs collapsed; the verdict's episode and its neighbours in full


LONG_TIMELINE = 40  # a replica with more windows than this is collapsed into episodes
CONTEXT_WINDOWS = 3  # shown in full before and after the focus episode
# A focus episode longer than FOCUS_MAX shows how it began (its first FOCUS_HEAD
# windows), its worst window with PEAK_NEIGHBOURS on each side, and how it ended; a
# healthy one only its worst window and neighbours.
FOCUS_MAX = 12
FOCUS_HEAD = 3
FOCUS_TAIL = 2
PEAK_NEIGHBOURS = 1
MAX_EPISODE_ROWS = 20  # per replica; the rest are counted in "omitted" rows


def in_episode(ws: Sequence[Window], v: Verdict) -> list[bool]:
    """Which windows belong to the verdict's episode (same replica, class and span)."""
    classes, replicas = window_columns(ws, ("cls", "replica"))
    return _in_episode(v, classes, replicas, window_micros(ws, "start"))


def _in_episode(
    v: Verdict, classes: list[Class], replicas: list[str], starts: Sequence[int]
) -> list[bool]:
    """in_episode of the windows' columns (`starts`: records.window_micros, which
    reads a naive time as UTC, as utc() does); the verdict's times converted once,
    not once a window (a month of windows: ~0.1 s)."""
    if v.start is None:
        return [False] * len(classes)
    cls, replica, first = v.cls, v.replica, micros(v.start)
    last = None if v.end is None else micros(v.end)
    return [
        c == cls
        and (not replica or r == replica)
        and s != NO_TIME
        and first <= s
        and (last is None or s <= last)
        for c, r, s in zip(classes, replicas, starts, strict=True)
    ]


@dataclass(frozen=True, slots=True)
class Episode:
    """A run of consecutive windows of one replica and one class, with its peaks.

    A stretch of time with no window (the engine logged nothing) does not end a run:
    nothing in it was of another class, and splitting there would turn an idle night into
    many rows. `silent` counts those windows instead."""

    replica: str
    cls: Class
    first: int  # index of its first window in the replica's windows
    n: int  # windows in the run
    start: datetime | None
    end: datetime | None  # end of its last window
    silent: int  # windows of its span without any log line
    preemptions: float  # sum over the run
    preemptions_lower_bound: bool
    preemptions_estimated: bool  # some of it is a spread counter delta (~)
    kv_max: float | None
    waiting_max: int | None
    running_max: int | None
    confidence: tuple[tuple[Confidence, int], ...]  # windows per confidence, most first
    verdict: bool  # the verdict's episode

    @property
    def last(self) -> int:
        return self.first + self.n - 1


def _peak(values: Sequence[float | int | None]) -> float | int | None:
    # (v == v drops NaN)
    return max((v for v in values if v is not None and v == v), default=None)


# What an episode reads of its windows, a column each (records.window_columns: a
# month's calm windows a column at a time, not a property a window and use), a chunk
# of windows at a time (a month's columns at once were ~5 MiB): what cuts the runs
# (and the starts, as window_micros), then what is summed, counted and peaked.
_RUNS = ("cls", "replica")
_READS = (
    "confidence",
    "preemptions",
    "preemptions_lower_bound",
    "preemptions_spread_over",
    "kv_max",
    "waiting_max",
    "running_max",
)
_CHUNK = 4096


class _Acc:
    """One run of windows as it is read, chunk by chunk: what its Episode says."""

    def __init__(self, first: int, cls: Class, replica: str, verdict: bool) -> None:
        self.first, self.last = first, first - 1
        self.cls, self.replica, self.verdict = cls, replica, verdict
        self.confidence: Counter[Confidence] = Counter()
        # (summed once, at its end, as sum() sums one list: the same float)
        self.preemptions: list[float] = []
        self.lower = self.estimated = False
        self.peaks: list[list[float | int]] = [[], [], []]  # kv, waiting, running

    def add(self, c: dict[str, list[Any]], a: int, b: int) -> None:
        """Rows a..b-1 of a chunk's columns `c`, the run's next windows."""
        self.last += b - a
        self.confidence.update(c["confidence"][a:b])
        preemptions = c["preemptions"][a:b]
        self.preemptions += preemptions
        self.lower = self.lower or any(c["preemptions_lower_bound"][a:b])
        self.estimated = self.estimated or any(
            spread and p
            for spread, p in zip(c["preemptions_spread_over"][a:b], preemptions, strict=True)
        )
        for got, name in zip(self.peaks, ("kv_max", "waiting_max", "running_max"), strict=True):
            peak = _peak(c[name][a:b])
            if peak is not None:
                got.append(peak)

    def episode(self, ws: Sequence[Window], seconds: int) -> Episode:
        n = self.last - self.first + 1
        start, end = ws[self.first].start, ws[self.last].end  # (two windows read)
        silent = 0
        if start is not None and end is not None and seconds > 0:
            span = round((end - start).total_seconds() / seconds)
            silent = max(0, span - n)
        order = list(Confidence)
        kv, waiting, running = (_peak(p) for p in self.peaks)
        return Episode(
            replica=self.replica,
            cls=self.cls,
            first=self.first,
            n=n,
            verdict=self.verdict,
            start=start,
            end=end,
            silent=silent,
            preemptions=round(sum(self.preemptions), 2),
            preemptions_lower_bound=self.lower,
            preemptions_estimated=self.estimated,
            confidence=tuple(
                sorted(self.confidence.items(), key=lambda kv_: (-kv_[1], order.index(kv_[0])))
            ),
            kv_max=None if kv is None else float(kv),
            waiting_max=None if waiting is None else int(waiting),
            running_max=None if running is None else int(running),
        )


def episodes(ws: Sequence[Window], v: Verdict, seconds: int) -> list[Episode]:
    """The runs of one replica's windows (in order). A run ends where the class changes
    and where the verdict's episode begins or ends, so that episode is a row of its own."""
    out: list[Episode] = []
    run: _Acc | None = None
    for at in range(0, len(ws), _CHUNK):
        part = ws[at : at + _CHUNK]
        classes, replicas = window_columns(part, _RUNS)
        mine = _in_episode(v, classes, replicas, window_micros(part, "start"))
        c = dict(zip(_READS, window_columns(part, _READS), strict=True))
        i = 0
        # (a run: one class, by identity, and in the verdict's episode or not)
        for (_, verdict), group in groupby(zip(map(id, classes), mine, strict=True)):
            n = len(list(group))
            if run is not None and (run.cls is not classes[i] or run.verdict != verdict):
                out.append(run.episode(ws, seconds))
                run = None
            if run is None:
                run = _Acc(at + i, classes[i], replicas[i], verdict)
            run.add(c, i, i + n)
            i += n
    if run is not None:
        out.append(run.episode(ws, seconds))
    return out


def focus(eps: Sequence[Episode]) -> Episode | None:
    """The episode a replica's timeline is about: the verdict's, else the replica's own
    earliest most severe one (another replica holds the verdict, or nothing is dated)."""
    from preemptdiag.diagnose.rules import SEVERITY  # ~70 ms; only long timelines need it

    if not eps:
        return None
    marked = [e for e in eps if e.verdict]
    if marked:
        return marked[0]
    return min(eps, key=lambda e: (SEVERITY.index(e.cls), e.first))


def collapsed(ws: Sequence[Window], mode: TimelineMode) -> bool:
    return mode is TimelineMode.EPISODES and len(ws) > LONG_TIMELINE


def shown_mask(ws: Sequence[Window], v: Verdict, seconds: int, mode: TimelineMode) -> list[bool]:
    """Which of one replica's windows are shown in full: all of them in full mode or
    when they are few; else the focus episode (its head and tail when long) and
    CONTEXT_WINDOWS on either side."""
    if not collapsed(ws, mode):
        return [True] * len(ws)
    ep = focus(episodes(ws, v, seconds))
    keep = [False] * len(ws)
    if ep is None:
        return keep
    if ep.n > FOCUS_MAX:
        worst = ep.first + _worst(ws[ep.first : ep.last + 1])
        picked = list(range(worst - PEAK_NEIGHBOURS, worst + PEAK_NEIGHBOURS + 1))
        if ep.cls is not Class.HEALTHY:  # a healthy run has no onset or end to show
            picked += [
                *range(ep.first, ep.first + FOCUS_HEAD),
                *range(ep.last - FOCUS_TAIL + 1, ep.last + 1),
            ]
    else:
        picked = list(range(ep.first, ep.last + 1))
    picked += range(max(0, ep.first - CONTEXT_WINDOWS), ep.first)
    picked += range(ep.last + 1, min(len(ws), ep.last + 1 + CONTEXT_WINDOWS))
    for i in picked:
        if 0 <= i < len(ws):
            keep[i] = True
    return keep


def _worst(ws: Sequence[Window]) -> int:
    """The worst window of an episode's: most preemptions, then fullest KV, then the
    longest queue; the earliest of equals (read a column at a time)."""
    preemptions, kvs, waits = window_columns(ws, ("preemptions", "kv_max", "waiting_max"))
    kv = [v if v is not None and v == v else -1.0 for v in kvs]
    waiting = [v if v is not None else -1 for v in waits]
    return -max(zip(preemptions, kv, waiting, range(0, -len(ws), -1), strict=True))[3]


def episode_rows(eps: Sequence[Episode]) -> list[Episode | int]:
    """At most MAX_EPISODE_ROWS episodes, in time order, with an int standing for a run
    of left-out episodes. A log that flaps between two classes has thousands of runs:
    the verdict's is kept first, then the most severe, then the nearest to it."""
    if len(eps) <= MAX_EPISODE_ROWS:
        return list(eps)
    from preemptdiag.diagnose.rules import SEVERITY

    f = focus(eps)
    centre = f.first if f is not None else 0

    def priority(e: Episode) -> tuple[int, int, int]:
        return (0 if e.verdict else 1, SEVERITY.index(e.cls), abs(e.first - centre))

    kept = set(sorted(range(len(eps)), key=lambda i: priority(eps[i]))[:MAX_EPISODE_ROWS])
    return kept_runs(eps, [i in kept for i in range(len(eps))])
