"""The markdown report's Mermaid charts, as text (tests/render/test_mermaid_browser.py
checks what a real Mermaid draws from them)."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from datetime import timedelta

from test_episodes import T0, long_report
from test_renderers import suspected_report, thrash_report, win

from preemptdiag.model.records import Class, Report
from preemptdiag.render import Format, render
from preemptdiag.render.charts import MAX_LABELS, MAX_POINTS, charts, hidden_label, label_slots


def blocks(report: Report) -> list[list[str]]:
    text = render(report, Format.MARKDOWN)
    return [b.splitlines() for b in re.findall(r"```mermaid\n(.*?)\n```", text, re.S)]


def field(block: list[str], name: str) -> str:
    (line,) = [ln.strip() for ln in block if ln.strip().startswith(name)]
    return line


def test_two_charts_counts_and_kv_percent_each_on_its_own_axis() -> None:
    counts, kv = blocks(thrash_report())
    assert counts[counts.index("xychart-beta") :] == [
        "xychart-beta",
        '    title "Preemptions (red bars), waiting (blue), running (green), per 60 s window"',
        '    x-axis ["21:24", "21:25", "21:26", "21:27"]',
        '    y-axis "count" 0 --> 100',
        '    bar "preemptions (+ lower bound)" [0, 51, 50, 50]',  # 51+: sampled warnings
        '    line "waiting" [0, 31, 40, 52]',
        '    line "running" [12, 48, 48, 47]',
    ]
    assert '      plotColorPalette: "#d62728, #1f77b4, #2ca02c"' in counts
    assert kv[kv.index("xychart-beta") :] == [
        "xychart-beta",
        '    title "KV cache usage %, per 60 s window"',
        '    x-axis ["21:24", "21:25", "21:26", "21:27"]',
        '    y-axis "KV cache usage %" 0 --> 100',
        '    line "KV max %" [40, 99.8, 100, 98.5]',
    ]


def test_hundreds_of_preemptions_scale_the_count_axis_not_the_kv_one() -> None:
    r = thrash_report()
    ws = [replace(w, preemptions=692.0) if w.cls is Class.THRASH_LOOP else w for w in r.windows]
    counts, kv = blocks(replace(r, windows=tuple(ws)))
    assert field(counts, "y-axis") == 'y-axis "count" 0 --> 1000'
    assert field(kv, "y-axis") == 'y-axis "KV cache usage %" 0 --> 100'


def test_missing_data_is_skipped_and_listed_not_plotted_as_zero() -> None:
    r = thrash_report()
    ws = [*r.windows[:2], replace(r.windows[2], kv_max=None, running_max=None, waiting_max=None)]
    ws += [win(m, Class.HEALTHY) for m in (10, 11)]  # six minutes without any line
    text = render(replace(r, windows=tuple(ws)), Format.MARKDOWN)
    counts, kv = [b.splitlines() for b in re.findall(r"```mermaid\n(.*?)\n```", text, re.S)]
    assert field(kv, "x-axis") == 'x-axis ["21:24", "21:25", "⋯21:34", "21:35"]'
    assert field(kv, "line") == 'line "KV max %" [40, 99.8, 40, 40]'
    assert field(counts, 'line "waiting"') == 'line "waiting" [0, 31, 0, 0]'
    assert (
        "_no stats line in 21:26:00 → 21:34:00 (8 windows): not plotted (not zero); the axis "
        "skips it at the labels marked ⋯_"
    ) in text
    assert text.count("_no stats line in") == 1  # the same gaps in both charts: one note


def test_long_logs_are_bucketed_by_peak_with_thinned_labels() -> None:
    r = long_report(600, range(300, 303))  # ten hours; the loop in minutes 300-302
    (counts, kv) = charts(r)
    assert len(counts.labels) == 60  # 600 windows, 10 a point
    assert counts.title.endswith("peak 60 s window of each 10 min")
    pre = counts.series[0]
    assert pre.values[30] == 7 and sum(pre.values) == 7  # the max of a bucket, not its sum
    assert kv.series[0].values[30] == 99.2
    visible = [lbl for lbl in counts.labels if lbl]
    assert 2 <= len(visible) <= MAX_LABELS
    # "MM-DD HH:MM": 7 fit beside each other, one every 9 points (90 minutes)
    assert visible == [
        "06-16 21:24", "06-16 22:54", "06-17 00:24", "06-17 01:54", "06-17 03:24",
        "06-17 04:54", "06-17 06:24",
    ]  # fmt: skip


def test_label_slots_never_crowd_and_keep_gap_marks() -> None:
    for n in (1, 2, 11, 12, 13, 59, 60):
        slots = label_slots(n, [])
        assert len(slots) <= MAX_LABELS and slots[0] == 0
        step = -(-n // MAX_LABELS)
        assert all(b - a >= step for a, b in itertools.pairwise(slots))
    assert 37 in label_slots(60, [37])


def test_hidden_labels_are_distinct_invisible_and_short() -> None:
    names = [hidden_label(i) for i in range(MAX_POINTS)]
    assert len(set(names)) == MAX_POINTS
    assert all(len(n) == 3 and not n.strip("\u200b\u200c\u200d\u2060") for n in names)
    assert all(n.strip() == n for n in names)  # nothing a trim would remove


def test_no_chart_with_fewer_than_two_windows_with_data() -> None:
    r = thrash_report()
    one = replace(r, windows=r.windows[:1])
    assert blocks(one) == []
    assert "mermaid" not in render(one, Format.MARKDOWN)
    no_stats = tuple(replace(w, kv_max=None, running_max=None, waiting_max=None) for w in r.windows)
    assert blocks(replace(r, windows=no_stats)) == []


def test_only_the_verdicts_replica_is_charted() -> None:
    r = suspected_report()
    more = (win(1, Class.HEALTHY, replica="pod-a", kv_max=90.0), win(1, replica="pod-b"))
    text = render(replace(r, windows=(*r.windows, *more)), Format.MARKDOWN)
    assert '    title "KV cache usage %, per 60 s window - pod-a"' in text
    assert '    line "KV max %" [100, 90]' in text


def test_no_preemption_no_bars_and_estimates_say_so() -> None:
    r = thrash_report()
    calm = tuple(replace(w, preemptions=0.0) for w in r.windows)
    counts = blocks(replace(r, windows=calm))[0]
    assert not [ln for ln in counts if ln.strip().startswith("bar")]
    assert field(counts, 'title "').endswith('per 60 s window; no preemption seen"')
    assert '      plotColorPalette: "#1f77b4, #2ca02c"' in counts
    spread = tuple(replace(w, preemptions_spread_over=2) for w in r.windows)
    counts = blocks(replace(r, windows=spread))[0]
    assert field(counts, "bar").startswith('bar "preemptions (~ estimated, + lower bound)" [0, 51')
    lower = tuple(replace(w, preemptions_lower_bound=w.cls is Class.THRASH_LOOP) for w in r.windows)
    assert field(blocks(replace(r, windows=lower))[0], "bar").startswith(
        'bar "preemptions (+ lower bound)" [0, 51'
    )


def test_gap_before_the_first_data_is_no_gap() -> None:
    r = thrash_report()
    ws = (replace(r.windows[0], kv_max=None, running_max=None, waiting_max=None), *r.windows[1:])
    text = render(replace(r, windows=ws), Format.MARKDOWN)
    assert "no stats line" not in text
    assert '    x-axis ["21:25", "21:26", "21:27"]' in text
    assert T0 + timedelta(minutes=1) == ws[1].start
