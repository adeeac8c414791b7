"""The stats lane (scan/lane.py: whole blocks of plain stats lines matched and rolled
up as polars columns) gives exactly the hits, rollups, counts and skips of the
line-by-line scan, at every block size, and falls back wherever a line is not plain."""

from __future__ import annotations

import random
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import regex
from builders import bench_module
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bulk import V1, _stats_log
from test_equivalence import CORPUS_LOGS, SAMPLES, _bench_generator
from test_rollup import _docker_json, _kubectl_stamped

import preemptdiag.scan.bulk as bulk
import preemptdiag.scan.lane as lane
import preemptdiag.scan.lane_plain as lane_plain
import preemptdiag.scan.passes as passes
import preemptdiag.scan.rust_regex as rust_regex
from preemptdiag.cli import main
from preemptdiag.ingest.sources import open_source
from preemptdiag.scan.matcher import Matcher, ScanResult
from preemptdiag.scan.passes import scan_fast
from preemptdiag.scan.rollup import Rollups
from preemptdiag.scan.signatures import load

MATCHER = Matcher(load())
SIGS = {s.id: s for s in MATCHER.sigs}


def _scan(
    path: Path,
    monkeypatch: pytest.MonkeyPatch,
    on: bool,
    block: int,
    rollup: Rollups = Rollups.STATS,
) -> ScanResult:
    monkeypatch.setattr(bulk, "AFTER_LINES", 0)
    monkeypatch.setattr(lane, "ENABLED", on)
    monkeypatch.setattr(passes, "BLOCK_BYTES", block)
    return scan_fast(open_source(str(path)), MATCHER, rollup=rollup)


def _spy_on_lane(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each block the lane is asked about went its way, in order."""
    taken: list[bool] = []
    real = lane.try_block

    def spy(*args: Any) -> int | None:
        got = real(*args)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(lane, "try_block", spy)
    return taken


def _assert_lane_exact(
    path: Path,
    monkeypatch: pytest.MonkeyPatch,
    block: int = 1 << 20,
    every: bool = False,
    rollup: Rollups = Rollups.STATS,
) -> tuple[ScanResult, list[bool]]:
    """The scan with the lane on is the scan with it off, and so is the scan with the
    polars lane alone (lane_plain.py off: it takes most blocks of V1 stats lines);
    returns the on one and whether each block went the lane's way (with `every`, the
    lane is tried on every block, not again only some blocks after one it did not
    take). `rollup`: which lines the scans merge (Rollups.ALL: preemption lines too,
    as analyze has it)."""
    off = _scan(path, monkeypatch, False, block, rollup)
    if every:
        monkeypatch.setattr(lane.Lane, "missed", lambda self, block: None)
    monkeypatch.setattr(lane_plain, "ENABLED", False)
    polars_only = _scan(path, monkeypatch, True, block, rollup)
    monkeypatch.setattr(lane_plain, "ENABLED", True)
    taken = _spy_on_lane(monkeypatch)
    on = _scan(path, monkeypatch, True, block, rollup)
    for got in (on, polars_only):
        assert got.hits == off.hits
        assert got.members == off.members
        assert got.skipped == off.skipped
        assert got.recognised == off.recognised
        assert (got.lines_read, got.bytes_read) == (off.lines_read, off.bytes_read)
    return on, taken


@pytest.mark.parametrize("path", SAMPLES + CORPUS_LOGS, ids=lambda p: p.name)
def test_samples_and_corpus_through_the_lane_match_line_by_line(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _assert_lane_exact(path, monkeypatch, block=2048)


@pytest.mark.parametrize(
    "profile",
    [
        "vllm",
        "vllm-stats",
        "vllm-stats-busy",
        "vllm-stats-pinned",
        "vllm-v0-stats",
        "vllm-stats-kubectl",
        "vllm-requests",
        "sglang-dense",
        "sglang-thrash",
        "sglang-thrash-ranks",
    ],
)
@pytest.mark.parametrize("block", [4096, 1 << 16])
def test_generated_logs_through_the_lane_match_line_by_line(
    profile: str, block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / f"{profile}.log"
    with path.open("wb") as f:
        _bench_generator().PROFILES[profile](f, 600_000, 3)
    # (preemption lines merged too where there are many: as analyze scans them)
    rollup = Rollups.ALL if "thrash" in profile else Rollups.STATS
    _, taken = _assert_lane_exact(path, monkeypatch, block, rollup=rollup)
    if profile in (
        "vllm-stats",
        "vllm-stats-busy",
        "vllm-stats-pinned",
        "vllm-v0-stats",
        "vllm-stats-kubectl",
    ):
        # a server's stats lines, quiet, queueing or pinned, V1's or V0's, or stamped by
        # `kubectl logs --timestamps`: nearly every block is the lane's
        assert sum(taken) >= len(taken) - 2 and len(taken) > 8
    if profile.startswith("sglang"):
        # batch lines with retraction lines among them, now and then or from every
        # rank every second: the lane's too
        assert sum(taken) >= len(taken) - 2 and len(taken) > 8


@pytest.mark.parametrize(
    "head",
    [
        "INFO {t} metrics.py:396] ",  # V0's
        "(VllmWorkerProcess pid=7) INFO {t} metrics.py:396] ",  # V0's, a process named
        "INFO {t} [metrics.py:396] ",  # no process, a `[` before the file
        "(APIServer pid=1) INFO {t} [metrics.py:396] ",  # V1's head
    ],
)
def test_v0_lines_under_every_head_the_plain_lane_reads_match_line_by_line(
    head: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plain lane's head takes its process and the `[` as optional: each mix goes
    # as the line-by-line scan reads it (quiet and queueing minutes, a preemption
    # warning among them).
    t0 = datetime(2026, 3, 1, 23, 50)
    lines = []
    for i in range(1200):
        t = f"{t0 + timedelta(seconds=5 * i):%m-%d %H:%M:%S}"
        waiting = (i // 60) % 2 * (i % 7 + 1)
        lines.append(
            head.format(t=t) + f"Avg prompt throughput: {i % 97}.5 tokens/s, Avg generation "
            f"throughput: {i % 31}.0 tokens/s, Running: {i % 9 + 1} reqs, Swapped: 0 reqs, "
            f"Pending: {waiting} reqs, GPU KV cache usage: {i % 80}.1%, CPU KV cache usage: "
            "0.0%."
        )
        if i == 700:
            lines.append(
                f"WARNING {t} scheduler.py:1089] Sequence group cmpl-1 is preempted by "
                "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
                "total_num_cumulative_preemption=1"
            )
    path = tmp_path / "v0.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    on, taken = _assert_lane_exact(path, monkeypatch, block=1 << 14, every=True)
    assert on.recognised["stats"] == 1200 and any(taken)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("block", [1500, 8192, 1 << 20])
def test_two_engines_across_midnight_with_odd_lines_match_line_by_line(
    seed: int, block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stamps that move the clock otherwise, glued records, ips in the process tag,
    # 64-bit overflows among the plain lines (~4 % of the lines): a block holding them
    # goes line by line, or a lane matches them as line by line in their place.
    path = tmp_path / "stats.log"
    path.write_text("\n".join(_stats_log(seed, 3000)) + "\n", encoding="utf-8")
    on, taken = _assert_lane_exact(path, monkeypatch, block)
    assert any(h.rollup and h.rollup.preempting for h in on.hits)
    # (the one block of 1 MiB holds lines of another clock: line by line)
    assert any(taken) if block < 1 << 20 else taken == [False]


def _plain_log(
    n: int, start: datetime, step: int, seed: int, preempting: float = 0.05
) -> list[str]:
    rng = random.Random(seed)
    out = []
    t = start
    for i in range(n):
        t += timedelta(seconds=step)
        pre = f"Preemptions: {rng.randrange(1, 5)}, " if rng.random() < preempting else ""
        out.append(
            f"(APIServer pid=1) INFO {t:%m-%d %H:%M:%S} [loggers.py:236] Engine 000: Avg "
            f"prompt throughput: {rng.uniform(0, 900):.1f} tokens/s, Avg generation "
            f"throughput: {rng.uniform(0, 90):.1f} tokens/s, Running: {rng.randrange(9)} reqs, "
            f"Waiting: {rng.choice([0, 0, 2])} reqs, {pre}GPU KV cache usage: "
            f"{rng.choice([0.0, 50.5, 99.9, 99.9])}%, Prefix cache hit rate: 1.0%"
        )
        if i % 97 == 5:
            out.append('(APIServer pid=1) INFO:     127.0.0.1:5000 - "GET /health HTTP/1.1" 200 OK')
    return out


@pytest.mark.parametrize(
    "start",
    [datetime(2025, 12, 31, 23, 50), datetime(2025, 2, 28, 23, 55), datetime(2025, 6, 3, 0, 0)],
    ids=["new-year", "end-of-february", "plain-day"],
)
@pytest.mark.parametrize("step", [1, 7, 10, 61])
def test_month_day_changes_and_steps_inside_a_block(
    start: datetime, step: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "plain.log"
    path.write_text("\n".join(_plain_log(2500, start, step, step)) + "\n", encoding="utf-8")
    on, taken = _assert_lane_exact(path, monkeypatch, 16384)
    assert all(taken)
    assert sum(h.rollup.stats.n if h.rollup else 1 for h in on.hits) == 2500


@pytest.mark.parametrize(
    "odd",
    [
        lambda s: s.replace("INFO 06-03", "INFO 02-30"),  # no such day: no stamp
        lambda s: regex.sub(r"06-03 \d\d:", "06-03 24:", s, count=1),  # no such hour
        lambda s: s + " prompt: 'x'",  # request text
        lambda s: s.replace("Prefix cache", "Préfix cache"),  # not ASCII
        lambda s: s + "\t",  # a control character
        lambda s: s + " " + s,  # two records glued on one line
        lambda s: s + " (EngineCore_DP0 pid=3) INFO 06-03 00:50:00 [core.py:9] done",
        lambda s: s.replace("[loggers.py:236]", "[repeated 2x across cluster] [loggers.py:236]"),
        lambda s: s.replace("Running: ", "Running: " + "9" * 30, 1),  # past 64 bits
        lambda s: s.replace("(APIServer pid=1)", "(APIServer pid=1, ip=10.0.0.1)"),
        lambda s: s.replace("Engine 000: ", "") + " Running: 1 reqs, Waiting: 2 reqs",
        lambda s: "INFO 01-28 10:11:12 loggers.py:21] Running: 12 reqs, Waiting: 5 reqs",
        # rsyslog's escaped ESC, which normalise takes out (fuzzed: a stream of its own)
        lambda s: s.replace("(APIServer pid=1)", "(APIServer#033[2m pid=1)"),
        # past the converters' ranges: refused line by line, not aggregated (fuzzed)
        lambda s: regex.sub(r"usage: [0-9.]+%", "usage: 1000.5%", s),
        lambda s: regex.sub(r"prompt throughput: [0-9.]+", "prompt throughput: 1" + "0" * 15, s),
    ],
    ids=[
        "feb-30",
        "hour-24",
        "request-text",
        "not-ascii",
        "tab",
        "glued",
        "glued-other",
        "ray-repeat",
        "overflow",
        "ip",
        "v070-tail",
        "v070-line",
        "syslog-escape",
        "kv-past-1000",
        "tput-past-1e15",
    ],
)
def test_one_odd_line_sends_its_block_line_by_line(
    odd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    lines = _plain_log(600, datetime(2025, 6, 3, 0, 0), 10, 1)
    lines = [ln for ln in lines if "GET /health" not in ln]
    lines[300] = odd(lines[300])
    path = tmp_path / "odd.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    on, taken = _assert_lane_exact(path, monkeypatch, 1 << 20)
    # and bulk.py's path (the lane's "off" above) is the one line at a time
    monkeypatch.setattr(bulk, "AFTER_LINES", 10**9)
    monkeypatch.setattr(lane, "ENABLED", False)
    one_by_one = scan_fast(open_source(str(path)), MATCHER, rollup=True)
    assert (on.hits, on.skipped, on.recognised) == (
        one_by_one.hits,
        one_by_one.skipped,
        one_by_one.recognised,
    )
    # The lane takes a block with an odd line only where that line, matched as line
    # by line, records no stats hit: a value past 64 bits, a KV usage past 1000 % or
    # a throughput past 1e15 is refused (a skip count).
    odd_id = request.node.callspec.id
    assert taken == [odd_id in ("overflow", "kv-past-1000", "tput-past-1e15")]


@pytest.mark.parametrize("stop", lane._STOP)
def test_the_stop_pattern_finds_each_stop_literal_as_contains_any_does(stop: str) -> None:
    import polars as pl

    near = [stop, f"x {stop} y", stop[:-1], stop[1:], stop.upper(), ""]
    s = pl.Series(near)
    assert (
        s.str.contains(lane._STOP_PATTERN).to_list()
        == s.str.contains_any(list(lane._STOP)).to_list()
    )
    assert s.str.contains(lane._STOP_PATTERN)[0]


def test_a_rollup_open_at_a_block_end_carries_on_into_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lines a second apart: every block ends inside a minute, whose lines the next
    # block's first lines join (through the sink, as line by line).
    path = tmp_path / "dense.log"
    path.write_text(
        "\n".join(_plain_log(3000, datetime(2025, 6, 3, 0, 0), 1, 2, 0.0)) + "\n", encoding="utf-8"
    )
    for block in (700, 3000, 9000):
        on, taken = _assert_lane_exact(path, monkeypatch, block)
        assert all(taken)
        assert [h.rollup.stats.n if h.rollup else 1 for h in on.hits[1:-1]] == [60] * (
            len(on.hits) - 2
        )


@pytest.mark.parametrize("log", ["generated", "real_engine_replayed"])
def test_report_through_the_lane_is_byte_identical(
    log: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "stats.log"
    if log == "generated":
        with path.open("wb") as f:
            _bench_generator().PROFILES["vllm-stats"](f, 900_000, 5)
    else:
        _replayed_engine_log(path, 3000)
    outs = []
    monkeypatch.setattr(bulk, "AFTER_LINES", 0)
    monkeypatch.setattr(passes, "BLOCK_BYTES", 1 << 16)
    for on in (False, True):
        monkeypatch.setattr(lane, "ENABLED", on)
        for fmt in ("json", "markdown"):
            code = main(["analyze", str(path), "--format", fmt, "--year", "2026", "--jobs", "1"])
            outs.append((code, capsys.readouterr().out))
    assert outs[:2] == outs[2:]
    assert '"class": "healthy"' in outs[0][1]


def test_zero_test_turns_a_leading_look_behind_into_not_preceded_by() -> None:
    rw = SIGS["vllm.v1.stats_running_waiting"]
    z = rust_regex.zero_test(rw.pattern)
    assert z is not None and rust_regex.rust_ok(z)
    assert z.startswith("(?:^.{0,9}|")
    assert rust_regex.zero_test(SIGS["sglang.stats.decode"].pattern) is None or rust_regex.rust_ok(
        str(rust_regex.zero_test(SIGS["sglang.stats.decode"].pattern))
    )


_ALPHABET = "tokens/, RuniWaigq:0123456789GPUKVx"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=_ALPHABET, max_size=60))
def test_the_zero_test_finds_something_wherever_the_pattern_matches(text: str) -> None:
    import polars as pl

    for sid in ("vllm.v1.stats_running_waiting", "vllm.v1.stats", "vllm.v0.stats"):
        sig = SIGS[sid]
        z = rust_regex.zero_test(sig.pattern)
        assert z is not None
        probe = f"Running: 1 reqs, Waiting: 2 reqs{text}"
        for t in (text, probe, "tokens/s, " + probe, text + probe):
            if regex.search(sig.pattern, t):
                assert pl.Series([t]).str.contains(z)[0], (sid, t)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab1_ .-", max_size=30))
def test_ascii_spelling_matches_as_the_unicode_classes_on_ascii_text(text: str) -> None:
    import polars as pl

    for pattern in (r"\d+\.\d", r"\w+ \s?\d", r"[\w.]+:\d+", r"\bab\b", r"[^\d]+"):
        spelt = rust_regex.ascii_only(pattern)
        assert spelt is not None
        found = pl.Series([text]).str.count_matches(spelt)[0]
        assert found == len(regex.findall(pattern, text)), (pattern, text)


def test_a_jobs_range_takes_the_lane_from_its_first_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the polars lane's gating: lane_plain.py's, which pays no polars, is
    # test_lane_plain.py's)
    monkeypatch.setattr(lane_plain, "ENABLED", False)
    # A range of a file big enough to split holds fewer than AFTER_LINES lines (a
    # tenth of a 10-day log): it must not be matched one by one for that.
    path = tmp_path / "plain.log"
    path.write_text(
        "\n".join(_plain_log(3000, datetime(2025, 6, 3), 10, 3)) + "\n", encoding="utf-8"
    )
    taken = _spy_on_lane(monkeypatch)
    monkeypatch.setattr(passes, "BLOCK_BYTES", 1 << 16)
    size = path.stat().st_size
    whole = scan_fast(open_source(str(path)), MATCHER, rollup=True)
    assert taken == []  # 3,000 lines: under AFTER_LINES, one by one
    half = path.read_bytes().index(b"\n", size // 2) + 1
    scan_fast(open_source(str(path)), MATCHER, byte_range=(half, size), rollup=True)
    assert taken and all(taken)
    assert whole.lines_read == 3000 + 3000 // 97 + 1


def test_a_stream_whose_clock_goes_back_to_its_first_minute_keeps_two_rollups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two pods' logs one after the other, the same process tag in both: the block's
    # first minute comes back at its end. The first run of it went to the sink line
    # by line; left open, the second joined it (one rollup of 5 lines, not 3 and 2).
    minutes = [(0, 5), (0, 15), (0, 25)] + [(m, s) for m in range(1, 30) for s in (5, 35)]
    lines = [V1.format(m=m, s=s, p=100 + m, r=3) for m, s in [*minutes, (0, 45), (0, 55)]]
    path = tmp_path / "two_pods.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    on, taken = _assert_lane_exact(path, monkeypatch)
    assert taken == [True]
    sizes = [(h.line, h.rollup.stats.n if h.rollup else 1) for h in on.hits]
    assert (sizes[0], sizes[-1], len(sizes)) == ((1, 3), (62, 2), 31)


_STEP = st.tuples(
    st.sampled_from([1, 1, 2]),  # the engine (its process tag is its stream)
    # seconds on, or None: back to the first line's stamp, 30 s on (a second pod's log)
    st.sampled_from([0, 1, 10, 10, 10, 59, 60, -10, -60, -3600, 86_400, -86_400, None]),
    st.sampled_from([0, 0, 0, 2]),  # preemptions on the line
    st.sampled_from([10.0, 55.5, 99.9]),  # KV usage
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=150), st.sampled_from([2048, 4096, 1 << 16]))
def test_stats_lines_whose_clocks_jump_about_roll_up_as_line_by_line(
    steps: list[tuple[int, int | None, int, float]], block: int
) -> None:
    # Streams interleaved, stamps going back and forth by seconds, minutes, hours and
    # days, at block sizes that cut minutes anywhere: the lane's segments and edges
    # must leave the sink as the lines one by one would.
    start = t = datetime(2025, 6, 3, 23, 50, 0)
    lines: list[str] = []
    for pid, delta, pre, kv in steps:
        t = start + timedelta(seconds=30) if delta is None else t + timedelta(seconds=delta)
        lines.append(_engine_line(pid, t, len(lines) % 7, pre, kv))
    _assert_lines_exact(lines, block)


def _engine_line(pid: int, t: datetime, running: int, preempted: int, kv: float) -> str:
    """A V1 stats line of engine `pid` at `t`, as many waiting as were `preempted`."""
    preempt = f"Preemptions: {preempted}, " if preempted else ""
    return (
        f"(APIServer pid={pid}) INFO {t:%m-%d %H:%M:%S} [loggers.py:236] Engine 00{pid}: "
        f"Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 5.0 tokens/s, "
        f"Running: {running} reqs, Waiting: {preempted} reqs, {preempt}GPU KV cache "
        f"usage: {kv}%, Prefix cache hit rate: 12.0%"
    )


def _assert_lines_exact(lines: list[str], block: int) -> None:
    """_assert_lane_exact of a log of these lines (in a hypothesis test: no fixture)."""
    with pytest.MonkeyPatch.context() as monkeypatch, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lines.log"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        _assert_lane_exact(path, monkeypatch, block=block)


def _kube(t: datetime, ns: int) -> str:
    return f"{t:%Y-%m-%dT%H:%M:%S}.{ns:09d}Z"


def _json(stamp: str, line: str, head: str = '{"log":', tail: str = "") -> str:
    """A record of Docker's json-file log (with another `head` or `tail`: one it does
    not write)."""
    return f'{head}"{line}\\n","stream":"stderr","time":"{stamp}"{tail}}}'


# How `kubectl logs --timestamps`, `docker logs -t`, a CRI log file and Docker's
# json-file log wrap a line, and wrappings no lane reads (they go line by line): a
# stamp with no `T`, a zone the lane does not read, a time or zone that is none; a
# record in another order, with more keys, spaces or an escape in its text.
_WRAPS = (
    lambda t, ns, x: f"{_kube(t, ns)} {x}",
    lambda t, ns, x: f"{t:%Y-%m-%dT%H:%M:%S}.{ns:09d}".rstrip("0").rstrip(".") + f"Z {x}",
    lambda t, ns, x: f"{t:%Y-%m-%dT%H:%M:%S},{ns // 1000:06d}+05:30 {x}",
    lambda t, ns, x: f"{_kube(t, ns)} stdout F {x}",
    lambda t, ns, x: f"{t:%Y-%m-%dT%H:%M:%S}-03:00  stderr P {x}",
    lambda t, ns, x: _json(_kube(t, ns), x),
)
_ODD_WRAPS = (
    lambda t, ns, x: f"{t:%Y-%m-%d %H:%M:%S}.{ns:09d}Z {x}",
    lambda t, ns, x: f"{t:%Y-%m-%dT%H:%M:%S}.{ns:09d}+0100 {x}",
    lambda t, ns, x: f"{t:%Y-%m-%dT%H:%M:%S}.{ns:09d} {x}",
    lambda t, ns, x: f"{t:%Y-%m-%dT}25:{t:%M:%S}Z {x}",
    lambda t, ns, x: f"{t:%Y-%m-%dT%H:%M:%S}+24:00 {x}",
    lambda t, ns, x: _json(_kube(t, ns), x, '{"stream":"stderr","log":'),
    lambda t, ns, x: _json(_kube(t, ns), x, tail=',"attrs":{}'),
    lambda t, ns, x: _json(_kube(t, ns), x, '{ "log": '),
    lambda t, ns, x: _json(_kube(t, ns), x.replace("Running", "\\u0052unning")),
    lambda t, ns, x: _json(_kube(t, ns), x.replace("reqs,", 'reqs\\",')),
    lambda t, ns, x: _json(f"{t:%Y-%m-%dT}25:{t:%M:%S}Z", x),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([1, 1, 2]),  # the engine
            st.sampled_from([0, 1, 10, 10, 10, 59, 60, -1, -3600, 86_400]),  # seconds on
            st.integers(0, 999_999_999),  # the wrapper's nanoseconds
            st.sampled_from([0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 5, 5, 6]),  # its shape, or odd
            st.sampled_from([10.0, 55.5, 99.9]),  # KV usage
        ),
        min_size=1,
        max_size=150,
    ),
    st.sampled_from([2048, 4096, 1 << 16]),
    st.randoms(use_true_random=False),
)
def test_stats_lines_a_wrapper_stamped_roll_up_as_line_by_line(
    steps: list[tuple[int, int, int, int, float]], block: int, rng: random.Random
) -> None:
    # The stamp `kubectl logs --timestamps` puts before each line times it (rollup's
    # minute holds its zone, its seconds its fraction): seconds that go back inside a
    # second, zones, fractions of any length or none, a CRI file's `stdout F`, Docker's
    # json-file records, and wrappings the lane leaves to line by line, at block sizes
    # that cut minutes anywhere.
    t = datetime(2025, 12, 31, 23, 50, 0)
    lines: list[str] = []
    for pid, delta, ns, shape, kv in steps:
        t += timedelta(seconds=delta)
        wrap = _WRAPS[shape] if shape < len(_WRAPS) else rng.choice(_ODD_WRAPS)
        lines.append(wrap(t, ns, _engine_line(pid, t, len(lines) % 7, 0, kv)))
    _assert_lines_exact(lines, block)


@pytest.mark.parametrize("profile", ["sglang-dense", "sglang-thrash-ranks", "vllm-v0-stats"])
@pytest.mark.parametrize("block", [4096, 1 << 16])
def test_generated_logs_a_wrapper_stamped_through_the_lane_match_line_by_line(
    profile: str, block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SGLang's batch and retraction lines (eight ranks' copies of each) and V0's stats
    # lines, each stamped by `kubectl logs --timestamps`: read by the plain lane, timed
    # by that stamp, SGLang's rank read from under it.
    plain = tmp_path / "plain.log"
    with plain.open("wb") as f:
        _bench_generator().PROFILES[profile](f, 600_000, 3)
    stamped = _kubectl_stamped(plain.read_text(encoding="utf-8"), 3)
    # (and each line a record of Docker's json-file log, its stamp the record's `time`)
    for way, text in (("kubectl", stamped), ("docker", _docker_json(stamped))):
        path = tmp_path / f"{profile}.{way}.log"
        path.write_text(text, encoding="utf-8")
        rollup = Rollups.ALL if "thrash" in profile else Rollups.STATS
        on, taken = _assert_lane_exact(path, monkeypatch, block, rollup=rollup)
        # (Docker escapes a retraction's `->` as `-\u003e`: those lines, and their
        # blocks, go line by line)
        if way == "kubectl" or "thrash" not in profile:
            assert sum(taken) >= len(taken) - 2 and len(taken) > 8
        assert all(h.ts_wrapper is not None and h.ts_wrapper.kind == "iso" for h in on.hits)
        if profile.startswith("sglang"):
            assert {h.proc for h in on.hits} >= {"TP0"}


def test_a_block_of_kubectl_stamped_stats_lines_goes_the_plain_lanes_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every line with the wrapper's stamp, in UTC with nanoseconds: the plain lane
    # reads the block, and its hits are stamped and timed as line by line.
    start = datetime(2026, 3, 1, 23, 55)
    lines = [
        f"{start + timedelta(seconds=10 * i, microseconds=3001):%Y-%m-%dT%H:%M:%S.%f}123Z "
        + V1.format(m=(55 + i // 6) % 60, s=10 * (i % 6), p=100 + i, r=3)
        for i in range(120)
    ]
    path = tmp_path / "kubectl.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    on, taken = _assert_lane_exact(path, monkeypatch)
    assert taken == [True]
    first = on.hits[0]
    assert first.ts_wrapper is not None and first.ts_wrapper.kind == "iso"
    assert first.ts_wrapper.text == "2026-03-01T23:55:00.003001123Z"
    assert first.text.startswith("(APIServer pid=1) INFO ")
    # a rollup a minute, the wrapper's (23:55 to 00:14: the date turns at 00:00)
    assert [h.line for h in on.hits] == list(range(1, 121, 6))


_PREFILL = (
    "[{t} {rank}] Prefill batch, #new-seq: 4, #new-token: {tok}, #cached-token: 512, token "
    "usage: {kv}, #running-req: {run}, #queue-req: {q}, "
)
_DECODE = (
    "[{t} {rank}] Decode batch, #running-req: {run}, #token: {tok}, token usage: {kv}, cuda "
    "graph: True, gen throughput (token/s): {gen}, #queue-req: {q}, "
)
_RETRACT = (
    "[{t} {rank}] KV cache pool is full. Retract requests. #retracted_reqs: {run}, "
    "#new_token_ratio: 0.7000 -> 0.9000"
)
# Lines that are no plain batch line, each a way the lane must not read as one.
_SG_ODD = {
    "retract": lambda ln, t: _RETRACT.format(t=t, rank="TP0", run=3),
    "retract-next-day": lambda ln, t: _RETRACT.format(
        t=f"{datetime.fromisoformat(t) + timedelta(days=1):%Y-%m-%d %H:%M:%S}", rank="TP0", run=2
    ),
    "largest-len": lambda ln, t: ln.replace("cuda graph", "largest-len: 0, cuda graph"),
    "cut": lambda ln, t: ln[: ln.find("token usage") + 15],
    "fraction-stamp": lambda ln, t: ln.replace(f"[{t} ", f"[{t}.250 ", 1),
    "february-30": lambda ln, t: ln.replace(t[:10], f"{t[:4]}-02-30", 1),
    "no-space": lambda ln, t: ln.replace("] ", "]", 1),
    "usage-past-one": lambda ln, t: regex.sub(r"token usage: [\d.]+", "token usage: 1.25", ln),
    "glued": lambda ln, t: ln + ln,
    "kubectl": lambda ln, t: f"{t.replace(' ', 'T')}.000000000Z {ln}",
    "pid-in-it": lambda ln, t: ln + " (Worker pid=9)",
    "level-word": lambda ln, t: ln + " INFO",
    "quote": lambda ln, t: ln.replace("] ", "] > ", 1),
    # hard-wrapped by a terminal 60 columns wide: the line by line scan rejoins it
    "wrapped": lambda ln, t: _wrapped(ln),
    "wrapped-retract": lambda ln, t: _wrapped(_RETRACT.format(t=t, rank="TP0", run=3)),
}


def _wrapped(line: str, width: int = 60) -> str:
    return line[:width] + "\n" + line[width:]


_SG_STEP = st.tuples(
    st.sampled_from(["decode", "decode", "decode", "prefill"]),
    st.sampled_from(["TP0", "TP0", "DP1 TP1", "PP0 TP3", "GPU0", ""]),
    # seconds on: within a minute, to the next ones, an hour, a day, back
    st.sampled_from([0, 0, 1, 1, 2, 20, 59, 61, 3600, 86_400, -3, -70]),
    st.sampled_from(["0.05", "0.97", "0.50", "0.00", "1.00"]),
    # mostly plain lines, retractions now and then, any other odd kind rarely
    st.sampled_from([None] * 200 + ["retract"] * 8 + sorted(_SG_ODD)),
)


def _sglang_lines(steps: list[tuple[str, str, int, str, str | None]], start: datetime) -> list[str]:
    t = start
    out: list[str] = []
    for k, (batch, rank, delta, kv, odd) in enumerate(steps):
        t += timedelta(seconds=delta)
        stamp = f"{t:%Y-%m-%d %H:%M:%S}"
        shape = _DECODE if batch == "decode" else _PREFILL
        line = shape.format(
            t=stamp, rank=rank, run=k % 40, tok=1000 + k, kv=kv, gen=f"{k * 7.5:.2f}", q=k % 3
        )
        if rank == "":
            line = line.replace(" ]", "]", 1)
        out.append(line if odd is None else _SG_ODD[odd](line, stamp))
    return out


# A retraction as SGLang versions word it (plain shape: the lane reads it whole), and
# ways it is not plain.
_RETRACTIONS = (
    "KV cache pool is full. Retract requests. #retracted_reqs: {n}, #new_token_ratio: "
    "0.{n}000 -> 0.9000",
    "KV cache pool is full. Retract requests. #retracted_reqs: {n}, #new_tokens_gained: "
    "{n}096, #mamba_num_gained: {n}, #new_token_ratio: 0.0700 -> 0.3300",
    "KV cache pool is full. Retract requests. #retracted_reqs: {n}, #aborted_retracted_reqs: "
    "1, #new_token_ratio: 0.1200 -> 0.4400",
    "Decode out of memory happened. #retracted_reqs: {n}, #new_token_ratio: 0.2250 -> 0.6125",
    "KV cache pool is full. Retract requests. #retracted_reqs: {n}",
    # not plain: a field the shape does not know, a second record glued on, cut short
    "KV cache pool is full. Retract requests. #retracted_reqs: {n}, #new_field: 3",
    "KV cache pool is full. Retract requests. #retracted_reqs: {n} KV cache pool is full. "
    "Retract requests. #retracted_reqs: 1",
    "KV cache pool is full. Retract requests. #retracted_reqs: ",
    "Testing retraction. #retracted_reqs: {n}, #new_tokens_gained: 512",
)
_RETRACT_STEP = st.tuples(
    st.sampled_from(["decode", "decode", "prefill", "retract", "retract", "retract"]),
    # the ranks that print it: one, the TP ranks of one DP rank, two DP ranks
    st.sampled_from([("TP0",), ("TP0", "TP1", "TP2", "TP3"), ("DP0 TP0", "DP1 TP1"), ("",)]),
    st.sampled_from([0, 0, 0, 1, 1, 2, 59, 61, 86_400, -2]),
    st.sampled_from([0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]),  # which wording
    st.booleans(),  # one rank's copy printed after the next line
)


def _retracting_lines(
    steps: list[tuple[str, tuple[str, ...], int, int, bool]], start: datetime
) -> list[str]:
    t = start
    out: list[str] = []
    late: list[str] = []
    for k, (kind, ranks, delta, wording, later) in enumerate(steps):
        t += timedelta(seconds=delta)
        stamp = f"{t:%Y-%m-%d %H:%M:%S}"
        if kind != "retract":
            shape = _DECODE if kind == "decode" else _PREFILL
            line = shape.format(
                t=stamp, rank=ranks[0], run=k % 40, tok=1000 + k, kv="0.97", gen="9.5", q=k % 5
            )
            out.append(line.replace(" ]", "]", 1))
            out += late
            late = []
            continue
        record = _RETRACTIONS[wording].format(n=1 + k % 4)
        copies = [f"[{stamp} {rank}] {record}".replace(" ]", "]", 1) for rank in ranks]
        if later and len(copies) > 1:
            late.append(copies.pop())
        out += copies
    return out + late


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_RETRACT_STEP, min_size=40, max_size=300),
    st.sampled_from([2048, 4096, 1 << 16]),
    st.sampled_from([Rollups.ALL, Rollups.STATS]),
)
def test_retraction_lines_among_batch_lines_roll_up_as_line_by_line(
    steps: list[tuple[str, tuple[str, ...], int, int, bool]], block: int, rollup: Rollups
) -> None:
    # A thrashing server: retractions as dense as its batch lines, printed by one rank
    # or copied by several at one stamp (a copy now and then after the next line),
    # worded as each SGLang version words them or not plain, across midnight and back
    # in time. The lane reads the plain ones as columns and gives them to the sink in
    # their place; the scan is the line-by-line one, preemption rollups on or off.
    lines = _retracting_lines(steps, datetime(2025, 11, 2, 23, 58, 30))
    with pytest.MonkeyPatch.context() as monkeypatch, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "retracting.log"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        _assert_lane_exact(path, monkeypatch, block=block, every=True, rollup=rollup)


def test_a_block_of_retractions_from_eight_ranks_goes_the_plain_lanes_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Eight ranks retracting every second: four lines in five are retractions, far
    # past what a block may hold of odd lines (lane_plain.MAX_ODD). They are plain
    # lines of the lane now: every block is its, each minute's retractions one rollup
    # counted once a stamp, as line by line.
    steps = [
        ("retract", tuple(f"TP{r}" for r in range(8)), 1, 0, False)
        if k % 3 == 2
        else ("decode", ("TP0",), 0, 0, False)
        for k in range(6000)
    ]
    path = tmp_path / "ranks.log"
    path.write_text("\n".join(_retracting_lines(steps, datetime(2025, 11, 2, 10, 0))) + "\n")
    on, taken = _assert_lane_exact(path, monkeypatch, block=1 << 16, rollup=Rollups.ALL)
    assert len(taken) > 10 and all(taken)
    assert on.recognised == {"stats": 4000, "preemption": 16_000}
    # ~34 minutes of them, a rollup each: 2,000 records, the eight copies of each
    # counted once
    rolled = [h for h in on.hits if h.sig == "sglang.retract"]
    assert len(rolled) < 40 and all(h.rollup for h in rolled)
    assert sum(h.rollup.stats.n for h in rolled if h.rollup) == 2000


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_SG_STEP, min_size=40, max_size=200),
    st.sampled_from([2048, 4096, 1 << 16]),
    st.sampled_from([datetime(2025, 11, 2, 0, 0), datetime(2024, 2, 28, 23, 58, 30)]),
)
def test_sglang_batch_lines_with_odd_lines_among_them_roll_up_as_line_by_line(
    steps: list[tuple[str, str, int, str, str | None]], block: int, start: datetime
) -> None:
    # Decode and prefill streams of several ranks, clocks stepping across midnight
    # and a leap day, and among them lines of every odd kind: retractions (of this
    # clock and of another), batch lines of another shape, cut, glued, stamped
    # otherwise, with a pid or a level word in them. Whatever the lane takes, and
    # whatever it gives back, the scan is the line-by-line one.
    lines = _sglang_lines(steps, start)
    with pytest.MonkeyPatch.context() as monkeypatch, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sglang.log"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        _assert_lane_exact(path, monkeypatch, block=block, every=True)


def _batch_log(n: int, odd: dict[int, str]) -> list[str]:
    steps = [
        ("prefill" if k % 9 == 0 else "decode", "TP0", k % 2, "0.50", odd.get(k)) for k in range(n)
    ]
    return _sglang_lines(steps, datetime(2025, 11, 2, 10, 0))


@pytest.mark.parametrize(
    ("odd", "taken"),
    [
        ("retract", True),  # a retraction of the same clock: its hit goes in its place
        ("cut", True),  # no hit, an unparsed line counted
        ("usage-past-one", True),  # 125 %: the converter takes it, as line by line
        ("retract-next-day", False),  # would end the open rollups
        ("largest-len", False),  # a stats hit line by line: it might join a rollup
        ("glued", False),
        ("kubectl", False),
        ("wrapped", False),  # a rejoin reaches into the next line
        # (a rejoined line's hit is no stats hit: the lane leaves rejoins to line by
        # line all the same)
        ("wrapped-retract", False),
    ],
)
def test_an_odd_line_among_batch_lines_goes_its_own_way(
    odd: str, taken: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "batch.log"
    path.write_text("\n".join(_batch_log(900, {400: odd})) + "\n", encoding="utf-8")
    on, took = _assert_lane_exact(path, monkeypatch)
    assert took == [taken]
    kinds = {h.sig for h in on.hits}
    assert {"sglang.stats.decode", "sglang.stats.prefill"} <= kinds


def test_a_retraction_among_batch_lines_keeps_its_place_and_the_rollups_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two batch lines a second: a minute's rollup of each batch kind runs on across
    # the retraction line, whose hit sits between the rollups its minute opened
    # before it and those opened after.
    path = tmp_path / "batch.log"
    path.write_text("\n".join(_batch_log(900, {400: "retract"})) + "\n", encoding="utf-8")
    on, took = _assert_lane_exact(path, monkeypatch)
    assert took == [True]
    at = next(i for i, h in enumerate(on.hits) if h.sig == "sglang.retract")
    retract = on.hits[at]
    assert (retract.line, retract.fields["count"], retract.proc) == (401, 3, "TP0")
    assert on.hits[at - 1].line < 401 < on.hits[at + 1].line
    around = [h for h in on.hits if h.rollup and h.line < 401 and h.rollup.last.line > 401]
    assert [h.sig for h in around] == ["sglang.stats.decode", "sglang.stats.prefill"]
    assert on.recognised == {"stats": 899, "preemption": 1}


@pytest.mark.parametrize("odd", ["retract", "wrapped-retract"])
def test_an_odd_line_in_a_blocks_tail_waits_for_the_next_block(
    odd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The line by line scan holds a candidate among a block's last lines back for
    # the next block (a wrapped record may go on there): the polars lane does not
    # take that block; the plain lane takes the lines above it, and the line by line
    # scan the rest.
    lines = _batch_log(300, {297: odd})
    path = tmp_path / "batch.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    on, took = _assert_lane_exact(path, monkeypatch)
    assert took == [True]
    assert [h.line for h in on.hits if h.sig == "sglang.retract"] == [298]
    monkeypatch.setattr(lane_plain, "ENABLED", False)
    polars_lane = _spy_on_lane(monkeypatch)
    _scan(path, monkeypatch, True, 1 << 20)
    assert polars_lane == [False]


def _three_blocks_of_stats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, big: bool) -> Path:
    """A log of ~2.7 MiB of stats lines, counted as big (BIG_BYTES) or not."""
    path = tmp_path / "stats.log"
    lines = _plain_log(12_000, datetime(2025, 6, 3, 0, 0), 10, 3)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert path.stat().st_size > 2 << 20
    # (big: not to write 8 MiB)
    monkeypatch.setattr(bulk, "BIG_BYTES", path.stat().st_size + (0 if big else 1))
    return path


def test_a_big_files_first_dense_block_goes_the_lanes_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the polars lane's gating: lane_plain.py's, which pays no polars, is
    # test_lane_plain.py's)
    monkeypatch.setattr(lane_plain, "ENABLED", False)
    # Big on disk and dense with stats lines from its first block (a month of them):
    # that block goes the lane's way too, not one line at a time before polars.
    path = _three_blocks_of_stats(tmp_path, monkeypatch, big=True)
    monkeypatch.setattr(lane, "ENABLED", False)
    off = scan_fast(open_source(str(path)), MATCHER, rollup=True)
    monkeypatch.setattr(lane, "ENABLED", True)
    taken = _spy_on_lane(monkeypatch)
    on = scan_fast(open_source(str(path)), MATCHER, rollup=True)
    assert taken == [True, True, True]
    assert (on.hits, on.members, on.recognised) == (off.hits, off.members, off.recognised)


def test_a_big_sparse_file_never_tries_the_lane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the polars lane's gating: lane_plain.py's, which pays no polars, is
    # test_lane_plain.py's)
    monkeypatch.setattr(lane_plain, "ENABLED", False)
    # A few stats lines a block among other lines: no block is dense enough to pay
    # polars for (the lane is not even asked).
    filler = "(APIServer pid=1) INFO 06-03 00:00:00 [logger.py:41] GET /health 200 OK\n" * 1500
    stats = _plain_log(600, datetime(2025, 6, 3, 0, 0), 10, 4)
    path = tmp_path / "sparse.log"
    with path.open("w", encoding="utf-8") as f:
        for i in range(0, len(stats), 20):
            f.write(filler + "\n".join(stats[i : i + 20]) + "\n")
    monkeypatch.setattr(bulk, "BIG_BYTES", 1 << 20)
    taken = _spy_on_lane(monkeypatch)
    got = scan_fast(open_source(str(path)), MATCHER, rollup=True)
    assert taken == []
    assert got.recognised["stats"] == 600
    # ... nor does a --jobs range of it, nor bulk.py: a GiB of request logging's ranges
    # paid polars for ~9 candidate lines a block (--jobs 2: 2.8 s CPU, one job 1.9 s)
    bulked: list[bool] = []
    real = passes.match_block

    def spy(*args: Any) -> bool:
        bulked.append(args[-1])
        return bool(real(*args))

    monkeypatch.setattr(passes, "match_block", spy)
    size = path.stat().st_size
    half = path.read_bytes().index(b"\n", size // 2) + 1
    part = scan_fast(open_source(str(path)), MATCHER, byte_range=(half, size), rollup=True)
    assert taken == [] and bulked and not any(bulked)
    assert 0 < part.recognised["stats"] < 600


def test_a_small_dense_file_tries_the_lane_only_after_many_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the polars lane's gating: lane_plain.py's, which pays no polars, is
    # test_lane_plain.py's)
    monkeypatch.setattr(lane_plain, "ENABLED", False)
    # Under BIG_BYTES a file's first AFTER_LINES candidate lines go one by one: polars'
    # pages cost more memory than a short log saves in time (a day of stats lines).
    path = _three_blocks_of_stats(tmp_path, monkeypatch, big=False)
    taken = _spy_on_lane(monkeypatch)
    scan_fast(open_source(str(path)), MATCHER, rollup=True)
    assert taken == []
    monkeypatch.setattr(bulk, "AFTER_LINES", 4000)  # under a block of lines
    scan_fast(open_source(str(path)), MATCHER, rollup=True)
    assert taken == [True, True]  # the blocks after the first


ENGINE = Path(__file__).resolve().parent / "fixtures" / "engine" / "vllm-0.32.0"
# The engine head of a stats line: the lane reads it as polars columns, so a new stamp
# goes in its place and nothing else of the recorded line changes.
_ENGINE_STAMP = regex.compile(r"^(\(APIServer pid=\d+\) INFO )\d\d-\d\d \d\d:\d\d:\d\d ")


def _replayed_engine_log(path: Path, lines: int) -> None:
    """A quiet server's hours in vLLM 0.32.0's own lines: the recorded healthy run's
    start-up, then every stats line the recorded runs printed, cycled one each 10 s
    and re-stamped, with the access lines the healthy run printed among them."""
    head = (ENGINE / "healthy" / "server.log").read_text(encoding="utf-8").split("\n")
    first = next(i for i, line in enumerate(head) if "loggers.py" in line)
    access = [line for line in head if "HTTP/1.1" in line]
    stats = [
        line
        for run in sorted(ENGINE.glob("*/server.log"))
        for line in run.read_text(encoding="utf-8").split("\n")
        if _ENGINE_STAMP.match(line) and "Engine 000:" in line
    ]
    assert len(stats) > 100 and access  # the recordings are there
    t = datetime(2026, 12, 31, 20, 0, 0)  # the year turns in the middle
    out = head[:first]
    for i in range(lines):
        out.append(_ENGINE_STAMP.sub(rf"\g<1>{t:%m-%d %H:%M:%S} ", stats[i % len(stats)]))
        if i % 6 == 5:
            out.append(access[i % len(access)])
        t += timedelta(seconds=10)
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


@pytest.mark.parametrize("block", [4096, 1 << 16])
def test_the_real_engines_stats_lines_through_the_lane_match_line_by_line(
    block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The speed of a long log rests on the lane taking what a real engine prints
    # (`CPU KV cache usage`, `Engine 000:`, its access lines), not only our generator's
    # lines: nearly every block goes its way, and the result is line by line's.
    path = tmp_path / "replayed.log"
    _replayed_engine_log(path, 3000)
    on, taken = _assert_lane_exact(path, monkeypatch, block)
    # (the start-up lines' blocks miss: three of 4 KiB, each tried again at the next)
    assert sum(taken) >= len(taken) - 3 and len(taken) > 8
    assert on.recognised["stats"] == 3000
    # rolled up by the minute: six lines to each of 500 minutes
    stats = [h for h in on.hits if h.sig == "vllm.v1.stats"]
    assert len(stats) == 500
    assert sum(h.rollup.stats.n if h.rollup else 1 for h in stats) == 3000


LANE_FUZZ_SEED, LANE_FUZZ_INPUTS = 13, 30


def test_damaged_generated_logs_through_the_lane_and_bulk_match_line_by_line() -> None:
    """The CI slice of bench/lane_fuzz.py (the long run: --count 5000): dense
    generated logs damaged by fuzz.py's mutators, scanned one line at a time, by
    bulk.py and through the lane, all three alike; and analyze's report the same with
    calm minutes as without."""
    tally = bench_module("lane_fuzz").run(LANE_FUZZ_SEED, range(LANE_FUZZ_INPUTS))
    assert tally.inputs == LANE_FUZZ_INPUTS
    assert tally.lane_blocks > 100  # the slice exercises the lane, not only its refusals
    assert tally.calm_minutes > 100  # ... and calm minutes
    assert not tally.found, "\n".join(tally.found)


@pytest.mark.parametrize("block", [1500, 8192, 1 << 20])
def test_data_parallel_engines_of_one_api_server_roll_up_apart(
    block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--data-parallel-size 2 --api-server-count 1`: one process prints a line per engine
    # every 10 s. Each engine has its own pool and queue, so a rollup holds one engine's
    # lines (rollup.STREAM_FIELDS), in the lane as line by line.
    rng = random.Random(7)
    t = datetime(2026, 12, 6, 3, 44, 4)
    lines = []
    for _ in range(1200):
        t += timedelta(seconds=10)
        for engine in (0, 1):
            lines.append(
                f"(APIServer pid=9762) INFO {t:%m-%d %H:%M:%S} [loggers.py:335] Engine "
                f"00{engine}: Avg prompt throughput: {rng.uniform(0, 99):.1f} tokens/s, Avg "
                f"generation throughput: {rng.uniform(500, 1200):.1f} tokens/s, Running: "
                f"{rng.randrange(3, 15)} reqs, Waiting: {rng.randrange(0, 180)} reqs, CPU KV "
                f"cache usage: {rng.choice([80.6, 90.3, 96.8, 100.0])}%, Prefix cache hit rate: "
                "0.0%"
            )
    path = tmp_path / "dp.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    on, taken = _assert_lane_exact(path, monkeypatch, block, every=True)
    assert any(taken)
    carriers = [h for h in on.hits if h.rollup]
    # a minute's six lines of each engine: two rollups a minute, each one engine's
    assert {h.rollup.stats.n for h in carriers if h.rollup} <= {1, 2, 3, 4, 5, 6}
    by_minute: dict[str | None, set[object]] = {}
    for h in carriers:
        assert h.rollup is not None
        assert h.rollup.peak_first.fields["engine_idx"] == h.fields["engine_idx"]
        by_minute.setdefault((h.ts_engine or "")[:11], set()).add(h.fields["engine_idx"])
    assert sum(len(v) == 2 for v in by_minute.values()) >= len(by_minute) - 2
