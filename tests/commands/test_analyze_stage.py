"""commands.analyze: the pipeline composed, on a built log."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from preemptdiag.commands.analyze import Options, run_analysis
from preemptdiag.model.records import Class
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
