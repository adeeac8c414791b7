"""The bulk path (scan/bulk.py: a block's like candidate lines searched as one polars
column) gives exactly the hits, counts and skips of matching them one by one."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st
from test_equivalence import CORPUS_LOGS, SAMPLES, _assert_same, _bench_generator

import preemptdiag.scan.bulk as bulk
import preemptdiag.scan.lane as lane
import preemptdiag.scan.rust_regex as rust_regex
from preemptdiag.cli import main
from preemptdiag.ingest.sources import open_source
from preemptdiag.scan.matcher import Matcher, ScanResult
from preemptdiag.scan.passes import scan_fast, scan_reference
from preemptdiag.scan.signatures import PLAIN_MATCH, load

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


def test_rust_regex_refuses_a_counted_repetition_of_a_thousand_or_more() -> None:
    # Rust's regex unrolls it: an engine's config line pattern, `[^\n]{0,4000}?`, was
    # 10-23 MiB compiled, and polars keeps it for the run.
    assert "{0,4000}?" in SIGS["vllm.v1.engine_init"].pattern
    assert not rust_regex.rust_ok(SIGS["vllm.v1.engine_init"].pattern)
    assert not rust_regex.rust_ok(r"x[^\n]{1000}y")
    assert rust_regex.rust_ok(r"x[^\n]{0,999}?y")


@pytest.mark.parametrize("path", SAMPLES + CORPUS_LOGS, ids=lambda p: p.name)
def test_samples_and_corpus_in_bulk_match_line_by_line(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _assert_bulk_exact(path, monkeypatch)


@pytest.mark.parametrize(
    "profile",
    ["vllm", "vllm-stats", "vllm-stats-busy", "vllm-v0-stats", "vllm-requests", "sglang-dense"],
)
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
    # 20,000 one by one would cost seconds a month of stats lines need not spend, and
    # that block itself goes in bulk.
    lines = [V1.format(m=i // 60 % 60, s=i % 60, p=100 + i, r=i % 7) for i in range(10_000)]
    path = tmp_path / "stats.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")  # three 1 MiB blocks
    monkeypatch.setattr(bulk, "BIG_BYTES", path.stat().st_size)  # not to write 8 MiB
    calls = _spy_find(monkeypatch)
    at_once = scan_fast(open_source(str(path)), MATCHER)
    assert len(calls) == 3  # every block, each dense with stats lines
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
    # SGLang's batch lines in the iteration form (`Decode batch [40],`) need
    # look-arounds and fit no plain shape: no polars, and after one block that gained
    # nothing the next RETRY_BLOCKS blocks do not try (no work done twice).
    path = tmp_path / "sglang.log"
    with path.open("wb") as f:
        _bench_generator().generate_dense(f, 5 << 19, seed=5)  # 2.5 MiB: three blocks
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace(" batch, ", " batch [40], "), encoding="utf-8")
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


DECODE = (
    "[2025-11-02 00:{m:02d}:{s:02d} TP0] Decode batch, #running-req: {r}, #token: {t}, "
    "token usage: 0.{u:02d}, cuda graph: True, gen throughput (token/s): {g}.50, #queue-req: {q}, "
)
PREFILL = (
    "[2025-11-02 00:{m:02d}:{s:02d} TP0] Prefill batch, #new-seq: 2, #new-token: {t}, "
    "#cached-token: 12, token usage: 0.{u:02d}, #running-req: {r}, #queue-req: {q}, "
)


def _assert_plain_stands_for(sid: str, text: str) -> None:
    """sid's plain shape fits `text` whole, in `regex` and in polars, and reads there
    what its pattern reads: one match, on the plain match's span, the same captures."""
    import polars as pl

    sig = SIGS[sid]
    m = regex.fullmatch(sig.plain, text)
    assert m is not None
    found = list(sig.finditer(text))
    assert len(found) == 1
    assert found[0].span() == m.span(PLAIN_MATCH)
    want = {k: found[0].group(k) for k in sig.fields}
    assert {k: m.group(k) if k in m.re.groupindex else None for k in sig.fields} == want
    shape = bulk._plain(sig)
    assert shape is not None
    caps = pl.Series([text]).str.extract_groups(shape).struct.unnest().row(0, named=True)
    assert caps[PLAIN_MATCH] == found[0].group()
    assert {k: caps.get(k) for k in sig.fields} == want


_NUMBER = st.integers(0, 10**15).map(str)
_DECIMAL = _NUMBER | st.tuples(_NUMBER, st.integers(0, 10**6)).map(lambda t: f"{t[0]}.{t[1]}")
_GRAPH = st.sampled_from(["cuda", "cpu", "npu", "musa"]).map(lambda g: f"{g} graph: ") | st.just("")
_END = st.sampled_from(["", ",", ", "])


@given(
    sep=st.sampled_from(".,"),
    nums=st.tuples(_NUMBER, _NUMBER, _NUMBER),
    usage=_DECIMAL,
    graph=st.tuples(_GRAPH, st.booleans()),
    tput=_DECIMAL,
    end=_END,
)
@settings(max_examples=300, deadline=None)
def test_sglang_decode_lines_of_the_plain_shape_read_as_the_pattern_reads_them(
    sep: str,
    nums: tuple[str, str, str],
    usage: str,
    graph: tuple[str, bool],
    tput: str,
    end: str,
) -> None:
    label = f", {graph[0]}{graph[1]}" if graph[0] else ""
    text = (
        f"Decode batch{sep} #running-req: {nums[0]}, #token: {nums[1]}, token usage: {usage}"
        f"{label}, gen throughput (token/s): {tput}, #queue-req: {nums[2]}{end}"
    )
    _assert_plain_stands_for("sglang.stats.decode", text)


@given(
    sep=st.sampled_from(".,"),
    nums=st.tuples(*[_NUMBER] * 6),
    usage=_DECIMAL,
    tail=st.none() | st.tuples(_GRAPH.filter(bool), st.booleans(), _DECIMAL),
    end=_END,
)
@settings(max_examples=300, deadline=None)
def test_sglang_prefill_lines_of_the_plain_shape_read_as_the_pattern_reads_them(
    sep: str,
    nums: tuple[str, ...],
    usage: str,
    tail: tuple[str, bool, str] | None,
    end: str,
) -> None:
    more = (
        ""
        if tail is None
        else (
            f", #pending-token: {nums[5]}, {tail[0]}{tail[1]}, input throughput (token/s): {tail[2]}"
        )
    )
    text = (
        f"Prefill batch{sep} #new-seq: {nums[0]}, #new-token: {nums[1]}, #cached-token: "
        f"{nums[2]}, token usage: {usage}, #running-req: {nums[3]}, #queue-req: {nums[4]}"
        f"{more}{end}"
    )
    _assert_plain_stands_for("sglang.stats.prefill", text)


def test_sglang_batch_lines_come_from_the_columns_and_odd_ones_fall_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [
        (PREFILL if i % 9 == 4 else DECODE).format(
            m=i // 60, s=i % 60, r=i % 13, t=1000 + i, u=i % 97, g=300 + i, q=i % 5
        )
        for i in range(120)
    ]
    odd = {
        10: lines[10][:26] + "KV cache pool is full. Retract requests. #retracted_reqs: 2",
        20: lines[20].replace("cuda graph", "#retracted-req: 3, cuda graph"),  # PD decode
        30: lines[30].replace("token usage: 0.", "token usage: 99999."),  # refused value
        40: lines[40].replace(" TP0]", " DP1 TP1]"),  # another rank: still plain
        60: lines[60].replace("Decode batch,", "Decode batch [2048],"),  # iteration form
        70: lines[70] + lines[71],  # two records glued on one line
        80: "2025-11-02T00:01:20.123Z " + lines[80],  # a kubectl stamp before its own
        90: lines[90][:100],  # cut before the throughput
    }
    for k, text in odd.items():
        lines[k] = text
    path = tmp_path / "sglang.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _assert_bulk_exact(path, monkeypatch)
    columns: list[int] = []  # lines whose match and fields came from polars
    real = bulk._emit

    def counting(*args: Any) -> bool:
        made: bool = real(*args)
        if args[3].sig.id.startswith("sglang.stats.") and args[3].typed is not None:
            columns.append(args[2])
        return made

    monkeypatch.setattr(bulk, "_emit", counting)
    res = _scan(path, monkeypatch, 1, rollup=True)
    # All but the odd ones (the DP-ranked line is plain, and so is the kubectl-stamped
    # one: normalise takes off the stamp and SGLang's bracket under it) and the block's
    # last 13 lines, which wait for the next block in case they are wrapped.
    assert columns == [n for n in range(1, 108) if n - 1 not in set(odd) - {40, 80}]
    assert res.skipped["unreadable value: sglang.stats.decode"] == 1
    assert [h.proc for h in res.hits if h.line == 41] == ["DP1 TP1"]


_DIGITS = st.one_of(
    st.from_regex(r"[0-9]{1,20}(\.[0-9]{1,20})?", fullmatch=True),
    st.sampled_from(["1000", "1000.0", "1000.0000000000001", "1000.00000000000001",
                     "999999999999999", "1000000000000000", "999999999999999.9", "9" * 400,
                     "1e5", "-3", "", "12%", "9" * 18, "9" * 19]),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(_DIGITS, min_size=1, max_size=8), st.sampled_from(sorted(bulk._CAST_SHAPES)))
def test_a_cast_column_takes_what_its_converter_takes_and_gives_the_same(
    values: list[str], typ: str
) -> None:
    import polars as pl

    from preemptdiag.scan.signatures import CONVERTERS

    fits, cast = bulk.cast_column(pl.Series(values, dtype=pl.Utf8), typ)
    for v, ok, got in zip(values, fits.to_list(), cast.to_list(), strict=True):
        if ok:
            # taken as cast only where the converter gives that very value
            assert CONVERTERS[typ](v) == got
