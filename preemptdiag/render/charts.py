"""Mermaid charts of the markdown report: requests and preemptions, and KV usage.

Two charts, not one: counts (preemptions, waiting, running) and a percentage (KV usage,
0-100) on one axis make the smaller flat (at 692 preemptions a window, KV is a line on
the floor). Mermaid's xychart has one y axis, so each unit gets its own chart.

Missing data is not zero. A window with no stats line (start-up, a crash, a quiet
engine that logs nothing) has no KV usage, and the time between two log lines may have
no window at all. xychart cannot leave a hole in a line (every category needs a number),
and a 0 there reads as "KV fell to 0 %" or "the queue emptied". So a point is plotted
only where a stats line was seen; the x axis is categories (times), and the stretches
without data are skipped, marked on the axis (the first label after a gap starts with
"⋯") and listed under the chart with their length. Every plotted value is a real one.

Long logs stay readable: at most MAX_POINTS points, each the peak (max) of an equal
share of the time span, and at most MAX_LABELS axis labels. The other points carry
distinct invisible labels (three zero-width characters each): Mermaid merges equal
categories into one band, and trims blanks, so "" or " " would drop points. With fewer than two points a chart
says nothing and is left out (a start-up failure has no stats line at all).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from preemptdiag.model.records import (
    NO_TIME,
    Report,
    from_micros,
    window_columns,
    window_micros,
)
from preemptdiag.render import common

MAX_POINTS = 60
MAX_LABELS = 12
WIDTH, HEIGHT = 900, 380  # px; Mermaid's default 700 leaves ~450 px of plot beside the legend
PLOT_WIDTH = 700  # what the x axis gets of WIDTH (the y axis and the legend take the rest)
MAX_GAPS_LISTED = 5
GAP_MARK = "⋯"
# Invisible characters that String.trim() keeps (format characters, not blanks): zero-width
# space, non-joiner, joiner and word joiner. Three of them name 64 distinct categories.
HIDDEN = ("\u200b", "\u200c", "\u200d", "\u2060")
assert len(HIDDEN) ** 3 >= MAX_POINTS

# Named in the titles, since older Mermaid releases draw no legend.
COUNT_COLOURS = ("#d62728", "#1f77b4", "#2ca02c")  # preemptions red, waiting blue, running green
KV_COLOUR = "#9467bd"  # purple


@dataclass(frozen=True, slots=True)
class Point:
    """One time bucket with stats data: the peak of each series over its windows."""

    start: datetime  # the bucket's start (its label)
    bucket: int
    data_start: datetime  # start of its first window with data, end of its last one
    data_end: datetime
    preemptions: int
    waiting: int | None
    running: int | None
    kv: float | None


@dataclass(frozen=True, slots=True)
class Gap:
    start: datetime
    end: datetime
    windows: int  # windows of the span (the grid's, whether or not a window exists)


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    kind: str  # "bar" or "line"
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    y_title: str
    y_top: float
    labels: tuple[str, ...]  # one per point, "" where not shown
    series: tuple[Series, ...]
    colours: tuple[str, ...]
    gaps: tuple[Gap, ...]


# What a chart reads of its windows, a column each (records.window_columns: a month's
# calm windows without a window object each); their starts as window_micros.
_READS = (
    "preemptions",
    "preemptions_lower_bound",
    "preemptions_spread_over",
    "waiting_max",
    "running_max",
    "kv_max",
)


@dataclass(frozen=True, slots=True)
class _Grid:
    replica: str
    t0: datetime
    slot: int  # window seconds
    per: int  # windows a bucket holds
    buckets: list[list[int]]  # each bucket's windows, by their row in `columns`
    columns: dict[str, list[Any]]  # _READS' columns of the charted windows
    starts: Sequence[int]  # their starts (records.micros)


def _grid(report: Report) -> _Grid | None:
    """The charted replica's dated windows, bucketed into at most MAX_POINTS equal spans.

    With several replicas only the verdict's is charted: categories from different
    replicas would interleave on one time axis and mislead."""
    reps = common.replicas(report.windows)
    if not reps:
        return None
    replica = report.verdict.replica if report.verdict.replica in reps else reps[0]
    ws = common.of_replica(report.windows, replica)
    micro: Sequence[int] = window_micros(ws, "start")
    dated = [i for i, us in enumerate(micro) if us != NO_TIME]
    if not dated:
        return None
    if len(dated) != len(ws):
        ws, micro = [ws[i] for i in dated], [micro[i] for i in dated]
    columns = dict(zip(_READS, window_columns(ws, _READS), strict=True))
    slot = max(1, report.window_seconds)
    first = min(micro)
    at = [(us - first) // (slot * 1_000_000) for us in micro]
    span = max(at) + 1
    per = math.ceil(span / MAX_POINTS)
    buckets: list[list[int]] = [[] for _ in range(math.ceil(span / per))]
    for i, k in enumerate(at):
        buckets[k // per].append(i)
    return _Grid(replica, from_micros(first), slot, per, buckets, columns, micro)


def _peak(values: Sequence[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None and math.isfinite(v)]
    return max(present) if present else None


def _int(x: float | None) -> int | None:
    return None if x is None else int(x)


def _point(grid: _Grid, k: int, has: Callable[[dict[str, list[Any]], int], bool]) -> Point | None:
    """Bucket k as a point, from its windows with the chart's data; None without any.
    Preemptions count from every window of the bucket."""
    c = grid.columns
    rows = [i for i in grid.buckets[k] if has(c, i)]
    if not rows:
        return None
    starts = [from_micros(grid.starts[i]) for i in rows]  # (a bucket's own, when read)
    return Point(
        start=grid.t0 + timedelta(seconds=k * grid.per * grid.slot),
        bucket=k,
        data_start=min(starts),
        data_end=max(starts) + timedelta(seconds=grid.slot),
        preemptions=max(
            (common.round_count(c["preemptions"][i]) for i in grid.buckets[k]), default=0
        ),
        waiting=_int(_peak([c["waiting_max"][i] for i in rows])),
        running=_int(_peak([c["running_max"][i] for i in rows])),
        kv=_peak([c["kv_max"][i] for i in rows]),
    )


def _nice_top(x: float) -> float:
    """The y axis top: the next 1, 2, 2.5 or 5 × 10^k at or above x (at least 10)."""
    if x <= 10:
        return 10.0
    base = 10 ** math.floor(math.log10(x))
    return float(next(m * base for m in (1, 2, 2.5, 5, 10) if m * base >= x))


def _label_text(t: datetime, grid: _Grid, one_date: bool) -> str:
    if one_date:
        return f"{t:%H:%M}"
    if grid.per * grid.slot >= 86400:
        return f"{t:%m-%d}"
    return f"{t:%m-%d %H:%M}"


def max_labels(chars: int) -> int:
    """How many labels of `chars` characters fit side by side (14 px font: ~7 px a
    digit, and a gap), at most MAX_LABELS."""
    return max(2, min(MAX_LABELS, PLOT_WIDTH // (7 * chars + 16)))


def label_slots(n: int, forced: Sequence[int], most: int = MAX_LABELS) -> list[int]:
    """Which of n points get a visible label: the first point after each gap first (a
    few), then a regular grid; no two closer than n/most points, so they cannot
    overlap and never number more than `most`."""
    step = max(1, math.ceil(n / most))
    chosen: list[int] = []
    for i in [*forced[: most // 2], *range(0, n, step)]:
        if len(chosen) < most and all(abs(i - j) >= step for j in chosen):
            chosen.append(i)
    return sorted(chosen)


def _chart(
    grid: _Grid,
    has: Callable[[dict[str, list[Any]], int], bool],
    build: Callable[[list[Point]], tuple[Series, ...]],
    title: str,
    y_title: str,
    colours: tuple[str, ...],
    y_top: float | None,
) -> Chart | None:
    points = [p for k in range(len(grid.buckets)) if (p := _point(grid, k, has)) is not None]
    if len(points) < 2:
        return None
    # A gap is a skipped bucket between two points; it runs from the last data before
    # it to the first data after it (shorter holes inside a bucket cannot show).
    gaps: list[Gap] = []
    after_gap: list[int] = []
    for i in range(1, len(points)):
        a, b = points[i - 1], points[i]
        if b.bucket > a.bucket + 1:
            windows = round((b.data_start - a.data_end).total_seconds() / grid.slot)
            gaps.append(Gap(a.data_end, b.data_start, windows))
            after_gap.append(i)
    one_date = len({p.start.date() for p in points}) == 1
    texts = [_label_text(p.start, grid, one_date) for p in points]
    most = max_labels(max(len(t) for t in texts) + 1)  # + 1: the gap mark
    shown = set(label_slots(len(points), after_gap, most))
    labels = tuple(
        (GAP_MARK if i in after_gap else "") + texts[i] if i in shown else ""
        for i in range(len(points))
    )
    series = build(points)
    top = y_top if y_top is not None else _nice_top(max(max(s.values) for s in series))
    return Chart(title, y_title, top, labels, series, colours, tuple(gaps))


def _every(grid: _Grid) -> str:
    seconds = grid.per * grid.slot
    if grid.per == 1:
        return f"per {grid.slot} s window"
    if seconds % 3600 == 0:
        span = f"{seconds // 3600} h"
    elif seconds % 60 == 0:
        span = f"{seconds // 60} min"
    else:
        span = f"{seconds} s"
    return f"peak {grid.slot} s window of each {span}"


def charts(report: Report) -> list[Chart]:
    grid = _grid(report)
    if grid is None:
        return []
    of = f" - {grid.replica}" if len(common.replicas(report.windows)) > 1 else ""
    every = _every(grid)
    c = grid.columns
    # No preemption at all: no bars (Mermaid draws a zero bar as a stub on the axis,
    # which would read as a few preemptions everywhere). A spread counter delta (~ in
    # the timeline) is an estimate and sampled warnings (+) a lower bound: the legend
    # says so.
    preempted = any(common.round_count(p) for p in c["preemptions"])
    spread = any(
        over and p for over, p in zip(c["preemptions_spread_over"], c["preemptions"], strict=True)
    )
    lower = any(c["preemptions_lower_bound"])
    caveats = [c for c, on in (("~ estimated", spread), ("+ lower bound", lower)) if on]
    pre_name = "preemptions" + (f" ({', '.join(caveats)})" if caveats else "")

    def counts(points: list[Point]) -> tuple[Series, ...]:
        bars = (Series(pre_name, "bar", tuple(float(p.preemptions) for p in points)),)
        return (*(bars if preempted else ()),
            Series("waiting", "line", tuple(float(p.waiting or 0) for p in points)),
            Series("running", "line", tuple(float(p.running or 0) for p in points)),
        )  # fmt: skip

    def kv(points: list[Point]) -> tuple[Series, ...]:
        return (Series("KV max %", "line", tuple(p.kv or 0.0 for p in points)),)

    colours: tuple[str, ...] = COUNT_COLOURS
    if preempted:
        counts_title = f"Preemptions (red bars), waiting (blue), running (green), {every}"
    else:
        counts_title = f"Waiting (blue), running (green), {every}; no preemption seen"
        colours = COUNT_COLOURS[1:]
    out = [
        _chart(
            grid,
            lambda c, i: c["waiting_max"][i] is not None and c["running_max"][i] is not None,
            counts,
            counts_title + of,
            "count",
            colours,
            None,
        ),
        _chart(
            grid,
            lambda c, i: c["kv_max"][i] is not None and math.isfinite(c["kv_max"][i]),
            kv,
            f"KV cache usage %, {every}{of}",
            "KV cache usage %",
            (KV_COLOUR,),
            100.0,
        ),
    ]
    return [c for c in out if c is not None]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def _quote(text: str) -> str:
    return '"' + text.replace('"', "'") + '"'


def _gap_note(gaps: Sequence[Gap], date: str | None, seconds: int) -> str:
    listed = [
        f"{common.span_cell(g.start, g.end, date, seconds)} ({common.fmt_int(g.windows)} "
        f"window{'s' if g.windows != 1 else ''})"
        for g in gaps[:MAX_GAPS_LISTED]
    ]
    more = len(gaps) - MAX_GAPS_LISTED
    if more > 0:
        listed.append(f"and {more} more")
    return (
        f"no stats line in {', '.join(listed)}: not plotted (not zero); the axis skips "
        f"{'it' if len(gaps) == 1 else 'them'} at the labels marked {GAP_MARK}"
    )


def hidden_label(i: int) -> str:
    """The i-th invisible category name (i < 64 = MAX_POINTS and more)."""
    return "".join(HIDDEN[(i >> shift) & 3] for shift in (4, 2, 0))


def mermaid_block(chart: Chart) -> list[str]:
    hidden = 0
    categories = []
    for label in chart.labels:
        if label:
            categories.append(_quote(label))
        else:
            categories.append(_quote(hidden_label(hidden)))
            hidden += 1
    out = [
        "```mermaid",
        "---",
        "config:",
        "  xyChart:",
        f"    width: {WIDTH}",
        f"    height: {HEIGHT}",
        "    titleFontSize: 16",
        "  themeVariables:",
        "    xyChart:",
        f'      plotColorPalette: "{", ".join(chart.colours)}"',
        "---",
        "xychart-beta",
    ]
    if hidden:
        out.append(
            "    %% unlabelled points carry distinct zero-width labels: equal ones would merge"
        )
    out += [
        f"    title {_quote(chart.title)}",
        f"    x-axis [{', '.join(categories)}]",
        f"    y-axis {_quote(chart.y_title)} 0 --> {_num(chart.y_top)}",
    ]
    out += [
        f"    {s.kind} {_quote(s.name)} [{', '.join(_num(v) for v in s.values)}]"
        for s in chart.series
    ]
    out.append("```")
    return out


def mermaid(report: Report) -> list[str]:
    """The charts as markdown lines (fenced mermaid blocks, each after a blank line, and
    the gap notes); none where fewer than two windows have a stats line."""
    cs = charts(report)
    date = common.shared_date(report.windows)
    out: list[str] = []
    notes: list[str] = []
    for c in cs:
        out += ["", *mermaid_block(c)]
        if c.gaps:
            note = _gap_note(c.gaps, date, report.window_seconds)
            if note not in notes:
                notes.append(note)
    for n in notes:
        out += ["", f"_{n}_"]
    return out
