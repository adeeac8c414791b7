"""Stats lines merged per stream and minute (rollup.py) give the report line-by-line
events give: every sample, the shared corpus, generated logs and adversarial stream
interleavings go through both paths."""

from __future__ import annotations

import gzip
import io
import json
import random
import re
import sys
from dataclasses import asdict, replace
from dataclasses import fields as dataclass_fields
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from builders import Pipe
from hypothesis import given, settings
from hypothesis import strategies as st
from test_equivalence import CORPUS_LOGS, SAMPLES, _bench_generator, adversarial_log

import preemptdiag.commands.analyze as analyze_mod
import preemptdiag.ingest.spool as spool_mod
import preemptdiag.scan.parallel as parallel
import preemptdiag.scan.rollup as rollup_mod
from preemptdiag.cli import main
from preemptdiag.commands.analyze import Options, Outcome, run_analysis
from preemptdiag.commands.compare import summarize
from preemptdiag.model.records import Hit, Kind, WrapperStamp
from preemptdiag.model.timeparse import parse_iso
from preemptdiag.render.json_format import report_dict
from preemptdiag.timeline.events import TimeContext

ROOT = Path(__file__).resolve().parents[1]
GROUPS = [
    [ROOT / "samples/host_oom_incident" / n for n in ("engine.log", "dmesg.log", "describe.txt")],
    [ROOT / "samples/v1_suspected_no_counter.log", *sorted((ROOT / "samples/scrapes").iterdir())],
]


def _run(files: list[Path], rollup: bool, **kw: Any) -> Outcome:
    kw.setdefault("time", TimeContext(year=2025))
    return run_analysis(Options(files=tuple(str(f) for f in files), rollup=rollup, **kw))


def _same_summary(a: Outcome, b: Outcome) -> None:
    # compare's means add partial sums in another order: equal to the last bits.
    sa, sb = asdict(summarize(a, ["x"])), asdict(summarize(b, ["x"]))
    for k, v in sa.items():
        if isinstance(v, float):
            assert v == pytest.approx(sb[k], rel=1e-12), k
        else:
            assert v == sb[k], k


def _assert_same_report(files: list[Path], **kw: Any) -> Outcome:
    lines, rolled = _run(files, False, **kw), _run(files, True, **kw)
    assert report_dict(rolled.report) == report_dict(lines.report)
    assert rolled.exit_code == lines.exit_code
    # (what compare reads: every stats line's event, in rollups, no calm minute; a
    # dense log's calm minutes are no events)
    if kw.get("calm", True) and sum(e.lines for e in rolled.events) != len(lines.events):
        rolled = _run(files, True, **{**kw, "calm": False})
        assert report_dict(rolled.report) == report_dict(lines.report)
    _same_summary(rolled, lines)
    assert sum(e.lines for e in rolled.events) == len(lines.events)
    return rolled


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: str(p.relative_to(ROOT / "samples")))
def test_samples(path: Path) -> None:
    _assert_same_report([path])


@pytest.mark.parametrize("files", GROUPS, ids=["host_oom_incident", "with_scrapes"])
def test_sample_groups(files: list[Path]) -> None:
    _assert_same_report(files)


@pytest.mark.parametrize("path", CORPUS_LOGS, ids=lambda p: p.name)
def test_shared_corpus(path: Path) -> None:
    _assert_same_report([path])


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("rollup")
    gen = _bench_generator()
    out = {"vllm": d / "vllm.log", "dense": d / "dense.log", "adversarial": d / "adv.log"}
    with out["vllm"].open("wb") as f:
        gen.generate(f, 2 << 20, seed=3)
    with out["dense"].open("wb") as f:
        gen.generate_dense(f, 1 << 20, seed=3)
    data = adversarial_log(seed=5, pages=128, wrapped=True)
    out["adversarial"].write_bytes(data)
    out["gzip"] = d / "adv.log.gz"
    out["gzip"].write_bytes(gzip.compress(data, mtime=0))
    out["cr_only"] = d / "adv_cr.log"
    out["cr_only"].write_bytes(data.replace(b"\n", b"\r"))
    return out


@pytest.mark.parametrize("name", ["vllm", "dense", "adversarial", "gzip", "cr_only"])
def test_generated(generated: dict[str, Path], name: str) -> None:
    _assert_same_report([generated[name]])


def test_dense_log_keeps_about_one_event_a_minute(generated: dict[str, Path]) -> None:
    rolled = _assert_same_report([generated["dense"]])
    stats = [e for e in rolled.events if e.kind is Kind.STATS]
    first, last = stats[0].ts, stats[-1].ts
    assert first is not None and last is not None
    minutes = (last - first).total_seconds() / 60 + 1
    # Two streams (decode and prefill lines), each one event a minute at most.
    assert len(stats) <= 2 * minutes
    assert sum(e.lines for e in stats) > 50 * len(stats)


@pytest.mark.parametrize("name", ["dense", "vllm", "adversarial"])
def test_forked_workers_split_rollups(
    generated: dict[str, Path], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1)
    path = generated[name]
    one = _run([path], True, jobs=1)
    two = _run([path], True, jobs=2)
    assert report_dict(two.report) == report_dict(one.report)


def test_forked_workers_keep_a_peak_that_preempted_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Under pressure a minute's first line is both its peak (KV 100 %, most
    # preemptions) and its first preempting line: one object in two roles. A worker's
    # range used to come back with two copies of it, and the window then offered the
    # peak twice as evidence instead of the peak and the next preempting line.
    line = (
        "(APIServer pid=1) INFO 06-03 10:{mm:02d}:{ss:02d} [loggers.py:236] Engine 000: "
        "Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 900.0 tokens/s, "
        "Running: {run} reqs, Waiting: {w} reqs, {pre}GPU KV cache usage: {kv:.1f}%, "
        "Prefix cache hit rate: 10.0%"
    )
    rows = []
    for mm in range(20):
        for ss in range(0, 60, 10):
            hot = mm >= 10
            rows.append(
                line.format(
                    mm=mm,
                    ss=ss,
                    run=100 if hot else 40,
                    w=50 if hot else 0,
                    pre=f"Preemptions: {65 - ss}, " if hot else "",
                    kv=100.0 if hot else 40.0 + ss / 10,
                )
            )
    path = tmp_path / "pressure.log"
    path.write_text("\n".join(rows) + "\n")
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1)
    one = _run([path], True, jobs=1)
    two = _run([path], True, jobs=2)
    assert report_dict(two.report) == report_dict(one.report)
    hot = [w for w in two.report.windows if w.preemptions]
    assert len(hot) == 10
    for w in hot:
        lines = [e.line for e in w.evidence]
        assert len(lines) == 2 and lines[0] < lines[1], lines  # peak, then the next


def test_forked_workers_take_several_files(
    generated: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Files that inform each other (dmesg boot time, kubectl describe) and a .gz, each
    # a task or cut in ranges: the report of one process.
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1)
    gz = tmp_path / "dense.log.gz"
    gz.write_bytes(gzip.compress(generated["dense"].read_bytes()))
    files = [*GROUPS[0], gz]
    one = _run(files, True, jobs=1)
    two = _run(files, True, jobs=2)
    assert report_dict(two.report) == report_dict(one.report)


# --- adversarial streams ----------------------------------------------------------------

V1 = (
    "{wrap}(APIServer pid=1) INFO {md} {hms} [loggers.py:123] Engine 00{eng}: Avg prompt "
    "throughput: {p} tokens/s, Avg generation throughput: {g} tokens/s, Running: {run} reqs, "
    "Waiting: {wait} reqs, GPU KV cache usage: {kv}%, Prefix cache hit rate: 10.0%{pre}"
)
SGL = (
    "[{date} {hms} TP{tp}] Decode batch, #running-req: {run}, #token: 1000, token usage: "
    "{kv}, cuda graph: True, gen throughput (token/s): {g}, #queue-req: {wait}, "
)
PREEMPT_V0 = (
    "WARNING {md} {hms} scheduler.py:1560] Sequence group cmpl-{n} is preempted by "
    "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
    "total_num_cumulative_preemption={n}"
)


def _interleaved(seed: int, start: datetime = datetime(2025, 3, 4, 9, 58, 30, tzinfo=UTC)) -> str:
    """Two engines' V1 lines and two SGLang ranks, interleaved, with ties at peak KV,
    preempting lines, stamps out of order, kubectl wrappers with fractions on some,
    fields missing on some, and V0 warnings in between."""
    r = random.Random(seed)
    t = start
    out: list[str] = []
    n = 0
    for _ in range(900):
        t += timedelta(seconds=r.choice([0, 0, 1, 2, 5, 13]))
        s = t - timedelta(seconds=r.choice([0, 0, 0, 3]))  # out of order now and then
        kv = r.choice([99.0, 99.0, 98.5, 0.0, 50.0, 100.0])
        what = r.random()
        if what < 0.45:
            wrap = f"{s:%Y-%m-%dT%H:%M:%S}.{r.randrange(10**6):06d}Z " if r.random() < 0.3 else ""
            pre = f", Preemptions: {r.choice([0, 1, 3])}" if r.random() < 0.3 else ""
            out.append(
                V1.format(
                    wrap=wrap,
                    md=f"{s:%m-%d}",
                    hms=f"{s:%H:%M:%S}",
                    eng=r.choice([0, 1]),
                    p=r.choice(["0.0", "12.5", "3.3"]),
                    g=r.choice(["100.1", "0.7", "33.3"]),
                    run=r.randint(0, 9),
                    wait=r.choice([0, 0, 2, 7]),
                    kv=kv,
                    pre=pre,
                )
            )
        elif what < 0.85:
            out.append(
                SGL.format(
                    date=f"{s:%Y-%m-%d}",
                    hms=f"{s:%H:%M:%S}",
                    tp=r.choice([0, 1]),
                    run=r.randint(1, 9),
                    kv=f"{kv / 100:.2f}",
                    g=r.choice(["10.00", "20.50"]),
                    wait=r.choice([0, 1, 4]),
                )
            )
        else:
            n += r.choice([1, 50])
            out.append(PREEMPT_V0.format(md=f"{s:%m-%d}", hms=f"{s:%H:%M:%S}", n=n))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("seed", range(6))
def test_interleaved_streams(tmp_path: Path, seed: int) -> None:
    p = tmp_path / "mixed.log"
    p.write_text(_interleaved(seed))
    rolled = _assert_same_report([p])
    assert any(e.rollup for e in rolled.events)
    for window in (120, 3600):
        _assert_same_report([p], window_seconds=window)


@pytest.mark.parametrize("seed", range(3))
def test_across_a_year_rollover(tmp_path: Path, seed: int) -> None:
    # Year-less engine stamps from Dec 31 into Jan 1: the year tracker moves on while
    # rollups are open, and lines of both years interleave.
    p = tmp_path / "rollover.log"
    p.write_text(_interleaved(seed, datetime(2024, 12, 31, 23, 40, tzinfo=UTC)))
    for ctx in (TimeContext(year=2024), TimeContext()):  # --year, or the file's mtime
        rolled = _assert_same_report([p], time=ctx)
        assert any(e.rollup for e in rolled.events)
        years = sorted({e.ts.year for e in rolled.events if e.ts is not None})
        assert len(years) == 2 and years[1] == years[0] + 1, years
        if ctx.year:
            assert years == [2024, 2025]


def test_off_when_a_minute_could_straddle_a_boundary(tmp_path: Path) -> None:
    p = tmp_path / "mixed.log"
    p.write_text(_interleaved(1))
    at = datetime(2025, 3, 4, 10, 3, 30, tzinfo=UTC)
    for kw in (
        {"window_seconds": 30},
        {"window_seconds": 90},
        {"since": at},
        {"until": at},
        {"since": at.replace(second=0), "until": at + timedelta(minutes=5)},
        {"time": TimeContext(year=2025, tz=timezone(timedelta(seconds=30)))},
    ):
        rolled = _assert_same_report([p], **kw)
        assert not any(e.rollup for e in rolled.events), kw


def test_on_minute_since_until_keep_rollups(tmp_path: Path) -> None:
    p = tmp_path / "mixed.log"
    p.write_text(_interleaved(2))
    start = datetime(2025, 3, 4, 10, 5, tzinfo=UTC)
    rolled = _assert_same_report([p], since=start, until=start + timedelta(minutes=20))
    assert any(e.rollup for e in rolled.events)
    assert all(e.ts is not None and e.ts >= start for e in rolled.events)


def test_rollup_members_are_real_lines(tmp_path: Path) -> None:
    p = tmp_path / "mixed.log"
    p.write_text(_interleaved(3))
    text = p.read_text().splitlines()
    rolled = _run([p], True)
    for e in rolled.events:
        if e.rollup is None:
            continue
        for m in (e.rollup.last, e.rollup.peak_first, *e.rollup.preempting):
            assert m.text in text[m.line - 1]
            assert m.ts is not None and e.ts is not None
            assert timedelta(0) <= m.ts - e.ts < timedelta(minutes=1)


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5])
def test_glued_sglang_lines_roll_up_as_line_by_line(tmp_path: Path, share: float) -> None:
    # Issue 15: records glued on one physical line (no newline between them: a lost
    # flush, a paste) once gave a rollup another waiting_last than line by line.
    rng = random.Random(15)
    out = []
    for line in (ROOT / "samples/sglang_thrash.log").read_text().splitlines():
        out.append(line + ("\n" if rng.random() < share else ""))
    path = tmp_path / "glued.log"
    path.write_text("".join(out) + "\n")
    rolled = _assert_same_report([path])
    assert any(e.rollup for e in rolled.events)


@pytest.mark.parametrize("bad", ["60", "99"])
def test_a_leap_second_among_a_minutes_stats_is_no_rollup_member(tmp_path: Path, bad: str) -> None:
    # Found by bench/fuzz.py: a `:60` stamp joined its minute's rollup, whose members'
    # times are the carrier's with their own seconds: datetime refused second=60
    # (an internal error). Events take such a stamp for none; so does the rollup.
    line = (
        "INFO 06-16 17:21:{s} [metrics.py:1] Avg prompt throughput: 1.0 tokens/s, Avg "
        "generation throughput: 2.0 tokens/s, Running: 4 reqs, Swapped: 0 reqs, Pending: "
        "{w} reqs, GPU KV cache usage: 50.0%, CPU KV cache usage: 0.0%."
    )
    secs = ["00", "10", bad, "20", "30"]
    path = tmp_path / "leap.log"
    path.write_text("".join(line.format(s=s, w=i) + "\n" for i, s in enumerate(secs)))
    rolled = _assert_same_report([path])
    assert sum(e.lines for e in rolled.events) == 5


def test_unstamped_lines_after_a_glued_line_crossing_a_minute(tmp_path: Path) -> None:
    # Found by bench/fuzz.py (issue 15's waiting_last 54 vs 52): a glued line's records
    # cross into the next minute, so it carries two rollups with the same last line;
    # the unstamped stats lines below took the first rollup's time, not the second's.
    rec = (
        "INFO 11-04 16:{m:02d}:{s:02d} [loggers.py:1] Engine 000: Avg prompt throughput: "
        "1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: "
        "{w} reqs, GPU KV cache usage: {kv}.0%, Prefix cache hit rate: 0.0%"
    )
    glued = "".join(
        rec.format(m=(33 + 5 * i) // 60 + 3, s=(33 + 5 * i) % 60, w=i, kv=40 + i) for i in range(8)
    )
    bare = rec.split("] ", 1)[1]
    lines = [glued] + [bare.format(w=50 + i, kv=90 + i) for i in range(3)]
    path = tmp_path / "glued_minutes.log"
    path.write_text("\n".join(lines) + "\n")
    rolled = _assert_same_report([path], time=TimeContext(year=2026))
    assert sum(1 for e in rolled.events if e.rollup) == 2


def test_an_unstamped_record_glued_after_a_rollups_members(tmp_path: Path) -> None:
    # Found by bench/fuzz.py: a record whose stamp cannot be a time, glued after a
    # minute's records on their line, took the rollup carrier's (first) time, not its
    # last member's as line by line: waiting_last 37 against 0.
    rec = (
        "INFO {stamp} [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg "
        "generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: {w} reqs, GPU KV "
        "cache usage: 50.0%, Prefix cache hit rate: 0.0%"
    )
    stamped = [rec.format(stamp=f"07-15 14:01:{s:02d}", w=30 + s) for s in (4, 14, 24, 34)]
    glued = "".join([*stamped, rec.format(stamp="99-99 99:99:99", w=0)])
    path = tmp_path / "glued_bad_stamp.log"
    path.write_text(rec.format(stamp="07-15 14:00:54", w=1) + "\n" + glued + "\n")
    rolled = _assert_same_report([path], time=TimeContext(year=2026))
    assert rolled.report.windows[-1].waiting_last == 0


def test_rollup_copies_every_field_of_a_hit() -> None:
    # rollup._with spells dataclasses.replace out for speed: a field Hit gains must
    # not be dropped there (each field a distinct value, so a swap shows too).
    values = {f.name: object() for f in dataclass_fields(Hit)}
    h = Hit(**values)
    got = rollup_mod._with(h, {"x": 1}, "t", None)
    assert got == replace(h, fields={"x": 1}, text="t", rollup=None)


def test_a_record_glued_after_a_member_with_a_stamped_line_between(tmp_path: Path) -> None:
    # Found by bench/fuzz.py (seed 4041, input 1322): a preemption warning (stamped, no
    # rollup) between a minute's carrier and its last member; a record with a stamp
    # that is no time (`:60`) glued after that member took the warning's time, not
    # the member's as line by line does.
    stats = (
        "INFO 11-04 16:07:{s:02d} metrics.py:349] Avg prompt throughput: 1.0 tokens/s, Avg "
        "generation throughput: 2.0 tokens/s, Running: 5 reqs, Swapped: 0 reqs, Pending: "
        "{w} reqs, GPU KV cache usage: {kv}%, CPU KV cache usage: 0.0%."
    )
    warn = (
        "WARNING 11-04 16:07:27 scheduler.py:1481] Sequence group chat-1 is preempted by "
        "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
        "total_num_cumulative_preemption=1"
    )
    lines = [
        stats.format(s=27, w=1, kv="90.0"),
        warn,
        stats.format(s=37, w=2, kv="91.0"),
        stats.format(s=47, w=3, kv="92.0")
        + stats.format(s=60, w=4, kv="99.6").replace("11-04 16:07:60", "06-16 17:21:60"),
        stats.format(s=57, w=5, kv="93.0"),
    ]
    path = tmp_path / "glued_after_member.log"
    path.write_text("\n".join(lines) + "\n")
    _assert_same_report([path], time=TimeContext(year=2026))


def test_a_stamp_that_is_no_time_inside_a_minute_closes_its_rollups(tmp_path: Path) -> None:
    # Found by bench/fuzz.py (seed 6061, input 2080): `14:35:9999…` is no time to
    # events (timed by the line before, 14:35:40), but the open rollup went on past
    # it, so the line took the carrier's time (14:35:00) as the window's KV evidence.
    line = (
        "INFO 11-19 14:35:{s} metrics.py:349] Avg prompt throughput: 1.0 tokens/s, Avg "
        "generation throughput: 2.0 tokens/s, Running: 4 reqs, Swapped: 0 reqs, Pending: "
        "{w} reqs, GPU KV cache usage: {kv}%, CPU KV cache usage: 0.0%."
    )
    secs = ["00", "10", "20", "40", "9" * 40, "50", "55"]
    kvs = ["80.0", "81.0", "82.0", "83.0", "99.6", "84.0", "85.0"]
    path = tmp_path / "no_time.log"
    path.write_text(
        "".join(
            line.format(s=s, w=i, kv=k) + "\n"
            for i, (s, k) in enumerate(zip(secs, kvs, strict=True))
        )
    )
    rolled = _assert_same_report([path], time=TimeContext(year=2026))
    (peak,) = [e for e in rolled.report.verdict.evidence if "99.6%" in e.text]
    assert peak.ts is not None and (peak.ts.minute, peak.ts.second) == (35, 40)


def test_a_minute_mixing_fraction_separators_keeps_its_lines_in_time_order(
    tmp_path: Path,
) -> None:
    # `59.1` sorts after `59,9` as text (`.` > `,`) but is 0.8 s earlier: taken as
    # forward, the rollup's last line (Waiting's last value) was the earlier one.
    line = (
        "2025-03-04 10:10:{s} INFO metrics.py:349] Avg prompt throughput: 1.0 tokens/s, "
        "Avg generation throughput: 2.0 tokens/s, Running: 4 reqs, Swapped: 0 reqs, "
        "Pending: {w} reqs, GPU KV cache usage: 80.0%, CPU KV cache usage: 0.0%."
    )
    path = tmp_path / "separators.log"
    path.write_text(
        "".join(line.format(s=s, w=w) + "\n" for s, w in [("05", 3), ("59,9", 1), ("59.1", 7)])
    )
    rolled = _assert_same_report([path], time=TimeContext(year=2025))
    (window,) = rolled.report.windows
    assert (window.waiting_first, window.waiting_last, window.waiting_max) == (3, 1, 7)


_V0_STATS = (
    "{proc}INFO 11-04 {t} metrics.py:349] Avg prompt throughput: 1.0 tokens/s, Avg "
    "generation throughput: 2.0 tokens/s, Running: 5 reqs, Swapped: 0 reqs, Pending: "
    "{w} reqs, GPU KV cache usage: 90.0%, CPU KV cache usage: 0.0%."
)


def _v0(t: str, w: int, proc: str = "") -> str:
    return _V0_STATS.format(proc=proc, t=t, w=w)


def test_seed_8081_index_12465_a_record_glued_after_a_member_on_its_line(tmp_path: Path) -> None:
    # Found by bench/fuzz.py (seed 8081, input 12465): a member (16:06:50) with the
    # next minute's first record glued after it; the line below, its stamp no time
    # (`00-00`), took the member's time (window 16:06), not the glued record's
    # (16:07) as line by line: prompt tok/s 5.9x against 5.7x.
    lines = [
        _v0("16:06:40", 1),
        _v0("16:06:50", 2) + _v0("16:07:12", 3),
        _v0("16:07:20", 4).replace("11-04 16:07:20", "00-00 00:00:00"),
    ]
    path = tmp_path / "glued_next_minute.log"
    path.write_text("\n".join(lines) + "\n")
    rolled = _assert_same_report([path], time=TimeContext(year=2026))
    assert [
        (w.start.minute if w.start else None, w.waiting_last) for w in rolled.report.windows
    ] == [
        (6, 2),
        (7, 4),
    ]


def test_seed_8081_index_12465_two_streams_glued_on_one_line(tmp_path: Path) -> None:
    # The same family with two streams: both rollups' members on one glued line, the
    # earlier carrier's member last; an unstamped line below takes the later record's
    # time (16:07:50, stream A), as line by line, not the later carrier's member's.
    a, b = "(EngineCore_DP0 pid=1) ", "(EngineCore_DP1 pid=2) "
    lines = [
        _v0("16:07:00", 1, a),
        _v0("16:07:05", 2, b),
        _v0("16:07:20", 3, b) + _v0("16:07:50", 4, a),
        "Traceback (most recent call last):",
        _v0("16:08:40", 6, a).replace("11-04 16:08:40", "99-99 99:99:99"),
    ]
    path = tmp_path / "glued_two_streams.log"
    path.write_text("\n".join(lines) + "\n")
    rolled = _assert_same_report([path], time=TimeContext(year=2026))
    assert [(w.start.minute if w.start else None, w.n_stats) for w in rolled.report.windows] == [
        (7, 5)
    ]


def test_seed_8081_index_8048_two_streams_glued_at_one_second(tmp_path: Path) -> None:
    # Found by bench/fuzz.py (seed 8081, input 8048: SGLang prefill and decode records
    # glued on one line): two streams' lines at one second on one line, KV tied.
    # Evidence took the first, and waiting_last the last, in the order the events
    # came in, and rollups list a member at its carrier's place (DP1's carrier is the
    # earlier): rollup on picked DP1's line as the peak and DP0's as the last, off the
    # other way round. Ties go by where a record starts in its line.
    a, b = "(EngineCore_DP0 pid=1) ", "(EngineCore_DP1 pid=2) "
    lines = [
        _v0("16:07:20", 1, a).replace("90.0%", "50.0%"),
        _v0("16:07:28", 2, a).replace("90.0%", "99.0%")
        + _v0("16:07:10", 3, b).replace("90.0%", "40.0%")
        + _v0("16:07:28", 4, b).replace("90.0%", "99.0%"),
    ]
    path = tmp_path / "glued_tie.log"
    path.write_text("\n".join(lines) + "\n")
    rolled = _assert_same_report([path], time=TimeContext(year=2026))
    ((window, peak),) = [(w, e) for w in rolled.report.windows for e in w.evidence]
    assert peak.text.startswith(a + "INFO 11-04 16:07:28")
    assert window.waiting_last == 4


def _late_count_log(path: Path) -> Path:
    """A V1 log whose stats lines print `Preemptions:` (a late count: every line is a
    read, visibility.Settled), a queue inside the minutes where the count moves."""
    start = datetime(2025, 3, 4, 14, 8)
    lines = [
        "(APIServer pid=1) INFO 03-04 14:07:50 [core.py:93] Initializing a V1 LLM engine "
        "(v0.12.0) with config: model='m'"
    ]
    count = 0
    for i in range(36):
        waiting = 3 if 14 <= i <= 16 or 20 <= i <= 22 else 0
        count = {15: 2, 21: 5}.get(i, count)
        lines.append(
            f"(APIServer pid=1) INFO {start + timedelta(seconds=10 * i):%m-%d %H:%M:%S} "
            "[loggers.py:236] Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation "
            f"throughput: 20.0 tokens/s, Running: 4 reqs, Waiting: {waiting} reqs, Preemptions: "
            f"{count}, GPU KV cache usage: 50.0%, Prefix cache hit rate: 0.0%"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_late_v1_count_is_read_line_by_line(tmp_path: Path) -> None:
    # Its reads and drains are every line's (time, count, Waiting); a rollup keeps a
    # minute's first and last: bench/fuzz.py seed 3032 index 101 found the reason's time
    # moved to a minute's, here a window's confidence moved too. analyze reads such a
    # log again, line by line.
    rolled = _assert_same_report([_late_count_log(tmp_path / "late.log")])
    assert not any(e.rollup for e in rolled.events)
    assert any("not seen empty after 14:10:10" in n for n in rolled.report.notes)
    assert [str(w.confidence) for w in rolled.report.windows][:3] == ["low", "high", "high"]


def _piped_json(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], copy: bool
) -> dict[str, Any]:
    """analyze's JSON of `path` piped to stdin; `copy`: as it is (read from its copy in
    the temporary folder, ingest/spool.py), or where no such copy can be made."""
    with monkeypatch.context() as m:
        if not copy:
            m.setattr(spool_mod.tempfile, "mkstemp", _no_temporary_folder)
        m.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Pipe(path.read_bytes()))))
        assert main(["analyze", "--year", "2025", "-f", "json", "-"]) in (0, 1)
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _no_temporary_folder(*_: object, **__: object) -> tuple[int, str]:
    raise PermissionError(13, "Permission denied")


def test_a_late_v1_count_from_stdin_is_read_again_from_its_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Piped, the log is read from its copy on disk: line by line again, as the file
    # is. Streamed once (no copy could be made) the report says its spans were read by
    # minute.
    path = _late_count_log(tmp_path / "late.log")
    named = run_analysis(Options(files=(str(path),), time=TimeContext(year=2025)))
    copied = _piped_json(path, monkeypatch, capsys, copy=True)
    streamed = _piped_json(path, monkeypatch, capsys, copy=False)
    assert analyze_mod._LATE_ROLLED not in named.report.notes
    assert analyze_mod._LATE_ROLLED not in copied["notes"]
    assert analyze_mod._LATE_ROLLED in streamed["notes"]
    named_json = report_dict(named.report)
    for key in ("verdict", "windows", "lever"):
        assert json.dumps(copied[key]).replace("<stdin>", str(path)) == json.dumps(named_json[key])


def test_past_the_line_by_line_bound_a_late_count_keeps_its_rollups_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read line by line, a month of such stats lines was ~30 s and ~400 MiB: past the
    # bound analyze keeps the minutes merged, and the report says what that changes.
    path = _late_count_log(tmp_path / "late.log")
    exact = _run([path], False)
    monkeypatch.setattr(analyze_mod, "LINE_BY_LINE_MAX_LINES", 10)
    rolled = _run([path], True)
    assert any(e.rollup for e in rolled.events)
    assert analyze_mod._LATE_ROLLED in rolled.report.notes
    assert analyze_mod._LATE_ROLLED not in exact.report.notes
    assert (rolled.exit_code, rolled.report.verdict.cls) == (
        exact.exit_code,
        exact.report.verdict.cls,
    )


# --- preemption lines merged a minute at a time (rollup.PreemptionBuilder) -------------

RETRACT = (
    "{pod}[{date} {hms} TP{tp}] KV cache pool is full. Retract requests. #retracted_reqs: {n}, "
    "#new_token_ratio: 0.4512 -> {ratio}"
)
SGL_CONFIG = (
    "{pod}[{date} {hms} TP0] server_args=ServerArgs(model_path='/models/demo-8b', tp_size=2, "
    "mem_fraction_static=0.88, max_running_requests=2048, chunked_prefill_size=8192)"
)
V0_WARN = (
    "{ray}WARNING {md} {hms} scheduler.py:1560] Sequence group {rid} is preempted by "
    "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can "
    "affect the end-to-end performance. Increase gpu_memory_utilization or "
    "tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption={n}"
)
V0_START = "INFO {md} {hms} gpu_executor.py:122] # GPU blocks: {blocks}, # CPU blocks: 512"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def _preempting(
    seed: int, engine: str, back: float = 1 / 6, split: float = 0.1, late: float = 0.0
) -> str:
    """SGLang: retractions printed by several ranks (copies at one second, interleaved
    with other records of that second) of two pods behind kubectl --prefix, and
    batch lines. V0: warnings, copied now and then, from two Ray hosts and none,
    counters that restart, and engine starts among them. Both: stamps out of order (a
    share `back` of lines), records glued on one line, and unstamped failure lines,
    which end rollups (a share `split` of units; as many put between two copies). A
    share `late` of retractions has a rank's copy printed after the next unit's lines."""
    r = random.Random(seed)
    t = datetime(2025, 3, 4, 9, 58, 30, tzinfo=UTC)
    out: list[str] = []
    counters = {"10.0.0.1": 0, "10.0.0.2": 0}
    held: list[str] = []  # a copy printed late
    for _ in range(600):
        out.extend(held)
        held = []
        t += timedelta(seconds=r.choice([0, 0, 0, 1, 1, 2, 7, 31]))
        s = t - timedelta(seconds=2 if r.random() < back else 0)  # out of order now and then
        what = r.random()
        pod = r.choice(["", "", "[pod/sglang-0/server] ", "[pod/sglang-1/server] "])
        date, hms, md = f"{s:%Y-%m-%d}", f"{s:%H:%M:%S}", f"{s:%m-%d}"
        if what < split:
            out.append(OOM)
        elif engine == "sglang" and what < 0.7:
            n, ratio = r.choice([1, 2, 3]), r.choice(["0.8127", "0.9000"])
            copies = [
                RETRACT.format(pod=pod, date=date, hms=hms, tp=tp, n=n, ratio=ratio)
                for tp in range(r.choice([1, 2, 2, 4]))
            ]
            if r.random() < 0.2:  # another record of the same second between the copies
                copies.insert(
                    1, RETRACT.format(pod=pod, date=date, hms=hms, tp=0, n=7, ratio=ratio)
                )
            if r.random() < split:  # a failure line with no stamp between the copies
                copies.insert(1, OOM)
            if r.random() < 0.1 and len(copies) > 1:  # two records glued (a lost newline)
                copies[:2] = [copies[0] + copies[1]]
            if r.random() < late and len(copies) > 1:
                held.append(copies.pop())
            out.extend(copies)
        elif engine == "sglang" and what < 0.95:
            out.append(
                SGL.format(
                    date=date,
                    hms=hms,
                    tp=r.choice([0, 1]),
                    run=r.randint(1, 9),
                    kv=r.choice(["0.99", "0.50", "1.00"]),
                    g="10.00",
                    wait=r.choice([0, 4]),
                ).rstrip(", ")
            )
        elif engine == "sglang":
            out.append(SGL_CONFIG.format(pod=pod, date=date, hms=hms))
        elif what < 0.85:
            host = r.choice(list(counters))
            counters[host] = 1 if r.random() < 0.05 else counters[host] + r.choice([1, 50])
            ray = f"(RayWorkerWrapper pid=7{host[-1]}, ip={host}) " if r.random() < 0.5 else ""
            line = V0_WARN.format(
                ray=ray, md=md, hms=hms, rid=f"cmpl-{r.randrange(99)}", n=counters[host]
            )
            copies = [line] * r.choice([1, 1, 2])
            if r.random() < 0.1:  # two records glued (a lost newline)
                copies[-1] += line
            out.extend(copies)
        elif what < 0.9:
            out.append(V0_START.format(md=md, hms=hms, blocks=r.choice([2000, 4000])))
            counters = dict.fromkeys(counters, 0)
        else:
            out.append(f"{hms} some unrelated line")
    return "\n".join(out) + "\n"


def _rolled_preemptions(o: Outcome) -> int:
    return sum(1 for e in o.events if e.kind is Kind.PREEMPTION and e.rollup is not None)


@pytest.mark.parametrize("engine", ["sglang", "v0"])
@pytest.mark.parametrize("seed", range(4))
def test_preemption_lines_roll_up_as_line_by_line(tmp_path: Path, seed: int, engine: str) -> None:
    # In order and with nothing between a second's copies, the rollups stand; stamps
    # that go back or copies split by an unstamped line make analyze read again.
    for back, split in ((0.0, 0.0), (1 / 6, 0.1)):
        p = tmp_path / f"preempting_{back}_{split}.log"
        p.write_text(_preempting(seed, engine, back, split))
        for window in (60, 120, 3600):
            rolled = _assert_same_report([p], window_seconds=window)
            if not back and not split:
                assert _rolled_preemptions(rolled) > 20


@pytest.mark.parametrize("seed", range(4))
def test_a_ranks_copy_printed_late_joins_its_rollup(tmp_path: Path, seed: int) -> None:
    # (after the next second's lines: several ranks print to one stream)
    p = tmp_path / "late.log"
    p.write_text(_preempting(seed, "sglang", back=0.0, split=0.0, late=0.3))
    for window in (60, 120):
        rolled = _assert_same_report([p], window_seconds=window)
        assert _rolled_preemptions(rolled) > 20


def test_preemption_rollups_stand_for_their_lines_in_an_ordered_log(tmp_path: Path) -> None:
    # Stamps never go back and no copy crosses a rollup's edge: the rollups stay, and
    # a minute of a retraction every two seconds from two ranks is one event.
    lines = []
    for k in range(180):
        t = datetime(2025, 3, 4, 10, 0, tzinfo=UTC) + timedelta(seconds=2 * k)
        lines += [
            RETRACT.format(
                pod="", date=f"{t:%Y-%m-%d}", hms=f"{t:%H:%M:%S}", tp=tp, n=k % 3 + 1, ratio="0.9"
            )
            for tp in (0, 1)
        ]
    p = tmp_path / "ordered.log"
    p.write_text("\n".join(lines) + "\n")
    rolled = _assert_same_report([p])
    pre = [e for e in rolled.events if e.kind is Kind.PREEMPTION]
    assert [e.lines for e in pre] == [30, 30, 30, 30, 30, 30]
    assert sum(e.preemptions for e in pre) == sum(k % 3 + 1 for k in range(180))
    # (each window's evidence: the first six retractions of its minute, one copy each)
    w = rolled.report.windows[0]
    assert [e.line for e in w.evidence] == [1, 3, 5, 7, 9, 11]


def test_a_copy_across_a_rollups_edge_out_of_order_is_read_again_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same records printed by two ranks at 10:00:05 and :07, the second copies
    # after an unstamped line (which ends the rollup of the first): time goes back,
    # and the first rollup's records of its middle stamps were merged.
    def line(hms: str, tp: int, n: int) -> str:
        return RETRACT.format(pod="", date="2025-03-04", hms=hms, tp=tp, n=n, ratio="0.9")

    text = [line("10:00:05", 0, 3), line("10:00:07", 0, 2), line("10:00:09", 0, 1), OOM]
    text += [line("10:00:05", 1, 3), line("10:00:07", 1, 2), line("10:00:10", 1, 4)]
    p = tmp_path / "back.log"
    p.write_text("\n".join(text) + "\n")
    rolled = _assert_same_report([p])
    assert _rolled_preemptions(rolled) == 0  # (scanned again without them)
    pre = [e for e in rolled.events if e.kind is Kind.PREEMPTION]
    assert sum(e.preemptions for e in pre) == 3 + 2 + 1 + 4
    # Piped, it is read again from its copy on disk. Streamed once (no copy could be
    # made), it cannot be: the count the merged minutes give, and a note.
    copied = _piped_json(p, monkeypatch, capsys, copy=True)
    assert sum(w["preemptions"] for w in copied["windows"]) == 3 + 2 + 1 + 4
    assert not any("the log was piped" in n for n in copied["notes"])
    notes = _piped_json(p, monkeypatch, capsys, copy=False)["notes"]
    assert any("cannot show their copies here (the log was piped)" in n for n in notes), notes


def test_an_engine_start_among_v0_warnings_out_of_order_is_read_again(tmp_path: Path) -> None:
    # The start (which resets the counter) printed after the minute's warnings but
    # stamped inside their span.
    warn = [
        V0_WARN.format(ray="", md="03-04", hms=f"10:00:{s:02d}", rid="cmpl-1", n=n)
        for s, n in ((5, 51), (20, 101), (40, 1), (50, 51))
    ]
    start = V0_START.format(md="03-04", hms="10:00:30", blocks=2000)
    p = tmp_path / "start.log"
    p.write_text("\n".join([*warn, "unstamped traceback line", OOM, start]) + "\n")
    rolled = _assert_same_report([p])
    assert _rolled_preemptions(rolled) == 0


@pytest.mark.parametrize("seed", range(3))
def test_forked_workers_split_a_seconds_copies(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seed: int
) -> None:
    # Many ranges: some start among one second's copies (of several ranks), whose
    # records the range before ends on. Each range's first stamp of a space stays lines
    # of their own, so events finds the copies: no second scan, the same report.
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(parallel, "RANGES_PER_JOB", 40)
    p = tmp_path / "ranks.log"
    p.write_text(_preempting(seed, "sglang", back=0.0, split=0.0, late=0.3))
    one, two = _run([p], True, jobs=1), _run([p], True, jobs=2)
    assert report_dict(two.report) == report_dict(one.report)
    assert _rolled_preemptions(two) > 20


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
def test_zoneless_stamps_in_a_named_zone(tmp_path: Path, zone: str) -> None:
    # SGLang's stamps carry no zone: in a named --tz, a member line's time was its wall
    # clock given the carrier's (by then UTC) zone, hours off: evidence times, Waiting's
    # last value and a verdict moved.
    from zoneinfo import ZoneInfo

    p = tmp_path / "sglang.log"
    p.write_text(_preempting(0, "sglang", back=0.0, split=0.0, late=0.3))
    rolled = _assert_same_report([p], time=TimeContext(year=2025, tz=ZoneInfo(zone)))
    assert _rolled_preemptions(rolled) > 20
    assert any(e.rollup for e in rolled.events if e.kind is Kind.STATS)


def test_a_window_outside_the_log_counts_every_line_and_its_span(tmp_path: Path) -> None:
    # "N event(s) matched ... the input spans A to B": N counted events, not lines, and
    # B was the last rollup's first line, not its last.
    p = tmp_path / "ranks.log"
    p.write_text(_preempting(3, "sglang", back=0.0, split=0.0, late=0.3))
    after = datetime(2025, 3, 5, 0, 0, tzinfo=UTC)
    rolled = _assert_same_report([p], since=after, until=after + timedelta(hours=1))
    every = _run([p], False).events
    last = max(e.ts for e in every if e.ts is not None)
    assert rolled.report.verdict.why == (
        f"{len(every)} event(s) matched, but none fall between 2025-03-05 00:00:00 and "
        "2025-03-05 01:00:00 (--since/--until); the input spans 2025-03-04 09:58:31 to "
        f"{last:%Y-%m-%d %H:%M:%S} UTC"
    )
    merged = _run([p], True).events
    assert len(merged) < len(every) and max(e.ts for e in merged if e.ts) < last


_OWN_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)| (\d\d-\d\d \d\d:\d\d:\d\d) ")


def _kubectl_stamped(text: str, seed: int) -> str:
    """`text` as `kubectl logs --timestamps` prints it: each line after its `[pod/...]`
    prefix stamped with its own stamp's second (the year 2025, UTC; a line with none,
    the last one's) and the nanosecond the wrapper read it, later in the second for
    each line after it (a second's copies from several ranks each have their own)."""
    rng, now, ns, out = random.Random(seed), datetime(2025, 1, 1), 0, []
    for line in text.splitlines():
        m = _OWN_STAMP.search(line)
        if m is not None:
            then = now
            now = datetime.strptime(m[1] or f"2025-{m[2]}", "%Y-%m-%d %H:%M:%S")
            ns = 0 if now != then else ns
        pod = line[: line.index("] ") + 2] if line.startswith("[pod/") else ""
        ns = rng.randrange(ns + 1, ns + 1 + (1_000_000_000 - ns) // 8)
        out.append(f"{pod}{now:%Y-%m-%dT%H:%M:%S}.{ns:09d}Z {line[len(pod) :]}")
    return "\n".join(out) + "\n"


def _docker_json(stamped: str) -> str:
    """_kubectl_stamped's lines as records of Docker's json-file log: the line its
    `log`, the stamp its `time`, written as Go's encoder writes them (`<`, `>` and `&`
    escaped)."""
    out = []
    for line in stamped.splitlines():
        pod = line[: line.index("] ") + 2] if line.startswith("[pod/") else ""
        stamp, text = line[len(pod) :].split(" ", 1)
        record = {"log": pod + text + "\n", "stream": "stderr", "time": stamp}
        dumped = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
        out.append(dumped.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("engine", ["sglang", "v0"])
@pytest.mark.parametrize("seed", range(3))
def test_a_wrapper_stamps_each_ranks_copy_apart_and_it_counts_once(
    tmp_path: Path, seed: int, engine: str
) -> None:
    # A wrapper stamps each line with the nanosecond it read it, so a second's copies
    # from several ranks had stamps of their own: eight ranks' copies of a retraction
    # were eight retractions. Copies are told by the second, and SGLang's rank is read
    # from under the wrapper's stamp, as from a bare line (DP ranks retract apart).
    plain = tmp_path / "plain.log"
    plain.write_text(_preempting(seed, engine, back=0.0, split=0.0))
    wrapped = tmp_path / "wrapped.log"
    wrapped.write_text(_kubectl_stamped(plain.read_text(), seed))
    # (and as Docker's json-file log keeps them: the stamp in each record's `time`)
    docker = tmp_path / "docker.log"
    docker.write_text(_docker_json(wrapped.read_text()))
    for window in (60, 3600):
        got = [
            [
                (e.preemptions, e.lines)
                for e in _run([p], False, window_seconds=window).events
                if e.kind is Kind.PREEMPTION
            ]
            for p in (plain, wrapped, docker)
        ]
        for other in got[1:]:
            assert sum(n for n, _ in other) == sum(n for n, _ in got[0]) > 20
            assert sum(k for _, k in other) == sum(k for _, k in got[0])
        _assert_same_report([wrapped], window_seconds=window)
        _assert_same_report([docker], window_seconds=window)


def test_data_parallel_ranks_retract_on_their_own(tmp_path: Path) -> None:
    # Each SGLang DP rank schedules (and retracts) on its own: the same record from DP0
    # and DP1 at one second is two retractions; from two TP ranks of one DP rank, one.
    line = "[2025-03-04 10:00:{s:02d} DP{dp} TP{tp}] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.4512 -> 0.9000"
    text = [
        line.format(s=s, dp=dp, tp=2 * dp + tp) for s in (5, 9) for dp in (0, 1) for tp in (0, 1)
    ]
    p = tmp_path / "dp.log"
    p.write_text("\n".join(text) + "\n")
    for rollup in (False, True):
        pre = [e for e in _run([p], rollup).events if e.kind is Kind.PREEMPTION]
        assert (sum(e.preemptions for e in pre), sum(e.lines for e in pre)) == (12, 4)
    _assert_same_report([p])


def _part(hi: int) -> st.SearchStrategy[str]:
    """Two digits: mostly a real value (up to `hi`), now and then any."""
    return st.one_of(st.integers(0, hi), st.integers(0, hi), st.integers(0, 99)).map(
        lambda n: f"{n:02d}"
    )


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(["1899", "1900", "2025", "2024", "9000", "9001"]),
    st.tuples(_part(12), _part(31), _part(23), _part(59), _part(59)),
    st.sampled_from(["", ".5", ",123456789", ".000001"]),
    st.sampled_from(["", "Z", "+00:00", "-0330", "+25:00", "+14:00", "-99:99"]),
    st.sampled_from(["T", " "]),
    st.booleans(),
)
def test_a_wrapper_stamp_is_a_time_where_parse_iso_reads_one(
    year: str,
    parts: tuple[str, str, str, str, str],
    frac: str,
    zone: str,
    sep: str,
    wide: bool,
) -> None:
    # (stamp_of reads a minute once, not each stamp: a wrapper's differ by the
    # nanosecond, and parse_iso of each was most of a stamped thrash loop's scan)
    month, day, hour, minute, sec = parts
    text = f"{year}-{month}-{day}{sep}{hour}:{minute}:{sec}{frac}{zone}"
    if wide:  # (digits outside ASCII: parse_iso's long way)
        text = text.replace("1", "\u0661")
    for kind in ("iso", "sql"):
        got = rollup_mod.stamp_of(WrapperStamp(kind, text), None)
        if rollup_mod._ISO.fullmatch(text):
            assert (got[1] is not None) == (parse_iso(text) is not None), text
