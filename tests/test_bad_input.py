"""The bad-input table (README "Bad input"): every row is a case here.

Each case gets a clear one-line error (exit 2) or a clean partial result with a
count of what was skipped — never a traceback.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
from pathlib import Path

import pytest

from preemptdiag.cli import main

V0_PREEMPT = (
    "WARNING 09-11 17:21:29 scheduler.py:1560] Sequence group cmpl-1 is preempted by "
    "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can "
    "affect the end-to-end performance. Increase gpu_memory_utilization or "
    "tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=1"
)
V0_STATS = (
    "INFO 09-11 17:21:{s:02d} metrics.py:351] Avg prompt throughput: 10.0 tokens/s, "
    "Avg generation throughput: 50.0 tokens/s, Running: 4 reqs, Swapped: 0 reqs, "
    "Pending: 0 reqs, GPU KV cache usage: 40.0%, CPU KV cache usage: 0.0%."
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("preemptdiag: error: ")
    return lines[0]


def analyze_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code, out, _ = run(capsys, "analyze", "--format", "json", "--year", "2024", *argv)
    return code, json.loads(out)


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "analyze", str(tmp_path / "nope.log"))
    assert code == 2
    assert one_line_error(err).endswith("nope.log: no such file")


def test_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "analyze", str(tmp_path))
    assert code == 2
    assert "is a directory" in one_line_error(err)


def test_unreadable_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "secret.log"
    p.write_text(V0_PREEMPT + "\n")
    # Root reads anything, so take read permission away where the check happens.
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    code, _, err = run(capsys, "analyze", str(p))
    assert code == 2
    assert one_line_error(err).endswith("secret.log: permission denied")


def test_file_removed_while_being_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # logrotate moves the file between the sniff and the scan.
    import preemptdiag.commands.analyze as analyze

    p = tmp_path / "vllm.log"
    p.write_text(V0_PREEMPT + "\n")
    real_open_source = analyze.open_source

    def sniff_then_rotate(name: str) -> object:
        src = real_open_source(name)
        p.rename(tmp_path / "vllm.log.1")
        return src

    monkeypatch.setattr(analyze, "open_source", sniff_then_rotate)
    code, _, err = run(capsys, "analyze", str(p))
    assert code == 2
    assert one_line_error(err).endswith("vllm.log: no such file (removed while being read)")


def test_empty_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "empty.log"
    p.write_bytes(b"")
    code, report = analyze_json(capsys, str(p))
    assert code == 0
    assert report["verdict"]["evidence_found"] is False
    assert "the input was empty" in report["notes"]
    code, _, _ = run(capsys, "analyze", "--strict", str(p))
    assert code == 2


def test_binary_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "core.bin"
    p.write_bytes(bytes(range(256)) * 400)
    code, _, err = run(capsys, "analyze", str(p))
    assert code == 2
    assert one_line_error(err).endswith("core.bin: looks like a binary file, not a text log")


def test_invalid_utf8_is_counted_and_still_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    p = tmp_path / "latin1.log"
    p.write_bytes(b"caf\xe9 \xff\xfe " + V0_PREEMPT.encode() + b"\n")
    code, report = analyze_json(capsys, str(p))
    assert code == 0
    assert report["verdict"]["class"] == "benign_preemption"
    assert report["scan"]["skipped"] == {"invalid UTF-8 (replaced)": 1}


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"], ids=["crlf", "cr-only"])
def test_crlf_and_cr_only_line_ends(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, eol: bytes
) -> None:
    lines = [V0_STATS.format(s=s).encode() for s in range(0, 30, 5)] + [V0_PREEMPT.encode()]
    p = tmp_path / "eol.log"
    p.write_bytes(eol.join(lines) + eol)
    code, report = analyze_json(capsys, str(p))
    assert code == 0
    assert report["scan"]["lines_read"] == 7
    assert report["verdict"]["class"] == "benign_preemption"
    preempt = [e for e in report["verdict"]["evidence"] if e["kind"] == "preemption"]
    assert [e["line"] for e in preempt] == [7]


def test_fifty_megabyte_single_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "huge.log"
    with p.open("wb") as f:
        f.write(b"x" * (50 << 20) + b" is preempted by junk\n")
        f.write(V0_PREEMPT.encode() + b"\n")
    code, report = analyze_json(capsys, str(p))
    assert code == 0
    assert report["scan"]["skipped"] == {"over-long line cut to 1 MiB": 1}
    assert report["verdict"]["class"] == "benign_preemption"
    assert [e["line"] for e in report["verdict"]["evidence"]] == [2]


def test_truncated_gzip_keeps_what_was_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    body = "\n".join([V0_PREEMPT] + [V0_STATS.format(s=s % 60) for s in range(5000)]) + "\n"
    blob = gzip.compress(body.encode())
    p = tmp_path / "cut.log.gz"
    p.write_bytes(blob[: len(blob) // 2])
    code, report = analyze_json(capsys, str(p))
    assert code == 0
    assert report["scan"]["skipped"] == {"truncated gzip: input ended early": 1}
    assert report["verdict"]["class"] == "benign_preemption"
    assert 0 < report["scan"]["lines_read"] < 5001


def test_corrupt_gzip(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "bad.log.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00garbage-not-deflate" * 10)
    code, _, err = run(capsys, "analyze", str(p))
    assert code == 2
    assert "corrupt or truncated gzip data" in one_line_error(err)


def test_not_a_log_at_all(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "data.csv"
    p.write_text("id,name,price\n1,apple,3\n2,pear,4\n")
    code, out, _ = run(capsys, "analyze", "--format", "markdown", str(p))
    assert code == 0
    assert "no vLLM evidence found" in out


def test_interleaved_garbage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "mixed.log"
    p.write_bytes(
        b"\x00\x01garbage\n"
        + V0_STATS.format(s=1).encode()
        + b"\n%%%% is preempted ???\n"
        + b"\xff\xfe\n"
        + V0_PREEMPT.encode()
        + b"\n"
    )
    code, report = analyze_json(capsys, str(p))
    assert code == 0
    assert report["verdict"]["class"] == "benign_preemption"
    assert report["scan"]["lines_read"] == 5


def test_timestamps_going_backwards_are_ordered(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    later = V0_STATS.format(s=50)
    earlier = V0_STATS.format(s=10).replace("40.0%", "20.0%")
    p = tmp_path / "back.log"
    p.write_text(later + "\n" + earlier + "\n")
    code, report = analyze_json(capsys, str(p))
    assert code == 0
    assert [w["start"] for w in report["windows"]] == ["2024-09-11T17:21:00+00:00"]
    assert report["windows"][0]["kv_max"] == 40.0


def test_year_rollover(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dec = V0_STATS.replace("09-11 17:21", "12-31 23:59").format(s=50)
    jan = V0_STATS.replace("09-11 17:21", "01-01 00:00").format(s=10)
    p = tmp_path / "newyear.log"
    p.write_text(dec + "\n" + jan + "\n")
    code, report = analyze_json(capsys, str(p))
    assert code == 0
    assert [w["start"] for w in report["windows"]] == [
        "2024-12-31T23:59:00+00:00",
        "2025-01-01T00:00:00+00:00",
    ]


def test_only_unrecognised_lines(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "app.log"
    p.write_text("".join(f"2025-01-01 00:00:{i:02d} app started worker {i}\n" for i in range(50)))
    code, out, _ = run(capsys, "analyze", str(p))
    assert code == 0
    assert "no vLLM evidence found" in out
    code, _, _ = run(capsys, "analyze", "--strict", str(p))
    assert code == 2


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "a.log"
    p.write_text(V0_PREEMPT + "\n")
    for argv, needle in [
        (["analyze", "--format", "yaml", str(p)], "unknown --format 'yaml'"),
        (["analyze", "--window", "soon", str(p)], "not a duration: 'soon'"),
        (["analyze", "--fail-on", "meltdown", str(p)], "unknown class in --fail-on: 'meltdown'"),
        (["analyze", "--tz", "Mars/Olympus", str(p)], "--tz: unknown time zone"),
        (["explain", "nothing-like-this"], "unknown topic 'nothing-like-this'"),
    ]:
        code, _, err = run(capsys, *argv)
        assert code == 2, argv
        assert needle in one_line_error(err)


def test_more_signal_lines_than_memory_allows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Each signal line but those merged per minute (stats lines, stamped preemption
    # lines) is an event that costs memory, so the default limit follows free memory;
    # --max-events sets it (tested small here), 0 lifts it. (Preemption warnings with
    # no stamp: one event each.)
    p = tmp_path / "dense.log"
    p.write_text(
        "".join(V0_PREEMPT.replace("WARNING 09-11 17:21:29", "WARNING:") + "\n" for _ in range(50))
    )
    code, _, err = run(capsys, "analyze", "--max-events", "49", str(p))
    assert code == 2
    assert one_line_error(err) == (
        f"preemptdiag: error: {p}: more than 49 signal events (~0 MiB to hold them); cut "
        "the log to the incident's time range first, or raise --max-events (0: no limit)"
    )
    code, doc = analyze_json(capsys, "--max-events", "50", str(p))
    assert (code, doc["scan"]["lines_read"]) == (0, 50)
    code, doc = analyze_json(capsys, "--max-events", "0", str(p))
    assert (code, doc["scan"]["lines_read"]) == (0, 50)
    code, _, err = run(capsys, "analyze", "--max-events", "-1", str(p))
    assert (code, one_line_error(err)) == (
        2,
        "preemptdiag: error: --max-events must be 0 (no limit) or more",
    )


def test_stdin_given_twice(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # stdin is streamed, not held: a second `-` would read an exhausted pipe.
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(V0_PREEMPT.encode())))
    code, _, err = run(capsys, "analyze", "-", "-")
    assert code == 2
    assert one_line_error(err) == (
        "preemptdiag: error: stdin (-) can be read only once; pass it once"
    )


def test_old_mac_line_ends_then_crlf_are_numbered_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A CR-only head (old-Mac line ends) and then CRLF lines: each \r\n was read as two
    # line ends, so every line after the switch got a blank line before it.
    from preemptdiag.ingest.sources import SNIFF_BYTES, open_source
    from preemptdiag.scan.matcher import Matcher
    from preemptdiag.scan.passes import scan_fast, scan_reference
    from preemptdiag.scan.signatures import load

    filler = "INFO 06-16 12:00:00 [x.py:1] nothing to see here\r"
    head = filler * (SNIFF_BYTES // len(filler) + 10)
    tail = "".join(f"{V0_PREEMPT}\r\n" for _ in range(20))
    p = tmp_path / "mixed.log"
    p.write_bytes((head + tail).encode())
    src = open_source(str(p))
    assert src.cr_only
    want = (head + tail).splitlines()  # universal newlines: \r, \n and \r\n are one end each
    first = next(i for i, ln in enumerate(want, 1) if "preempted" in ln)
    matcher = Matcher(load())
    for scan in (scan_fast, scan_reference):
        result = scan(src, matcher)
        assert result.lines_read == len(want)
        assert [h.line for h in result.hits] == list(range(first, first + 20))
