"""One-line verdict, for `check`, `analyze --quiet` and pre-commit output."""

from __future__ import annotations

from preemptdiag.model.records import Report
from preemptdiag.render.common import no_evidence


def verdict_line(report: Report) -> str:
    v = report.verdict
    if not v.evidence_found:
        return no_evidence(v)
    span = ""
    if v.start is not None:
        span = f" {v.start:%Y-%m-%d %H:%M}Z" if v.start.utcoffset() is not None else ""
    lever = report.lever
    change = (
        f"; lever: {lever.knob} {lever.current or '?'} -> {lever.proposed or '?'}"
        if lever.knob
        else "; lever: no change"
    )
    suspected = " (suspected)" if v.suspected else ""
    return f"{v.cls.value}{suspected} [{v.confidence.value}]{span}{change}"
