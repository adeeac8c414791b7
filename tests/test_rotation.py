"""Rotated logs (vllm.log, vllm.log.1, vllm.log.2.gz) read as one engine's log."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from preemptdiag.cli import main
from preemptdiag.ingest.rotation import rotated_sets, rotation_base

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "v0_thrash_loop.log"
T0 = datetime(2025, 11, 4, 16, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("vllm.log", "vllm.log"),
        ("vllm.log.1", "vllm.log"),
        ("logs/vllm.log.12.gz", "logs/vllm.log"),
        ("vllm.log-20251104", "vllm.log"),
        ("vllm.log-20251104.xz", "vllm.log"),
        ("0.log.20251104-101010.gz", "0.log"),  # kubelet
        ("abc-json.log.3", "abc-json.log"),  # docker json-file
        ("engine.log.zst", "engine.log"),
        ("replica-0.log", "replica-0.log"),  # a replica's number, not a rotation
        ("node.2024.log", "node.2024.log"),
        ("run.12345", "run.12345"),  # five digits: not a rotation count
    ],
)
def test_rotation_base(name: str, base: str) -> None:
    assert rotation_base(name) == base


def _span(start_min: float, end_min: float) -> tuple[datetime, datetime]:
    return T0 + timedelta(minutes=start_min), T0 + timedelta(minutes=end_min)


def test_files_that_follow_one_another_are_one_set() -> None:
    names = ["vllm.log", "vllm.log.1", "vllm.log.2.gz", "other.log"]
    spans = {
        "vllm.log": _span(20, 30),
        "vllm.log.1": _span(10, 20.5),  # half a minute of overlap: lines out of order
        "vllm.log.2.gz": _span(0, 10),
        "other.log": _span(0, 30),
    }
    assert rotated_sets(spans, names) == {
        "vllm.log": "vllm.log",
        "vllm.log.1": "vllm.log",
        "vllm.log.2.gz": "vllm.log",
    }


def test_files_that_overlap_in_time_are_different_engines() -> None:
    names = ["a.log.1", "a.log.2"]
    assert rotated_sets({"a.log.1": _span(0, 10), "a.log.2": _span(5, 15)}, names) == {}
    # Without timestamps nothing shows the files follow one another.
    assert rotated_sets({"a.log.1": _span(0, 10), "a.log.2": None}, names) == {}
    assert rotated_sets({"a.log.1": _span(0, 10)}, ["a.log.1"]) == {}


def _cut_in_three(tmp_path: Path) -> list[Path]:
    """The sample as logrotate leaves it: oldest part in vllm.log.2.gz."""
    lines = SAMPLE.read_bytes().splitlines(keepends=True)
    third = len(lines) // 3
    parts = [lines[:third], lines[third : 2 * third], lines[2 * third :]]
    oldest = tmp_path / "vllm.log.2.gz"
    oldest.write_bytes(gzip.compress(b"".join(parts[0])))
    middle, live = tmp_path / "vllm.log.1", tmp_path / "vllm.log"
    middle.write_bytes(b"".join(parts[1]))
    live.write_bytes(b"".join(parts[2]))
    return [live, middle, oldest]  # as a shell glob lists them: newest first


def _report(capsys: pytest.CaptureFixture[str], *files: Path) -> tuple[int, dict[str, Any]]:
    code = main(["analyze", "--format", "json", "--year", "2025", *map(str, files)])
    return code, json.loads(capsys.readouterr().out)


def _timeline(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    keys = ("start", "class", "preemptions", "kv_max", "running_max", "waiting_last")
    return [tuple(w[k] for k in keys) for w in report["windows"]]


def test_rotated_files_give_the_report_of_the_whole_log(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    files = _cut_in_three(tmp_path)
    code, parts = _report(capsys, *files)
    whole_code, whole = _report(capsys, SAMPLE)
    assert code == whole_code == 1
    # One replica and one V0 counter: the timeline and its preemption counts are the
    # whole file's (read apart, each file's first warning was only a lower bound).
    assert {w["replica"] for w in parts["windows"]} == {str(files[0])}
    assert _timeline(parts) == _timeline(whole)
    assert parts["verdict"]["class"] == whole["verdict"]["class"] == "thrash_loop"
    assert parts["lever"] == whole["lever"]
    # Evidence still points into the file that holds the line.
    assert {e["file"] for e in parts["verdict"]["evidence"]} <= {str(f) for f in files}
    assert parts["notes"][0] == (
        f"{files[0]}: read as one log from its rotated files, oldest first: "
        f"{files[2]}, {files[1]}, {files[0]}"
    )


def test_alike_names_that_overlap_stay_two_replicas(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a, b = tmp_path / "engine.log.1", tmp_path / "engine.log.2"
    a.write_bytes(SAMPLE.read_bytes())
    b.write_bytes(SAMPLE.read_bytes())
    _, report = _report(capsys, a, b)
    assert {w["replica"] for w in report["windows"]} == {str(a), str(b)}
    assert not any("rotated" in n for n in report["notes"])
