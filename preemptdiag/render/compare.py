"""`compare`'s outcome in each format (terminal, markdown, json): a pure function of one
Comparison, like the report renderers."""

from __future__ import annotations

import json
from dataclasses import asdict

from preemptdiag.model.records import Comparison, Side

_ROWS: tuple[tuple[str, str], ...] = (
    ("verdict", "verdict"),
    ("minutes of log", "minutes"),
    ("preemptions", "preemptions"),
    ("preemptions / min", "preemptions_per_min"),
    ("KV usage mean %", "kv_mean"),
    ("KV usage max %", "kv_max"),
    ("Waiting mean", "waiting_mean"),
    ("Waiting max", "waiting_max"),
    ("prompt tok/s", "prompt_tput"),
    ("generation tok/s", "gen_tput"),
    ("completed requests", "completed"),
    ("completed / min", "completed_per_min"),
)


def _side_dict(side: Side) -> dict[str, object]:
    out: dict[str, object] = asdict(side)
    per_min = side.completed_per_min
    out["completed_per_min"] = round(per_min, 2) if per_min is not None else None
    return out


def _cell(v: object) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return str(v)


def render_compare(c: Comparison, fmt: str) -> str:
    if fmt == "json":
        data = {
            "schema": "preemptdiag/compare",
            "schema_version": 1,
            "change": c.change.value,
            "why": c.why,
            "changed_knobs": {
                k: {"before": v[0], "after": v[1]} for k, v in c.changed_knobs.items()
            },
            "before": _side_dict(c.before),
            "after": _side_dict(c.after),
        }
        return json.dumps(data, indent=2)
    knobs = ", ".join(f"{k}: {v[0]} -> {v[1]}" for k, v in c.changed_knobs.items()) or "none seen"
    rows = [
        (label, _cell(getattr(c.before, attr)), _cell(getattr(c.after, attr)))
        for label, attr in _ROWS
    ]
    if fmt == "markdown":
        out = [
            f"### preemptdiag compare: {c.change.value}",
            "",
            f"- **why:** {c.why}",
            f"- **knob changed:** {knobs}",
            "",
            "| | before | after |",
            "|---|---:|---:|",
        ]
        out += [f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows]
        return "\n".join(out) + "\n"
    width = max(len(r[0]) for r in rows)
    out = [f"compare: {c.change.value.upper()}", f"  why: {c.why}", f"  knob changed: {knobs}", ""]
    out.append(f"  {'':<{width}}  {'before':>14}  {'after':>14}")
    out += [f"  {r[0]:<{width}}  {r[1]:>14}  {r[2]:>14}" for r in rows]
    return "\n".join(out) + "\n"
