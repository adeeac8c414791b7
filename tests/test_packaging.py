"""The installed package (CI installs it non-editable) must carry its signatures."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import preemptdiag
from preemptdiag.scan.signatures import builtin_dir, load_dir

REPO_SIGNATURES = Path(__file__).resolve().parents[1] / "signatures"


def test_builtin_signatures_are_the_repository_ones() -> None:
    installed = "site-packages" in Path(preemptdiag.__file__).parts
    where = builtin_dir()
    if installed:
        assert where.name == "_signatures" and where.parent == Path(preemptdiag.__file__).parent
    ids = sorted(s.id for s in load_dir(where, builtin=True))
    assert ids == sorted(s.id for s in load_dir(REPO_SIGNATURES, builtin=True))
    assert len(ids) > 80


def test_console_script_runs_from_an_unrelated_directory(tmp_path: Path) -> None:
    exe = shutil.which("preemptdiag", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "preemptdiag"]
    r = subprocess.run(
        [*cmd, "signatures", "list"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    assert "vllm.v0.preemption" in r.stdout


def test_data_files_inside_the_package_are_installed(tmp_path: Path) -> None:
    # The model table and the window rules' cases live beside their modules.
    exe = shutil.which("preemptdiag", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "preemptdiag"]
    r = subprocess.run(
        [*cmd, "explain", "PD110"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    assert "+ a calm minute" in r.stdout
    r = subprocess.run(
        [*cmd, "budget", "--model", "llama-3.1-8b", "--pool-gib", "24", "--prompt", "2000",
         "--output", "1500"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
