"""Markdown format: GitHub-flavoured, no ANSI, paste-ready for a ticket or runbook.

Log text only ever appears inside a fenced block (whose fence is longer than any
backtick run in it) or an escaped table cell, so a pasted log cannot break the page.
"""

from __future__ import annotations

import re

from preemptdiag.model.records import Report
from preemptdiag.render import common

_BACKTICK_RUN = re.compile(r"`+")


def cell(text: str) -> str:
    """A table cell: a raw `|` would end the cell and a newline the row."""
    return common.clean_text(text).replace("\\", "\\\\").replace("|", "\\|")


def _longest_ticks(text: str) -> int:
    return max((len(m) for m in _BACKTICK_RUN.findall(text)), default=0)


def fence_for(text: str) -> str:
    return "`" * max(3, _longest_ticks(text) + 1)


def code(text: str) -> str:
    """Inline code that survives backticks in the text (CommonMark's variable-length spans)."""
    longest = _longest_ticks(text)
    ticks = "`" * (longest + 1)
    pad = " " if longest else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _verdict(report: Report) -> list[str]:
    v = report.verdict
    out = [f"### preemptdiag: {v.cls} ({v.confidence})", ""]
    if not v.evidence_found:
        out += [f"> **{common.no_evidence(v)}**", ""]
    if v.suspected:
        out += [f"> **{common.SUSPECTED}** — capture next: {v.capture_next or common.EMPTY}", ""]
    out += [
        f"- **class:** `{v.cls}`",
        f"- **confidence:** {v.confidence}",
        f"- **time span:** {common.time_span(v)}",
        f"- **replica:** {code(v.replica) if v.replica else common.EMPTY}",
        f"- **why:** {v.why or common.EMPTY}",
    ]
    cause = common.cause_line(v)
    if cause:
        out.append(f"- {cause}")
    return out


def _mermaid_num(x: float | None) -> str:
    x = common.finite(x)
    if x is None:
        return "0"
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def mermaid(report: Report) -> list[str]:
    """An xychart of the shown windows: bars = preemptions, line = KV max %.

    With several replicas only the verdict's replica is charted: categories from
    different replicas would interleave on one time axis and mislead.
    """
    tl = common.timeline(report)
    ws = list(tl.windows)
    reps = common.replicas(ws)
    replica = (
        report.verdict.replica if report.verdict.replica in reps else (reps[0] if reps else "")
    )
    title = "preemptions (bars) and KV max % (line)"
    if len(reps) > 1:
        ws = [w for w in ws if w.replica == replica]
        title += f" - {replica}"
    if tl.omitted:
        title += f" - {tl.omitted} windows omitted"
    if not ws:
        return []
    pre = [float(common.round_count(w.preemptions)) for w in ws]
    kv = [common.finite(w.kv_max) for w in ws]
    top = max([100.0, *pre, *(k for k in kv if k is not None)])
    labels = ", ".join(f'"{common.start_cell(w, tl.date)}"' for w in ws)
    title = title.replace('"', "'")
    return [
        "```mermaid",
        "xychart-beta",
        f'    title "{title}"',
        f"    x-axis [{labels}]",
        f'    y-axis "preemptions / KV %" 0 --> {_mermaid_num(top)}',
        f"    bar [{', '.join(_mermaid_num(p) for p in pre)}]",
        f"    line [{', '.join(_mermaid_num(k) for k in kv)}]",
        "```",
    ]


def _timeline(report: Report) -> list[str]:
    tl = common.timeline(report)
    title = f"#### Timeline ({report.window_seconds} s windows"
    title += f", {tl.date} UTC)" if tl.date else ")"
    out = ["", title, ""]
    if not tl.rows:
        return [*out, "_no windows_"]
    out.append("| " + " | ".join(c.header for c in tl.columns) + " |")
    out.append("|" + "|".join("---:" if c.numeric else "---" for c in tl.columns) + "|")
    for row in tl.rows:
        cells = [cell(c) for c in row.cells]
        if row.cls is not None:
            cells[tl.class_index] = f"`{row.cells[tl.class_index]}`"
        else:
            cells[tl.class_index] = f"_{cells[tl.class_index]}_"
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    for spark in common.sparklines(report):
        out.append(f"- {spark.label}: `{spark.line}` (top = {spark.peak})")
    chart = mermaid(report)
    if chart:
        out += ["", *chart]
    return out


def _evidence(report: Report) -> list[str]:
    lines, more = common.evidence_lines(report.verdict)
    out = ["", "#### Evidence", ""]
    if not lines:
        return [*out, "_none_"]
    body = "\n".join(f"{ev.location}  {ev.text}" for ev in lines)
    fence = fence_for(body)
    out += [f"{fence}text", body, fence]
    if more:
        out += ["", f"_… {more} more evidence line(s) in the JSON output_"]
    return out


def _lever(report: Report) -> list[str]:
    lv = report.lever
    change = common.lever_change(report)
    out = ["", "#### Lever", "", f"- **change:** {code(change) if lv.knob else change}"]
    if lv.rationale:
        out.append(f"- **rationale:** {lv.rationale}")
    if lv.arithmetic:
        out.append("- **arithmetic:**")
        out += [f"  - {code(step)}" for step in lv.arithmetic]
    if lv.apply:
        out.append(f"- **apply:** {lv.apply}")
    out.append(f"- **verify:** {lv.verify or common.EMPTY}")
    if lv.rollback:
        out.append(f"- **roll back:** {lv.rollback}")
    out.append(f"- **avoid:** {lv.do_not or common.EMPTY}")
    return out


def _footer(report: Report) -> list[str]:
    s = report.stats
    out = [
        "",
        "#### Scan",
        "",
        f"- **files:** {', '.join(code(f) for f in s.files) or common.EMPTY}",
        f"- **lines read:** {common.fmt_int(s.lines_read)}",
        f"- **bytes:** {common.fmt_bytes(s.bytes_read)}",
        f"- **recognised:** {common.fmt_mapping(s.recognised)}",
        f"- **skipped:** {common.fmt_mapping(s.skipped)}",
        f"- **engine:** {common.engine_label(report)}",
        f"- **window:** {common.fmt_seconds(report.window_seconds)}",
        f"- **thresholds:** {common.fmt_mapping(report.thresholds, sort=False)}",
        f"- **tool version:** {report.tool_version or common.EMPTY}",
    ]
    out += [f"- **replica:** {common.replica_line(r)}" for r in report.replicas]
    out += [f"- **note:** {n}" for n in report.notes]
    return out


def render_markdown(report: Report) -> str:
    lines = [*_verdict(report), *_timeline(report), *_evidence(report), *_lever(report)]
    lines += _footer(report)
    return "\n".join(lines) + "\n"
