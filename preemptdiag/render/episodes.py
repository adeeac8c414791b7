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

from preemptdiag.model.records import Class, Confidence, Verdict, Window, window_columns
from preemptdiag.render.common import kept_runs, utc


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
    return _in_episode(v, *window_columns(ws, ("cls", "replica", "start")))


def _in_episode(
    v: Verdict, classes: list[Class], replicas: list[str], starts: list[datetime | None]
) -> list[bool]:
    """in_episode of the windows' columns; the verdict's times converted once, not
    once a window (a month of windows: ~0.1 s)."""
    if v.start is None:
        return [False] * len(classes)
    cls, replica, first = v.cls, v.replica, utc(v.start)
    last = None if v.end is None else utc(v.end)
    return [
        c == cls
        and (not replica or r == replica)
        and s is not None
        and first <= (at := utc(s))
        and (last is None or at <= last)
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
# month's calm windows a column at a time, not a property a window and use): what
# cuts the runs, then their ends and counts, then their peaks (a few columns at a
# time: a month's eleven at once were ~10 MiB).
_RUNS = ("cls", "replica", "start")
_COUNTS = (
    "end",
    "confidence",
    "preemptions",
    "preemptions_lower_bound",
    "preemptions_spread_over",
)
_PEAKS = ("kv_max", "waiting_max", "running_max")


@dataclass(frozen=True, slots=True)
class _Run:
    first: int
    last: int
    verdict: bool


def _counted(c: dict[str, list[Any]], r: _Run, seconds: int) -> dict[str, Any]:
    """What an episode says of run `r` of its replica's windows (`c`: _RUNS' and
    _COUNTS' columns) but its peaks."""
    first, last = r.first, r.last
    n = last - first + 1
    start, end = c["start"][first], c["end"][last]
    silent = 0
    if start is not None and end is not None and seconds > 0:
        span = round((end - start).total_seconds() / seconds)
        silent = max(0, span - n)

    def run(name: str) -> list[Any]:
        return _part(c[name], first, last)

    counts = Counter(run("confidence"))
    order = list(Confidence)
    preemptions = run("preemptions")
    return {
        # which run
        "replica": c["replica"][first],
        "cls": c["cls"][first],
        "first": first,
        "n": n,
        "verdict": r.verdict,
        # when
        "start": start,
        "end": end,
        "silent": silent,
        # how many preemptions, and how sure that count is
        "preemptions": round(sum(preemptions), 2),
        "preemptions_lower_bound": any(run("preemptions_lower_bound")),
        "preemptions_estimated": any(
            spread and p
            for spread, p in zip(run("preemptions_spread_over"), preemptions, strict=True)
        ),
        # how sure its class is, window by window
        "confidence": tuple(sorted(counts.items(), key=lambda kv_: (-kv_[1], order.index(kv_[0])))),
    }


def _part(column: list[Any], first: int, last: int) -> list[Any]:
    """column[first : last + 1]; the column itself when that is all of it (a month
    of calm windows is one run)."""
    return column if first == 0 and last + 1 == len(column) else column[first : last + 1]


def _peaks(c: dict[str, list[Any]], r: _Run) -> dict[str, Any]:
    """Run `r`'s peaks (`c`: _PEAKS' columns)."""
    kv, waiting, running = (_peak(_part(c[name], r.first, r.last)) for name in _PEAKS)
    return {
        "kv_max": None if kv is None else float(kv),
        "waiting_max": None if waiting is None else int(waiting),
        "running_max": None if running is None else int(running),
    }


def episodes(ws: Sequence[Window], v: Verdict, seconds: int) -> list[Episode]:
    """The runs of one replica's windows (in order). A run ends where the class changes
    and where the verdict's episode begins or ends, so that episode is a row of its own."""
    c = dict(zip(_RUNS, window_columns(ws, _RUNS), strict=True))
    mine = _in_episode(v, c["cls"], c["replica"], c["start"])
    runs: list[_Run] = []
    i = 0
    # (a run: one class, by identity, and in the verdict's episode or not)
    for _, group in groupby(zip(map(id, c["cls"]), mine, strict=True)):
        n = len(list(group))
        runs.append(_Run(i, i + n - 1, mine[i]))
        i += n
    del mine
    c.update(zip(_COUNTS, window_columns(ws, _COUNTS), strict=True))
    made = [_counted(c, r, seconds) for r in runs]
    c = dict(zip(_PEAKS, window_columns(ws, _PEAKS), strict=True))
    return [Episode(**m, **_peaks(c, r)) for m, r in zip(made, runs, strict=True)]


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
