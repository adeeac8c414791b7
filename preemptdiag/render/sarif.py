"""SARIF 2.1.0 format: the verdict as code-scanning results on the evidence lines.

One run; the rules are the classes; one result per evidence event of the verdict, all
carrying the verdict's class, so a scanner shows the incident at every line behind it.
"""

from __future__ import annotations

import json
from urllib.parse import quote

from preemptdiag.model.records import Class, Event, Report
from preemptdiag.render import common
from preemptdiag.render.json_format import JSONValue, lever_dict

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL_NAME = "preemptdiag"

_RULES = list(Class)


def level(cls: Class) -> str:
    return common.CLASS_LEVELS[cls]


def artifact_uri(source: str) -> str:
    """SARIF wants a URI reference; a plain relative path is one once spaces etc. are
    percent-encoded (ordinary file names come through unchanged)."""
    return quote(source, safe="/")


def _rule(cls: Class) -> dict[str, JSONValue]:
    return {
        "id": str(cls),
        "shortDescription": {"text": common.CLASS_DESCRIPTIONS[cls]},
        "defaultConfiguration": {"level": level(cls)},
    }


def _result(report: Report, e: Event) -> dict[str, JSONValue]:
    v = report.verdict
    physical: dict[str, JSONValue] = {"artifactLocation": {"uri": artifact_uri(e.source)}}
    if e.line >= 1:  # SARIF regions are 1-based; a line-less event gets no region
        physical["region"] = {"startLine": e.line, "snippet": {"text": e.text}}
    return {
        "ruleId": str(v.cls),
        "ruleIndex": _RULES.index(v.cls),
        "level": level(v.cls),
        "message": {"text": v.why or common.CLASS_DESCRIPTIONS[v.cls]},
        "locations": [{"physicalLocation": physical}],
        "properties": {
            "confidence": str(v.confidence),
            "suspected": v.suspected,
            "signature": e.sig,
            "kind": str(e.kind),
            "timestamp": common.iso(e.ts),
        },
    }


def sarif_dict(report: Report) -> dict[str, JSONValue]:
    v = report.verdict
    driver: dict[str, JSONValue] = {"name": TOOL_NAME, "rules": [_rule(c) for c in _RULES]}
    if report.tool_version:
        driver["version"] = report.tool_version
    run: dict[str, JSONValue] = {
        "tool": {"driver": driver},
        "results": [_result(report, e) for e in v.evidence],
    }
    notifications: list[JSONValue] = []
    if not v.evidence_found:
        notifications.append({"level": "warning", "message": {"text": common.no_evidence(v)}})
    if v.suspected or v.capture_next:
        text = f"capture next: {v.capture_next or common.EMPTY}"
        text = f"{common.SUSPECTED}; {text}" if v.suspected else text
        notifications.append({"level": "note", "message": {"text": text}})
    invocation: dict[str, JSONValue] = {"executionSuccessful": True}
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    run["invocations"] = [invocation]
    run["properties"] = {
        "verdict": {
            "class": str(v.cls),
            "confidence": str(v.confidence),
            "start": common.iso(v.start),
            "end": common.iso(v.end),
            "replica": v.replica,
            "cause": v.cause,
            "consequence": v.consequence,
        },
        "lever": lever_dict(report.lever),
    }
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def render_sarif(report: Report) -> str:
    return json.dumps(sarif_dict(report), indent=2, allow_nan=False) + "\n"
