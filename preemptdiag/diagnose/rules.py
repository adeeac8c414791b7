"""Classify windows and pick the incident verdict (design.md section 3).

Each rule is a small function of one window's features; the run-level thrash rule
looks at consecutive windows of one replica. Thresholds come from config.Thresholds.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate, groupby, islice, pairwise
from operator import itemgetter

from preemptdiag.diagnose.stories import (
    StatsSeen,
    cpu_backend,
    crash_of,
    healthy_why,
    host_story,
    queueing_why,
)
from preemptdiag.diagnose.visibility import Visibility
from preemptdiag.diagnose.window_rules import classify_window
from preemptdiag.model.config import Thresholds
from preemptdiag.model.evolve import evolve
from preemptdiag.model.records import (
    NO_TIME,
    Class,
    Confidence,
    Event,
    Kind,
    ReadWindow,
    Repeats,
    Verdict,
    Window,
    window_columns,
    window_micros,
    window_runs,
)

# Most severe first. insufficient_evidence sits above benign: a suspected loop that
# the log cannot prove deserves attention before a proven harmless burst.
SEVERITY: tuple[Class, ...] = (
    Class.ALLOCATION_FAILURE,
    Class.HOST_PRESSURE,
    Class.THRASH_LOOP,
    Class.INSUFFICIENT_EVIDENCE,
    Class.BENIGN_PREEMPTION,
    Class.QUEUEING,
    Class.HEALTHY,
)
MAX_VERDICT_EVIDENCE = 8


def _consecutive(a: Window, b: Window, seconds: int) -> bool:
    if a.start is None or b.start is None:
        return False
    return (b.start - a.start).total_seconds() <= seconds


def _queue_growing(w: Window) -> bool:
    return (w.waiting_last or 0) > (w.waiting_first or 0) or (w.swapped_last or 0) > (
        w.swapped_first or 0
    )


def _thrash_reason(run: Sequence[Window], thr: Thresholds, seconds: int) -> str | None:
    kv_vals = [w.kv_max for w in run if w.kv_max is not None]
    kv_hot = bool(kv_vals) and max(kv_vals) >= thr.kv_pressure_pct
    total = sum(w.preemptions for w in run)
    if len(run) >= thr.thrash_min_windows and (kv_hot or not kv_vals):
        return f"preemption in {len(run)} consecutive windows ({total:.0f} in all)" + (
            f", KV up to {max(kv_vals):.1f}%" if kv_vals else ""
        )
    rate_limit = thr.thrash_rate_per_min * seconds / 60.0
    for w in run:
        if kv_hot and w.preemptions >= rate_limit:
            return (
                f"{w.preemptions:.0f} preemptions in one {seconds}s window with KV at "
                f"{max(kv_vals):.1f}%"
            )
        if (
            w.max_cumulative is not None
            and w.max_cumulative >= thr.thrash_cumulative
            and w.kv_max is not None
            and w.kv_max >= thr.kv_pressure_pct
            and _queue_growing(w)
        ):
            return (
                f"cumulative preemption counter at {w.max_cumulative} with KV "
                f"{w.kv_max:.1f}% and the waiting/swapped queue growing"
            )
    return None


def _reprefill(run: Sequence[Window], thr: Thresholds) -> str:
    """V0 counts recomputed prompts in its prompt throughput, so prompt tok/s far above
    generation tok/s in a loop is the re-prefill the preemption costs (V1 counts each
    prompt once: there the ratio says nothing)."""
    pairs = [(w.prompt_tput, w.gen_tput) for w in run if w.prompt_tput and w.gen_tput]
    if not pairs:
        return ""
    ratio = sum(p for p, _ in pairs) / sum(g for _, g in pairs)
    if ratio < thr.reprefill_ratio:
        return ""
    return f"; prompt tok/s {ratio:.1f}x generation (re-prefill of preempted requests)"


def classify(
    windows: Sequence[Window],
    thr: Thresholds,
    vis: Visibility,
    seconds: int,
    generation: str | None = None,
) -> list[Window]:
    out = [classify_window(w, thr, vis) for w in windows]
    result: list[Window] = []
    for _, group in groupby(out, key=lambda w: w.replica):
        ws = list(group)
        i = 0
        while i < len(ws):
            if ws[i].cls is not Class.BENIGN_PREEMPTION:
                result.append(ws[i])
                i += 1
                continue
            j = i + 1
            while (
                j < len(ws)
                and ws[j].cls is Class.BENIGN_PREEMPTION
                and _consecutive(ws[j - 1], ws[j], seconds)
            ):
                j += 1
            run = ws[i:j]
            reason = _thrash_reason(run, thr, seconds)
            if reason is not None and generation == "v0":
                reason += _reprefill(run, thr)
            for w in run:
                if reason is None:
                    result.append(w)
                    continue
                exact = not w.preemptions_lower_bound and w.n_stats > 0
                result.append(
                    evolve(
                        w,
                        cls=Class.THRASH_LOOP,
                        confidence=Confidence.HIGH if exact else Confidence.MEDIUM,
                        why=reason,
                    )
                )
            i = j
    return result


def _rank(w: Window) -> int:
    r = SEVERITY.index(w.cls)
    # A swap-size warning alone is a risk note, not an incident: rank it below a
    # proven loop so it never hides one.
    if w.cls is Class.HOST_PRESSURE and not w.host_ooms:
        r = SEVERITY.index(Class.BENIGN_PREEMPTION)
    return r


# What the verdict reads of every window, a column each (records.window_columns): a
# healthy month is one run of 43,200 windows, and a property read a window and use
# was most of the verdict's time. Read a chunk of windows at a time; what it keeps
# grows little with the span: replicas and classes a run at a time (records.Repeats),
# the host kills where there are some, each replica's stats lines counted, the peaks
# a healthy verdict names folded (StatsSeen), and each window's start (8 bytes: a
# quarter's ~130,000 windows were ~9 MiB as lists, then ~5 MiB as arrays).
@dataclass(frozen=True, slots=True)
class _Read:
    replica: Repeats
    cls: Repeats
    hosts: dict[int, int]  # (host_ooms of the windows that have some, by index)
    stats: dict[str, tuple[int, int]]  # (by replica: windows with stats lines, lines)
    start: array[int]  # (records.window_micros)
    seen: StatsSeen  # (healthy_why's)

    @classmethod
    def of(cls, windows: Sequence[Window]) -> _Read:
        replica, classes = Repeats(), Repeats()
        hosts: dict[int, int] = {}
        stats: dict[str, tuple[int, int]] = {}
        seen = StatsSeen()
        for at in range(0, len(windows), _READ_CHUNK):
            part = windows[at : at + _READ_CHUNK]
            reps, kinds, ns, host_ooms, kv, waiting = window_columns(part, _READ)
            replica.extend(reps)
            classes.extend(kinds)
            if any(host_ooms):
                hosts.update((at + j, n) for j, n in enumerate(host_ooms) if n)
            for r, group in groupby(zip(reps, ns, strict=True), key=itemgetter(0)):
                lines = [n for _, n in group if n]
                got = stats.get(r, (0, 0))
                stats[r] = (got[0] + len(lines), got[1] + sum(lines))
            seen.add(at, ns, kv, waiting)
        return cls(replica, classes, hosts, stats, window_micros(windows, "start"), seen)

    def worst(self) -> Sequence[int]:
        """The windows of the most severe rank (_rank), in order."""
        benign = SEVERITY.index(Class.BENIGN_PREEMPTION)
        ranked: list[tuple[int, int, int]] = []  # (rank, first, end) of runs of one rank
        for c, lo, hi in self.cls.runs():
            if c is not Class.HOST_PRESSURE:
                ranked.append((SEVERITY.index(c), lo, hi))
                continue
            for i in range(lo, hi):  # (a swap warning alone ranks as benign: _rank)
                ranked.append((SEVERITY.index(c) if self.hosts.get(i) else benign, i, i + 1))
        best = min(r for r, _, _ in ranked)
        runs = [(lo, hi) for r, lo, hi in ranked if r == best]
        if len(runs) == 1:
            return range(*runs[0])  # (a month of calm windows: no list of 43,200 ints)
        return [i for lo, hi in runs for i in range(lo, hi)]

    def earliest(self, among: Sequence[int]) -> int | None:
        """The window of `among` with the earliest start (the first such), if one has
        a start."""
        dated = (
            among
            if type(among) is range and NO_TIME not in self.start
            else [i for i in among if self.start[i] != NO_TIME]
        )
        return min(dated, key=self.start.__getitem__) if dated else None


_READ = ("replica", "cls", "n_stats", "host_ooms", "kv_max", "waiting_max")
_READ_CHUNK = 4096


def _episode(windows: Sequence[Window], seconds: int, read: _Read) -> Sequence[Window]:
    """The earliest run of windows (one replica) of the most severe class."""
    worst = read.worst()
    # The first of them by (start, undated last; replica), as a stable sort puts it.
    k = read.earliest(worst)
    if k is None:
        _, k = min(zip([read.replica[i] for i in worst], worst, strict=True))
    else:
        first = read.start[k]
        _, _, k = min((read.start[i], read.replica[i], i) for i in worst if read.start[i] == first)
    cls, replica = read.cls[k], read.replica[k]
    run = _Indexes(k)
    prev = read.start[k]
    for i, r, c, start in zip(
        range(k + 1, len(windows)),
        read.replica.iterate(k + 1),
        read.cls.iterate(k + 1),
        islice(read.start, k + 1, None),
        strict=True,
    ):
        if r != replica:
            continue  # (another replica's window between two of this one's)
        if (
            c is not cls
            or prev == NO_TIME
            or start == NO_TIME
            or start - prev > seconds * 1_000_000
        ):
            break
        run.append(i)
        prev = start
    if run.apart is None:
        # (the usual: consecutive windows, a slice, which a month's calm windows'
        # sequence gives without making them: records.Windows)
        return windows[k : run.last + 1]
    return [windows[i] for i in run.apart]


class _Indexes:
    """Indexes appended in increasing order: held as the first and last while they are
    consecutive (a month's episode: no list of 43,200 ints), as a list once not."""

    def __init__(self, first: int) -> None:
        self.first = self.last = first
        self.apart: list[int] | None = None

    def append(self, i: int) -> None:
        if self.apart is None and i != self.last + 1:
            self.apart = list(range(self.first, self.last + 1))
        if self.apart is not None:
            self.apart.append(i)
        self.last = i


class _Taken:
    """The lines of one file taken as evidence: a set, and runs of lines that only go
    up (a month's calm windows' lines, taken without a set of 43,200 ints: ~4 MiB)."""

    def __init__(self) -> None:
        self.lines: set[int] = set()
        self.runs: list[Sequence[int]] = []  # (arrays: 8 bytes a line)

    def __contains__(self, at: int) -> bool:
        return at in self.lines or any(self._in(run)(at) for run in self.runs)

    def add(self, at: int) -> None:
        self.lines.add(at)

    def isdisjoint(self, up: Sequence[int]) -> bool:
        """Whether none of `up` (lines that only go up) is taken."""
        if not up:
            return True
        if not self.lines.isdisjoint(up):
            return False
        return all(
            run[-1] < up[0] or up[-1] < run[0] or not any(map(self._in(run), up))
            for run in self.runs
        )

    @staticmethod
    def _in(run: Sequence[int]) -> Callable[[int], bool]:
        def has(at: int) -> bool:
            k = bisect_left(run, at)
            return k < len(run) and run[k] == at

        return has


_EVIDENCE_CHUNK = 4096


def _read_evidence(
    kind: type[ReadWindow],
    reads: Sequence[ReadWindow],
    seen: dict[str, _Taken],
    kvs: array[float],
    lines: list[Sequence[Event | ReadWindow]],
    decisive: list[Event],
) -> None:
    """_verdict_evidence's reading of a run of ReadWindows of one class: their lines
    taken, their stats lines' KV usages and windows added to `kvs` and `lines`, the
    other lines' events to `decisive`."""
    source, line, kinds = kind.evidence_places(reads)
    kv = kind.evidence_values(reads, "kv_usage")
    if kinds.count(Kind.STATS) == len(kinds) and source.count(source[0]) == len(source):
        taken = seen.setdefault(source[0], _Taken())
        if all(a < b for a, b in pairwise(line)) and taken.isdisjoint(line):
            # (the usual: a run of stats lines of one file, each its own)
            taken.runs.append(array("q", line))
            kvs += array("d", [float(usage or 0.0) for usage in kv])
            lines.append(reads)
            return
    for r, file, at, k, usage in zip(reads, source, line, kinds, kv, strict=True):
        taken = seen.setdefault(file, _Taken())
        if at not in taken:
            taken.add(at)
            if k is Kind.STATS:
                kvs.append(float(usage or 0.0))
                lines.append((r,))
            else:
                decisive.append(r.evidence[0])


def _verdict_evidence(run: Sequence[Window]) -> tuple[Event, ...]:
    seen: dict[str, _Taken] = {}  # (the lines taken, by file)
    decisive: list[Event] = []
    # Each stats line's KV usage and its event; a ReadWindow's stats line is read
    # without making its event, made only if picked (a healthy month is one run of
    # 43,200 windows, read a column at a time).
    kvs: array[float] = array("d")  # (8 bytes a line, no float object)
    # (the stats lines, kvs' order, a run at a time: a month's calm windows are a
    # sequence of them, made only when picked)
    lines: list[Sequence[Event | ReadWindow]] = []
    for kind, ws in window_runs(run):
        if issubclass(kind, ReadWindow):
            # (a few thousand at a time: a month's columns of line numbers and KV
            # usages at once were ~3 MiB)
            for first in range(0, len(ws), _EVIDENCE_CHUNK):
                reads: Sequence[ReadWindow] = ws[first : first + _EVIDENCE_CHUNK]  # type: ignore[assignment]
                _read_evidence(kind, reads, seen, kvs, lines, decisive)
            continue
        for w in ws:
            for e in w.evidence:
                taken = seen.setdefault(e.source, _Taken())
                if e.line in taken:
                    continue
                taken.add(e.line)
                if e.kind is Kind.STATS:
                    kvs.append(float(e.fields.get("kv_usage") or 0.0))
                    lines.append((e,))
                else:
                    decisive.append(e)
    # Keep the earliest decisive lines and the two hottest stats lines: the first two
    # of a stable sort by KV usage, highest first (nlargest is that sort's head, where
    # no usage is a NaN, which has no place in an order).
    if any(v != v for v in kvs):
        hot = sorted(range(len(kvs)), key=lambda i: -kvs[i])[:2]
    else:
        hot = heapq.nlargest(2, range(len(kvs)), key=kvs.__getitem__)
    ends = list(accumulate(map(len, lines)))

    def stats_line(i: int) -> Event | ReadWindow:
        k = bisect_right(ends, i)
        return lines[k][i - (ends[k - 1] if k else 0)]

    hottest = [e if isinstance(e, Event) else e.evidence[0] for e in map(stats_line, hot)]
    picked = decisive[: MAX_VERDICT_EVIDENCE - min(2, len(kvs))] + hottest
    return tuple(sorted(picked, key=lambda e: (e.source, e.line)))


def _suspect(w: Window, thr: Thresholds, vis: Visibility) -> bool:
    """An insufficient-evidence window for KV pressure the log cannot explain (not
    one that is undecided because the engine died)."""
    return _pinned(w.cls, w.engine_deaths, w.kv_max, w.waiting_max, thr) and vis.blind_at(w)


def _pinned(
    cls: Class, deaths: int, kv_max: float | None, waiting_max: int | None, thr: Thresholds
) -> bool:
    """_suspect of a window of these numbers, but where the log is blind."""
    return (
        cls is Class.INSUFFICIENT_EVIDENCE
        and not deaths
        and (kv_max or 0.0) >= thr.kv_pressure_pct
        and (waiting_max or 0) > 0
    )


def _suspects(windows: Sequence[Window], thr: Thresholds, vis: Visibility) -> int:
    """How many windows _suspect takes, read a column at a time (a month of a pinned
    pool's calm windows, each made, was ~0.5 s); a window is made only to ask when it
    was where the log is not blind throughout."""
    n = 0
    for at in range(0, len(windows), _READ_CHUNK):
        part = windows[at : at + _READ_CHUNK]
        columns = window_columns(part, ("cls", "engine_deaths", "kv_max", "waiting_max"))
        for j, (cls, deaths, kv, waiting) in enumerate(zip(*columns, strict=True)):
            if _pinned(cls, deaths, kv, waiting, thr) and (vis.blind or vis.blind_at(part[j])):
                n += 1
    return n


def _first_ts(windows: Sequence[Window], read: _Read, cls: Class) -> Window | None:
    k = read.earliest([i for c, lo, hi in read.cls.runs() if c is cls for i in range(lo, hi)])
    return None if k is None else windows[k]


# "Nothing went wrong" is only as sure as the time the stats lines cover: high needs
# five minutes of them (30 lines: V1 prints one per 10 s), a look under two minutes is
# low. An excerpt of a few seconds around a complaint must not read "healthy (high)".
CALM_HIGH_WINDOWS, CALM_HIGH_LINES, CALM_MEDIUM_WINDOWS = 5, 30, 2


def _calm_cap(read: _Read, replica: str, conf: Confidence) -> tuple[Confidence, str]:
    seen, lines = read.stats.get(replica, (0, 0))
    if seen >= CALM_HIGH_WINDOWS and lines >= CALM_HIGH_LINES:
        return conf, ""
    cap = Confidence.MEDIUM if seen >= CALM_MEDIUM_WINDOWS else Confidence.LOW
    order = (Confidence.LOW, Confidence.MEDIUM, Confidence.HIGH)
    if order.index(conf) <= order.index(cap):
        return conf, ""
    return cap, f" (only {seen} window(s) of stats: too short a look to be sure)"


def verdict(
    windows: Sequence[Window],
    thr: Thresholds,
    vis: Visibility,
    seconds: int,
    events: Sequence[Event] = (),
) -> Verdict:
    if not windows:
        return Verdict(
            cls=Class.INSUFFICIENT_EVIDENCE,
            confidence=Confidence.LOW,
            start=None,
            end=None,
            replica="",
            why="no vLLM evidence found: no line matched a known signature",
            evidence=(),
            evidence_found=False,
        )
    read = _Read.of(windows)
    run = _episode(windows, seconds, read)
    head = run[0]
    conf_order = (Confidence.LOW, Confidence.MEDIUM, Confidence.HIGH)
    conf = max(set(window_columns(run, ("confidence",))[0]), key=conf_order.index)
    cause = consequence = None
    alloc = _first_ts(windows, read, Class.ALLOCATION_FAILURE)
    hosts = read.earliest(sorted(read.hosts))
    host = None if hosts is None else windows[hosts]
    cls = head.cls
    why = head.why
    if cls is Class.HEALTHY:
        why = healthy_why(windows, read.seen, why)
    elif cls is Class.QUEUEING:
        why = queueing_why(windows, head.replica, why)
    # (the CPU backend's KV pool and weights live in host RAM: no GPU to name)
    needed = cls is Class.ALLOCATION_FAILURE or alloc is not None
    device = "CPU-backend (host RAM)" if needed and cpu_backend(events) else "GPU"
    if cls is Class.ALLOCATION_FAILURE and why.startswith("GPU "):
        why = f"{device} " + why.removeprefix("GPU ")
    if alloc and host:
        if host.start <= alloc.start:  # type: ignore[operator]
            cls, cause, consequence = (
                Class.HOST_PRESSURE,
                "host/container memory kill",
                f"{device} allocation failure / engine death afterwards",
            )
            run = [host]
            why = "the kernel/container killed the engine for host memory before any GPU error"
        else:
            cause, consequence = (
                f"{device} allocation failure (CUDA OOM / KV sizing)"
                if device == "GPU"
                else f"{device} allocation failure (KV sizing)",
                "container restart / OOM report afterwards",
            )
    elif cls is Class.ALLOCATION_FAILURE and any(window_columns(windows, ("engine_deaths",))[0]):
        cause, consequence = f"{device} allocation failure", "engine death"
    if cls is Class.HOST_PRESSURE and events:
        h_why, h_cause, h_cons = host_story(events)
        why = h_why or why
        cause = h_cause or cause
        consequence = h_cons or consequence
    if cls is Class.HEALTHY:  # queueing is seen, not inferred from absence
        conf, short = _calm_cap(read, head.replica, conf)
        why += short
    del read  # (a month's columns, before the evidence reads its own)
    suspected = cls is Class.INSUFFICIENT_EVIDENCE and _suspect(head, thr, vis)
    if suspected:
        n = _suspects(windows, thr, vis)
        if n >= thr.suspect_min_windows:
            conf = Confidence.MEDIUM
        why = (
            f"KV cache pinned at >= {thr.kv_pressure_pct:g}% with requests waiting in {n} "
            f"window(s), but {vis.reason}: preemption is suspected, not proven"
        )
        died = next((w for w in run if w.engine_deaths), None)
        if died is not None and died.start is not None:
            # (a real 0.11.0's engine core segfaulted in the middle of such an overload:
            # the death is what the reader must not miss; nothing says the one caused
            # the other, so no cause is named)
            crash = crash_of(died.evidence)
            how = f": {crash}, by the kernel's line" if crash else ""
            why += f"; then the engine died (window from {died.start:%H:%M}){how}"
    evidence = _verdict_evidence(run)
    capture = vis.capture_next if suspected else None
    off = vis.stats_off_at(head.replica)
    if cls is Class.INSUFFICIENT_EVIDENCE and off and not head.n_stats and not head.engine_deaths:
        # (window rule PD106) the line that says the log has no stats lines is the
        # evidence, and the engine's /metrics is what can decide
        others = [e for e in evidence if (e.source, e.line) != (off.line.source, off.line.line)]
        evidence = tuple(sorted([*others, off.line], key=lambda e: (e.source, e.line)))
        capture = off.capture
    return Verdict(
        cls=cls,
        confidence=conf,
        start=run[0].start,
        end=run[-1].end,
        replica=run[0].replica,
        why=why,
        evidence=evidence,
        cause=cause,
        consequence=consequence,
        suspected=suspected,
        capture_next=capture,
    )
