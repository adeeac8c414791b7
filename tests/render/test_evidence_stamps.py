"""Evidence lines carry their time even where the scan read the stamp off as a
wrapper (render/common.stamped)."""

from __future__ import annotations

from pathlib import Path

import pytest

from preemptdiag.cli import main

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def test_sglang_and_kernel_evidence_keep_their_time(capsys: pytest.CaptureFixture[str]) -> None:
    # SGLang's `[2025-11-02 10:00:08 TP0]` and the kernel's ISO stamp are wrappers the
    # scan reads into the event's time; evidence puts them back in front.
    main(["analyze", "--format", "markdown", str(SAMPLES / "sglang_thrash.log")])
    out = capsys.readouterr().out
    assert (
        "sglang_thrash.log:92  [2025-11-02 10:00:08 TP0] KV cache pool is full. "
        "Retract requests. #retracted_reqs: 3" in out
    )
    host = sorted((SAMPLES / "host_oom_incident").iterdir())
    main(["analyze", "--format", "markdown", "--year", "2025", *map(str, host)])
    out = capsys.readouterr().out
    assert "describe.txt:38  [2025-08-19 18:34:30] Reason:       OOMKilled" in out
    assert "dmesg.log:7  [2025-08-19 18:34:30] gpu-node-7 kernel: python3 invoked oom-killer" in out


def test_a_line_with_its_own_stamp_is_shown_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    main(["analyze", "--format", "markdown", "--year", "2026", str(SAMPLES / "v1_cuda_oom.log")])
    out = capsys.readouterr().out
    assert "v1_cuda_oom.log:253  (EngineCore_0 pid=312) ERROR 08-20 10:18:16 [core.py:700]" in out


def test_replica_span_past_midnight_names_both_days() -> None:
    from datetime import UTC, datetime

    from preemptdiag.model.records import EngineInfo, ReplicaFacts
    from preemptdiag.render.common import replica_line

    def facts(start: datetime, end: datetime) -> ReplicaFacts:
        return ReplicaFacts(
            replica="a.log",
            engine=EngineInfo("vllm", "v1", "0.32.0"),
            start=start,
            end=end,
            dated_by=("--year 2026",),
            facts=(),
        )

    day = datetime(2026, 6, 3, 0, 0, tzinfo=UTC)
    month = datetime(2026, 7, 3, 0, 1, tzinfo=UTC)
    assert replica_line(facts(day, month)) == (
        "a.log: vllm v1 0.32.0, 2026-06-03 00:00 → 2026-07-03 00:01 (dated by --year 2026)"
    )
    noon = datetime(2026, 6, 3, 12, 30, tzinfo=UTC)
    assert replica_line(facts(day, noon)) == (
        "a.log: vllm v1 0.32.0, 2026-06-03 00:00–12:30 (dated by --year 2026)"
    )
