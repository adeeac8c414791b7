"""Each replica's facts: engine and version, configuration and KV capacity with the
lines that show them, its time span and how its clock was dated. Facts belong to the
replica, so they are read from all of its events, before any time filter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from preemptdiag.model.records import Event, Fact, ReplicaFacts
from preemptdiag.timeline.calm import Weights, lines
from preemptdiag.timeline.events import detect_engine, rollup_ends
from preemptdiag.timeline.knobs import read_facts


def _at(e: Event | None) -> str:
    return f"{e.source}:{e.line}" if e is not None else ""


def replica_facts(
    events: Sequence[Event],
    dated_by: Mapping[str, str],
    calm: Weights | None = None,
) -> tuple[ReplicaFacts, ...]:
    """One record per replica, in name order. `dated_by`: source -> how its stamps got
    their date and year (a wrapper's stamp, --year, the file's time); `calm`: the calm
    minutes' lines (timeline/calm.weights), which count toward a replica's engine."""
    by_replica: dict[str, list[Event]] = {}
    for e in events:
        by_replica.setdefault(e.replica, []).append(e)
    out: list[ReplicaFacts] = []
    for name in sorted(by_replica):
        evs = by_replica[name]
        facts = read_facts(evs)
        rows = [Fact(k, v, _at(facts.knob_lines.get(k))) for k, v in sorted(facts.knobs.items())]
        if facts.kv_tokens is not None:
            rows.append(
                Fact(
                    "kv_tokens",
                    str(facts.kv_tokens),
                    _at(facts.kv_tokens_line),
                    facts.kv_tokens_how,
                )
            )
        if facts.max_concurrency is not None:
            rows.append(
                Fact("max_concurrency", f"{facts.max_concurrency:g}", _at(facts.concurrency_line))
            )
        stamps = [e.ts for e in evs if e.ts is not None]
        stamps += [m.ts for m in rollup_ends(evs) if m.ts is not None]
        out.append(
            ReplicaFacts(
                replica=name,
                engine=detect_engine(evs, lines(calm or {}, name)),
                start=min(stamps) if stamps else None,
                end=max(stamps) if stamps else None,
                dated_by=tuple(sorted({dated_by[e.source] for e in evs if e.source in dated_by})),
                facts=tuple(rows),
            )
        )
    return tuple(out)
