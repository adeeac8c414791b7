"""The shipped pre-commit hook, run the way pre-commit runs it, on an incidents repo."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HOOKS_FILE = ROOT / ".pre-commit-hooks.yaml"
SAMPLES = ROOT / "samples"

THRASH = "incidents/vllm-0.log"
HEALTHY = "incidents/vllm-1.log"
NOTES = "incidents/README.md"

# README-ready: the `.pre-commit-config.yaml` of the incidents repo below, verbatim.
# `language: system` runs the preemptdiag the user already installed. The shipped hook
# says `language: python`, which makes pre-commit build a virtualenv and pip-install
# the hook's repository into it: that needs the network, and with `repo: local` there
# is no package to install at all. The other fields must equal the shipped hook's
# (test_readme_config_matches_shipped_hook), so the README cannot drift from it.
README_PRE_COMMIT_CONFIG = """\
repos:
  - repo: local
    hooks:
      - id: preemptdiag
        name: "preemptdiag: diagnose captured incident logs"
        entry: preemptdiag check
        language: system
        files: '\\.(log|txt|prom)(\\.(gz|bz2|xz|zst))?$'
        require_serial: true
        pass_filenames: true
"""

# `FILE: class ...`, the line `preemptdiag check` prints per file.
VERDICT_LINE = re.compile(r"^(?P<file>\S+): (?P<cls>[a-z_]+) ")


def _shipped_hook() -> dict[str, Any]:
    hooks = yaml.safe_load(HOOKS_FILE.read_text(encoding="utf-8"))
    (hook,) = (h for h in hooks if h["id"] == "preemptdiag")
    return dict(hook)


def _readme_hook() -> dict[str, Any]:
    config = yaml.safe_load(README_PRE_COMMIT_CONFIG)
    (repo,) = config["repos"]
    (hook,) = repo["hooks"]
    return dict(hook)


def _env(extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Run this checkout's package even when an older preemptdiag is installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["NO_COLOR"] = "1"
    if extra_path is not None:
        env["PATH"] = os.pathsep.join([str(extra_path), env.get("PATH", "")])
    return env


def _entry_argv(entry: str) -> list[str]:
    """The hook's entry as pre-commit would exec it: split, program looked up on PATH
    (falling back to this interpreter, for a source checkout without the console script)."""
    program, *rest = shlex.split(entry)
    assert program == "preemptdiag"
    exe = shutil.which(program)
    return [exe, *rest] if exe else [sys.executable, "-m", "preemptdiag", *rest]


def _run_hook(
    repo: Path, files: list[str], args: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    # pre-commit execs `entry + args + filenames` from the repository root.
    argv = [*_entry_argv(_shipped_hook()["entry"]), *(args or []), *files]
    return subprocess.run(argv, cwd=repo, env=_env(), capture_output=True, text=True, timeout=120)


def _verdicts(stdout: str) -> list[tuple[str, str]]:
    out = []
    for line in stdout.splitlines():
        m = VERDICT_LINE.match(line)
        assert m, f"not a verdict line: {line!r}"
        out.append((m["file"], m["cls"]))
    return out


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, timeout=60)


@pytest.fixture
def incidents_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "incidents-repo"
    (repo / "incidents").mkdir(parents=True)
    shutil.copyfile(SAMPLES / "v0_thrash_loop.log", repo / THRASH)
    shutil.copyfile(SAMPLES / "v0_healthy.log", repo / HEALTHY)
    # Mentions a failure class but is no log: the hook's `files` must leave it out.
    (repo / NOTES).write_text("Postmortem notes: thrash_loop on vllm-0.\n", encoding="utf-8")
    (repo / ".pre-commit-config.yaml").write_text(README_PRE_COMMIT_CONFIG, encoding="utf-8")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")  # pre-commit --all-files runs on tracked files only
    return repo


# ---------------------------------------------------------------- the hook definition


def test_shipped_hook_definition() -> None:
    hook = _shipped_hook()
    assert hook["id"] == "preemptdiag"
    assert hook["name"] == "preemptdiag: diagnose captured incident logs"
    assert hook["entry"] == "preemptdiag check"
    assert hook["language"] == "python"
    assert hook["require_serial"] is True
    assert hook["pass_filenames"] is True


@pytest.mark.parametrize(
    ("path", "selected"),
    [
        ("incidents/vllm-0.log", True),
        ("incidents/vllm-0.log.gz", True),
        ("incidents/dmesg.txt", True),
        ("incidents/scrape-1.prom", True),
        ("incidents/scrape-1.prom.gz", True),
        ("incidents/README.md", False),
        ("incidents/bundle.tar.gz", False),
        ("incidents/vllm-0.logs", False),
    ],
)
def test_hook_files_pattern(path: str, selected: bool) -> None:
    # pre-commit applies `files` with re.search to the repo-relative path.
    assert bool(re.search(_shipped_hook()["files"], path)) is selected


def test_readme_config_matches_shipped_hook() -> None:
    shipped = _shipped_hook()
    readme = _readme_hook()
    assert readme["language"] == "system"
    shared = ("id", "name", "entry", "files", "require_serial", "pass_filenames")
    assert set(readme) == {"language", *shared}
    for key in shared:
        assert readme[key] == shipped[key], key


# ---------------------------------------------------------------- the entry, as pre-commit runs it


def test_entry_fails_when_a_thrash_log_is_included(incidents_repo: Path) -> None:
    proc = _run_hook(incidents_repo, [THRASH, HEALTHY])
    assert proc.returncode == 1, proc.stderr
    assert _verdicts(proc.stdout) == [(THRASH, "thrash_loop"), (HEALTHY, "healthy")]
    assert proc.stderr == ""


def test_entry_passes_with_only_the_healthy_log(incidents_repo: Path) -> None:
    proc = _run_hook(incidents_repo, [HEALTHY])
    assert proc.returncode == 0, proc.stderr
    assert _verdicts(proc.stdout) == [(HEALTHY, "healthy")]


def test_hook_args_change_fail_on(incidents_repo: Path) -> None:
    # `args:` in a user's config go between the entry and the file names.
    proc = _run_hook(incidents_repo, [THRASH], ["--fail-on", "allocation_failure"])
    assert proc.returncode == 0, proc.stderr
    assert _verdicts(proc.stdout) == [(THRASH, "thrash_loop")]


# ---------------------------------------------------------------- pre-commit itself


def _pre_commit(repo: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if shutil.which("preemptdiag") is None:
        # `language: system` needs `preemptdiag` on PATH; a source checkout has no
        # console script, so stand in for it with this interpreter.
        shim = bin_dir / "preemptdiag"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m preemptdiag "$@"\n')
        shim.chmod(0o755)
    env = _env(bin_dir)
    env["PRE_COMMIT_HOME"] = str(tmp_path / "pre-commit-home")  # not ~/.cache/pre-commit
    env.pop("PRE_COMMIT", None)
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--color", "never", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_pre_commit_run_all_files_fails_on_the_thrash_log(
    incidents_repo: Path, tmp_path: Path
) -> None:
    proc = _pre_commit(incidents_repo, tmp_path, "--all-files")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert re.search(r"^preemptdiag: diagnose captured incident logs\.+Failed$", out, re.M), out
    assert "- hook id: preemptdiag\n- exit code: 1\n" in out
    verdicts = [ln for ln in out.splitlines() if ln.startswith("incidents/")]
    # pre-commit passes the files in `git ls-files` order.
    assert _verdicts("\n".join(verdicts)) == [(THRASH, "thrash_loop"), (HEALTHY, "healthy")]
    assert NOTES not in out


def test_pre_commit_run_passes_on_the_healthy_log(incidents_repo: Path, tmp_path: Path) -> None:
    proc = _pre_commit(incidents_repo, tmp_path, "--files", HEALTHY, NOTES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^preemptdiag: diagnose captured incident logs\.+Passed$", proc.stdout, re.M)


def test_pre_commit_run_judges_a_log_with_the_scrapes_beside_it(tmp_path: Path) -> None:
    # The log alone is only suspected (a V1 log cannot show preemptions); the scrapes
    # committed next to it make it a thrash loop, as `analyze` of the three says.
    repo = tmp_path / "scraped-repo"
    inc = repo / "incidents" / "2025-07-15"
    inc.mkdir(parents=True)
    shutil.copy(SAMPLES / "v1_suspected_no_counter.log", inc / "vllm.log")
    for name in ("v1_before.prom", "v1_after.prom"):
        shutil.copy(SAMPLES / "scrapes" / name, inc / name)
    (repo / ".pre-commit-config.yaml").write_text(README_PRE_COMMIT_CONFIG, encoding="utf-8")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    proc = _pre_commit(repo, tmp_path, "--all-files")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("incidents/")]
    assert sorted(_verdicts("\n".join(lines))) == [
        ("incidents/2025-07-15/v1_after.prom", "thrash_loop"),
        ("incidents/2025-07-15/v1_before.prom", "thrash_loop"),
        ("incidents/2025-07-15/vllm.log", "thrash_loop"),
    ]
