"""JSON format: the versioned, machine-readable report (docs/json-schema.md).

Bump SCHEMA_VERSION when a field is removed, renamed or changes meaning; adding a
field is compatible. The exit code is deliberately absent: the CLI owns it.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from enum import Enum
from typing import Any

from preemptdiag.model.records import Event, Lever, ReplicaFacts, Report, ScanStats, Verdict, Window
from preemptdiag.render import common
from preemptdiag.render.episodes import Episode, TimelineMode, episodes

SCHEMA = "preemptdiag/report"
SCHEMA_VERSION = 1

JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]


def jsonable(value: Any) -> JSONValue:
    """Thresholds and event fields are open-ended; make them valid JSON (no NaN)."""
    if value is None or isinstance(value, bool | int | str):
        return value.value if isinstance(value, Enum) else value
    if isinstance(value, float):
        return common.finite(value)
    if isinstance(value, datetime):
        return common.iso(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Enum):
        return jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, Sequence | set | frozenset):
        return [jsonable(v) for v in value]
    return str(value)


def event_dict(e: Event) -> dict[str, JSONValue]:
    return {
        "file": e.source,
        "line": e.line,
        "signature": e.sig,
        "kind": str(e.kind),
        "text": e.text,
        "ts": common.iso(e.ts),
    }


def verdict_dict(v: Verdict) -> dict[str, JSONValue]:
    return {
        "class": str(v.cls),
        "confidence": str(v.confidence),
        "start": common.iso(v.start),
        "end": common.iso(v.end),
        "replica": v.replica,
        "why": v.why,
        "evidence_found": v.evidence_found,
        "filtered_out": v.filtered_out,
        "suspected": v.suspected,
        "capture_next": v.capture_next,
        "cause": v.cause,
        "consequence": v.consequence,
        "evidence": [event_dict(e) for e in v.evidence],
    }


def lever_dict(lv: Lever) -> dict[str, JSONValue]:
    return {
        "knob": lv.knob,
        "current": lv.current,
        "proposed": lv.proposed,
        "arithmetic": list(lv.arithmetic),
        "verify": lv.verify,
        "apply": lv.apply or None,
        "rollback": lv.rollback or None,
        "do_not": lv.do_not,
        "rationale": lv.rationale,
        "engine": lv.engine,
    }


def window_dict(w: Window) -> dict[str, JSONValue]:
    f = common.finite
    return {
        "replica": w.replica,
        "start": common.iso(w.start),
        "end": common.iso(w.end),
        "class": str(w.cls),
        "confidence": str(w.confidence),
        "why": w.why,
        "preemptions": f(w.preemptions),
        "preemptions_lower_bound": w.preemptions_lower_bound,
        "preemptions_spread_over": w.preemptions_spread_over,
        "max_cumulative": w.max_cumulative,
        "kv_max": f(w.kv_max),
        "kv_mean": f(w.kv_mean),
        "kv_peak_running": w.kv_peak_running,
        "running_max": w.running_max,
        "running_mean": f(w.running_mean),
        "waiting_first": w.waiting_first,
        "waiting_last": w.waiting_last,
        "waiting_max": w.waiting_max,
        "swapped_first": w.swapped_first,
        "swapped_last": w.swapped_last,
        "swapped_max": w.swapped_max,
        "prompt_tput": f(w.prompt_tput),
        "gen_tput": f(w.gen_tput),
        "n_events": w.n_events,
        "n_stats": w.n_stats,
        "alloc_failures": w.alloc_failures,
        "host_ooms": w.host_ooms,
        "engine_deaths": w.engine_deaths,
        "swap_warnings": w.swap_warnings,
        "evidence": [event_dict(e) for e in w.evidence],
    }


def _sorted_counts(m: Mapping[str, int]) -> dict[str, JSONValue]:
    # Counters fill in log order; sorting keeps two runs over the same input diffable.
    return {k: m[k] for k in sorted(m)}


def scan_dict(s: ScanStats) -> dict[str, JSONValue]:
    return {
        "files": list(s.files),
        "lines_read": s.lines_read,
        "bytes_read": s.bytes_read,
        "recognised": _sorted_counts(s.recognised),
        "skipped": _sorted_counts(s.skipped),
    }


def replica_dict(r: ReplicaFacts) -> dict[str, JSONValue]:
    e = r.engine
    return {
        "replica": r.replica,
        "engine": {"engine": e.engine, "generation": e.generation, "version": e.version},
        "start": r.start.isoformat() if r.start else None,
        "end": r.end.isoformat() if r.end else None,
        "dated_by": list(r.dated_by),
        "facts": [
            {"name": f.name, "value": f.value, "source": f.source, "how": f.how or None}
            for f in r.facts
        ],
    }


def episode_dict(e: Episode) -> dict[str, JSONValue]:
    return {
        "replica": e.replica,
        "start": common.iso(e.start),
        "end": common.iso(e.end),
        "class": str(e.cls),
        "windows": e.n,
        "silent_windows": e.silent,
        "preemptions": common.finite(e.preemptions),
        "preemptions_lower_bound": e.preemptions_lower_bound,
        "preemptions_estimated": e.preemptions_estimated,
        "kv_max": common.finite(e.kv_max),
        "waiting_max": e.waiting_max,
        "running_max": e.running_max,
        "confidence": {str(c): n for c, n in e.confidence},
        "verdict": e.verdict,
    }


def _episodes(report: Report) -> list[JSONValue]:
    out: list[JSONValue] = []
    for rep in common.replicas(report.windows):
        ws = [w for w in report.windows if w.replica == rep]
        out += [episode_dict(e) for e in episodes(ws, report.verdict, report.window_seconds)]
    return out


def shown_windows(report: Report, timeline: TimelineMode) -> list[Window]:
    if timeline is TimelineMode.FULL:
        return list(report.windows)
    return [w for w in common.select_windows(report, timeline) if not isinstance(w, int)]


def report_dict(
    report: Report, with_windows: bool = True, timeline: TimelineMode = TimelineMode.FULL
) -> dict[str, JSONValue]:
    e = report.engine
    shown = shown_windows(report, timeline) if with_windows else []
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "tool_version": report.tool_version,
        "verdict": verdict_dict(report.verdict),
        "lever": lever_dict(report.lever),
        "windows": [window_dict(w) for w in shown],
        "engine": {"engine": e.engine, "generation": e.generation, "version": e.version},
        "scan": scan_dict(report.stats),
        # Thresholds keep their defined order (it groups related knobs).
        "thresholds": {str(k): jsonable(v) for k, v in report.thresholds.items()},
        "window_seconds": report.window_seconds,
        "notes": list(report.notes),
        "replicas": [replica_dict(r) for r in report.replicas],
        "timeline": str(timeline),
        "episodes": _episodes(report),
    }


_WINDOWS_SLOT = "\x00windows\x00"


def render_json(report: Report, *, timeline: TimelineMode = TimelineMode.FULL) -> str:
    """report_dict as indented JSON. The windows (thousands on a week of log) are
    dumped one at a time into the text rather than built as one tree first: the
    same bytes with a third of the peak memory."""
    timeline = TimelineMode(timeline)
    doc = {**report_dict(report, with_windows=False, timeline=timeline), "windows": _WINDOWS_SLOT}
    # allow_nan=False: a NaN that slipped past `finite` must fail loudly, not emit bad JSON.
    head, tail = json.dumps(doc, indent=2, allow_nan=False).split(json.dumps(_WINDOWS_SLOT))
    shown = shown_windows(report, timeline)
    if not shown:
        return f"{head}[]{tail}\n"
    parts = [head, "[\n"]
    for i, w in enumerate(shown):
        if i:
            parts.append(",\n")
        parts.append(textwrap.indent(json.dumps(window_dict(w), indent=2, allow_nan=False), "    "))
    parts += ["\n  ]", tail, "\n"]
    return "".join(parts)
