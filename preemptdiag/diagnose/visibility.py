"""Can this log show preemptions at all, and where? V0 warns with a counter, SGLang logs
every retraction, V1 prints nothing (and its stats line's `Preemptions:` field never
appears in released builds, vllm PR #38452): then only /metrics scrapes of the counter
can show them, and only between the first and the last scrape."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from preemptdiag.model.records import EngineInfo, Event, Kind, Window
from preemptdiag.timeline.events import version_at_least

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
class Visibility:
    """Can this log show preemptions at all, and where?

    `covered` is set when only /metrics counters can show them: windows outside the
    first..last scrape are as blind as a log without scrapes."""

    blind: bool
    capture_next: str | None
    reason: str
    covered: tuple[datetime, datetime] | None = None

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


def preemption_visibility(events: Sequence[Event], info: EngineInfo) -> Visibility:
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
