"""Golden outputs: the markdown and JSON reports of two samples, byte for byte.

Regenerate after an intended change with PREEMPTDIAG_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from preemptdiag import __version__
from preemptdiag.cli import main

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden"
CASES = [
    ("v0_thrash_loop", ["samples/v0_thrash_loop.log"]),
    ("v1_cuda_oom", ["samples/v1_cuda_oom.log"]),
    (
        "host_oom_incident",
        [
            "samples/host_oom_incident/engine.log",
            "samples/host_oom_incident/dmesg.log",
            "samples/host_oom_incident/describe.txt",
        ],
    ),
]


@pytest.mark.parametrize("fmt,ext", [("markdown", "md"), ("json", "json")])
@pytest.mark.parametrize("name,files", CASES, ids=[c[0] for c in CASES])
def test_golden(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    files: list[str],
    fmt: str,
    ext: str,
) -> None:
    monkeypatch.chdir(ROOT)  # evidence paths are relative, as a user would type them
    main(["analyze", "--format", fmt, "--year", "2025", *files])
    out = capsys.readouterr().out.replace(__version__, "VERSION")
    path = GOLDEN / f"{name}.{ext}"
    if os.environ.get("PREEMPTDIAG_UPDATE_GOLDEN"):
        path.write_text(out, encoding="utf-8")
    assert out == path.read_text(encoding="utf-8")
