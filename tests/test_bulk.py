"""The bulk path (scan/bulk.py: a block's like candidate lines searched as one polars
column) gives exactly the hits, counts and skips of matching them one by one."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_equivalence import CORPUS_LOGS, SAMPLES, _assert_same, _bench_generator

import preemptdiag.scan.bulk as bulk
import preemptdiag.scan.lane as lane
import preemptdiag.scan.rust_regex as rust_regex
from preemptdiag.cli import main
from preemptdiag.ingest.sources import open_source
from preemptdiag.scan.matcher import Matcher, ScanResult
from preemptdiag.scan.passes import scan_fast, scan_reference
from preemptdiag.scan.signatures import load

MATCHER = Matcher(load())
SIGS = {s.id: s for s in MATCHER.sigs}

V1 = (
    "(APIServer pid=1) INFO 06-03 08:{m:02d}:{s:02d} [loggers.py:236] Engine 000: Avg prompt "
    "throughput: {p}.0 tokens/s, Avg generation throughput: 95.5 tokens/s, Running: {r} reqs, "
    "Waiting: 0 reqs, GPU KV cache usage: 40.1%, Prefix cache hit rate: 12.0%"
)


def _scan(
    path: Path, monkeypatch: pytest.MonkeyPatch, min_lines: int, rollup: bool = False
) -> ScanResult:
    monkeypatch.setattr(bulk, "MIN_LINES", min_lines)
    monkeypatch.setattr(bulk, "AFTER_LINES", 0)
    monkeypatch.setattr(lane, "ENABLED", False)  # tests/test_lane.py holds the lane
    return scan_fast(open_source(str(path)), MATCHER, rollup=rollup)


def _assert_bulk_exact(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    by_one = _scan(path, monkeypatch, 1 << 40)
    together = _scan(path, monkeypatch, 1)
    assert together.hits == by_one.hits
    assert together.skipped == by_one.skipped
    assert together.recognised == by_one.recognised
    _assert_same(together, scan_reference(open_source(str(path)), MATCHER))
    _assert_rollups_exact(path, monkeypatch)


def _assert_rollups_exact(path: Path, monkeypatch: pytest.MonkeyPatch) -> ScanResult:
    """With rollups on, bulk lines go to the sink as deferred hits: the rollups (their
    aggregates and every line they keep) are the ones line-by-line matching builds."""
    by_one = _scan(path, monkeypatch, 1 << 40, rollup=True)
    together = _scan(path, monkeypatch, 1, rollup=True)
    assert together.hits == by_one.hits
    assert together.members == by_one.members
    assert together.skipped == by_one.skipped
    assert together.recognised == by_one.recognised
    return together


def test_rust_regex_takes_most_builtin_patterns_and_refuses_look_around() -> None:
    assert rust_regex.rust_ok(SIGS["vllm.v1.stats"].pattern)
    assert rust_regex.rust_ok(SIGS["vllm.v0.stats"].pattern)
    # Look-arounds: Rust's regex has none, so these stay on the `regex` path.
    assert not rust_regex.rust_ok(SIGS["sglang.stats.decode"].pattern)
    assert not rust_regex.rust_ok(SIGS["vllm.v1.stats_running_waiting"].pattern)
    assert not rust_regex.rust_ok(r"(?:x)*")  # can match nothing: finditer counts may differ


@pytest.mark.parametrize("path", SAMPLES + CORPUS_LOGS, ids=lambda p: p.name)
def test_samples_and_corpus_in_bulk_match_line_by_line(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _assert_bulk_exact(path, monkeypatch)


@pytest.mark.parametrize("profile", ["vllm", "vllm-stats", "vllm-requests", "sglang-dense"])
def test_generated_logs_in_bulk_match_line_by_line(
    profile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / f"{profile}.log"
    with path.open("wb") as f:
        _bench_generator().PROFILES[profile](f, 400_000, 3)
    _assert_bulk_exact(path, monkeypatch)


def test_odd_lines_among_like_ones_fall_back_and_count_as_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [V1.format(m=i // 60, s=i % 60, p=100 + i, r=i % 7) for i in range(120)]
    odd = {
        10: lines[10] + " " + lines[11],  # two records glued on one line: two hits
        20: lines[20].replace("Running: 6", "Running: " + "9" * 40),  # past 64 bits
        30: lines[30].replace("Prefix cache", "Préfix cache"),  # not ASCII
        40: "Received request chatcmpl-1: prompt: 'why " + lines[40] + "'",  # a decoy
        50: "\x1b[32m" + lines[50] + "\x1b[0m",  # colour codes normalise strips
        60: "2025-06-03T08:01:00.123456789Z " + lines[60],  # a kubectl stamp
        70: lines[70][:120],  # cut short: the literal is there, the regex fails
        80: lines[80].replace("Avg prompt", "Avg  prompt"),
    }
    for k, text in odd.items():
        lines[k] = text
    path = tmp_path / "mixed.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _assert_bulk_exact(path, monkeypatch)
    emitted: list[int] = []
    real = bulk._emit

    def counting(*args: Any) -> bool:
        made: bool = real(*args)
        emitted.append(made)
        return made

    monkeypatch.setattr(bulk, "_emit", counting)
    res = _scan(path, monkeypatch, 1)
    # The plain lines (and the coloured and stamped ones) came from the columns, but
    # the block's last lines, which wait for the next block in case they are wrapped.
    assert sum(emitted) == 120 - 13 - 6
    assert sum(h.line == 11 for h in res.hits) == 2
    assert res.skipped["unreadable value: vllm.v1.stats"] == 1
    assert res.skipped["decoy in request text"] == 1


def _spy_find(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of lines of each block bulk._find is given, from now on."""
    calls: list[int] = []
    real = bulk._find

    def spy(matcher: Matcher, items: Any) -> Any:
        calls.append(len(items))
        return real(matcher, items)

    monkeypatch.setattr(bulk, "_find", spy)
    return calls


def test_a_short_log_never_turns_to_polars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fewer candidate lines than AFTER_LINES before a block: it is matched one by one
    # (polars' string kernels would cost more memory than they save time).
    lines = [V1.format(m=i // 60 % 60, s=i % 60, p=100 + i, r=i % 7) for i in range(10_000)]
    path = tmp_path / "stats.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")  # three 1 MiB blocks
    calls = _spy_find(monkeypatch)
    monkeypatch.setattr(bulk, "BIG_BYTES", path.stat().st_size + 1)
    scan_fast(open_source(str(path)), MATCHER)
    assert calls == []
    monkeypatch.setattr(bulk, "AFTER_LINES", 1000)
    scan_fast(open_source(str(path)), MATCHER)
    assert len(calls) == 2  # the blocks after the first


def test_a_big_file_turns_to_polars_after_its_first_dense_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Big on disk, and its first block is dense with candidate lines: the first
    # 20,000 one by one would cost seconds a month of stats lines need not spend.
    lines = [V1.format(m=i // 60 % 60, s=i % 60, p=100 + i, r=i % 7) for i in range(10_000)]
    path = tmp_path / "stats.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")  # three 1 MiB blocks
    monkeypatch.setattr(bulk, "BIG_BYTES", path.stat().st_size)  # not to write 8 MiB
    calls = _spy_find(monkeypatch)
    at_once = scan_fast(open_source(str(path)), MATCHER)
    assert len(calls) == 2  # every block after the first, dense with stats lines
    monkeypatch.setattr(bulk, "BIG_BYTES", path.stat().st_size + 1)
    assert scan_fast(open_source(str(path)), MATCHER).hits == at_once.hits  # one by one


def test_a_big_sparse_file_never_turns_to_polars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A big log with a few candidate lines a block (the 1 GiB benchmark log: ~7):
    # polars would cost its pages and gain nothing.
    filler = "(APIServer pid=1) INFO 06-03 00:00:00 [logger.py:41] GET /health 200 OK\n" * 1500
    stats = [V1.format(m=i // 60 % 60, s=i % 60, p=100 + i, r=i % 7) for i in range(600)]
    path = tmp_path / "sparse.log"
    with path.open("w", encoding="utf-8") as f:
        for i in range(0, len(stats), 20):
            f.write(filler + "\n".join(stats[i : i + 20]) + "\n")
    calls = _spy_find(monkeypatch)
    monkeypatch.setattr(bulk, "BIG_BYTES", 1 << 20)
    assert path.stat().st_size > 3 << 20
    assert len(scan_fast(open_source(str(path)), MATCHER).hits) == 600
    assert calls == []


def test_lines_only_regex_matches_stop_the_bulk_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SGLang's batch lines need look-arounds: no polars, and after one block that
    # gained nothing the next RETRY_BLOCKS blocks do not try (no work done twice).
    path = tmp_path / "sglang.log"
    with path.open("wb") as f:
        _bench_generator().generate_dense(f, 5 << 19, seed=5)  # 2.5 MiB: three blocks
    calls: list[int] = []
    real = bulk._find

    def spy(matcher: Matcher, items: Any) -> Any:
        found = real(matcher, items)
        calls.append(len(found))
        return found

    monkeypatch.setattr(bulk, "_find", spy)
    monkeypatch.setattr(bulk, "AFTER_LINES", 0)
    res = scan_fast(open_source(str(path)), MATCHER)
    assert res.bytes_read > 2 << 20
    assert calls == [0]
    monkeypatch.setattr(bulk, "RETRY_BLOCKS", 2)
    scan_fast(open_source(str(path)), MATCHER)
    assert calls == [0, 0, 0]  # blocks 0 and 2, not 1


def _stats_log(seed: int, n: int = 1500) -> list[str]:
    """Two engines' V1 stats lines interleaved at uneven steps across midnight, some
    preempting, with lines whose stamp moves the clock otherwise among them."""
    rng = random.Random(seed)
    t = datetime(2025, 6, 3, 23, 40, 0)
    out: list[str] = []
    for _ in range(n):
        t += timedelta(seconds=rng.choice([0, 1, 3, 7, 10, 10, 10, 25]))
        pid = rng.choice([1, 1, 2])
        preempt = f"Preemptions: {rng.randrange(1, 9)}, " if rng.random() < 0.08 else ""
        line = (
            f"(APIServer pid={pid}) INFO {t:%m-%d %H:%M:%S} [loggers.py:236] Engine 00{pid}: "
            f"Avg prompt throughput: {rng.uniform(0, 5000):.1f} tokens/s, Avg generation "
            f"throughput: {rng.uniform(0, 200):.1f} tokens/s, Running: {rng.randrange(60)} "
            f"reqs, Waiting: {rng.choice([0, 0, 0, 3])} reqs, {preempt}GPU KV cache usage: "
            f"{rng.choice([10.0, 55.5, 99.9, 99.9, rng.uniform(0, 100)]):.1f}%, Prefix cache "
            "hit rate: 12.0%"
        )
        r = rng.random()
        if r < 0.01:  # a kubectl stamp: another clock, mid-minute
            line = f"{t:%Y-%m-%dT%H:%M:%S}.5Z " + line
        elif r < 0.02:  # no engine stamp: timed by the line before it
            line = line.replace(f" INFO {t:%m-%d %H:%M:%S}", "")
        elif r < 0.025:  # two records glued on one line
            line = line + " " + line
        elif r < 0.03:  # an ip in the process tag: the head is found per line
            line = line.replace(f"pid={pid})", f"pid={pid}, ip=10.0.0.{pid})")
        elif r < 0.035:  # a value of another shape (past 64 bits): refused per line
            line = line.replace("Running: ", "Running: 1" + "0" * 25, 1)
        elif r < 0.04:
            line = line.replace("[loggers.py:236]", "[loggers.py:236] [x]")
        out.append(line)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rollups_from_bulk_lines_match_line_by_line(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "stats.log"
    path.write_text("\n".join(_stats_log(seed)) + "\n", encoding="utf-8")
    made: list[int] = []
    real = bulk.new_hit

    def counting(*args: Any) -> Any:
        made.append(1)
        return real(*args)

    monkeypatch.setattr(bulk, "new_hit", counting)
    res = _assert_rollups_exact(path, monkeypatch)
    rolled = [h for h in res.hits if h.rollup is not None]
    assert len(rolled) > 60  # minutes of both engines, split where the clock moved
    assert any(h.rollup and h.rollup.preempting for h in res.hits)
    # Hits were made only for the lines a rollup keeps, not for every line.
    assert 0 < len(made) < 0.8 * 1500


def test_minute_boundaries_and_a_clock_change_mid_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [V1.format(m=i * 7 // 60, s=i * 7 % 60, p=100 + i, r=i % 9) for i in range(200)]
    lines[100] = "2025-06-03T08:11:40Z " + lines[100]  # kubectl stamp: closes the minute
    path = tmp_path / "minutes.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = _assert_rollups_exact(path, monkeypatch)
    sizes = [h.rollup.stats.n if h.rollup else 1 for h in res.hits]
    assert sum(sizes) == 200
    # 08:11 (lines 96-103): the lines before the stamped one, the stamped one alone
    # (another stream), and the lines after it in a rollup of their own.
    at_11 = [h for h in res.hits if h.ts_engine and h.ts_engine.startswith("06-03 08:11")]
    assert [(h.line, h.rollup.stats.n if h.rollup else 1) for h in at_11] == [
        (96, 5),
        (101, 1),
        (102, 2),
    ]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_report_of_bulk_rollups_is_byte_identical(
    jobs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "stats.log"
    path.write_text("\n".join(_stats_log(7, 6000)) + "\n", encoding="utf-8")
    argv = ["analyze", str(path), "--format", "json", "--year", "2026", "--jobs", jobs]
    outs = []
    monkeypatch.setattr(lane, "ENABLED", False)
    for min_lines in (1 << 40, 1):
        monkeypatch.setattr(bulk, "MIN_LINES", min_lines)
        monkeypatch.setattr(bulk, "AFTER_LINES", 0)
        code = main(argv)
        outs.append((code, capsys.readouterr().out))
    assert outs[0] == outs[1]
    assert '"windows"' in outs[0][1]
