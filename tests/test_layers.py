"""The pipeline's layers (pyproject's [tool.importlinter]): cli -> commands -> render ->
diagnose -> timeline -> scan -> ingest -> model; nothing reaches backwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [exe, "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 2 kept, 0 broken." in proc.stdout


def test_every_stage_is_a_package_with_one_job() -> None:
    pkg = ROOT / "preemptdiag"
    stages = {"model", "ingest", "scan", "timeline", "diagnose", "render", "commands"}
    assert {p.parent.name for p in pkg.glob("*/__init__.py")} == stages
    for stage in stages:
        doc = (pkg / stage / "__init__.py").read_text(encoding="utf-8")
        assert doc.startswith('"""') and len(doc) > 40, stage
    # Only the entry points stay at the top.
    assert sorted(p.name for p in pkg.glob("*.py")) == ["__init__.py", "__main__.py", "cli.py"]
