"""A report is written in the pieces render_chunks gives (JSON a batch of windows at a
time): stdout and -o get exactly render()'s text, and memory holds a batch, not the
whole 60 MB of a month's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import preemptdiag.render.json_format as jf
from preemptdiag.cli import main
from preemptdiag.commands.analyze import run_analysis
from preemptdiag.commands.options import build_options
from preemptdiag.model.records import Report
from preemptdiag.render import Format, render, render_chunks

SAMPLE = Path(__file__).parents[2] / "samples" / "v0_thrash_loop.log"


def _report(path: Path) -> Report:
    opts = build_options(
        [str(path)], None, None, None, 2026, None, None, None, None, 1, False, False, None
    )
    return run_analysis(opts).report


@pytest.mark.parametrize("fmt", list(Format))
def test_the_pieces_joined_are_the_rendered_text(
    fmt: Format, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jf, "_BATCH", 3)  # many pieces even on a small log
    report = _report(SAMPLE)
    pieces = list(render_chunks(report, fmt))
    assert "".join(pieces) == render(report, fmt)
    if fmt is Format.JSON:
        assert len(pieces) > 2  # windows went out in batches
        json.loads("".join(pieces))


def test_stdout_and_output_file_get_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(jf, "_BATCH", 2)
    out = tmp_path / "report.json"
    argv = ["analyze", str(SAMPLE), "--format", "json", "--year", "2026"]
    code = main(argv)
    printed = capsys.readouterr().out
    assert main([*argv, "-o", str(out)]) == code == 1
    assert out.read_text(encoding="utf-8") == printed
    assert printed.endswith("}\n") and not printed.endswith("\n\n")


def test_a_bad_timeline_is_refused_before_the_output_file_is_touched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "keep.json"
    out.write_text("earlier report\n", encoding="utf-8")
    argv = ["analyze", str(SAMPLE), "-f", "json", "--timeline", "weekly", "-o", str(out)]
    assert main(argv) == 2
    assert "--timeline must be one of" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == "earlier report\n"
