"""A Prometheus store's replicas on the timeline, and the logs given beside them.

Each replica's points become the events a `/metrics` file's scrapes become
(scrapes.scrape_events), under the replica's name. A log given beside the store joins
the replica its name points at (the pod or the instance's host in the log's name or
kubectl prefix), else the one replica whose series overlaps the log's span: then the
log's lines and the store's counter are judged as one engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from preemptdiag.ingest.prometheus_api import Fleet, Replica
from preemptdiag.model.records import SYSTEM_ENGINES, Event
from preemptdiag.timeline.scrapes import scrape_events


def _span(events: Sequence[Event]) -> tuple[datetime, datetime] | None:
    stamps = [e.ts for e in events if e.ts is not None]
    return (min(stamps), max(stamps)) if stamps else None


def _named_in(r: Replica, log_replica: str) -> bool:
    """The log's name (a file path or a kubectl pod prefix) names this replica."""
    text = log_replica.lower()
    pod = r.labels.get("pod", "")
    host = r.labels.get("instance", "").rsplit(":", 1)[0]
    return any(v and v.lower() in text for v in (pod, host))


def _overlaps(r: Replica, span: tuple[datetime, datetime]) -> bool:
    stamps = [s.ts for s in r.scrapes if s.ts is not None]
    return bool(stamps) and min(stamps) <= span[1] and max(stamps) >= span[0]


def join_logs(fleet: Fleet, log_events: Sequence[Event]) -> tuple[dict[str, str], list[str]]:
    """Store replica name -> the log replica it joins, and a note per decision."""
    by_log: dict[str, list[Event]] = {}
    for e in log_events:
        if e.engine not in SYSTEM_ENGINES:
            by_log.setdefault(e.replica, []).append(e)
    joined: dict[str, str] = {}
    notes: list[str] = []
    for log, evs in sorted(by_log.items()):
        free = [r for r in fleet.replicas if r.name not in joined]
        named = [r for r in free if _named_in(r, log)]
        span = _span(evs)
        how = "its name"
        if len(named) != 1:
            named = [r for r in free if span is not None and _overlaps(r, span)]
            how = "time span (the only replica in the store over it)"
        if len(named) == 1:
            joined[named[0].name] = log
            notes.append(f"Prometheus replica {named[0].name} joined to the log {log} by {how}")
        elif named:
            notes.append(
                f"the log {log} was not joined to a Prometheus replica: its name matches none "
                f"and {len(named)} overlap its span (narrow --selector to its pod)"
            )
    return joined, notes


def store_events(fleet: Fleet, log_events: Sequence[Event]) -> tuple[list[Event], list[str]]:
    """Every replica's points as events (joined ones under the log's replica name),
    and the notes that say what was read and joined."""
    joined, notes = join_logs(fleet, log_events)
    out: list[Event] = []
    for r in fleet.replicas:
        out.extend(scrape_events(r.scrapes, joined.get(r.name, r.name)))
    points = sum(len(r.scrapes) for r in fleet.replicas)
    notes.insert(
        0,
        f"Prometheus {fleet.url}{' ' + fleet.selector if fleet.selector else ''}: "
        f"{len(fleet.replicas)} replica(s), {points} points at a {fleet.step_s} s step "
        f"from {fleet.start:%Y-%m-%d %H:%M:%S} to {fleet.end:%Y-%m-%d %H:%M:%S} UTC "
        f"({fleet.queries} queries)",
    )
    return out, notes + restart_notes(fleet.replicas)


def restart_notes(replicas: Sequence[Replica]) -> list[str]:
    restarted = [f"{r.name} ({r.restarts}x)" for r in replicas if r.restarts]
    if not restarted:
        return []
    return [
        "engine restarts (process start time moved or counters reset; counters read from "
        "each new start): " + ", ".join(restarted)
    ]
