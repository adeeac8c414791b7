"""The markdown report's Mermaid charts, drawn by the real mermaid package in a real
headless Chromium: every block parses, and the SVG has the charts, series, points and
axis labels the report meant.

Needs Debian's `chromium` and `npm ci` in tests/render/browser/ (tests/install-deps does both). A
missing browser fails this test; set PREEMPTDIAG_NO_BROWSER=1 to skip it on purpose.
"""

from __future__ import annotations

import io
import os
import re
import sys
from contextlib import redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from builders import healthy_v1_log

from preemptdiag.cli import main

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent / "browser"))
import mermaid_harness  # noqa: E402

if os.environ.get("PREEMPTDIAG_NO_BROWSER") == "1":
    pytest.skip("PREEMPTDIAG_NO_BROWSER=1: browser rendering not checked", allow_module_level=True)

ENGINE = "tests/fixtures/engine/vllm-0.32.0"
BROKEN = 'xychart-beta\n    x-axis ["a", "b"]\n    line [1, oops]'


def day_with_gap(tmp: Path) -> list[str]:
    """A day of a calm V1 server that logged nothing from 13:00 to 14:00."""
    lines = [
        ln
        for ln in healthy_v1_log(
            datetime(2026, 3, 2, tzinfo=UTC), 24 * 60, spikes={4000: (0, 77.7)}
        )
        if " 03-02 13:" not in ln
    ]
    log = tmp / "day.log"
    log.write_text("\n".join(lines) + "\n")
    return [str(log)]


def markdown(files: list[str]) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        main(["analyze", "--year", "2026", "--format", "markdown", *files])
    return buf.getvalue()


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case's blocks drawn in one browser run (one start-up, ~1.5 s)."""
    if mermaid_harness.chromium() is None:
        pytest.fail("chromium is not installed (apt-get install chromium); "
                    "PREEMPTDIAG_NO_BROWSER=1 skips this test")  # fmt: skip
    if not mermaid_harness.MERMAID_JS.exists():
        pytest.fail(f"mermaid is not installed: run `npm ci` in {mermaid_harness.HERE}")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        reports = {
            "thrash": markdown(
                [f"{ENGINE}/thrash_loop/server.log",
                 *sorted(str(p) for p in Path(f"{ENGINE}/thrash_loop").glob("metrics-*.prom"))]
            ),
            "v0_thrash": markdown(["samples/v0_thrash_loop.log"]),
            "queueing": markdown(["samples/v1_queueing.log"]),
            "healthy_day": markdown(day_with_gap(tmp_path_factory.mktemp("day"))),
            "startup_failure": markdown(["samples/v0_startup_kv_too_small.log"]),
        }  # fmt: skip
    finally:
        os.chdir(cwd)
    blocks = {name: mermaid_harness.mermaid_blocks(md) for name, md in reports.items()}
    flat = [b for bs in blocks.values() for b in bs] + [BROKEN]
    charts = mermaid_harness.render(flat)["charts"]
    out: dict[str, Any] = {"broken": charts[-1], "markdown": reports}
    i = 0
    for name, bs in blocks.items():
        out[name] = list(zip(bs, charts[i : i + len(bs)], strict=True))
        i += len(bs)
    return out


def values(block: str, kind: str) -> list[list[str]]:
    return [m.split(", ") for m in re.findall(rf"^\s+{kind} \"[^\"]*\" \[(.*)\]$", block, re.M)]


def labels(block: str) -> list[str]:
    (axis,) = re.findall(r"^\s+x-axis \[(.*)\]$", block, re.M)
    names = re.findall(r'"([^"]*)"', axis)
    return [n for n in names if n.strip("\u200b\u200c\u200d\u2060")]


def check(block: str, svg: dict[str, Any]) -> None:
    """The SVG drew what the block says: no error, one band per category (hidden labels
    did not merge), every bar and line point, exactly the visible labels."""
    assert svg["ok"] and not svg["error_text"], svg
    bars, lines = values(block, "bar"), values(block, "line")
    n = len((bars or lines)[0])
    assert svg["x_categories"] == n
    assert svg["bars"] == [len(b) for b in bars]
    assert svg["lines"] == [len(v) for v in lines]
    assert svg["x_labels"] == labels(block)
    assert len(svg["x_labels"]) <= 12
    assert svg["title"] == re.search(r'^\s+title "(.*)"$', block, re.M).group(1)  # type: ignore[union-attr]


def test_the_harness_reports_a_syntax_error(drawn: dict[str, Any]) -> None:
    assert not drawn["broken"]["ok"] and "Parse error" in drawn["broken"]["error"]


def test_a_real_thrash_loop_draws_counts_and_kv_charts(drawn: dict[str, Any]) -> None:
    (counts_block, counts), (kv_block, kv) = drawn["thrash"]
    check(counts_block, counts)
    check(kv_block, kv)
    assert counts["legend"] == ["preemptions (~ estimated)", "waiting", "running"]
    assert counts["bars"] == [6] and counts["lines"] == [6, 6]
    assert counts["x_labels"] == ["23:02", "23:03", "23:04", "23:05", "23:06", "23:07"]
    assert "0 --> 500" in counts_block  # 430 preemptions at most: the count axis
    assert kv["bars"] == [] and kv["lines"] == [6] and "0 --> 100" in kv_block


def test_the_v0_sample_draws_both_charts(drawn: dict[str, Any]) -> None:
    assert len(drawn["v0_thrash"]) == 2
    for block, svg in drawn["v0_thrash"]:
        check(block, svg)


def test_queueing_draws_lines_and_no_bars(drawn: dict[str, Any]) -> None:
    (counts_block, counts), (kv_block, kv) = drawn["queueing"]
    check(counts_block, counts)
    check(kv_block, kv)
    assert counts["bars"] == [] and counts["lines"] == [8, 8]
    assert counts["legend"] == ["waiting", "running"]
    assert counts["title"].endswith("no preemption seen")


def test_a_healthy_day_is_bucketed_with_its_gap_marked(drawn: dict[str, Any]) -> None:
    (counts_block, counts), (kv_block, kv) = drawn["healthy_day"]
    check(counts_block, counts)
    check(kv_block, kv)
    # 1,440 minutes in 24-minute buckets, of which the two inside the idle hour are skipped
    assert kv["lines"] == [58] and kv["x_categories"] == 58
    assert "⋯14:00" in kv["x_labels"]
    assert kv["title"] == "KV cache usage %, peak 60 s window of each 24 min"
    assert "_no stats line in 13:00:00 → 14:00:00 (60 windows)" in drawn["markdown"]["healthy_day"]


def test_a_startup_failure_gets_no_chart(drawn: dict[str, Any]) -> None:
    assert drawn["startup_failure"] == []
    assert "allocation_failure" in drawn["markdown"]["startup_failure"]
