"""commands.analyze: the pipeline composed, on a built log."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from builders import Pipe

from preemptdiag.commands import analyze
from preemptdiag.commands.analyze import Options, run_analysis
from preemptdiag.ingest.sources import Source, open_source
from preemptdiag.model.records import Class
from preemptdiag.scan.matcher import Matcher
from preemptdiag.scan.signatures import load
from preemptdiag.timeline.events import TimeContext

STATS = (
    "INFO 09-11 17:{m:02d}:{s:02d} metrics.py:351] Avg prompt throughput: 10.0 tokens/s, "
    "Avg generation throughput: 50.0 tokens/s, Running: 4 reqs, Swapped: 0 reqs, "
    "Pending: 0 reqs, GPU KV cache usage: 40.0%, CPU KV cache usage: 0.0%."
)


def test_the_composition_gives_verdict_exit_code_and_replica(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("\n".join(STATS.format(m=m, s=s) for m in (20, 21) for s in (0, 5, 10)) + "\n")
    out = run_analysis(Options(files=(str(log),), time=TimeContext(year=2025)))
    assert out.report.verdict.cls is Class.HEALTHY and out.exit_code == 0
    (rep,) = out.report.replicas
    assert rep.replica == str(log) and rep.dated_by == ("--year 2025",)
    assert len(out.report.windows) == 2 and out.report.stats.recognised == {"stats": 6}


def test_a_time_range_past_the_log_leaves_no_window_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text(STATS.format(m=20, s=0) + "\n")
    opts = Options(
        files=(str(log),),
        time=TimeContext(year=2025),
        since=datetime(2026, 1, 1, tzinfo=UTC),
        strict=True,
    )
    out = run_analysis(opts)
    assert out.report.windows == () and out.report.verdict.filtered_out
    assert out.exit_code == 2


def _piped(monkeypatch: pytest.MonkeyPatch, data: bytes) -> Source:
    """A Source on stdin, as a pipe gives it (short reads, no size, no path)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Pipe(data, chunk=65536))))
    src = open_source("-")
    assert src.path is None and src.size is None
    return src


def _stats_log(minutes: int) -> bytes:
    return "".join(
        STATS.format(m=m % 60, s=s) + "\n" for m in range(minutes) for s in (0, 10, 20)
    ).encode()


def test_a_small_pipe_is_scanned_without_the_preload(monkeypatch: pytest.MonkeyPatch) -> None:
    # `kubectl logs pod | preemptdiag analyze -` of a small log: polars' import (~0.12 s,
    # ~40 MiB) would be for nothing, windows.py aggregates such a table in Python.
    data = _stats_log(20)
    assert len(data) < analyze.PRELOAD_AFTER
    ran: list[str] = []
    (got,) = analyze.scan_sources(
        [_piped(monkeypatch, data)], Matcher(load()), 1, preload=lambda: ran.append("x")
    )
    assert ran == [] and got.bytes_read == len(data) and got.recognised == {"stats": 60}


def test_a_big_pipe_preloads_in_a_thread_while_it_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _stats_log(200)
    monkeypatch.setattr(analyze, "PRELOAD_AFTER", len(data) // 2)
    ran: list[tuple[str, int]] = []
    src = _piped(monkeypatch, data)
    pipe = sys.stdin.buffer.raw  # type: ignore[attr-defined]

    def preload() -> None:
        ran.append((threading.current_thread().name, pipe.served))

    (got,) = analyze.scan_sources([src], Matcher(load()), 1, preload=preload)
    # Once, in its own thread, joined before the scan's result came back, started after
    # the pipe had given PRELOAD_AFTER bytes and before it had given them all.
    assert len(ran) == 1 and ran[0][0] == "preload"
    assert analyze.PRELOAD_AFTER <= ran[0][1] <= len(data)
    assert got.bytes_read == len(data) and got.recognised == {"stats": 600}


def test_a_small_log_on_stdin_is_analysed_without_importing_polars(tmp_path: Path) -> None:
    # (in a fresh interpreter: this one has polars already)
    log = tmp_path / "a.log"
    log.write_bytes(_stats_log(20))
    code = (
        "import sys\n"
        "from preemptdiag.cli import main\n"
        "code = main(['analyze', '--format', 'json', '--year', '2025', '-'])\n"
        "print('polars' in sys.modules, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    with log.open("rb") as stdin:
        r = subprocess.run(
            [sys.executable, "-c", code], stdin=stdin, capture_output=True, text=True
        )
    assert (r.returncode, r.stderr) == (0, "False\n")
    report = json.loads(r.stdout)
    assert report["verdict"]["class"] == "healthy" and len(report["windows"]) == 20
