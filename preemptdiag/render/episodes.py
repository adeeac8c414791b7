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

from preemptdiag.model.records import Class, Confidence, Verdict, Window
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
    """Which windows belong to the verdict's episode (same replica, class and span);
    its times converted once, not once a window (a month of windows: ~0.1 s)."""
    if v.start is None:
        return [False] * len(ws)
    cls, replica, first = v.cls, v.replica, utc(v.start)
    last = None if v.end is None else utc(v.end)
    return [
        w.cls == cls
        and (not replica or w.replica == replica)
        and (start := w.start) is not None
        and first <= (start := utc(start))
        and (last is None or start <= last)
        for w in ws
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
    present = [v for v in values if v is not None and v == v]  # v == v drops NaN
    return max(present) if present else None


def _episode(ws: Sequence[Window], first: int, last: int, verdict: bool, seconds: int) -> Episode:
    run = ws[first : last + 1]
    start, end = run[0].start, run[-1].end
    silent = 0
    if start is not None and end is not None and seconds > 0:
        span = round((end - start).total_seconds() / seconds)
        silent = max(0, span - len(run))
    counts = Counter(w.confidence for w in run)
    order = list(Confidence)
    kv = _peak([w.kv_max for w in run])
    waiting = _peak([w.waiting_max for w in run])
    running = _peak([w.running_max for w in run])
    return Episode(
        # which run
        replica=run[0].replica,
        cls=run[0].cls,
        first=first,
        n=len(run),
        verdict=verdict,
        # when
        start=start,
        end=end,
        silent=silent,
        # how many preemptions, and how sure that count is
        preemptions=round(sum(w.preemptions for w in run), 2),
        preemptions_lower_bound=any(w.preemptions_lower_bound for w in run),
        preemptions_estimated=any(w.preemptions_spread_over and w.preemptions for w in run),
        # its peaks
        kv_max=None if kv is None else float(kv),
        waiting_max=None if waiting is None else int(waiting),
        running_max=None if running is None else int(running),
        # how sure its class is, window by window
        confidence=tuple(sorted(counts.items(), key=lambda kv_: (-kv_[1], order.index(kv_[0])))),
    )


def episodes(ws: Sequence[Window], v: Verdict, seconds: int) -> list[Episode]:
    """The runs of one replica's windows (in order). A run ends where the class changes
    and where the verdict's episode begins or ends, so that episode is a row of its own."""
    mine = in_episode(ws, v)
    out: list[Episode] = []
    i = 0
    while i < len(ws):
        j = i
        while j + 1 < len(ws) and ws[j + 1].cls is ws[i].cls and mine[j + 1] == mine[i]:
            j += 1
        out.append(_episode(ws, i, j, mine[i], seconds))
        i = j + 1
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
        worst = max(range(ep.first, ep.last + 1), key=lambda i: (_severity(ws[i]), -i))
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


def _severity(w: Window) -> tuple[float, float, int]:
    """How bad a window of an episode is: most preemptions, then fullest KV, then the
    longest queue (the earliest of equals wins)."""
    kv = w.kv_max if w.kv_max is not None and w.kv_max == w.kv_max else -1.0
    return (w.preemptions, kv, w.waiting_max if w.waiting_max is not None else -1)


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
