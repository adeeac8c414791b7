"""scan/lane_plain.py: blocks of plain V1 stats lines read in Python's `re`, without
polars. test_lane.py holds every block it takes to the line-by-line scan (and the
polars lane, with it off, too); here: that it takes what a quiet vLLM server prints
from the first block on, never imports polars doing so, gives the polars lane's calm
minutes, refuses what it must, and that each shortcut it takes is its long way."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from datetime import datetime, timedelta
from functools import reduce
from operator import add
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_equivalence import _bench_generator
from test_lane import MATCHER, _assert_lane_exact, _replayed_engine_log, _sglang_lines

import preemptdiag.scan.bulk as bulk
import preemptdiag.scan.lane as lane
import preemptdiag.scan.lane_plain as lane_plain
import preemptdiag.scan.passes as passes
from preemptdiag.commands.analyze import Options, run_analysis
from preemptdiag.ingest.sources import open_source
from preemptdiag.render.json_format import report_dict
from preemptdiag.scan.bulk import _BAD, _converted
from preemptdiag.scan.matcher import ScanResult
from preemptdiag.scan.passes import scan_fast
from preemptdiag.scan.rollup import Rollups, snap6
from preemptdiag.scan.signatures import load
from preemptdiag.timeline.events import TimeContext

ROOT = Path(__file__).resolve().parents[1]
SIGS = {s.id: s for s in load()}
V1 = (
    "(APIServer pid=1) INFO {t:%m-%d %H:%M:%S} [loggers.py:236] Engine 000: Avg prompt "
    "throughput: {p:.1f} tokens/s, Avg generation throughput: {g:.1f} tokens/s, Running: "
    "{r} reqs, Waiting: {w} reqs, GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: 0.0%"
)
WARNING_STATS = (
    V1.replace(" INFO ", " WARNING ")
    .replace("{p:.1f}", "1.0")
    .replace("{g:.1f}", "2.0")
    .replace("{r}", "3")
    .replace("{w}", "0")
    .replace("{kv:.1f}", "4.0")
)
START = (
    "(APIServer pid=1) INFO {t:%m-%d %H:%M:%S} [api_server.py:1880] vLLM API server version "
    "0.12.0\n"
    "(EngineCore_DP0 pid=312) INFO {t:%m-%d %H:%M:%S} [gpu_worker.py:298] Available KV cache "
    "memory: 54.79 GiB\n"
    "(EngineCore_DP0 pid=312) INFO {t:%m-%d %H:%M:%S} [kv_cache_utils.py:1087] GPU KV cache "
    "size: 448,848 tokens"
)


def _v1_log(path: Path, n: int, odd: dict[int, str] | None = None, start: bool = True) -> None:
    """A quiet server's start-up lines and `n` V1 stats lines 10 s apart (waiting now
    and then, KV up to 97 %), with `odd` lines put before the stats line of their index."""
    t = datetime(2026, 2, 28, 20, 0, 0)  # the Feb 28 -> Mar 1 turn inside
    out = [START.format(t=t)] if start else []
    for i in range(n):
        if odd and i in odd:
            out.append(odd[i].format(t=t))
        out.append(
            V1.format(t=t, p=i % 97 * 1.5, g=i % 13 * 7.25, r=i % 9, w=(i % 50 == 7) * 3, kv=i % 98)
        )
        t += timedelta(seconds=10)
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


def _spy(monkeypatch: pytest.MonkeyPatch) -> Counter[bool | str | None]:
    """What lane_plain.take answered, while it is on: True (it took the whole block),
    "part" (the lines above an odd line in its tail), False (none: line by line),
    None (the polars lane's to judge)."""
    said: Counter[bool | str | None] = Counter()
    real = lane_plain.take

    def spy(*args: Any) -> int | None:
        got = real(*args)
        text, tail = args[2], args[-1]
        # (a part is taken by a second call on its lines, with no tail: not counted)
        if lane_plain.ENABLED and tail < len(text):
            said[None if got is None else "part" if 0 < got < len(text) else got > 0] += 1
        return got

    monkeypatch.setattr(lane_plain, "take", spy)
    return said


@pytest.mark.parametrize("block", [4096, 1 << 16, 1 << 20])
def test_a_quiet_servers_log_goes_this_way_from_its_first_block(
    block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Start-up lines above the first stats line are odd lines matched as line by line
    # in their place (the polars lane sent such a block line by line).
    path = tmp_path / "quiet.log"
    _v1_log(path, 3000)
    said = _spy(monkeypatch)
    on, _ = _assert_lane_exact(path, monkeypatch, block, every=True)
    assert said[True] >= (1 if block == 1 << 20 else 2) and said[None] == said[False] == 0
    assert {h.sig for h in on.hits} >= {"vllm.capacity.available_kv_memory", "vllm.v1.stats"}


def test_the_real_engines_lines_go_this_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM 0.32.0's own stats and access lines (test_lane.py's replay): every block
    # after the start-up one, whose config lines are too long for a lane.
    path = tmp_path / "replayed.log"
    _replayed_engine_log(path, 3000)
    said = _spy(monkeypatch)
    _assert_lane_exact(path, monkeypatch, 1 << 16)
    assert said[True] >= 8 and said[None] == 0


@pytest.mark.parametrize(
    ("odd", "answer"),
    [
        # Ray's repeat mark on a candidate line: neither lane takes the block
        (
            "(EngineCore_DP0 pid=312) INFO {t:%m-%d %H:%M:%S} [gpu_worker.py:298] Available "
            "KV cache memory: 5.0 GiB [repeated 2x across cluster]",
            False,
        ),
        # a candidate line past MAX_LINE: the same
        (
            "(EngineCore_DP0 pid=312) INFO {t:%m-%d %H:%M:%S} [gpu_worker.py:298] Available "
            "KV cache memory: 5.0 GiB " + "x" * lane.MAX_LINE,
            False,
        ),
        # a stats line at WARNING: a stats hit among the odd lines, the polars lane's
        (WARNING_STATS, None),
        # a line of another clock (kubectl's stamp) among the stats lines: line by line
        (
            "2026-02-27T23:10:00.5Z (EngineCore_DP0 pid=312) INFO {t:%m-%d %H:%M:%S} "
            "[gpu_worker.py:298] Available KV cache memory: 5.0 GiB",
            False,
        ),
        # a line of the same clock: matched as line by line in its place, the block taken
        (
            "(EngineCore_DP0 pid=312) INFO {t:%m-%d %H:%M:%S} [gpu_worker.py:298] Available "
            "KV cache memory: 5.0 GiB",
            True,
        ),
    ],
    ids=["repeat-mark", "long-line", "warning-stats", "other-clock", "same-clock"],
)
def test_an_odd_line_among_the_stats_lines(
    odd: str, answer: bool | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "odd.log"
    _v1_log(path, 400, {200: odd}, start=False)
    said = _spy(monkeypatch)
    _assert_lane_exact(path, monkeypatch, 1 << 20, every=True)
    assert said == Counter({answer: 1})


def test_preemption_counts_on_some_lines_are_shown_for_their_signatures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `Preemptions: N` (a fixed vLLM prints it when not zero) holds a literal the first
    # line does not: the other signatures it makes the lines candidates of are shown
    # to match none of them, and the block is still taken; the counts and the minutes
    # they are in are no calm minutes.
    lines = [
        V1.format(
            t=datetime(2026, 3, 1, 0, 0, 10 * i % 60) + timedelta(minutes=i // 6),
            p=1.0,
            g=2.0,
            r=5,
            w=0,
            kv=50.0,
        )
        for i in range(600)
    ]
    for i in range(3, 600, 50):
        lines[i] = lines[i].replace("GPU KV", f"Preemptions: {i % 7 + 1}, GPU KV")
    path = tmp_path / "counts.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    said = _spy(monkeypatch)
    on, _ = _assert_lane_exact(path, monkeypatch, 1 << 20, every=True)
    assert said == Counter({True: 1})
    # (a line with a count is a stream of its own: its fields differ in what is there)
    counted = [h.rollup.stats.preemptions if h.rollup else h.fields["preemptions"] for h in on.hits]
    assert sum(n for n in counted if n) == sum(i % 7 + 1 for i in range(3, 600, 50))


def _calm(path: Path, monkeypatch: pytest.MonkeyPatch, plain: bool, block: int) -> ScanResult:
    monkeypatch.setattr(bulk, "AFTER_LINES", 0)
    monkeypatch.setattr(passes, "BLOCK_BYTES", block)
    monkeypatch.setattr(lane_plain, "ENABLED", plain)
    monkeypatch.setattr(lane.Lane, "missed", lambda self, block: None)
    return scan_fast(open_source(str(path)), MATCHER, rollup=True, calm_kv=90.0)


def _table(r: ScanResult) -> list[tuple[object, ...]]:
    # each value with its type: an int column must not come back as floats
    return [
        (
            c.source,
            c.sig,
            c.fields,
            c.sglang,
            c.frame.names if c.frame else None,
            [[(type(v), v) for v in col] for col in c.frame.data] if c.frame else None,
        )
        for c in r.calm
    ]


@pytest.mark.parametrize("block", [4096, 1 << 20])
def test_calm_minutes_are_the_polars_lanes(
    block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (no start-up lines: the polars lane sends their block line by line, this one not)
    path = tmp_path / "quiet.log"
    _v1_log(path, 3000, start=False)
    said = _spy(monkeypatch)
    polars_lane = _calm(path, monkeypatch, False, block)
    mine = _calm(path, monkeypatch, True, block)
    assert said[True] >= (1 if block == 1 << 20 else 2) and said[None] == 0
    assert mine.calm_minutes > 150  # (minutes with waiting, KV >= 90 %, at an edge: hits)
    assert _table(mine) == _table(polars_lane)
    assert mine.hits == polars_lane.hits
    # numbers with no gap kept as arrays (in the fewest bytes), packed from 16 rows
    # (records.PackedNumbers), one value once (8 rows or more), as plain_columns keeps
    # them
    frame = max((c.frame for c in mine.calm if c.frame), key=lambda f: f.height)
    kinds = {name: type(col).__name__ for name, col in zip(frame.names, frame.data, strict=True)}
    numbers = {kinds[n] for n in ("first_line", "sum_kv_usage", "mean_running", "minute")}
    assert numbers <= {"array", "PackedNumbers"} and frame.column("sum_kv_usage").typecode == "d"
    assert ("PackedNumbers" in kinds.values()) is (frame.height >= 16), kinds
    one = "Const" if frame.height >= 8 else "list"
    assert kinds["swapped_first"] == kinds["f_engines_aggregated"] == one  # (None a row)


def test_the_report_is_the_line_by_line_scans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # analyze with its calm minutes, the start-up block included, byte for byte
    path = tmp_path / "quiet.log"
    _v1_log(path, 3000)
    monkeypatch.setattr(bulk, "AFTER_LINES", 0)
    monkeypatch.setattr(passes, "BLOCK_BYTES", 1 << 16)
    said = _spy(monkeypatch)
    reports = []
    for on in (True, False):
        monkeypatch.setattr(lane, "ENABLED", on)
        got = run_analysis(Options(files=(str(path),), time=TimeContext(year=2026), jobs=1))
        reports.append(json.dumps(report_dict(got.report), sort_keys=True))
    assert said[True] >= 2
    assert reports[0] == reports[1]


def _fresh_scan(
    path: Path, setup: str = "", shows: str = "r.calm_minutes > 0", rollup: str = "STATS"
) -> str:
    """What a scan of `path` in a process of its own shows (`shows`, then whether it
    imported polars), after `setup` (lines of Python: bulk and lane_plain imported),
    with the rollups named (rollup.Rollups)."""
    code = (
        "import sys\n"
        "import preemptdiag.scan.bulk as bulk\n"
        "import preemptdiag.scan.lane_plain as lane_plain\n"
        "from preemptdiag.ingest.sources import open_source\n"
        "from preemptdiag.scan.matcher import Matcher\n"
        "from preemptdiag.scan.passes import scan_fast\n"
        "from preemptdiag.scan.rollup import Rollups\n"
        "from preemptdiag.scan.signatures import load\n"
        f"{setup}"
        "r = scan_fast(\n"
        f"    open_source(sys.argv[1]), Matcher(load()), rollup=Rollups.{rollup}, calm_kv=90.0\n"
        ")\n"
        f"print({shows}, 'polars' in sys.modules)\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT
    )
    assert got.returncode == 0, got.stderr
    return got.stdout.split("\n")[0]


def test_a_scan_of_v1_stats_lines_never_imports_polars(tmp_path: Path) -> None:
    # The --jobs worker's memory: polars' pages are ~55 MiB of it. (A stats line at
    # WARNING sends its block the polars lane's way: the check would see polars.)
    # (the warned log is past bulk.BIG_BYTES, where the polars lane is tried at once;
    # this lane is tried on any file's dense blocks)
    quiet = tmp_path / "quiet.log"
    _v1_log(quiet, 6000)
    warned = tmp_path / "warned.log"
    _v1_log(warned, 40000, {20000: WARNING_STATS})
    assert _fresh_scan(quiet) == "True False"
    assert _fresh_scan(warned) == "True True"


def test_a_big_v0_log_with_its_start_up_lines_never_imports_polars(tmp_path: Path) -> None:
    # V0's start-up lines hold `llm_engine.py:` (a stop of the lanes): its first block
    # goes line by line, without polars' bulk matching (a dense first block of a big
    # file pays for polars otherwise), and every block after it goes this lane's way:
    # no polars pages for a month of V0 stats lines. (Big from 1 MiB here: not to
    # write 8 MiB.)
    path = tmp_path / "v0.log"
    with path.open("wb") as f:
        _bench_generator().PROFILES["vllm-v0-stats"](f, 3 << 20, 2)
    assert " llm_engine.py:" in path.read_text(encoding="utf-8")[:4096]
    assert _fresh_scan(path, "bulk.BIG_BYTES = 1 << 20\n") == "True False"


def _sglang_log(path: Path, n: int, start: datetime, prefill_until: int | None = None) -> None:
    """`n` SGLang batch lines of one rank, two a second (a prefill line every ninth,
    up to line `prefill_until`), queues coming and going, KV at 50 %."""
    steps = [
        (
            "prefill" if k % 9 == 0 and (prefill_until is None or k < prefill_until) else "decode",
            "TP0",
            k % 2,
            "0.50",
            None,
        )
        for k in range(n)
    ]
    path.write_text("\n".join(_sglang_lines(steps, start)) + "\n", encoding="utf-8")


@pytest.mark.parametrize("block", [4096, 1 << 16, 1 << 20])
def test_a_dense_sglang_log_goes_this_way_from_its_first_block(
    block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Decode and prefill lines share each block: both signatures' lines are read in
    # one pass, rolled up apart and walked in line order.
    path = tmp_path / "sglang.log"
    _sglang_log(path, 6000, datetime(2025, 11, 2, 10, 0))
    said = _spy(monkeypatch)
    on, _ = _assert_lane_exact(path, monkeypatch, block, every=True)
    assert said[True] >= (1 if block == 1 << 20 else 10) and said[None] == said[False] == 0
    assert {h.sig for h in on.hits} == {"sglang.stats.decode", "sglang.stats.prefill"}
    assert on.recognised == {"stats": 6000}


@pytest.mark.parametrize(
    ("start", "prefill_until", "block"),
    [
        (datetime(2025, 11, 2, 10, 0), None, 1 << 16),
        (datetime(2025, 11, 2, 10, 0), None, 1 << 20),
        # One block across midnight: a date is SGLang's clock, and each line's clock
        # run is counted in the block's line order over both signatures' lines
        # (prefill lines on both sides of midnight, or only before it).
        (datetime(2025, 11, 2, 23, 40), None, 1 << 20),
        (datetime(2025, 11, 2, 23, 40), 1000, 1 << 20),
    ],
    ids=["64k-blocks", "1m-blocks", "midnight", "midnight-decode-only-after"],
)
def test_sglang_lines_roll_up_and_go_calm_as_the_other_ways(
    start: datetime,
    prefill_until: int | None,
    block: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "sglang.log"
    _sglang_log(path, 6000, start, prefill_until)
    said = _spy(monkeypatch)
    _assert_lane_exact(path, monkeypatch, block, every=True)
    polars_lane = _calm(path, monkeypatch, False, block)
    mine = _calm(path, monkeypatch, True, block)
    assert said[True] >= (2 if block == 1 << 20 else 20) and said[None] == said[False] == 0
    # (64 KiB is ~3.5 minutes of these lines: fewer calm minutes, more edges)
    assert mine.calm_minutes > (25 if block == 1 << 16 else 40)
    assert {(c.sig, c.sglang) for c in mine.calm} == {
        ("sglang.stats.decode", True),
        ("sglang.stats.prefill", True),
    }
    assert _table(mine) == _table(polars_lane)
    assert mine.hits == polars_lane.hits
    # the stamps' parts as SGLang prints them: the day is a date
    days = {d for c in mine.calm if c.frame for d in c.frame.column("day")}
    assert days == ({"2025-11-02"} if start.hour < 23 else {"2025-11-02", "2025-11-03"})
    assert {p for c in mine.calm if c.frame for p in c.frame.column("peak_proc")} == {"TP0"}


@pytest.mark.parametrize("rollup", [Rollups.STATS, Rollups.ALL])
def test_a_minute_with_a_retraction_is_never_calm(
    rollup: Rollups, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Retractions among quiet batch lines (KV at 50 %), three ranks' copies of one:
    # read by this lane as its own lines, their minutes are busy as an odd line's
    # are to the polars lane (lane.calm_of). The calm minutes are the polars lane's,
    # and none is a retraction's minute.
    path = tmp_path / "sglang.log"
    _sglang_log(path, 6000, datetime(2025, 11, 2, 10, 0))
    lines = path.read_text(encoding="utf-8").split("\n")
    retract = "KV cache pool is full. Retract requests. #retracted_reqs: 2"
    busy = set()
    for k, ranks in ((3000, ("TP0",)), (1200, ("TP0", "TP1", "TP2"))):  # (from the end)
        stamp = lines[k][1:20]
        busy.add(stamp[:16])
        lines[k + 1 : k + 1] = [f"[{stamp} {rank}] {retract}" for rank in ranks]
    path.write_text("\n".join(lines), encoding="utf-8")
    monkeypatch.setattr(bulk, "AFTER_LINES", 0)
    monkeypatch.setattr(passes, "BLOCK_BYTES", 1 << 20)
    monkeypatch.setattr(lane.Lane, "missed", lambda self, block: None)
    got = {}
    for plain in (False, True):
        monkeypatch.setattr(lane_plain, "ENABLED", plain)
        got[plain] = scan_fast(open_source(str(path)), MATCHER, rollup=rollup, calm_kv=90.0)
    mine = got[True]
    assert _table(mine) == _table(got[False]) and mine.hits == got[False].hits
    assert mine.recognised == {"stats": 6000, "preemption": 4}
    calm = {
        f"{d} {h:02d}:{m:02d}"
        for c in mine.calm
        if c.frame
        for d, h, m in zip(*(c.frame.column(k) for k in ("day", "hour", "minute")), strict=True)
    }
    assert len(calm) > 40 and not busy & calm
    assert busy == {"2025-11-02 10:10", "2025-11-02 10:25"}


SGLANG_RETRACT_RUN = ROOT / "tests/fixtures/engine/sglang-0.5.23/retract/server.log"
_SG_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]")


def test_a_real_sglang_servers_retractions_go_this_way_as_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SGLang 0.5.23's own lines (bench/engine/sglang_harness.py's recorded retract run):
    # its serving minutes (batch lines, 22 retractions, access lines) replayed one
    # after the other, each time later, across midnight. The retractions the engine
    # printed fit the lane's shape: its blocks take them, and the scan is the line by
    # line one, preemption rollups on.
    lines = SGLANG_RETRACT_RUN.read_text(encoding="utf-8").split("\n")
    first = next(i for i, line in enumerate(lines) if " batch, " in line)
    last = max(i for i, line in enumerate(lines) if " batch, " in line)
    served = [line for line in lines[first : last + 1] if _SG_STAMP.match(line)]
    stamps = [datetime.fromisoformat(m[1]) for m in map(_SG_STAMP.match, served) if m]
    span = stamps[-1] - stamps[0] + timedelta(seconds=1)
    shift = datetime(2026, 12, 6, 23, 40) - stamps[0]
    out = []
    for _ in range(40):
        for line, t in zip(served, stamps, strict=True):
            out.append(_SG_STAMP.sub(f"[{t + shift:%Y-%m-%d %H:%M:%S}]", line, count=1))
        shift += span
    path = tmp_path / "sglang-retract.log"
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    assert sum("Retract requests" in line for line in served) == 22
    fed: list[int] = []
    feed = lane.feed_preemption
    monkeypatch.setattr(lane, "feed_preemption", lambda *a: fed.append(feed(*a)) or fed[-1])
    on, taken = _assert_lane_exact(path, monkeypatch, 1 << 16, every=True, rollup=Rollups.ALL)
    assert sum(taken) >= len(taken) - 2 and len(taken) > 10
    assert on.recognised["preemption"] == 40 * 22
    # (the lane's lines, not odd ones: a block across midnight goes line by line)
    assert len(fed) >= 40 * 22 - 44


def test_a_dense_sglang_log_never_imports_polars(tmp_path: Path) -> None:
    # A retraction the lane does not read whole (a field it does not know) among a
    # block's last lines waits for the next block (a wrapped record may go on there):
    # the lines above it go this way, the rest line by line.
    # A block with a line the lanes never take (Ray's repeat mark) goes line by line,
    # without polars' bulk matching, which would pay its pages for that one block.
    # (Big from 1 MiB here, bulk from 1,000 lines: not to write 8 MiB.)
    path = tmp_path / "sglang.log"
    _sglang_log(path, 24_000, datetime(2025, 11, 2, 10, 0))
    lines = path.read_text(encoding="utf-8").split("\n")
    ends, end, k = [], 0, 0
    for _ in range(3):  # (each block's last line: 1 MiB of lines each)
        start = end
        while end + len(lines[k]) + 1 <= start + (1 << 20):
            end += len(lines[k]) + 1
            k += 1
        ends.append(k - 1)
    retract = "KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_field: 7"
    # (bulk matching waits for lines before: the second block, then the third)
    lines[ends[0] + 100] = lines[ends[0] + 100][:26] + retract + " [repeated 2x across cluster]"
    lines[ends[2] - 3] = lines[ends[2] - 3][:26] + retract
    path.write_text("\n".join(lines), encoding="utf-8")
    setup = (
        "from collections import Counter\n"
        "bulk.BIG_BYTES, bulk.AFTER_LINES = 1 << 20, 1000\n"
        "said, take = Counter(), lane_plain.take\n"
        "def spy(*args):\n"
        "    got = take(*args)\n"
        "    if args[-1] < len(args[2]):  # (not a part's lines taken again)\n"
        "        said[got if got is None else 'part' if 0 < got < len(args[2]) else got > 0] += 1\n"
        "    return got\n"
        "lane_plain.take = spy\n"
    )
    shows = "r.recognised['preemption'], said['part'], said[False], said[None]"
    assert _fresh_scan(path, setup, shows) == "2 1 1 0 False"


def test_a_thrashing_sglang_log_from_eight_ranks_never_imports_polars(tmp_path: Path) -> None:
    # Eight ranks retracting every second: four lines in five are retractions, far
    # more than a block may hold of odd lines (MAX_ODD). Its blocks went to polars'
    # bulk matching (~35 us a line, ~60 MiB of pages); read as this lane's lines, they
    # cost what its batch lines do, and a minute's retractions are one rollup.
    path = tmp_path / "ranks.log"
    with path.open("wb") as f:
        _bench_generator().PROFILES["sglang-thrash-ranks"](f, 3_000_000, 1)
    shows = "r.recognised['preemption'], sum(h.sig == 'sglang.retract' for h in r.hits)"
    setup = "bulk.BIG_BYTES = 1 << 20\n"  # (big: polars at its first dense block)
    got = _fresh_scan(path, setup, shows, rollup="ALL").split()
    assert got[2] == "False"
    assert int(got[0]) == path.read_text().count("Retract requests")
    # (~36 minutes: a rollup each, and lines of their own where a block ends in one)
    assert int(got[1]) < 120


def test_any_files_dense_blocks_try_it_and_sparse_ones_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A day of stats lines (under bulk.BIG_BYTES and AFTER_LINES: the polars lane waits)
    # goes this way from its first block; a log with a stats line among a hundred
    # others (request logging) is not tried: one at a time costs less there.
    monkeypatch.setattr(passes, "BLOCK_BYTES", 1 << 16)
    day = tmp_path / "day.log"
    _v1_log(day, 3000)
    said = _spy(monkeypatch)
    scan_fast(open_source(str(day)), MATCHER, rollup=True)
    assert said[True] >= 10 and said[None] == said[False] == 0
    said.clear()
    filler = "(APIServer pid=1) INFO 02-28 20:00:00 [logger.py:41] GET /health 200 OK"
    lines = []
    for i in range(3000):
        lines += [filler] * 100 if i % 10 == 0 else []
        lines.append(V1.format(t=datetime(2026, 2, 28, 20, 0, 0), p=1.0, g=2.0, r=1, w=0, kv=5.0))
    sparse = tmp_path / "sparse.log"
    sparse.write_text("\n".join(lines) + "\n", encoding="utf-8")
    got = scan_fast(open_source(str(sparse)), MATCHER, rollup=True)
    assert not said and got.recognised["stats"] == 3000


def test_requires_reads_the_literal_text_a_match_must_hold() -> None:
    req = lane_plain._requires
    assert req("abc(?:d|e)fg+h(?:ij)?k") == (("abc", "f", "g", "h", "k"), None)
    assert req(r"x(?P<n>\d+) reqs, Swapped: ") == ((" reqs, Swapped: ", "x"), None)
    assert req("(?:ab)+c") == (("ab", "c"), None)
    assert req("(?i)abc") is None  # (a case-blind literal is no literal text)
    assert req("a(?i:b)c") is None
    # V1's first stats line: `Running:` not after the V1 line's `tokens/s, `
    need = req(SIGS["vllm.v1.stats_running_waiting"].pattern)
    assert need is not None and need[1] == ("tokens/s, ", "Running: ")
    assert req(r"(?<!x)aba") == (("aba",), None)  # (`aba` overlaps itself: no such proof)
    assert req(r"(?<!x)ab") == (("ab",), ("x", "ab"))
    # No literal every match holds (an alternation's): nothing to show, so the pattern
    # runs on the records (SGLang's aborted-retraction line, a candidate of each
    # retraction line: the lane refused every block holding one)
    assert req("ab|cd") is None
    assert req(SIGS["sglang.retract.abort_last"].pattern) is None


def test_no_match_is_claimed_where_a_signature_matches() -> None:
    # Every signature's own example lines and every other's: where a pattern finds a
    # match, _matches_none never says there is none.
    lines = [e.line for s in SIGS.values() for e in s.matches] + [
        line for s in SIGS.values() for line in s.no_matches
    ]
    checked = 0
    for sig in SIGS.values():
        need = lane_plain._requires(sig.pattern)
        if need is None:
            continue
        for line in lines:
            if any(True for _ in sig.finditer(line)):
                found = {lit for lit in need[0] if lit in line}
                assert not lane_plain._matches_none(need, found, line), (sig.id, line[:80])
                checked += 1
    assert checked > len(SIGS)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.from_regex(r"[0-9]{1,22}(\.[0-9]{1,22})?", fullmatch=True),
            st.sampled_from(["1.2.3", ".", "9" * 400, "1e5", "00", "", "12,5", "-3"]),
        ),
        min_size=1,
        max_size=12,
        unique=True,
    ),
    st.sampled_from(["float", "percent", "int", "int_commas"]),
)
def test_convert_is_the_converters(raw: list[str], typ: str) -> None:
    got = lane_plain._convert(raw, typ)
    want = _converted(raw, typ)
    if any(v is _BAD for v in want.values()):
        assert got is None
    else:
        assert got is not None
        assert {k: (type(v), v) for k, v in got.items()} == {
            k: (type(v), v) for k, v in want.items()
        }
    # (a column whose values mostly differ is converted value by value, in its order)
    each = lane_plain._convert_each(raw, typ)
    if each is not None:
        assert [(type(v), v) for v in each] == [(type(want[k]), want[k]) for k in raw]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e15, allow_nan=False), max_size=12))
def test_sum_adds_one_value_at_a_time(values: list[float]) -> None:
    assert lane_plain._sum(values).hex() == reduce(add, values, 0.0).hex()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=6e15, allow_nan=False), min_size=1, max_size=9),
    st.lists(st.integers(0, 7), min_size=9, max_size=9),
)
def test_means_are_snapped_as_snap6_snaps(sums: list[float], counts: list[int]) -> None:
    counts = counts[: len(sums)]
    want = [snap6(snap6(s + 0.0) / c) if c else None for s, c in zip(sums, counts, strict=True)]
    got = lane_plain._means(sums, counts)
    assert [None if v is None else v.hex() for v in got] == [
        None if v is None else v.hex() for v in want
    ]
