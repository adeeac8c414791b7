"""Terminal format: a rich layout rendered into a string.

Everything echoed from a log goes through `Text`, never markup, so a `[bold]` or an
emoji code inside a log line prints literally.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from preemptdiag.model.config import Thresholds
from preemptdiag.model.records import Class, Report
from preemptdiag.render import common
from preemptdiag.render.episodes import TimelineMode

_LABEL_WIDTH = 13


def _class_style(cls: Class, *, bold: bool = False) -> str:
    return f"{'bold ' if bold else ''}{common.CLASS_COLOURS[cls]}"


def _fields(rows: list[tuple[str, str | Text]], style: str = "") -> Table:
    """Label/value lines; a long value wraps under itself, not under the label."""
    grid = Table.grid(padding=(0, 1), pad_edge=False)
    grid.add_column(width=_LABEL_WIDTH + 2, style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(Text(f"  {label}"), value if isinstance(value, Text) else Text(value, style))
    return grid


def _verdict(console: Console, report: Report) -> None:
    v = report.verdict
    if not v.evidence_found:
        console.print(Text(f"!! {common.no_evidence(v)} !!", style="bold reverse yellow"))
    head = Text("preemptdiag  ", style="bold")
    head.append(str(v.cls), style=_class_style(v.cls, bold=True))
    head.append(f"  ({v.confidence} confidence)")
    if v.suspected:
        head.append(f"  {common.SUSPECTED}", style="bold yellow")
    console.print(head)
    rows: list[tuple[str, str | Text]] = [
        ("span", common.time_span(v)),
        ("replica", v.replica or common.EMPTY),
        ("why", v.why or common.EMPTY),
    ]
    cause = common.cause_line(v)
    if cause:
        rows.append(("cause", cause.removeprefix("cause: ")))
    if v.suspected or v.capture_next:
        rows.append(("capture next", Text(v.capture_next or common.EMPTY, style="bold")))
    console.print(_fields(rows))


def _timeline(console: Console, report: Report, width: int, mode: TimelineMode) -> None:
    names = common.replicas(report.windows)
    if len(names) <= 1:
        _timeline_of(console, report, width, None, mode)
        return
    # One table per replica: a replica column would squeeze every number at 80-100
    # columns ("thrash_lo…", "126…").
    for name in names:
        own = replace(report, windows=common.of_replica(report.windows, name))
        _timeline_of(console, own, width, name, mode)


def _table(columns: Sequence[common.Column], rows: Sequence[common.Row], ci: int) -> Table:
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
        header_style="bold",
    )
    for col in columns:
        # Nothing wraps: a truncated cell ("21:2…") is better than a number split in two.
        table.add_column(col.short, justify="right" if col.numeric else "left", no_wrap=True)
    for row in rows:
        cells = [Text(c) for c in row.cells]
        if row.cls is not None:
            cells[ci].stylize(_class_style(row.cls))
        else:
            cells[ci].stylize("dim italic")
        table.add_row(*cells)
    return table


def _fitted_episodes(console: Console, eps: common.EpisodeTable) -> Table:
    """The episode table, narrowed only as far as it must be to fit: first a from → to
    breaks after its arrow, then the headers break at their spaces (`KV` over `max`).
    On one line a run across a new year (`2025-12-20 00:00 → 2026-01-02 21:20`) made
    the table too wide at 100 columns, and an `insufficient_evidence` run any table at
    80; the cells cut to fit lost the end time and the confidence (`2026-01-02 21:…`,
    `medi…`, `windo…`). Spans no wider than the broken ones stay on one line."""
    unbounded = console.options.update_width(1 << 16)

    def fits(table: Table) -> bool:
        return console.measure(table, options=unbounded).maximum <= console.width

    table = _table(eps.columns, eps.rows, eps.class_index)
    if fits(table):
        return table
    at = [c.key for c in eps.columns].index("span")
    pieces = [p for row in eps.rows for p in row.cells[at].split(" → ")]
    room = max(len(p) for p in pieces) + len(" →")

    def fitted(cell: str) -> str:
        return cell.replace(" → ", " →\n") if len(cell) > room else cell

    rows = [
        replace(row, cells=tuple(fitted(c) if i == at else c for i, c in enumerate(row.cells)))
        for row in eps.rows
    ]
    table = _table(eps.columns, rows, eps.class_index)
    if fits(table):
        return table
    # `from → to` over `(UTC)`, and the other headers at their spaces (`KV` over `max`)
    cols = [
        replace(c, short=c.short.replace(" (", "\n(") if i == at else c.short.replace(" ", "\n"))
        for i, c in enumerate(eps.columns)
    ]
    return _table(cols, rows, eps.class_index)


def _timeline_of(
    console: Console, report: Report, width: int, replica: str | None, mode: TimelineMode
) -> None:
    of = f" — {replica}" if replica is not None else ""
    eps = common.episode_table(report, mode, compact=True)
    if eps is not None:
        title = f"Episodes — {common.episode_title(eps, compact=True)}{of}"
        console.print()
        console.print(Text(title, style="bold underline"))
        console.print(_fitted_episodes(console, eps))
        if eps.silent:
            console.print(Text(f"  {common.SILENT_LEGEND}", style="dim"))
    tl = common.timeline(report, mode, compact=True)
    title = f"Timeline — {report.window_seconds} s windows, "
    title += f"{tl.date} (UTC)" if tl.date else "times in UTC"
    if eps is not None:
        title += ", around the focus episode"
    console.print()
    console.print(Text(title + of, style="bold underline"))
    if not tl.rows:
        console.print(Text("  no windows", style="dim"))
        return
    console.print(_table(tl.columns, tl.rows, tl.class_index))
    # (the labels' width, which the data does not change: one block each, where a
    # month's whole lines were ~4 MiB)
    sparks = common.sparklines(report, max_len=1)
    label_w = max((len(s.label) for s in sparks), default=0)
    room = max(10, width - label_w - 16)
    if len(report.windows) > room:  # bucketed: the legend says how much a block holds
        for _ in range(2):  # fewer blocks hold more windows each: a longer legend
            legend = max(len(s.legend) for s in common.sparklines(report, max_len=room))
            room = max(10, width - label_w - legend - 8)
    for spark in common.sparklines(report, max_len=room):
        line = Text(f"  {spark.label:<{label_w}}  ", style="bold")
        line.append(spark.line)
        line.append(f"  ({spark.legend})", style="dim")
        console.print(line, no_wrap=True, overflow="ellipsis")


def _evidence(console: Console, report: Report) -> None:
    console.print()
    console.print(Text("Evidence", style="bold underline"))
    lines, more = common.evidence_lines(report.verdict)
    if not lines:
        console.print(Text("  none", style="dim"))
    if lines and max(len(ev.location) for ev in lines) * 3 > console.width:
        # (a long path beside the text left it a column of a few words, six rows a
        # line at 80 columns: each file on its row, its lines' texts under it)
        file = None
        for ev in lines:
            path, _, line = ev.location.rpartition(":")
            if path != file:
                console.print(Text(f"  {path}", style="cyan"), overflow="fold")
                file = path
            row = Text(f"line {line}  ", style="cyan")
            row.append(ev.text)
            console.print(Padding(row, (0, 0, 0, 4)), overflow="fold")
    elif lines:
        grid = Table.grid(padding=(0, 2), pad_edge=False)
        grid.add_column(style="cyan", no_wrap=True)
        grid.add_column(overflow="fold")
        for ev in lines:
            grid.add_row(Text(f"  {ev.location}"), Text(ev.text))
        console.print(grid)
    if more:
        console.print(Text(f"  … {more} more evidence line(s) in the JSON output", style="dim"))


def _lever(console: Console, report: Report) -> None:
    lv = report.lever
    console.print()
    console.print(Text("Lever", style="bold underline"))
    rows: list[tuple[str, str | Text]] = [
        ("change", Text(common.lever_change(report), style="bold"))
    ]
    if lv.rationale:
        rows.append(("rationale", lv.rationale))
    rows += [("arithmetic" if i == 0 else "", step) for i, step in enumerate(lv.arithmetic)]
    if lv.apply:
        rows.append(("apply", lv.apply))
    rows.append(("verify", lv.verify or common.EMPTY))
    if lv.rollback:
        rows.append(("roll back", lv.rollback))
    rows.append(("avoid", lv.do_not or common.EMPTY))
    console.print(_fields(rows))


def _footer(console: Console, report: Report) -> None:
    s = report.stats
    console.print()
    console.print(Text("Scan", style="bold underline"))
    rows: list[tuple[str, str | Text]] = [
        ("files", ", ".join(s.files) or common.EMPTY),
        # (one row: a month's report fits a page of an 80-column terminal)
        ("read", f"{common.fmt_int(s.lines_read)} lines, {common.fmt_bytes(s.bytes_read)}"),
        ("recognised", common.fmt_mapping(s.recognised)),
        ("skipped", common.fmt_mapping(s.skipped)),
        ("engine", common.engine_label(report)),
        ("window", common.fmt_seconds(report.window_seconds)),
        ("thresholds", _thresholds(report.thresholds)),
        ("tool version", report.tool_version or common.EMPTY),
    ]
    # (one replica, named by the one file read: the row above says its name)
    named = len(report.replicas) > 1 or list(s.files) != [r.replica for r in report.replicas]
    rows += [("replica", common.replica_line(r, short=True, named=named)) for r in report.replicas]
    rows += [("note", n) for n in report.notes]
    console.print(_fields(rows, style="dim"))


def _thresholds(thresholds: Mapping[str, Any]) -> str:
    """Those not at their defaults: all eleven were four rows of a page-long report at
    80 columns, the same in nearly every run (the markdown and JSON list them all)."""
    defaults = Thresholds().as_dict()
    changed = {k: v for k, v in thresholds.items() if k not in defaults or defaults[k] != v}
    if not changed:
        return "the defaults (all listed in --format markdown or json)"
    return f"{common.fmt_mapping(changed, sort=False)}; the others the defaults"


def render_terminal(
    report: Report,
    *,
    color: bool = False,
    width: int = 100,
    timeline: TimelineMode = TimelineMode.EPISODES,
) -> str:
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        force_terminal=color,
        color_system="standard" if color else None,
        no_color=not color,
        force_jupyter=False,
        highlight=False,  # numbers in log text must not be recoloured
        markup=False,
        emoji=False,
    )
    report = common.verdict_replica_first(report)
    _verdict(console, report)
    _timeline(console, report, width, TimelineMode(timeline))
    _evidence(console, report)
    _lever(console, report)
    _footer(console, report)
    # Grids pad every cell to the column width; trailing blanks only get in a paste's way.
    lines = (_TRAILING.sub(_drop_spaces, line) for line in buf.getvalue().splitlines())
    return "\n".join(lines) + "\n"


# Trailing blanks, possibly interleaved with SGR codes that must survive (the resets).
_TRAILING = re.compile(r"(?:\x1b\[[0-9;]*m| )+$")


def _drop_spaces(m: re.Match[str]) -> str:
    return m.group(0).replace(" ", "")
