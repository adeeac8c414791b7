"""System evidence (kernel, kubectl, docker, Ray) joins the engine replica whose time span
holds it; evidence outside every engine's span is set aside with a note."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from preemptdiag.model.records import SYSTEM_ENGINES, Event

# System evidence counts for an engine from shortly before its first line (a kill
# of the previous instance is not this one's) to a while after its last (the log stops
# at the kill, the container runtime reports it later).
_SYSTEM_BEFORE_S = 60.0
_SYSTEM_AFTER_S = 600.0


def attach_system_sources(events: list[Event], notes: list[str]) -> list[Event]:
    """Kernel, kubectl and docker files describe the engine's node or pod: each
    system event joins the one engine replica whose span holds it; with several
    candidates it stays apart (which replica a node kill hit cannot be told from
    the lines); outside every engine's span it is set aside with a note, so old
    evidence never drives the verdict."""
    engine = [e for e in events if e.engine not in SYSTEM_ENGINES]
    spans: dict[str, tuple[datetime, datetime]] = {}
    for e in engine:
        if e.ts is not None:
            lo, hi = spans.get(e.replica, (e.ts, e.ts))
            spans[e.replica] = (min(lo, e.ts), max(hi, e.ts))
    engine_replicas = {e.replica for e in engine}
    system = [e for e in events if e.replica not in engine_replicas]
    if not system or not engine_replicas:
        return events

    def holders(t: datetime | None) -> list[str]:
        if t is None:
            return sorted(engine_replicas) if len(engine_replicas) == 1 else []
        return [
            r
            for r, (lo, hi) in spans.items()
            if (lo - t).total_seconds() <= _SYSTEM_BEFORE_S
            and (t - hi).total_seconds() <= _SYSTEM_AFTER_S
        ]

    moved: dict[str, set[str]] = {}
    outside: list[Event] = []
    out: list[Event] = []
    for e in events:
        if e.replica in engine_replicas:
            out.append(e)
            continue
        hold = holders(e.ts)
        if len(hold) == 1:
            moved.setdefault(hold[0], set()).add(e.replica)
            out.append(replace(e, replica=hold[0]))
        elif not hold and spans and e.ts is not None:
            outside.append(e)
        else:
            out.append(e)
    for target, sources in sorted(moved.items()):
        notes.append(
            f"system evidence from {', '.join(sorted(sources))} placed on the timeline of {target}"
        )
    if outside:
        first, last = min(e.ts for e in outside if e.ts), max(e.ts for e in outside if e.ts)
        files = ", ".join(sorted({e.source for e in outside}))
        notes.append(
            f"{len(outside)} system event(s) from {files} ({first:%Y-%m-%d %H:%M} to "
            f"{last:%Y-%m-%d %H:%M}) lie outside every engine log's span and were not used "
            "(check --year/--tz, or that the files belong to this incident)"
        )
    return out
