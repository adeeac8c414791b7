"""`fleet` output: one line per replica, worst first, in every format analyze has.

Pure functions of one FleetReport; the JSON form is `preemptdiag/fleet`
(docs/json-schema.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from preemptdiag.model.fleet import FleetReport, FleetRow
from preemptdiag.model.records import Class
from preemptdiag.render import common
from preemptdiag.render.json_format import JSONValue, jsonable, lever_dict, verdict_dict
from preemptdiag.render.markdown import cell, code
from preemptdiag.render.sarif import SARIF_SCHEMA, SARIF_VERSION, TOOL_NAME, _rule, level

SCHEMA = "preemptdiag/fleet"
SCHEMA_VERSION = 1

_HEAD = ("replica", "class", "confidence", "KV peak", "preempt/min", "waiting", "restarts", "lever")
_ANSI = {"red": "31", "yellow": "33", "cyan": "36", "green": "32"}


def lever_text(row: FleetRow) -> str:
    lv = row.lever
    if lv.knob is None:
        return "no change"
    current = lv.current if lv.current is not None else "default"
    return f"{lv.knob} {current} → {lv.proposed or common.EMPTY}"


def _class_text(row: FleetRow) -> str:
    return str(row.verdict.cls) + (" (suspected)" if row.verdict.suspected else "")


def _waiting(row: FleetRow) -> str:
    if row.waiting_max is None:
        return common.EMPTY
    return (
        row.waiting_trend
        if row.waiting_trend == "none"
        else (f"{row.waiting_trend} (max {row.waiting_max})")
    )


def cells(row: FleetRow) -> tuple[str, ...]:
    return (
        row.replica,
        _class_text(row),
        str(row.verdict.confidence),
        f"{row.kv_peak:.1f}%" if row.kv_peak is not None else common.EMPTY,
        common.fmt_num(row.preemptions_per_min),
        _waiting(row),
        str(row.restarts),
        lever_text(row),
    )


def summary(report: FleetReport) -> str:
    return ", ".join(f"{c} {n}" for c, n in report.counts.items()) or "no replicas"


def _title(report: FleetReport) -> str:
    sel = f" {report.selector}" if report.selector else ""
    return (
        f"{len(report.rows)} replica(s) in {report.url}{sel}, "
        f"{report.start:%Y-%m-%d %H:%M:%S} → {report.end:%Y-%m-%d %H:%M:%S} UTC, "
        f"{report.window_seconds} s windows"
    )


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def render_fleet_terminal(report: FleetReport, *, color: bool = False) -> str:
    body = [cells(r) for r in report.rows]
    lines = _table([_HEAD, *body])
    if color:
        for i, row in enumerate(report.rows, start=1):
            name = str(row.verdict.cls)
            colour = _ANSI[common.CLASS_COLOURS[row.verdict.cls]]
            lines[i] = lines[i].replace(name, f"\x1b[{colour}m{name}\x1b[0m", 1)
    out = [f"preemptdiag fleet  {_title(report)}", "", lines[0], "─" * len(lines[0]), *lines[1:]]
    out += ["", f"summary  {summary(report)}"]
    out += [f"note     {n}" for n in report.notes]
    return "\n".join(out) + "\n"


def render_fleet_markdown(report: FleetReport) -> str:
    out = [f"### preemptdiag fleet: {summary(report)}", "", cell(_title(report)), ""]
    out.append("| " + " | ".join(_HEAD) + " |")
    out.append("|" + "---|" * len(_HEAD))
    for row in report.rows:
        c = list(cells(row))
        c[0] = code(row.replica)
        c[1] = f"`{c[1]}`"
        out.append("| " + " | ".join(cell(x) if i > 1 else x for i, x in enumerate(c)) + " |")
    out.append("")
    for row in report.rows:
        if row.verdict.cls is not Class.HEALTHY:
            out.append(f"- {code(row.replica)}: {cell(row.verdict.why)}")
    out += [f"- note: {cell(n)}" for n in report.notes]
    return "\n".join(out).rstrip() + "\n"


def _row_dict(row: FleetRow) -> dict[str, JSONValue]:
    v = verdict_dict(row.verdict)
    return {
        "replica": row.replica,
        "labels": jsonable(row.labels),
        "engine": row.engine,
        "class": v.pop("class"),
        "confidence": v.pop("confidence"),
        "suspected": row.verdict.suspected,
        "why": row.verdict.why,
        "kv_peak_pct": common.finite(row.kv_peak),
        "preemptions": common.finite(row.preemptions),
        "preemptions_per_min": common.finite(row.preemptions_per_min),
        "waiting": {"trend": row.waiting_trend, "max": row.waiting_max},
        "restarts": row.restarts,
        "minutes": common.finite(row.minutes),
        "lever": lever_dict(row.lever),
        "verdict": v,
    }


def fleet_dict(report: FleetReport) -> dict[str, JSONValue]:
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "tool_version": report.tool_version,
        "source": {
            "url": report.url,
            "selector": report.selector or None,
            "start": common.iso(report.start),
            "end": common.iso(report.end),
            "step_seconds": report.step_s,
            "queries": report.queries,
        },
        "window_seconds": report.window_seconds,
        "thresholds": jsonable(report.thresholds),
        "fail_on": list(report.fail_on),
        "summary": dict(report.counts),
        "replicas": [_row_dict(r) for r in report.rows],
        "notes": list(report.notes),
    }


def render_fleet_json(report: FleetReport) -> str:
    return json.dumps(fleet_dict(report), indent=2, allow_nan=False) + "\n"


def render_fleet_sarif(report: FleetReport) -> str:
    """One result per replica that is not healthy, located at the replica (a logical
    location: a store has no file and line)."""
    rules = list(Class)
    results: list[JSONValue] = []
    for row in report.rows:
        cls = row.verdict.cls
        if cls is Class.HEALTHY:
            continue
        results.append(
            {
                "ruleId": str(cls),
                "ruleIndex": rules.index(cls),
                "level": level(cls),
                "message": {"text": f"{row.replica}: {row.verdict.why}; lever: {lever_text(row)}"},
                "locations": [{"logicalLocations": [{"name": row.replica, "kind": "resource"}]}],
                "properties": {
                    "confidence": str(row.verdict.confidence),
                    "suspected": row.verdict.suspected,
                    "labels": jsonable(row.labels),
                },
            }
        )
    driver: dict[str, JSONValue] = {"name": TOOL_NAME, "rules": [_rule(c) for c in rules]}
    if report.tool_version:
        driver["version"] = report.tool_version
    run: dict[str, JSONValue] = {
        "tool": {"driver": driver},
        "results": results,
        "invocations": [{"executionSuccessful": True}],
        "properties": {"summary": dict(report.counts), "source": report.url},
    }
    doc = {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def render_fleet(report: FleetReport, fmt: str, *, color: bool = False) -> str:
    if fmt == "terminal":
        return render_fleet_terminal(report, color=color)
    if fmt == "markdown":
        return render_fleet_markdown(report)
    if fmt == "json":
        return render_fleet_json(report)
    return render_fleet_sarif(report)
