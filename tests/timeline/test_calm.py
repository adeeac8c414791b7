"""Calm minutes (scan/lane.py keeps a stream-minute where nothing is preempted
as numbers; timeline/calm.py makes windows of them) give the report events give, byte
for byte in every format and with the same exit code: quiet logs, quiet logs with
incidents, several engines, SGLang, the real engine's lines, new year, a fixed zone,
a named zone, --jobs; and where calm minutes cannot stand for their lines, analyze
scans again without them and says the same."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_equivalence import _bench_generator
from test_lane import _plain_log, _replayed_engine_log
from test_rollup import _docker_json, _interleaved

import preemptdiag.commands.analyze as analyze
import preemptdiag.diagnose.rules as rules
import preemptdiag.render.episodes as episodes
import preemptdiag.scan.bulk as bulk
import preemptdiag.scan.lane as lane
import preemptdiag.scan.passes as passes
import preemptdiag.timeline.calm as calm
from preemptdiag.cli import main

FORMATS = ("json", "markdown", "terminal", "sarif")


class _Spy:
    """How many calm minutes each run placed, and whether one gave them up."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.placed = 0
        self.gave_up: list[analyze.Again] = []  # what each run scanned again without
        real_place, real_judged = calm.place, analyze._judged

        def place(*args: Any) -> list[calm.Placed] | None:
            got = real_place(*args)
            self.placed += sum(p.minutes for p in got or ())
            return got

        def judged(*args: Any) -> Any:
            got = real_judged(*args)
            if isinstance(got, analyze.Again):
                self.gave_up.append(got)
            return got

        monkeypatch.setattr(analyze, "place", place)
        monkeypatch.setattr(analyze, "_judged", judged)


def _outputs(
    files: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *args: str,
    block: int = 1 << 16,
) -> tuple[list[tuple[int, str]], _Spy]:
    """Every format's (exit code, output) with calm minutes off, then on (one run
    each, writing every format); and the spy on the second."""
    monkeypatch.setattr(bulk, "AFTER_LINES", 0)  # the lane from the first block
    monkeypatch.setattr(passes, "BLOCK_BYTES", block)
    out: list[tuple[int, str]] = []
    spy = None
    for on in (False, True):
        with monkeypatch.context() as m:
            if on:
                spy = _Spy(m)
            else:
                m.setattr(analyze, "_calm_exact", lambda *a: False)
            dests = [files[0].with_suffix(f".{on}.{fmt}") for fmt in FORMATS]
            each = [
                x for fmt, d in zip(FORMATS, dests, strict=True) for x in ("-f", fmt, "-o", str(d))
            ]
            code = main(["analyze", *map(str, files), *each, *args])
            capsys.readouterr()
            out += [(code, d.read_text(encoding="utf-8")) for d in dests]
    assert spy is not None
    return out, spy


def _assert_same(
    files: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *args: str,
    block: int = 1 << 16,
) -> _Spy:
    out, spy = _outputs(files, monkeypatch, capsys, *args, block=block)
    half = len(FORMATS)
    for fmt, off, on in zip(FORMATS, out[:half], out[half:], strict=True):
        assert on == off, fmt
    return spy


_FORKED = """
import sys
import preemptdiag.commands.analyze as analyze
import preemptdiag.scan.bulk as bulk
import preemptdiag.scan.lane as lane
import preemptdiag.scan.parallel as parallel
import preemptdiag.scan.passes as passes
from preemptdiag.cli import main

parallel.PARALLEL_MIN_BYTES, bulk.AFTER_LINES, passes.BLOCK_BYTES = 1, 0, 1 << 16
real, placed = analyze.place, []
def place(*a):
    got = real(*a)
    placed.append(sum(p.minutes for p in got or ()))
    return got
analyze.place = place
code = main(sys.argv[1:])
print("polars" in sys.modules, sum(placed), file=sys.stderr)
sys.exit(code)
"""


def _forked_run(path: Path, *args: str) -> tuple[int, bool, tuple[int, str]]:
    """(calm minutes placed, whether the parent imported polars, (exit code, JSON)) of
    `analyze --jobs 2` in a new process, the file cut into byte ranges however small,
    the lane from the first block."""
    got = subprocess.run(
        [sys.executable, "-c", _FORKED, "analyze", str(path), "-f", "json", "--jobs", "2", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    polars, placed = got.stderr.split()[-2:]
    return int(placed), polars == "True", (got.returncode, got.stdout)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _v1(t: datetime, engine: int, running: int, waiting: int, kv: float, pre: str = "") -> str:
    return (
        f"(APIServer pid=1) INFO {t:%m-%d %H:%M:%S} [loggers.py:236] Engine {engine:03d}: Avg "
        f"prompt throughput: {running * 31.7:.1f} tokens/s, Avg generation throughput: "
        f"{running * 9.1:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, "
        f"{pre}GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: 12.5%"
    )


def _day(
    seed: int,
    start: datetime,
    hours: float,
    engines: int = 1,
    counted: bool = False,
    warnings: bool = False,
) -> Iterator[str]:
    """Hours of one API server's stats lines, a line per engine each 10 s: mostly calm,
    with a queue now and then, the pool pinned with a queue for a few minutes every
    four hours (with `counted`, `Preemptions: N` there); with `warnings`, an odd V0
    preemption warning with its cumulative counter."""
    rng = random.Random(seed)
    t = start
    for i in range(int(hours * 360)):
        t += timedelta(seconds=10)
        hot = 400 <= i % 1500 < 440
        for e in range(engines):
            waiting = rng.randrange(1, 60) if hot or rng.random() < 0.01 else 0
            kv = rng.uniform(95, 100) if hot else rng.uniform(5, 80)
            pre = f"Preemptions: {rng.randrange(1, 9)}, " if counted and hot else ""
            yield _v1(t, e, rng.randrange(1, 40), waiting, kv, pre)
        if warnings and i % 997 == 300:
            yield (
                f"(APIServer pid=1) WARNING {t:%m-%d %H:%M:%S} [scheduler.py:1]  Sequence group "
                "cmpl-1 is preempted by PreemptionMode.RECOMPUTE mode because there is not "
                "enough KV cache space. total_num_cumulative_preemption=51"
            )


def _generated(tmp_path: Path, profile: str, size: int, seed: int) -> Path:
    path = tmp_path / f"{profile}.log"
    with path.open("wb") as f:
        _bench_generator().PROFILES[profile](f, size, seed)
    return path


@pytest.mark.parametrize(
    "profile",
    [
        "vllm-stats",  # a quiet server
        # at its cap the whole time: every minute a queue, none preempted; its minutes
        # are calm minutes too (queueing by PD109, as their windows would be)
        "vllm-stats-busy",
        # its pool pinned at 90-100 % and a queue the whole time: suspected preemption
        # (PD107) or queueing by the minute, calm minutes all the same
        "vllm-stats-pinned",
        # V0's lines (`INFO MM-DD HH:MM:SS metrics.py:396] ...`: no process name, no `[`
        # before the file) go the plain lane's way too, quiet and queueing by the hour
        "vllm-v0-stats",
    ],
)
def test_a_month_in_miniature_is_byte_identical(
    profile: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _generated(tmp_path, profile, 1_500_000, 5)
    spy = _assert_same([path], monkeypatch, capsys, "--year", "2026")
    assert spy.placed > 500 and not spy.gave_up


def test_queues_that_come_and_go_stalls_and_blips_are_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Minutes with a queue in every line (queueing), in one line of six (a blip:
    # healthy), with nothing running and KV empty (a stall: PD108), and quiet ones,
    # mixed a line at a time, so minutes and windows of every kind meet.
    rng = random.Random(11)
    t, lines = datetime(2026, 5, 1, 10), []
    for i in range(3000):
        t += timedelta(seconds=10)
        spell = (i // 30) % 4
        running = 0 if spell == 2 else rng.randrange(1, 64)
        kv = 0.0 if spell == 2 else rng.uniform(3.0, 80.0)
        waiting = rng.randrange(1, 40) if spell in (1, 2) or (spell == 3 and i % 6 == 0) else 0
        lines.append(
            f"(APIServer pid=1) INFO {t:%m-%d %H:%M:%S} [loggers.py:236] Engine 000: Avg "
            f"prompt throughput: {rng.uniform(0, 4000):.1f} tokens/s, Avg generation "
            f"throughput: {rng.uniform(0, 900):.1f} tokens/s, Running: {running} reqs, "
            f"Waiting: {waiting} reqs, GPU KV cache usage: {kv:.1f}%, Prefix cache hit "
            f"rate: {rng.uniform(0, 40):.1f}%"
        )
    path = _write(tmp_path / "queues.log", lines)
    spy = _assert_same([path], monkeypatch, capsys, "--year", "2026")
    assert spy.placed > 300 and not spy.gave_up


@pytest.mark.parametrize("warnings", [False, True], ids=["pinned", "warnings"])
@pytest.mark.parametrize("engines", [1, 2])
@pytest.mark.parametrize("seed", [1, 2])
def test_quiet_hours_with_queues_a_pinned_pool_and_warnings(
    warnings: bool,
    engines: int,
    seed: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The pinned minutes are calm minutes too (PD107 or queueing, as their windows
    # would be). A V0 warning's counter delta is spread onto windows with KV pinned
    # (windows.spread_counter_deltas): beside one, such a minute is no calm minute, and
    # analyze scans again with the pressure threshold as their limit.
    lines = list(_day(seed, datetime(2026, 3, 1, 22), 5, engines, warnings=warnings))
    path = _write(tmp_path / "mixed.log", lines)
    spy = _assert_same([path], monkeypatch, capsys, "--year", "2026")
    assert spy.placed > 100
    assert spy.gave_up == ([analyze.Again.PINNED] if warnings else [])
    # --jobs 2, the file cut into byte ranges: each range's calm minutes, moved to the
    # file's line numbers (parallel.merge). In a fresh process: a worker forked after
    # polars' threads started (this one's earlier runs) keeps off polars, so off the lane.
    # The workers send their calm minutes as plain columns (records.Columns), and their
    # few hundred hits are aggregated in Python: the parent never imports polars.
    placed, polars, jobs2 = _forked_run(path, "--year", "2026")
    assert placed > 100 and not polars
    assert jobs2 == _outputs([path], monkeypatch, capsys, "--year", "2026")[0][len(FORMATS)]


@pytest.mark.parametrize("warnings", [False, True], ids=["pinned", "warnings"])
@pytest.mark.parametrize("engines", [1, 2])
def test_windows_read_a_few_at_a_time_make_the_same_report(
    warnings: bool,
    engines: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The verdict's columns, its evidence, the suspected windows' count and the
    # episodes read a month's windows a chunk at a time (a few thousand): chunks of a
    # few windows cut every run of them, and a run of one class across chunks is one
    # episode, summed and peaked as one.
    lines = list(_day(3, datetime(2026, 3, 1, 22), 5, engines, warnings=warnings))
    path = _write(tmp_path / "mixed.log", lines)
    want = _outputs([path], monkeypatch, capsys, "--year", "2026")[0]
    monkeypatch.setattr(episodes, "_CHUNK", 5)
    monkeypatch.setattr(rules, "_READ_CHUNK", 7)
    monkeypatch.setattr(rules, "_EVIDENCE_CHUNK", 3)
    assert _outputs([path], monkeypatch, capsys, "--year", "2026")[0] == want
    report = json.loads(want[len(FORMATS)][1])
    assert want[0][0] == 0
    if warnings:
        assert report["verdict"]["class"] == "benign_preemption"
    else:
        # (the pinned minutes, calm: PD107's windows, counted in the verdict's why)
        assert report["verdict"]["class"] == "insufficient_evidence"
        assert "with requests waiting in 8 window(s)" in report["verdict"]["why"]


@pytest.mark.parametrize(
    "start,ctx",
    [
        (datetime(2025, 12, 31, 22, 30), ("--year", "2025")),  # the year turns
        (datetime(2025, 12, 31, 22, 30), ()),  # ... and its year is the file's time
        (datetime(2026, 2, 28, 23, 0), ("--year", "2026", "--tz", "+05:30")),
    ],
    ids=["new-year", "new-year-mtime", "fixed-zone"],
)
def test_across_midnight_new_year_and_in_a_fixed_zone(
    start: datetime,
    ctx: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _write(tmp_path / "night.log", list(_day(3, start, 3)))
    for block in (4096, 1 << 16):
        spy = _assert_same([path], monkeypatch, capsys, *ctx, block=block)
        assert spy.placed > 50 and not spy.gave_up


def _walled(zone: str, start_utc: datetime, hours: float, sglang: bool = False) -> list[str]:
    """_day's kind of log as a server whose clock is `zone`'s prints it: its stamps the
    wall clock of a UTC time 10 s apart (an hour skipped or printed twice where the
    zone shifts); with `sglang`, two ranks' decode lines in SGLang's wrapper stamps."""
    rng, wall, out = random.Random(9), ZoneInfo(zone), []
    for i in range(int(hours * 360)):
        t = (start_utc + timedelta(seconds=10 * i)).astimezone(wall)
        hot = 300 <= i % 1100 < 330
        waiting = rng.randrange(1, 60) if hot or rng.random() < 0.01 else 0
        kv = rng.uniform(95, 100) if hot else rng.uniform(5, 80)
        if not sglang:
            out.append(_v1(t, 0, rng.randrange(1, 40), waiting, kv))
            continue
        for rank in (0, 1):
            out.append(
                f"[{t:%Y-%m-%d %H:%M:%S} TP{rank}] Decode batch, #running-req: "
                f"{rng.randrange(1, 30)}, #token: {rng.randrange(1000, 90000)}, token usage: "
                f"{kv / 100:.2f}, cuda graph: True, gen throughput (token/s): "
                f"{rng.uniform(100, 2000):.2f}, #queue-req: {waiting}, "
            )
    return out


@pytest.mark.parametrize("sglang", [False, True], ids=["vllm", "sglang"])
@pytest.mark.parametrize(
    "zone,start,shifts",
    [
        # the year turns in Berlin's winter (CET all through), an Indian zone's whole
        # year (no summer time, +05:30), New York's summer across midnight
        ("Europe/Berlin", datetime(2025, 12, 31, 20, 30, tzinfo=UTC), False),
        ("Asia/Kolkata", datetime(2026, 2, 28, 16, 0, tzinfo=UTC), False),
        ("America/New_York", datetime(2026, 7, 4, 2, 0, tzinfo=UTC), False),
        # 02:00-02:59 skipped on 2026-03-29; 02:00-02:59 twice on 2026-10-25
        ("Europe/Berlin", datetime(2026, 3, 28, 23, 0, tzinfo=UTC), True),
        ("Europe/Berlin", datetime(2026, 10, 24, 23, 0, tzinfo=UTC), True),
        ("America/New_York", datetime(2026, 11, 1, 3, 0, tzinfo=UTC), True),
        ("America/New_York", datetime(2026, 3, 8, 4, 0, tzinfo=UTC), True),
    ],
    ids=[
        "berlin-winter",
        "kolkata",
        "new-york-summer",
        "berlin-spring",
        "berlin-autumn",
        "new-york-autumn",
        "new-york-spring",
    ],
)
def test_a_named_zone_keeps_its_calm_minutes(
    zone: str,
    start: datetime,
    shifts: bool,
    sglang: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Read with a named --tz, a calm minute is timed by the zone's offset through the
    # file's span (a month of stats lines was ~260 MiB read as events, ~51 as minutes).
    # Where the zone shifts inside the span, each by its own offset, a minute of an
    # hour the shift repeats in the pass events._in_utc reads its first line as, after
    # the stamps and minutes above it (calm._Shifts).
    path = _write(tmp_path / "zoned.log", _walled(zone, start, 5, sglang))
    end = start + timedelta(hours=5)
    assert (calm._one_offset(ZoneInfo(zone), start, end) is None) == shifts
    for block in (4096, 1 << 16):
        spy = _assert_same([path], monkeypatch, capsys, "--year", "2026", "--tz", zone, block=block)
        assert spy.placed > 100 and not spy.gave_up


def _pinned(line: str, pinned: bool = True) -> str:
    """A stats line of _walled's with the pool pinned and a queue (no calm minute's
    under the pressure threshold), or, not `pinned`, nothing waiting and the pool a
    third full (a calm one's)."""
    return re.sub(
        r"Waiting: \d+ reqs, GPU KV cache usage: [\d.]+%",
        "Waiting: 9 reqs, GPU KV cache usage: 99.0%"
        if pinned
        else "Waiting: 0 reqs, GPU KV cache usage: 33.0%",
        line,
    )


@pytest.mark.parametrize("case", ["late", "turned"])
def test_a_stamp_of_a_repeated_hour_reads_as_the_calm_minutes_above_it_say(
    case: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Berlin's 02:00-02:59 twice (720 lines from `first`). `late`: a line of its first
    # pass printed again an hour on, after calm minutes later than it: _in_utc reads
    # it as its first pass with or without them; the minutes keep. `turned`: its first
    # pass events up to 02:20 and calm from there, its second pass silent up to 02:20
    # and calm to 02:29, then a line at 02:30. events (without the calm minutes' lines
    # above it) read that as its first pass, _in_utc with them as its second:
    # _Shifts says so, and the file is scanned again without calm minutes.
    lines = _walled("Europe/Berlin", datetime(2026, 10, 24, 22, 0, tzinfo=UTC), 6)
    if case == "turned":
        lines = [_pinned(line, False) for line in lines]  # (no event but those below)
    first = next(i for i, line in enumerate(lines) if " 10-25 02:00:00 " in line)
    assert " 10-25 02:00:00 " in lines[first + 360]  # (the second pass)
    if case == "late":
        lines.insert(len(lines) - 30, lines[first + 300])
    else:
        for i in [*range(first, first + 126), first + 540]:
            lines[i] = _pinned(lines[i])
        del lines[first + 360 : first + 486]
    path = _write(tmp_path / "autumn.log", lines)
    # (one block: no block's edge, a hit, between the pinned lines; which are events
    # with calm minutes kept under the pressure threshold, as before analyze.CALM_KV)
    monkeypatch.setattr(analyze, "CALM_KV", 95.0)
    args = ("--year", "2026", "--tz", "Europe/Berlin")
    spy = _assert_same([path], monkeypatch, capsys, *args, block=1 << 20)
    assert spy.gave_up == ([analyze.Again.CALM] if case == "turned" else [])
    assert case == "turned" or spy.placed > 100


def test_a_zones_one_offset_through_a_span() -> None:
    # (a fixed zone is itself; a named one a fixed offset, from the second it holds)
    berlin = ZoneInfo("Europe/Berlin")
    summer = datetime(2026, 3, 29, 1, 0, 1, tzinfo=UTC)
    assert calm._one_offset(berlin, summer, summer + timedelta(days=200)) == timezone(
        timedelta(hours=2)
    )
    assert calm._one_offset(berlin, summer - timedelta(seconds=2), summer) is None
    assert calm._shifting(datetime(2026, 10, 25, 2, 30, tzinfo=berlin))  # (twice)
    assert calm._shifting(datetime(2026, 3, 29, 2, 30, tzinfo=berlin))  # (skipped)
    assert not calm._shifting(datetime(2026, 3, 29, 3, 0, tzinfo=berlin))
    plus = timezone(timedelta(hours=5, minutes=30))
    assert calm._one_offset(plus, summer, summer + timedelta(days=400)) is plus


@pytest.mark.parametrize("sglang", [False, True], ids=["vllm", "sglang"])
@pytest.mark.parametrize(
    "seconds,zone",
    [
        ("120", "UTC"),
        ("300", "UTC"),
        ("900", "+05:45"),  # (Nepal's: 900 s windows start on its quarter hours)
        ("600", "Asia/Kathmandu"),  # (its midnight falls inside a 10-minute window)
        ("3600", "+05:30"),  # (an hour's window across its midnight)
        ("1800", "America/New_York"),
    ],
)
def test_windows_of_several_minutes_keep_their_calm_minutes(
    seconds: str,
    zone: str,
    sglang: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # --window N: the lane keeps a window all calm minutes or all events (lane.calm_of
    # by lane.window_of), so a window of calm minutes is made of their numbers. A
    # month of stats lines in 5-minute windows was ~210 MiB read as events, ~52 here.
    start = datetime(2026, 6, 1, 16, 0, tzinfo=UTC)
    path = _write(tmp_path / "windows.log", _walled("UTC", start, 6, sglang))
    args = ("--year", "2026", "--window", seconds, "--tz", zone)
    # (blocks of 4 KiB, a few minutes each: every window has a block's edge or anchor
    # in it, so none is all calm minutes)
    assert not _assert_same([path], monkeypatch, capsys, *args, block=4096).gave_up
    spy = _assert_same([path], monkeypatch, capsys, *args, block=1 << 18)
    assert spy.placed > 100 and not spy.gave_up


def test_a_minutes_window_key_is_one_for_each_window() -> None:
    # (lane.window_of: windows start at multiples of their length in UTC; a stamp's
    # clock is `shift` minutes ahead of it)
    key = lane.window_of
    # 5-minute windows in UTC: 10:00-10:04 one window, 10:05 the next
    assert key("06-03 10:00", 5, 0) == key("06-03 10:04", 5, 0) != key("06-03 10:05", 5, 0)
    # Nepal (+05:45), 10-minute windows: its midnight is 18:15 UTC, inside 18:10-18:20
    night = [key(m, 10, 345) for m in ("06-02 23:55", "06-03 00:04", "06-03 00:05")]
    assert night[0] == night[1] != night[2]
    # a wrapper's dated stamp, across a new year, with a zone of its own
    assert key("2025-12-31 23:58", 2, 0) == key("2025-12-31 23:59", 2, 0)
    assert key("2025-12-31 23:59", 2, 0) != key("2026-01-01 00:00", 2, 0)
    assert key("2025-12-31 23:59", 2, 1) == key("2026-01-01 00:00", 2, 1)
    assert key("2026-01-01 00:00Z", 2, 60) == key("2026-01-01 00:01Z", 2, 60)
    assert key("2026-01-01 00:00Z", 2, 60) != key("2026-01-01 00:00", 2, 60)
    # ... on its own clock: 01:00 at +01:00 is 00:00 UTC, in --tz +01:00's window too
    assert key("2026-01-01T01:00+01:00", 2, 0) == key("2026-01-01T00:01Z", 2, 0)
    assert key("2026-01-01T01:00+01:00", 2, 0) == key("2026-01-01 01:01", 2, 60)
    assert key("2026-01-01T05:29+05:30", 2, 0) == key("2025-12-31T23:58Z", 2, 0)
    assert key("2025-12-31T20:59-03:00", 2, 0) != key("2025-12-31T21:00-03:00", 2, 0)
    # no day to count from: the minute stands for itself (a clash scans again)
    assert key("02-30 10:00", 5, 0) == "02-30 10:00" and key(None, 5, 0) is None


@pytest.mark.parametrize(
    "bounds",
    [
        ("--since", "2026-03-02T00:00"),
        ("--until", "2026-03-02T01:07"),
        ("--since", "2026-03-01T23:13", "--until", "2026-03-02T01:00"),
        ("--since", "23:00", "--until", "23:30"),  # (times of day on the log's date)
        ("--since", "2026-03-02T01:00", "--window", "300"),
        ("--since", "2026-03-02T00:02", "--until", "2026-03-02T00:04", "--window", "300"),
        # nothing between them: the count of the lines matched (calm minutes' too)
        (
            "--since",
            "2026-03-05T00:00",
        ),
    ],
)
def test_since_and_until_keep_the_calm_minutes_between_them(
    bounds: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A minute's lines are all on one side of a bound on a minute: the calm minutes
    # between the bounds make windows, the others count toward their replica's engine
    # as its events do (calm.trimmed). A month with --since was ~220 MiB read as
    # events, ~48 here.
    path = _write(tmp_path / "night.log", list(_day(3, datetime(2026, 3, 1, 22), 5, 2)))
    spy = _assert_same([path], monkeypatch, capsys, "--year", "2026", *bounds, block=1 << 18)
    assert spy.placed > 100 and not spy.gave_up


def test_the_real_engines_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "replayed.log"
    # (vLLM 0.32.0's recorded lines, its overloads' among them; the year turns)
    _replayed_engine_log(path, 4000)
    spy = _assert_same([path], monkeypatch, capsys, "--year", "2026")
    assert spy.placed > 5 and not spy.gave_up


def _kubectl(lines: Iterable[str], zone: str, seed: int) -> list[str]:
    """Each vLLM line with the stamp a wrapper puts before it: its engine stamp's time
    (year 2026) plus a few milliseconds of lag, on the clock of `zone` (`Z`: UTC, as
    `kubectl logs --timestamps` prints it, nanoseconds with trailing zeros dropped;
    an offset: a CRI log file's, with `stdout F`). A line goes back inside its second
    now and then (two writes landing out of order)."""
    rng, out = random.Random(seed), []
    offset = timedelta(0) if zone == "Z" else datetime.strptime(zone, "%z").utcoffset()
    assert offset is not None
    for line in lines:
        m = re.search(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)| (\d\d-\d\d \d\d:\d\d:\d\d) ", line)
        assert m is not None
        t = datetime.strptime(m[1] or f"2026-{m[2]}", "%Y-%m-%d %H:%M:%S") + offset
        ns = rng.randrange(1_000_000, 900_000_000) if rng.random() > 0.02 else 0
        frac = f".{ns:09d}".rstrip("0").rstrip(".")
        if zone == "Z":
            out.append(f"{t:%Y-%m-%dT%H:%M:%S}{frac}Z {line}")
        else:
            out.append(f"{t:%Y-%m-%dT%H:%M:%S}{frac}{zone} stdout F {line}")
    return out


@pytest.mark.parametrize(
    "zone,args",
    [
        ("Z", ()),
        # --tz is for stamps with no zone: a wrapper's has its own, so its minutes are
        # read on their own clock, a named zone's shift or not
        ("Z", ("--tz", "Europe/Berlin")),
        ("+05:30", ("--tz", "America/New_York")),
        ("-03:00", ("--window", "300")),
        ("Z", ("--since", "2026-10-25T01:00", "--until", "2026-10-25T02:30")),
        # each line a record of Docker's json-file log, the stamp its `time`
        ("json", ("--tz", "Europe/Berlin", "--window", "120")),
    ],
    ids=["utc", "named-tz", "cri-offset", "window", "since-until", "docker-json"],
)
def test_a_wrapper_stamped_log_keeps_its_calm_minutes(
    zone: str,
    args: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `kubectl logs --timestamps`, `docker logs -t`: every line's wrapper stamp times
    # it, with a zone and nanoseconds. Their minutes were all events: 10 days of stats
    # lines so stamped were 8.6 s and 167 MiB, against 1.3 s and 48 MiB unstamped.
    def stamped(lines: Iterable[str], seed: int) -> list[str]:
        if zone != "json":
            return _kubectl(lines, zone, seed)
        return _docker_json("\n".join(_kubectl(lines, "Z", seed))).splitlines()

    day = _day(4, datetime(2026, 10, 24, 22, 0), 6, 2)
    path = _write(tmp_path / "kubectl.log", stamped(day, 4))
    spy = _assert_same([path], monkeypatch, capsys, *args, block=1 << 18)
    assert spy.placed > 100 and not spy.gave_up
    # SGLang's decode lines of two ranks, its rank read from under the stamp
    start = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)
    path = _write(tmp_path / "sglang.log", stamped(_walled("UTC", start, 4, True), 5))
    spy = _assert_same([path], monkeypatch, capsys, *args, block=1 << 18)
    assert spy.placed > 100 and not spy.gave_up


@pytest.mark.parametrize("seed", range(3))
def test_adversarial_streams(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two V1 engines, SGLang ranks, kubectl wrappers, stamps out of order, V0 warnings.
    path = _write(tmp_path / "mixed.log", _interleaved(seed).splitlines())
    _assert_same([path], monkeypatch, capsys, "--year", "2025", block=2048)
    # (V1 lines with Preemptions: now and then, queues and a pinned pool on most)
    plain = _write(tmp_path / "plain.log", _plain_log(2500, datetime(2025, 6, 3), 10, seed))
    _assert_same([plain], monkeypatch, capsys, "--year", "2025", block=8192)


def test_sglang_batch_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # bench's dense SGLang log: its prefill lines show a queue nearly every minute
    _assert_same([_generated(tmp_path, "sglang-dense", 1_000_000, 4)], monkeypatch, capsys)
    # a quieter server: decode lines of two ranks every 2 s, a busy spell now and then
    rng = random.Random(6)
    t, lines = datetime(2026, 7, 1, 23, 0), []
    for i in range(6000):
        t += timedelta(seconds=2)
        busy = 700 <= i % 2000 < 760
        for rank in (0, 1):
            lines.append(
                f"[{t:%Y-%m-%d %H:%M:%S} TP{rank}] Decode batch, #running-req: "
                f"{rng.randrange(1, 30)}, #token: {rng.randrange(1000, 90000)}, token usage: "
                f"{rng.uniform(0.9, 0.99) if busy else rng.uniform(0.01, 0.6):.2f}, cuda graph: "
                f"True, gen throughput (token/s): {rng.uniform(100, 2000):.2f}, #queue-req: "
                f"{rng.randrange(1, 40) if busy else 0}, "
            )
    spy = _assert_same([_write(tmp_path / "sglang.log", lines)], monkeypatch, capsys, block=1 << 18)
    assert spy.placed > 50 and not spy.gave_up


def test_a_clash_across_blocks_scans_again_without_calm_minutes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same hours twice in one file (a pod's log copied after itself): the second
    # copy's lines fall in the first's calm windows. analyze gives them up and says
    # what it says without them.
    hours = list(_day(4, datetime(2026, 5, 1, 8), 2))
    path = _write(tmp_path / "twice.log", hours + hours)
    spy = _assert_same([path], monkeypatch, capsys, "--year", "2026")
    assert spy.gave_up == [analyze.Again.CALM]


def test_a_minute_earlier_than_its_files_events_scans_again_without_calm_minutes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Lines out of order (bench/lane_fuzz.py seed 42, input 37): a calm hour's last
    # line first, then the hour, whose first calm minutes come before every event (the
    # block's edges) in time. The replica's first time is its events' first: the
    # minutes are given up.
    t0 = datetime(2026, 5, 1, 8)
    hour = [_v1(t0 + timedelta(seconds=10 * i), 0, 20, 0, 30.0) for i in range(360)]
    path = _write(tmp_path / "out-of-order.log", [hour[-1], *hour[:-1]])
    spy = _assert_same([path], monkeypatch, capsys, "--year", "2026")
    assert spy.gave_up == [analyze.Again.CALM]
    out = path.with_suffix(".True.json").read_text(encoding="utf-8")
    assert '"start": "2026-05-01T08:00:00+00:00"' in out.split('"replicas"')[1]


def test_a_late_v1_count_reads_every_line_so_no_minute_is_calm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A V1 `Preemptions:` field makes every stats line of the replica a read of a late
    # count (visibility.Settled reads their Waiting): the windows must come from events.
    lines = list(_day(5, datetime(2026, 5, 1, 8), 3, counted=True))
    assert any("Preemptions:" in line for line in lines)
    path = _write(tmp_path / "late.log", lines)
    spy = _assert_same([path], monkeypatch, capsys, "--year", "2026")
    # (rollups too: the count reads every line's time and Waiting)
    assert spy.gave_up == [analyze.Again.ROLLUPS]


def test_calm_minutes_count_toward_max_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A calm minute holds about what a hit does (and becomes a window): the memory
    # guard counts it, so a decade of quiet log cannot slip past --max-events.
    path = _generated(tmp_path, "vllm-stats", 1_500_000, 5)
    monkeypatch.setattr(bulk, "AFTER_LINES", 0)
    monkeypatch.setattr(passes, "BLOCK_BYTES", 1 << 16)
    held: list[tuple[int, int]] = []  # (hits and members, calm minutes) of each scan
    real = analyze.scan_sources

    def scan(*args: Any) -> Any:
        got = real(*args)
        held.extend((r.held - r.calm_minutes, r.calm_minutes) for r in got)
        return got

    monkeypatch.setattr(analyze, "scan_sources", scan)
    args = ["analyze", str(path), "-f", "json", "--year", "2026", "--jobs", "1"]
    assert main([*args, "--max-events", "2000"]) == 0
    [(hits, calm)] = held
    assert hits < 300 < calm  # (the minutes alone cross the limit below)
    capsys.readouterr()
    assert main([*args, "--max-events", "300"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("preemptdiag: error: ") and "--max-events" in err, err


@settings(max_examples=300, deadline=None)
@given(
    st.datetimes(min_value=datetime(1971, 1, 2), max_value=datetime(2100, 1, 1)),
    st.one_of(
        st.just(UTC),
        st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m))),
        st.integers(-50_000, 50_000).map(lambda s: timezone(timedelta(seconds=s))),
    ),
    st.integers(0, 23),
    st.integers(0, 59),
    st.one_of(st.integers(0, 59).map(lambda s: s * 1_000_000), st.integers(0, 59_999_999)),
)
def test_a_minute_is_dated_by_its_anchors_day_and_its_clock_exactly(
    day: datetime, zone: timezone, hour: int, minute: int, us: int
) -> None:
    # (calm.place: a fixed offset's day is its midnight and the clock's seconds; the
    # long way is the anchor's time at the clock, as an epoch second; `us`: a line's
    # microseconds into its minute, a wrapper stamp's fraction among them)
    anchor = day.replace(tzinfo=zone)
    at = calm._at(anchor, hour, minute, us)
    start = calm._day_at(anchor)
    assert start is not None
    assert start + hour * 3600 + minute * 60 + us // 1_000_000 == int(at.timestamp())
    assert calm.micros(at) == (start + hour * 3600 + minute * 60) * 1_000_000 + us


def test_a_zone_that_is_not_a_fixed_offset_of_whole_seconds_is_dated_the_long_way() -> None:
    anchor = datetime(2026, 3, 29, 12, tzinfo=ZoneInfo("Europe/Berlin"))
    assert calm._day_at(anchor) is None  # (a day with a shift in it)
    assert calm._day_at(datetime(2026, 3, 29, tzinfo=timezone(timedelta(microseconds=7)))) is None
    assert calm._day_at(datetime(1969, 12, 31, tzinfo=UTC)) is None  # (before the epoch)
