"""Markdown format: GitHub-flavoured, no ANSI, paste-ready for a ticket or runbook.

Log text only ever appears inside a fenced block (whose fence is longer than any
backtick run in it) or an escaped table cell, so a pasted log cannot break the page.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from preemptdiag.model.records import Report
from preemptdiag.render import charts, common
from preemptdiag.render.episodes import TimelineMode

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
    elif v.capture_next:
        out += [f"> **capture next:** {v.capture_next}", ""]
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


def _table(columns: Sequence[common.Column], rows: Sequence[common.Row], ci: int) -> list[str]:
    out = ["| " + " | ".join(c.header for c in columns) + " |"]
    out.append("|" + "|".join("---:" if c.numeric else "---" for c in columns) + "|")
    for row in rows:
        cells = [cell(c) for c in row.cells]
        if row.cls is not None:
            text = row.cells[ci]
            mark = common.VERDICT_MARK if text.endswith(common.VERDICT_MARK) else ""
            cells[ci] = f"`{text.removesuffix(mark)}`{mark}"
        else:
            cells[ci] = f"_{cells[ci]}_"
        out.append("| " + " | ".join(cells) + " |")
    return out


def _timeline(report: Report, mode: TimelineMode) -> list[str]:
    out: list[str] = []
    eps = common.episode_table(report, mode)
    if eps is not None:
        out += ["", f"#### Episodes ({common.episode_title(eps)})", ""]
        out += _table(eps.columns, eps.rows, eps.class_index)
        if eps.silent:
            out += ["", f"_{common.SILENT_LEGEND}_"]
    tl = common.timeline(report, mode)
    title = f"#### Timeline ({report.window_seconds} s windows"
    title += f", {tl.date} UTC" if tl.date else ""
    title += ", around the focus episode)" if eps is not None else ")"
    out += ["", title, ""]
    if not tl.rows:
        return [*out, "_no windows_"]
    out += _table(tl.columns, tl.rows, tl.class_index)
    out.append("")
    for spark in common.sparklines(report):
        out.append(f"- {spark.label}: `{spark.line}` ({spark.legend})")
    return out + charts.mermaid(report)


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


def render_markdown(report: Report, *, timeline: TimelineMode = TimelineMode.EPISODES) -> str:
    report = common.verdict_replica_first(report)
    lines = [*_verdict(report), *_timeline(report, TimelineMode(timeline))]
    lines += [*_evidence(report), *_lever(report)]
    lines += _footer(report)
    return "\n".join(lines) + "\n"
