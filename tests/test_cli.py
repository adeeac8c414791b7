"""Command-line contract: version, explain, signatures, stdin, config, output files."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from builders import Pipe

from preemptdiag import __version__
from preemptdiag.cli import main

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"preemptdiag {__version__}"


def test_python_dash_m_runs_the_cli() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "preemptdiag", "explain", "queueing"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0
    assert r.stdout.startswith("queueing: queueing (admission queue")


def test_explain_class_uses_the_runbook_data(capsys: pytest.CaptureFixture[str]) -> None:
    from preemptdiag.diagnose.runbook import DOCS
    from preemptdiag.model.records import Class

    assert main(["explain", "thrash_loop"]) == 0
    out = capsys.readouterr().out
    doc = DOCS[Class.THRASH_LOOP]
    assert doc.mechanism in out
    assert doc.do_not in out
    assert "1. --max-model-len when one request can fill the pool" in out
    assert "kv_pressure_pct=95.0" in out


def test_explain_signature(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "vllm.v0.preemption"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("vllm.v0.preemption (preemption, vllm")
    assert "Prefilter: 'reempt'" in out


def test_signatures_list_and_test(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["signatures", "list"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert any(line.startswith("vllm.v1.stats ") for line in listing)
    assert main(["signatures", "test"]) == 0
    assert capsys.readouterr().out.strip().endswith("0 problem(s)")


def test_signatures_test_reports_a_broken_user_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "mine.toml").write_text(
        """
[[signature]]
id = "mine.slow"
family = "mine"
engine = "vllm"
kind = "context"
prefilter = ["hello"]
pattern = '''hello (?P<who>\\w+)'''
[signature.fields]
who = "str"
[[signature.match]]
line = "hello world"
fields = { who = "moon" }
"""
    )
    assert main(["signatures", "test", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL mine.slow: field 'who': expected 'moon', got 'world'" in out


def test_user_signature_file_errors_are_precise(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "bad.toml").write_text(
        '[[signature]]\nid = "x.y"\nfamily = "f"\nengine = "vllm"\nkind = "weird"\n'
        'prefilter = ["a"]\npattern = "a"\n'
    )
    log = tmp_path / "a.log"
    log.write_text("a\n")
    assert main(["analyze", "--signatures", str(tmp_path), str(log)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"preemptdiag: error: invalid signature file {tmp_path / 'bad.toml'}")
    assert "signature 'x.y': unknown kind 'weird'" in err


@pytest.mark.parametrize("compress", [False, True])
def test_stdin_is_streamed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, compress: bool
) -> None:
    data = (SAMPLES / "v0_thrash_loop.log").read_bytes()
    pipe = Pipe(gzip.compress(data) if compress else data)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(pipe)))
    assert main(["analyze", "-q", "-"]) == 1
    assert capsys.readouterr().out.startswith("thrash_loop [high]")
    assert pipe.served == len(pipe.data)
    # Same verdict line as the file itself.
    assert main(["analyze", "-q", str(SAMPLES / "v0_thrash_loop.log")]) == 1


def test_a_year_less_log_on_stdin_is_never_dated_after_it_was_read(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Piped on Dec 2, a log of Dec 20 to Jan 9 (no year in vLLM's stamps) was dated to
    # the coming Dec 20 and the next January: stdin has no file time to bound it. Its
    # month-days here come after today's, so they are last year's.
    from builders import healthy_v1_log

    now = datetime.now(UTC).replace(second=0, microsecond=0)
    start = now + timedelta(days=18) - timedelta(days=365)
    log = "\n".join(healthy_v1_log(start, minutes=3 * 24 * 60, every=60)) + "\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Pipe(log.encode()))))
    assert main(["analyze", "--format", "json", "-"]) == 0
    (replica,) = json.loads(capsys.readouterr().out)["replicas"]
    assert replica["dated_by"] == ["the time stdin was read"]
    assert datetime.fromisoformat(replica["end"]) < now
    assert datetime.fromisoformat(replica["start"]).date() == start.date()


def test_several_formats_to_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    code = main(
        [
            "analyze",
            "--year",
            "2025",
            "-f",
            "markdown",
            "-o",
            str(md),
            "-f",
            "json",
            "-o",
            str(js),
            str(SAMPLES / "v1_cuda_oom.log"),
        ]
    )
    assert code == 1
    assert capsys.readouterr().out == ""
    assert md.read_text().startswith("### preemptdiag: allocation_failure (high)")
    assert json.loads(js.read_text())["verdict"]["class"] == "allocation_failure"


def test_config_file_thresholds_and_flags_win(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.preemptdiag]\nfail-on = "queueing"\nwindow = "5m"\n'
        "[tool.preemptdiag.thresholds]\nkv_pressure_pct = 90\n"
    )
    monkeypatch.chdir(tmp_path)
    log = str(SAMPLES / "v1_queueing.log")
    assert main(["analyze", "-f", "json", log]) == 1  # fail-on from the config
    report = json.loads(capsys.readouterr().out)
    assert report["window_seconds"] == 300
    assert report["thresholds"]["kv_pressure_pct"] == 90.0
    assert main(["analyze", "-q", "--fail-on", "thrash_loop", "--window", "60s", log]) == 0
    capsys.readouterr()


def test_config_file_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "preemptdiag.toml"
    cfg.write_text("[thresholds]\nkv_presure = 90\n")
    assert main(["analyze", "--config", str(cfg), str(SAMPLES / "v0_healthy.log")]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}: unknown threshold 'kv_presure'" in err


def test_budget_command_reproduces_the_napkin_math(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "budget",
                "--layers",
                "32",
                "--kv-heads",
                "8",
                "--head-dim",
                "128",
                "--dtype",
                "fp16",
                "--pool-gib",
                "24",
                "--prompt",
                "2000",
                "--output",
                "1500",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "bytes per token = 2 × 32 layers × 8 KV heads × 128 head dim × 2 B = 131,072 B" in out
    assert "KV tokens = 24 GiB × 1024³ / 131,072 B = 196,608" in out
    assert "sustainable concurrency = floor(196,608 / (2,000 + 1,500)) = 56" in out


def test_budget_from_log(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "budget",
                "--from-log",
                str(SAMPLES / "v0_thrash_loop.log"),
                "--prompt",
                "1500",
                "--output",
                "700",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "116,512" in out
    assert "sustainable concurrency     52" in out


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_for_long_inputs_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from preemptdiag.render.progress import progress_factory as _progress_factory

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert _progress_factory(True) is None  # stderr is not a terminal: silent
    monkeypatch.setattr(sys, "stderr", _TTY())
    assert _progress_factory(False) is None  # --quiet
    factory = _progress_factory(True)
    assert factory is not None
    assert factory(1 << 20) is None  # small inputs get no bar
    advance = factory(64 << 20)
    assert callable(advance)
    advance(64 << 20)  # completes and stops the bar without raising


_SHOW_ALLOCATOR = (
    "import os, sys\n"
    "from preemptdiag import cli\n"
    "assert 'polars' not in sys.modules, 'polars imported before run() can set its allocator'\n"
    "cli.main = lambda: print(os.environ.get('_RJEM_MALLOC_CONF')) or 0\n"
    "cli.run()\n"
)


def test_the_console_script_has_polars_return_freed_memory_soon() -> None:
    # polars reads its allocator's settings when it first allocates, so run() sets
    # them before anything imports polars; the default decay (10 s) kept a month of
    # block buffers mapped till the end of the run.
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    r = subprocess.run(
        [sys.executable, "-c", _SHOW_ALLOCATOR], capture_output=True, text=True, env=env
    )
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == "dirty_decay_ms:50,muzzy_decay_ms:0\n"


def test_the_console_script_keeps_a_polars_allocator_setting_the_user_made() -> None:
    env = {**os.environ, "_RJEM_MALLOC_CONF": "narenas:1"}
    r = subprocess.run(
        [sys.executable, "-c", _SHOW_ALLOCATOR], capture_output=True, text=True, env=env
    )
    assert (r.returncode, r.stdout) == (0, "narenas:1\n")


def test_the_console_script_flushes_everything_before_its_fast_exit(tmp_path: Path) -> None:
    # run() ends with os._exit (no freeing of the report object by object): the
    # report must be out whole before it, and the verdict's exit code kept.
    log = SAMPLES / "sglang_thrash.log"
    r = subprocess.run(
        [sys.executable, "-m", "preemptdiag", "analyze", str(log), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 1
    assert r.stderr == ""
    report = json.loads(r.stdout)
    assert report["verdict"]["class"] == "thrash_loop"
    assert len(r.stdout) > 8192  # more than one buffer's worth
