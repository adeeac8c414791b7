"""One incident, many files (issue 13's cases): facts per replica and past the time
filter, a filter that leaves nothing, system evidence outside the engine's span, and
`check` judging the files of one incident together."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from builders import Pipe

import preemptdiag.ingest.spool as spool
from preemptdiag.cli import main

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def analyze(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["analyze", "--format", "json", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, json.loads(out)


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out.splitlines()


def test_two_replicas_the_lever_uses_the_failing_ones_facts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Case 1: the healthy replica's 199,552 KV tokens and cap 64 must not size the
    # thrashing one's lever, whatever year the mtimes suggest.
    code, r = analyze(capsys, str(SAMPLES / "v1_queueing.log"), str(SAMPLES / "v1_thrash_loop.log"))
    lever = r["lever"]
    assert r["verdict"]["replica"].endswith("v1_thrash_loop.log")
    assert (lever["knob"], lever["current"], lever["proposed"]) == ("--max-num-seqs", "256", "78")
    assert lever["arithmetic"][0] == "KV tokens = 215,401 (start-up KV token count)"
    assert code == 1


@pytest.mark.parametrize("since", ["16:07", "2026-11-04 16:07"])
def test_a_time_filter_narrows_windows_not_facts(
    capsys: pytest.CaptureFixture[str], since: str
) -> None:
    # Cases 2 and 3: a bare time is on the log's date; the start-up lines before it
    # still give the config (256) and the capacity (46, not a blind halving).
    code, r = analyze(
        capsys, str(SAMPLES / "v0_thrash_loop.log"), "--since", since, "--until", "16:09"
    )
    lever = r["lever"]
    assert r["verdict"]["class"] == "thrash_loop" and code == 1
    assert (lever["current"], lever["proposed"]) == ("256", "46")
    assert {w["start"][11:16] for w in r["windows"]} == {"16:07", "16:08"}


@pytest.mark.parametrize(("strict", "want"), [((), 0), (("--strict",), 2)])
def test_a_filter_that_leaves_nothing_says_so(
    capsys: pytest.CaptureFixture[str], strict: tuple[str, ...], want: int
) -> None:
    code, r = analyze(capsys, str(SAMPLES / "v0_thrash_loop.log"), "--since", "2027-01-01", *strict)
    v = r["verdict"]
    assert (v["evidence_found"], v["filtered_out"]) == (False, True)
    # (every signal line: its stats lines merged per minute count as the lines they are)
    assert v["why"].startswith("105 event(s) matched, but none fall between 2027-01-01 00:00:00")
    assert "no line matched" not in v["why"]
    assert code == want
    main(["analyze", str(SAMPLES / "v0_thrash_loop.log"), "--since", "2027-01-01"])
    assert "no event in the --since/--until range" in capsys.readouterr().out


def test_a_kernel_kill_months_away_never_drives_the_headline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Case 5: dmesg from 2025-08-19, engine log from 2025-12-09.
    code, r = analyze(
        capsys,
        str(SAMPLES / "v1_thrash_loop.log"),
        str(SAMPLES / "host_oom_incident/dmesg.log"),
        "--year",
        "2025",
    )
    assert r["verdict"]["class"] == "thrash_loop" and code == 1
    assert any(
        n.startswith("8 system event(s) from ")
        and "host_oom_incident/dmesg.log (2025-08-19 18:34" in n
        and "outside every engine log's span" in n
        for n in r["notes"]
    )
    assert all(w["host_ooms"] == 0 for w in r["windows"])


def test_check_judges_a_log_with_its_scrapes_like_analyze(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Case 4: the scrapes sit in another folder; their span is the log's.
    files = [str(SAMPLES / "v1_suspected_no_counter.log")]
    files += [str(p) for p in sorted((SAMPLES / "scrapes").glob("*.prom"))]
    code, lines = check(capsys, *files)
    acode, r = analyze(capsys, *files)
    assert r["verdict"]["class"] == "thrash_loop" and acode == code == 1
    assert len(lines) == 3
    assert all(": thrash_loop [high]" in ln and "-> 63" in ln for ln in lines)
    assert lines[0].endswith("(judged with v1_after.prom, v1_before.prom)")


def test_check_walks_a_folder_and_groups_its_incident(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = check(capsys, str(SAMPLES / "host_oom_incident"))
    assert [ln.split(": ")[0].rsplit("/", 1)[-1] for ln in lines] == [
        "describe.txt",
        "dmesg.log",
        "engine.log",
    ]
    assert all("host_pressure [high]" in ln for ln in lines) and code == 1


def test_check_reads_rotated_files_as_one_log(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = check(capsys, str(SAMPLES / "rotated"))
    assert len(lines) == 3 and all("--max-num-seqs 256 -> 46" in ln for ln in lines)
    assert code == 1


def _stdin(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Pipe(path.read_bytes()))))


@pytest.mark.parametrize("copy", [True, False], ids=["copied", "streamed"])
def test_check_judges_stdin_once_it_has_probed_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, copy: bool
) -> None:
    # check reads a file twice (what it holds, to group it; then its group): stdin
    # was read by the first and found empty by the second, so `check -` of a thrash
    # loop said "no vLLM evidence found" and passed. Now both read its copy; where no
    # copy can be made it is read once, by itself.
    if not copy:
        monkeypatch.setattr(spool.tempfile, "mkstemp", _refused)
    _stdin(monkeypatch, SAMPLES / "v1_thrash_loop.log")
    code, lines = check(capsys, "-", str(SAMPLES / "v0_healthy.log"))
    assert lines[0].startswith("-: thrash_loop [high]") and "--max-num-seqs 256 -> 78" in lines[0]
    assert lines[1].startswith(f"{SAMPLES / 'v0_healthy.log'}: healthy [high]")
    assert len(lines) == 2 and code == 1


def test_check_groups_stdin_with_its_scrapes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # (as test_check_judges_a_log_with_its_scrapes_like_analyze, the log piped: the
    # scrapes join it by their span)
    _stdin(monkeypatch, SAMPLES / "v1_suspected_no_counter.log")
    scrapes = [str(p) for p in sorted((SAMPLES / "scrapes").glob("*.prom"))]
    code, lines = check(capsys, "-", *scrapes)
    assert len(lines) == 3 and code == 1
    assert all(": thrash_loop [high]" in ln and "-> 63" in ln for ln in lines)
    assert lines[0].startswith("-: ") and lines[0].endswith(
        "(judged with v1_after.prom, v1_before.prom)"
    )


def _refused(*_: object, **__: object) -> tuple[int, str]:
    raise PermissionError(13, "Permission denied")


def test_check_explicit_group_and_a_missing_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "a.log"
    shutil.copy(SAMPLES / "v1_suspected_no_counter.log", log)
    before, after = (SAMPLES / "scrapes/v1_before.prom", SAMPLES / "scrapes/v1_after.prom")
    code, lines = check(
        capsys,
        str(tmp_path / "missing.log"),
        f"{log}+{before}+{after}",
        str(SAMPLES / "v0_healthy.log"),
    )
    assert (
        lines[0] == f"{tmp_path / 'missing.log'}: error: {tmp_path / 'missing.log'}: no such file"
    )
    assert lines[1].startswith(f"{log}: thrash_loop [high]")
    assert lines[-1].startswith(f"{SAMPLES / 'v0_healthy.log'}: healthy")
    assert len(lines) == 5
    assert code == 2


def test_each_replica_reports_its_own_facts_whatever_the_filter(
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = [str(SAMPLES / "v1_queueing.log"), str(SAMPLES / "v1_thrash_loop.log")]
    _, r = analyze(capsys, *files, "--year", "2025")
    reps = {x["replica"].rsplit("/", 1)[-1]: x for x in r["replicas"]}
    assert set(reps) == {"v1_queueing.log", "v1_thrash_loop.log"}

    def fact(rep: dict[str, Any], name: str) -> tuple[str, str]:
        f = next(f for f in rep["facts"] if f["name"] == name)
        return f["value"], f["source"].rsplit("/", 1)[-1]

    assert fact(reps["v1_queueing.log"], "max_num_seqs") == ("64", "v1_queueing.log:3")
    assert fact(reps["v1_thrash_loop.log"], "max_num_seqs") == ("256", "v1_thrash_loop.log:3")
    assert fact(reps["v1_thrash_loop.log"], "kv_tokens")[0] == "215401"
    assert reps["v1_thrash_loop.log"]["engine"]["version"] == "0.12.0"
    assert reps["v1_thrash_loop.log"]["dated_by"] == ["--year 2025"]
    # A window filter keeps the facts: they are the replica's, not the window's.
    _, later = analyze(
        capsys, str(SAMPLES / "v1_thrash_loop.log"), "--year", "2025", "--since", "14:10"
    )
    (rep,) = later["replicas"]
    assert fact(rep, "max_num_seqs") == ("256", "v1_thrash_loop.log:3")
    assert rep["start"] < "2025-12-09T14:10"
