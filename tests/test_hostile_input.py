"""Hostile and damaged values (issue 15's exit-3 causes): every one is a clear one-line
error or a clean partial result, never an internal error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from preemptdiag.cli import main

ROOT = Path(__file__).resolve().parents[1]
V1_STATS = (
    "(APIServer pid=1) INFO 06-16 17:21:{s} [loggers.py:1] Engine 000: Avg prompt throughput: "
    "1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
    "GPU KV cache usage: 1.0%"
)
KILL = (
    "Out of memory: Killed process 123 (python3) total-vm:1kB, anon-rss:1kB, file-rss:0kB, "
    "shmem-rss:0kB"
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in out + err
    return code, out, err


def report(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code, out, _ = run(capsys, "analyze", "--format", "json", *argv)
    assert code in (0, 1)
    data: dict[str, object] = json.loads(out)
    return data


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("leap_second", V1_STATS.format(s="60")),
        ("go_zero_time", "0001-01-01T00:00:00+01:00 " + V1_STATS.format(s="00")),
        ("year_10000", "9999-12-31T23:59:59-05:00 " + V1_STATS.format(s="00")),
        (
            "docker_bad_offset",
            json.dumps(
                {"log": V1_STATS.format(s="00") + "\n", "time": "2025-01-01T00:00:00+ab:cd"}
            ),
        ),
        ("german_syslog_month", f"Okt 22 15:35:31 host kernel: {KILL}"),
        ("spanish_syslog_month", f"Dic 22 15:35:31 host kernel: {KILL}"),
        ("huge_dmesg_uptime", f"[99999999999999.5] {KILL}"),
        ("impossible_date", V1_STATS.format(s="00").replace("06-16", "13-45")),
    ],
)
def test_damaged_stamps_are_no_stamps(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, line: str
) -> None:
    log = tmp_path / f"{name}.log"
    log.write_text(line + "\n")
    r = report(capsys, str(log), "--year", "2025")
    assert r["verdict"]["evidence_found"] is True  # type: ignore[index]


def test_localised_syslog_months_are_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"Okt 22 15:35:31 host kernel: {KILL}\n")
    r = report(capsys, str(log), "--year", "2025")
    assert r["verdict"]["class"] == "host_pressure"  # type: ignore[index]
    assert str(r["verdict"]["start"]).startswith("2025-10-22T15:35")  # type: ignore[index]


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--window", "inf", "window must be at most 7 days: 'inf'"),
        ("--window", "nan", "window must be at most 7 days: 'nan'"),
        ("--window", "1e20", "window must be at most 7 days: '1e20'"),
        ("--tz", "+25:00", "--tz: not a UTC offset: '+25:00' (from -23:59 to +23:59)"),
        ("--since", "2025-01-01T00:00+ab:cd", "--since: not a date/time: '2025-01-01T00:00+ab:cd'"),
    ],
)
def test_bad_flag_values_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, value: str, message: str
) -> None:
    log = tmp_path / "a.log"
    log.write_text(V1_STATS.format(s="00") + "\n")
    code, _, err = run(capsys, "analyze", str(log), flag, value)
    assert code == 2
    assert err.startswith(f"preemptdiag: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("file", "text", "message"),
    [
        ("preemptdiag.toml", "fail-on = 5\n", "fail-on must be a class name or a list of them"),
        (
            "preemptdiag.toml",
            "[thresholds]\nheadroom = nan\n",
            "'headroom' must be a finite number",
        ),
        (
            "preemptdiag.toml",
            "[thresholds]\nheadroom = 0\n",
            "'headroom' must be between 0.05 and 1",
        ),
        ("preemptdiag.toml", 'windw = "60s"\n', "unknown key 'windw'"),
    ],
)
def test_bad_config_is_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    file: str,
    text: str,
    message: str,
) -> None:
    (tmp_path / file).write_text(text)
    (tmp_path / "a.log").write_text(V1_STATS.format(s="00") + "\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "analyze", "a.log")
    assert code == 2 and message in err and err.count("\n") == 1


def test_an_unrelated_broken_pyproject_is_not_ours(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text('tool = "x"\n')
    (tmp_path / "a.log").write_text(V1_STATS.format(s="00") + "\n")
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "analyze", "a.log")[0] == 0
    (tmp_path / "pyproject.toml").write_text("[tool\n")  # not TOML at all
    assert run(capsys, "analyze", "a.log")[0] == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('fields = "oops"\n', "'fields' must be a table"),
        ('priority = "high"\n', "'priority' must be a whole number"),
        ("[[signature.match]]\nfields = {}\n", "needs a 'line'"),
    ],
)
def test_wrong_types_in_a_user_signature_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, body: str, message: str
) -> None:
    d = tmp_path / "sigs"
    d.mkdir()
    head = 'id = "x"\nfamily = "f"\nengine = "v"\nkind = "context"\nprefilter = ["abc"]\npattern = "abc"\n'
    match = "" if "signature.match" in body else '[[signature.match]]\nline = "abc"\n'
    (d / "a.toml").write_text("[[signature]]\n" + head + body + match)
    (tmp_path / "a.log").write_text("abc\n")
    code, _, err = run(capsys, "analyze", str(tmp_path / "a.log"), "--signatures", str(d))
    assert code == 2 and message in err


def test_a_user_field_that_will_not_convert_is_a_counted_skip(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    d = tmp_path / "sigs"
    d.mkdir()
    (d / "a.toml").write_text(
        '[[signature]]\nid = "x"\nfamily = "f"\nengine = "v"\nkind = "context"\n'
        'prefilter = ["abc"]\npattern = "abc(?P<n>[a-z]+)"\n[signature.fields]\nn = "int"\n'
        '[[signature.match]]\nline = "abc1"\n'
    )
    (tmp_path / "a.log").write_text("abcxyz\n")
    r = report(capsys, str(tmp_path / "a.log"), "--signatures", str(d))
    assert r["scan"]["skipped"] == {"unreadable value: x": 1}  # type: ignore[index]


def _cli(args: list[str], stdout: object) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "preemptdiag", *args],
        env=env, text=True, stdout=stdout, stderr=subprocess.PIPE, timeout=60,
    )  # fmt: skip


def test_stdout_full_or_closed_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text(V1_STATS.format(s="00") + "\n")
    with open("/dev/full", "w") as full:
        p = _cli(["analyze", str(log)], stdout=full)
    assert p.returncode == 2
    assert (
        p.stderr
        == "preemptdiag: error: cannot write the report to stdout: No space left on device\n"
    )
    p = _cli(["analyze", str(log)], stdout=subprocess.DEVNULL)
    assert p.returncode == 0


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["analyze", "--help"]])
def test_help_to_a_full_disk_is_one_line(args: list[str]) -> None:
    # click writes help and version text itself; a full disk there was an internal
    # error block (exit 3) before.
    with open("/dev/full", "w") as full:
        p = _cli(args, stdout=full)
    assert (p.returncode, p.stderr) == (
        2,
        "preemptdiag: error: cannot write the output: No space left on device\n",
    )


def test_text_left_in_the_buffer_at_exit_is_not_lost_silently() -> None:
    # The console script's last flush (run): what a command left buffered and could
    # not write makes the exit an error, not the command's own code.
    script = (
        "import sys\n"
        "from preemptdiag import cli\n"
        "cli.main = lambda: sys.stdout.write('verdict\\n') and 0\n"
        "cli.run()\n"
    )
    # Buffered, as a redirected stdout is by default (the write itself would fail)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(ROOT)
    with open("/dev/full", "w") as full:
        p = subprocess.run(
            [sys.executable, "-c", script],
            env=env, text=True, stdout=full, stderr=subprocess.PIPE, timeout=60,
        )  # fmt: skip
    assert (p.returncode, p.stderr) == (
        2,
        "preemptdiag: error: cannot write the output: No space left on device\n",
    )
    p = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert (p.returncode, p.stdout, p.stderr) == (0, "verdict\n", "")


def test_stdout_closed_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text(V1_STATS.format(s="00") + "\n")
    p = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -m preemptdiag analyze "{log}" >&-'],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert (
        p.stderr == "preemptdiag: error: cannot write the report: stdout is closed (use -o FILE)\n"
    )


def test_stdout_and_stderr_closed_leave_the_exit_code_to_speak(tmp_path: Path) -> None:
    # Nowhere to say the error either: the code is still the stdout-closed 2, not a
    # crash in the error handler (1), and a report sent to -o is still the verdict.
    log = tmp_path / "a.log"
    log.write_text(V1_STATS.format(s="00") + "\n")
    out = tmp_path / "r.md"
    py = f'"{sys.executable}" -m preemptdiag analyze'
    thrash = ROOT / "samples" / "v0_thrash_loop.log"
    for cmd, code in (
        (f'{py} "{log}" >&- 2>&-', 2),
        (f'{py} "{thrash}" -o "{out}" --format markdown >&- 2>&-', 1),
    ):
        p = subprocess.run(
            ["sh", "-c", cmd],
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            timeout=60,
        )
        assert (p.returncode, p.stdout, p.stderr) == (code, b"", b""), cmd
    assert out.read_text().startswith("### preemptdiag: thrash_loop (high)\n")


def test_a_configured_concurrency_threshold_never_raises_the_context_length() -> None:
    from builders import make_window

    from preemptdiag.diagnose.advice import choose_lever
    from preemptdiag.model.config import Thresholds
    from preemptdiag.model.records import Class, Confidence, EngineInfo, Verdict
    from preemptdiag.timeline.knobs import Facts

    # 116,512 KV tokens / 2 = 58,256 would be a *raise* from 8,192.
    facts = Facts(knobs={"max_model_len": "8192"}, kv_tokens=116_512, max_concurrency=14.2)
    w = make_window(
        0, preemptions=9.0, kv_max=99.0, running_max=50, kv_peak_running=50, cls=Class.THRASH_LOOP
    )
    v = Verdict(Class.THRASH_LOOP, Confidence.HIGH, None, None, "a", "x", ())
    thr = Thresholds(single_request_concurrency=16.0)
    lever = choose_lever(v, [w], [], facts, EngineInfo("vllm", "v0", "0.6.3"), thr)
    assert lever.knob == "--max-num-seqs"
    assert lever.proposed is not None and int(lever.proposed) < 50


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-f", "json", "-o", "{log}"], "-o {log}: that is an input file; it would be overwritten"),
        (
            ["-f", "json", "-o", "{link}"],
            "-o {link}: that is an input file; it would be overwritten",
        ),
        (
            ["-o", "{d}/a.json", "-o", "{d}/./a.json"],
            "-o {d}/a.json: named twice; one report per file",
        ),
        (
            ["-f", "terminal", "-f", "markdown", "-o", "{d}/r2.md"],
            "-o {d}/r2.md is markdown by its name but pairs with --format terminal",
        ),
        (["-o", "{d}/r.weird"], "-o {d}/r.weird: cannot tell the format from the name"),
    ],
    ids=["input", "input_via_link", "twice", "mismatch", "unknown_suffix"],
)
def test_outputs_never_overwrite_inputs_and_agree_with_their_format(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    log = tmp_path / "x.log"
    log.write_text(V1_STATS.format(s="00") + "\n")
    (tmp_path / "link.log").symlink_to(log)
    names = {"log": str(log), "link": str(tmp_path / "link.log"), "d": str(tmp_path)}
    code, _, err = run(capsys, "analyze", *(a.format(**names) for a in argv), str(log))
    assert code == 2 and err.startswith("preemptdiag: error: " + message.format(**names))
    assert log.read_text() == V1_STATS.format(s="00") + "\n"


def test_an_output_takes_its_format_from_its_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "x.log"
    log.write_text(V1_STATS.format(s="00") + "\n")
    code, out, _ = run(
        capsys, "analyze", "-o", str(tmp_path / "r.json"), "-o", str(tmp_path / "r.md"), str(log)
    )
    assert code == 0 and out == ""
    assert json.loads((tmp_path / "r.json").read_text())["schema"] == "preemptdiag/report"
    assert (tmp_path / "r.md").read_text().startswith("### preemptdiag: healthy")


@pytest.mark.parametrize(
    ("year", "ok"), [("0", False), ("-5", False), ("99999", False), ("2025", True)]
)
def test_year_is_a_plausible_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, year: str, ok: bool
) -> None:
    log = tmp_path / "a.log"
    log.write_text(V1_STATS.format(s="00") + "\n")
    code, _, err = run(capsys, "analyze", str(log), "--year", year)
    assert (code == 0) is ok
    if not ok:
        assert err == f"preemptdiag: error: --year must be between 1970 and 9000, not {year}\n"


def test_nul_runs_a_crash_left_are_skipped_and_counted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # What a node that crashed mid-write leaves: the log, then a run of NUL bytes, then
    # the lines written after the restart.
    log = tmp_path / "crashed.log"
    text = "\n".join(V1_STATS.format(s=f"{s:02d}") for s in range(0, 50, 10))
    log.write_bytes(
        b"\x00" * 4096 + text.encode() + b"\n" + b"\x00" * 100_000 + b"\n" + text.encode() + b"\n"
    )
    r = report(capsys, str(log), "--year", "2025")
    assert r["scan"]["skipped"] == {"NUL bytes (a crash's padding)": 104_096}  # type: ignore[index]
    assert r["scan"]["recognised"] == {"stats": 10}  # type: ignore[index]


def test_a_reversed_log_counts_preemptions_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Out-of-order lines must not read as counter restarts (251, not 506).
    lines = (ROOT / "samples" / "v0_thrash_loop.log").read_text().splitlines()
    rev = tmp_path / "reversed.log"
    rev.write_text("\n".join(reversed(lines)) + "\n")
    r = report(capsys, str(rev), "--year", "2025")
    assert r["verdict"]["class"] == "thrash_loop"  # type: ignore[index]
    assert round(sum(w["preemptions"] for w in r["windows"])) == 251  # type: ignore[index, union-attr]


@pytest.mark.parametrize(
    "value", ["99999999999999999999999999999999999999999", "1" + "0" * 400, "1500000000000000000.5"]
)
def test_throughputs_and_shares_past_any_engine_are_counted_skips(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str
) -> None:
    # Found by bench/fuzz.py: a 40-digit throughput was summed into the window mean,
    # whose last digits then depended on the order of the sum (rollups on or off).
    num = value
    lines = [V1_STATS.format(s=f"{s:02d}") for s in range(0, 60, 10)]
    lines[2] = lines[2].replace("2.0 tokens/s", f"{num} tokens/s")
    lines[3] = lines[3].replace("usage: 1.0%", f"usage: {num}%")
    log = tmp_path / "huge.log"
    log.write_text("\n".join(lines) + "\n")
    r = report(capsys, str(log), "--year", "2025")
    assert r["scan"]["skipped"] == {"unreadable value: vllm.v1.stats": 2}  # type: ignore[index]
    assert r["scan"]["recognised"] == {"stats": 4}  # type: ignore[index]


def _user_sig(tmp_path: Path, pattern: str, example: str = "abc") -> Path:
    d = tmp_path / "sigs"
    d.mkdir(exist_ok=True)
    (d / "a.toml").write_text(
        '[[signature]]\nid = "slow"\nfamily = "f"\nengine = "v"\nkind = "context"\n'
        f"prefilter = [\"abc\"]\npattern = '''{pattern}'''\n"
        f'[[signature.match]]\nline = "{example}"\n'
    )
    return d


@pytest.mark.parametrize(
    "pattern", [r"abc(?:a|aa)+$", r"abc((a+))+b", r"abc(\w+\s?)+$", r"abc(?:a{1,30}){1,30}b"]
)
def test_patterns_that_can_backtrack_without_end_are_refused_at_load(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, pattern: str
) -> None:
    d = _user_sig(tmp_path, pattern, "abcaab")
    (tmp_path / "a.log").write_text("abc\n")
    code, _, err = run(capsys, "analyze", str(tmp_path / "a.log"), "--signatures", str(d))
    assert code == 2
    assert err.strip() == (
        f"preemptdiag: error: invalid signature file {d / 'a.toml'}: signature 'slow': "
        "pattern has a nested unbounded quantifier (catastrophic backtracking)"
    )


def test_a_slow_user_pattern_is_bounded_per_line_and_per_run_and_counted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polynomial, not exponential (no repeated group): past the static check, but
    # a 3,000-character line of a's takes it minutes. Each line gets its slice of
    # time, the run a budget; every line it could not judge is counted.
    import time

    import preemptdiag.scan.signatures as sigmod

    monkeypatch.setattr(sigmod, "USER_REGEX_TIMEOUT_S", 0.02)
    monkeypatch.setattr(sigmod, "USER_REGEX_BUDGET_S", 0.2)
    d = _user_sig(tmp_path, "abc" + "a*" * 8 + "b")
    (tmp_path / "a.log").write_text(("abc" + "a" * 3000 + "\n") * 40 + V1_STATS.format(s="00"))
    t0 = time.monotonic()
    r = report(capsys, str(tmp_path / "a.log"), "--signatures", str(d), "--year", "2025")
    assert time.monotonic() - t0 < 10
    assert r["scan"]["skipped"] == {"regex timed out: slow": 40}  # type: ignore[index]
    assert r["scan"]["recognised"] == {"stats": 1}  # type: ignore[index]


def test_thousands_of_records_glued_on_one_line_take_linear_time(tmp_path: Path) -> None:
    # Each match once searched the line from its start (its record, stamp and
    # process tag) and tested the whole line for "[repeated": quadratic, 46 s for
    # 1,000 records. Each match still gets its own record's stamp.
    import time

    from preemptdiag.ingest.sources import open_source
    from preemptdiag.scan.matcher import Matcher
    from preemptdiag.scan.passes import scan_fast
    from preemptdiag.scan.signatures import load

    log = tmp_path / "glued.log"
    log.write_text("".join(V1_STATS.format(s=f"{s % 60:02d}") for s in range(4000)) + "\n")
    t0 = time.monotonic()
    result = scan_fast(open_source(str(log)), Matcher(load()))
    assert time.monotonic() - t0 < 8  # ~0.2 s; the quadratic scan took over 30 s
    assert len(result.hits) == 4000
    assert [h.ts_engine for h in result.hits[:3]] == [
        "06-16 17:21:00",
        "06-16 17:21:01",
        "06-16 17:21:02",
    ]
    assert {h.proc for h in result.hits} == {"APIServer"}


# --- leaks, injection, usage, interrupts -------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "\x1b]0;pwn\x07xy",  # OSC 0: the terminal's title
        "\x1b]52;c;Zm9v\x07xy",  # OSC 52: writes the clipboard
        "\x1b[31mx\x1b[0my\x07",  # colour and a bell
        "xy\x9b2J",  # 8-bit CSI: clear the screen
    ],
    ids=["osc_title", "osc_clipboard", "ansi_bell", "c1_csi"],
)
def test_terminal_escapes_in_a_process_name_reach_no_format(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    # The kernel prints the process name, which any local user picks.
    log = tmp_path / "kern.log"
    log.write_text(f"Okt 22 15:35:31 host kernel: {KILL.replace('(python3)', f'({name})')}\n")
    outs = {f: tmp_path / f"r.{f}" for f in ("terminal", "markdown", "json", "sarif")}
    argv = ["analyze", str(log), "--year", "2025", "--color", "never"]
    for f, o in outs.items():
        argv += ["-f", f, "-o", str(o)]
    code, _, err = run(capsys, *argv)
    assert code in (0, 1)
    texts = {f: o.read_text() for f, o in outs.items()}
    for f, text in texts.items():
        for bad in ("\x1b", "\x07", "\x9b", "\\u001b", "\\u0007", "\\u009b"):
            assert bad not in text, (f, bad)
    data = json.loads(texts["json"])
    assert "killed xy" in data["verdict"]["why"]
    assert "\x1b" not in err


def test_a_refusal_quoting_a_log_line_is_redacted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    scrape = tmp_path / "metrics.prom"
    scrape.write_text(
        "# TYPE vllm:num_preemptions_total counter\n"
        'vllm:num_preemptions_total{engine="0"} 3\n'
        '{"prompt": "my secret plan", "api_key": "sk-proj-abcdef1234567890"}\n'
    )
    code, _, err = run(capsys, "analyze", str(scrape))
    assert code == 2
    assert "not valid Prometheus text exposition" in err
    assert "secret plan" not in err and "abcdef1234567890" not in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["analyze", "--jobs", "x", "a.log"], "Invalid value for '--jobs' / '-j': 'x'"),
        (["analyze", "--bogus", "a.log"], "No such option: --bogus"),
        # files are optional to click since --prometheus can stand alone: ours says it
        (["analyze"], "Invalid value for 'FILES...': pass one or more logs, - for stdin"),
        (["compare", "a.log"], "Missing argument"),
        (["budget", "--headroom", "much"], "Invalid value for '--headroom'"),
    ],
)
def test_click_usage_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("preemptdiag: error: ") and message in lines[0]
    assert lines[0].endswith(f"(see preemptdiag {argv[0]} --help)")


@pytest.mark.parametrize(
    "argv", [["check", "-", "-"], ["check", "--", "-+-"], ["compare", "-", "-"]], ids=str
)
def test_check_and_compare_read_stdin_once(argv: list[str]) -> None:
    p = _cli(argv, subprocess.PIPE)
    assert p.returncode == 2
    assert p.stderr == "preemptdiag: error: stdin (-) can be read only once; pass it once\n"


def test_ctrl_c_with_jobs_stops_at_once_with_one_line(tmp_path: Path) -> None:
    # Every queued range used to be scanned first (18-28 s), and each worker printed
    # a traceback of its own. Ranges forced onto a few MiB (the threshold is 64 MiB),
    # read line by line (~10 s: the lanes read this log in ~2 s, too close to the
    # interrupt). The run's SIGINT is Python's own even where the suite was started
    # with it ignored (a shell's background job: Python leaves it ignored, and the run
    # went on to its end).
    import signal
    import time

    from builders import bench_module

    log = tmp_path / "dense.log"
    with log.open("wb") as f:
        bench_module("generate").generate_dense(f, 48 << 20, seed=1)
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "import sys; import preemptdiag.scan.parallel as p; p.PARALLEL_MIN_BYTES = 1; "
        "import preemptdiag.scan.lane as lane; lane.ENABLED = False; "
        "from preemptdiag.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "analyze", str(log), "--jobs", "2", "-f", "json",
         "--max-events", "0"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    time.sleep(1.5)
    assert proc.poll() is None, "finished before the interrupt: make the log bigger"
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 5
    assert proc.returncode == 130
    assert err == "preemptdiag: interrupted\n"
    time.sleep(0.2)
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True)
    assert left.stdout == ""  # no orphan workers


def test_glued_records_without_record_marks_take_linear_time(tmp_path: Path) -> None:
    # Found by bench/fuzz.py: glued records with no vLLM level-and-stamp mark are one
    # record to record_text, which looked for the next mark to the line's end and
    # copied the whole line again for every match (a 10 MB input ran past 120 s).
    import time

    from preemptdiag.ingest.sources import open_source
    from preemptdiag.scan.matcher import MAX_EVIDENCE_CHARS, Matcher
    from preemptdiag.scan.passes import scan_fast
    from preemptdiag.scan.signatures import load

    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 3 has "
        "a total capacity of 184.00 GiB of which 2.21 GiB is free. "
    )
    log = tmp_path / "glued.log"
    log.write_text(oom * 3000 + "\n")
    t0 = time.monotonic()
    result = scan_fast(open_source(str(log)), Matcher(load()))
    assert time.monotonic() - t0 < 15  # ~1 s
    assert len(result.hits) == 3000
    assert all(len(h.text) <= MAX_EVIDENCE_CHARS + 2 for h in result.hits)


@pytest.mark.parametrize("digits", [19, 400, 5000])
def test_seed_9091_index_733_a_ray_repeat_count_past_64_bits_is_no_repeat_marker(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, digits: int
) -> None:
    # Found by bench/fuzz.py (seed 9091, input 733): `[repeated 444…x across cluster]`
    # with 400 digits multiplied a warning's preemption into an int past any float
    # (OverflowError, exit 3); 5000 digits are past int()'s own limit. No count Ray
    # prints has more than 18 digits: the marker is not read, the line counts once.
    warn = (
        "WARNING 06-16 17:21:00 scheduler.py:1481] Sequence group 1 is preempted by "
        "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
        "total_num_cumulative_preemption=1"
    )
    log = tmp_path / "repeated.log"
    log.write_text(f"{warn} [repeated {'4' * digits}x across cluster]\n")
    r = report(capsys, str(log), "--year", "2025")
    assert sum(w["preemptions"] for w in r["windows"]) == 1  # type: ignore[index, union-attr]
