"""Can this log show preemptions at all, and where? V0 warns with a counter, SGLang logs
every retraction, V1 prints nothing (and its stats line's `Preemptions:` field never
appears in released builds, vllm PR #38452): then only /metrics scrapes of the counter
can show them, and only between the first and the last scrape."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from preemptdiag.model.records import EngineInfo, Event, Kind, Window
from preemptdiag.timeline.events import version_at_least
from preemptdiag.timeline.knobs import arg_value

_SCRAPE = "prometheus"  # the engine of an event that a /metrics scrape made

CAPTURE_V1 = (
    "two /metrics scrapes during the incident, a few minutes apart "
    "(`curl -s localhost:8000/metrics > t1.prom`, then t2.prom) so "
    "vllm:num_preemptions_total shows whether it was preempting (V1 stats lines do not "
    "print preemptions in current releases)"
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
class Visibility:
    """Can this log show preemptions at all, and where?

    `covered` is set when only /metrics counters can show them: windows outside the
    first..last scrape are as blind as a log without scrapes."""

    blind: bool
    capture_next: str | None
    reason: str
    covered: tuple[datetime, datetime] | None = None
    # The replicas whose log says the engine prints no stats lines at all (stats_off):
    # their quiet is no evidence of health.
    stats_off: tuple[StatsOff, ...] = ()

    def stats_off_at(self, replica: str) -> StatsOff | None:
        return next((s for s in self.stats_off if s.replica == replica), None)

    def blind_at(self, w: Window) -> bool:
        if self.blind or self.covered is None:
            return self.blind
        lo, hi = self.covered
        if w.start is None or w.end is None:
            return False
        return w.end <= lo or w.start >= hi


_V1_SILENT = (
    "V1 stats lines print no preemptions (vLLM resets the interval counter before "
    "logging it, vllm PR #38452) and this log shows no `Preemptions:` field"
)


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
    if any(e.fields.get("preemptions") is not None for e in stats):
        return Visibility(False, None, "stats line carries a Preemptions field")
    logged = [e for e in events if e.kind is Kind.PREEMPTION and e.engine != _SCRAPE]
    scraped = [e.ts for e in events if e.kind is Kind.PREEMPTION and e.engine == _SCRAPE]
    if logged:
        return Visibility(False, None, "preemption lines present")
    if info.engine == "sglang":
        return Visibility(False, None, "SGLang logs every retraction")
    if info.generation == "v1":
        return _counter_visibility(scraped, CAPTURE_V1, _V1_SILENT)
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
