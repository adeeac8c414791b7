"""What --jobs gives to forked workers: large files and ones dense in signal lines in
byte ranges, and several files at once."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_equivalence import _bench_generator

import preemptdiag.commands.analyze as analyze
import preemptdiag.scan.parallel as parallel
import preemptdiag.scan.passes as passes
from preemptdiag.commands.analyze import scan_sources
from preemptdiag.ingest.sources import Source, open_source
from preemptdiag.model.errors import DiagError
from preemptdiag.model.records import Hit
from preemptdiag.scan.limits import Budget, first_over
from preemptdiag.scan.matcher import Matcher, ScanResult
from preemptdiag.scan.passes import scan_fast
from preemptdiag.scan.signatures import load

MATCHER = Matcher(load())
FINDER = MATCHER.finder()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("parallel")
    gen = _bench_generator()
    out = {"dense": d / "dense.log", "sparse": d / "sparse.log"}
    with out["dense"].open("wb") as f:
        gen.generate_dense(f, 300_000, seed=1)
    with out["sparse"].open("wb") as f:
        gen.generate(f, 300_000, seed=1)
    out["dense_gz"] = d / "dense.log.gz"
    out["dense_gz"].write_bytes(gzip.compress(out["dense"].read_bytes(), mtime=0))
    return out


@pytest.mark.parametrize(
    ("name", "small_table", "wanted"),
    [
        ("sparse", 100, []),
        ("dense", 100, [True]),
        # (as many hits as windows.py aggregates in Python: polars is not needed)
        ("dense", 100_000, []),
    ],
)
def test_the_parent_imports_polars_while_it_waits_only_for_many_hits_of_dense_files(
    logs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    small_table: int,
    wanted: list[bool],
) -> None:
    # A sparse log's few events are aggregated in Python (windows.SMALL_TABLE): polars
    # imported meanwhile was ~0.3 s of CPU and ~47 MiB for nothing (a GiB of requests);
    # a dense log's, once the workers' results hold more hits than that, and once.
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 100_000)
    monkeypatch.setattr(analyze, "SMALL_TABLE", small_table)
    src = open_source(str(logs[name]))
    assert parallel.plan([src], 2, FINDER)  # cut into ranges for two workers
    preloaded: list[bool] = []
    done = scan_sources([src], MATCHER, 2, preload=partial(preloaded.append, True))
    if name == "dense":
        assert 100 < len(done[0].hits) < 100_000  # (so the bar decides)
    assert preloaded == wanted


def test_a_big_file_is_cut_into_ranges_of_at_most_max_range_bytes(
    logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker holds a range's results until it ends: ranges of bounded size keep its
    # memory flat however big the file (a quarter's log was ranges of 23 MiB).
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 100_000)
    src = open_source(str(logs["dense"]))
    size = os.path.getsize(logs["dense"])
    assert len(parallel.plan([src], 2, FINDER)) == 2 * parallel.RANGES_PER_JOB
    monkeypatch.setattr(parallel, "MAX_RANGE_BYTES", size // 20)
    tasks = parallel.plan([src], 2, FINDER)
    assert len(tasks) >= 20  # (size // 20 at most each: 21 asked, cut at record starts)
    cuts = sorted(r for _, r in tasks if r is not None)
    assert cuts[0][0] == 0 and cuts[-1][1] == size
    assert all(b - a <= size // 20 + 4096 for a, b in cuts)  # (cut at line starts)


def test_dense_files_split_from_a_few_mib(
    logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "DENSE_MIN_BYTES", 200_000)
    dense, sparse = open_source(str(logs["dense"])), open_source(str(logs["sparse"]))
    assert parallel.can_split(dense, 2, FINDER)
    assert not parallel.can_split(dense, 1, FINDER)  # one job: nothing to split over
    assert not parallel.can_split(dense, 2)  # no prefilter to judge the head with
    # Request logging on: a signal line now and then, not worth forking for.
    assert not parallel.can_split(sparse, 2, FINDER)
    # A gzip stream cannot be cut at byte offsets.
    assert not parallel.can_split(open_source(str(logs["dense_gz"])), 2, FINDER)
    monkeypatch.setattr(parallel, "DENSE_MIN_BYTES", 400_000)
    assert not parallel.can_split(dense, 2, FINDER)  # dense but small


def test_large_files_split_whatever_their_density(
    logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 200_000)
    assert parallel.can_split(open_source(str(logs["sparse"])), 2, FINDER)
    assert parallel.can_split(open_source(str(logs["sparse"])), 2)


# --- several files at once: rotated .gz logs, many medium files ---------------------


def _stdin_source() -> Source:
    return Source(name="<stdin>", path=None, codec=None, mtime=None, head=b"", size=None)


def test_plan_gives_whole_files_to_workers_costliest_first(
    logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sparse, gz = open_source(str(logs["sparse"])), open_source(str(logs["dense_gz"]))
    assert gz.size is not None and sparse.size is not None
    # A compressed byte weighs 8, a byte dense in signal lines 16 more.
    dense_weight = parallel.PARALLEL_MIN_BYTES // parallel.DENSE_MIN_BYTES
    assert parallel.work(gz) == gz.size * parallel.COMPRESSED_WEIGHT
    assert parallel.work(gz, FINDER) == gz.size * parallel.COMPRESSED_WEIGHT * dense_weight
    assert parallel.work(sparse, FINDER) == sparse.size
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1 << 40)
    assert parallel.plan([sparse, gz], 2, FINDER) == []  # too little work in all
    # Enough in all, though neither file is big enough to cut (nor could the .gz be):
    # each is one task, the costlier first. (The dense weight is the ratio of the two
    # sizes, kept at 16 here.)
    unit = gz.size * parallel.COMPRESSED_WEIGHT + 1
    monkeypatch.setattr(parallel, "DENSE_MIN_BYTES", unit)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", dense_weight * unit)
    assert parallel.work(gz, FINDER) < parallel.PARALLEL_MIN_BYTES  # not big alone
    assert parallel.plan([sparse, gz], 2, FINDER) == [(1, None), (0, None)]
    assert parallel.plan([sparse, gz], 1, FINDER) == []  # one job
    # stdin is read by this process, never a task.
    assert parallel.plan([_stdin_source(), sparse, gz], 2, FINDER) == [(2, None), (1, None)]
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1_000)
    assert parallel.plan([gz], 2, FINDER) == []  # one task: nothing to share


def test_plan_cuts_big_plain_files_and_keeps_the_rest_whole(
    logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sparse, gz = open_source(str(logs["sparse"])), open_source(str(logs["dense_gz"]))
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 200_000)
    tasks = parallel.plan([sparse, gz], 2, FINDER)
    ranges = [r for i, r in tasks if i == 0]
    assert len(ranges) == 2 * parallel.RANGES_PER_JOB
    assert all(r is not None for r in ranges)
    assert sorted(ranges) == parallel.split_ranges(logs["sparse"], 2 * parallel.RANGES_PER_JOB)
    assert [t for t in tasks if t[0] == 1] == [(1, None)]
    assert tasks[0] == (1, None)  # the whole .gz outweighs one range


def test_many_files_on_two_jobs_match_one_process(
    logs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rotated logs: a .gz, a CR-only copy (cannot be cut either), the plain file cut
    # in ranges, and stdin: every result as one process gives it, in input order.
    cr = tmp_path / "old-mac.log"
    cr.write_bytes(logs["sparse"].read_bytes().replace(b"\n", b"\r"))
    paths = [logs["dense_gz"], cr, logs["sparse"], logs["dense"]]
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 200_000)
    srcs = [open_source(str(p)) for p in paths]
    tasks = parallel.plan(srcs, 2, FINDER)
    assert {i for i, r in tasks if r is None} == {0, 1}
    assert {i for i, r in tasks if r is not None} == {2, 3}
    preloaded: list[bool] = []
    monkeypatch.setattr(analyze, "SMALL_TABLE", 0)  # (any hit: polars is wanted)
    # Without rollups: a range boundary cuts a stream-minute in two (windows add the
    # halves up; tests/test_rollup.py holds those reports equal), so hits differ there.
    two = scan_sources(srcs, MATCHER, 2, preload=lambda: preloaded.append(True))
    one = scan_sources(srcs, MATCHER, 1)
    assert preloaded == [True]  # the parent's wait is used once
    for a, b in zip(two, one, strict=True):
        assert a.source == b.source
        assert a.hits == b.hits
        assert (a.lines_read, a.bytes_read, a.skipped) == (b.lines_read, b.bytes_read, b.skipped)
    assert [r.source for r in two] == [str(p) for p in paths]


def test_limit_over_pooled_files_names_the_file_that_crossed_it(
    logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1_000)
    srcs = [open_source(str(logs["sparse"])), open_source(str(logs["dense_gz"]))]
    first = len(scan_sources(srcs[:1], MATCHER, 1)[0].hits)
    assert parallel.plan(srcs, 2, FINDER)
    with pytest.raises(DiagError, match=r"dense\.log\.gz: more than \d+ signal events"):
        scan_sources(srcs, MATCHER, 2, max_hits=first + 10)


def test_merge_keeps_a_member_with_two_roles_one_object(logs: dict[str, Path]) -> None:
    # A rollup's last line is often its peak too: one object in two roles. Events and
    # evidence tell members apart by identity; shifting a later range's line numbers
    # must not make two objects of one line (it did: --jobs 2 then picked other
    # evidence than one process on the 1 GiB benchmark log).
    src = open_source(str(logs["dense"]))
    part = scan_fast(src, MATCHER, rollup=True)
    shared = [h for h in part.hits if h.rollup and h.rollup.last is h.rollup.peak_first]
    assert shared
    merged = parallel.merge(src.name, [part, part])
    second = merged.hits[len(part.hits) :]
    for before, after in zip(part.hits, second, strict=True):
        assert after.line == before.line + part.lines_read
        if before.rollup and before.rollup.last is before.rollup.peak_first:
            assert after.rollup is not None
            assert after.rollup.last is after.rollup.peak_first
            assert after.rollup.last.line == before.rollup.last.line + part.lines_read
    assert merged.hits[: len(part.hits)] == part.hits


def test_a_worker_result_comes_back_equal_with_shared_members_shared(
    logs: dict[str, Path],
) -> None:
    # Workers' hits come back pickled: by their constructor (records.py), and a line
    # with two roles in a rollup still one object after the trip.
    src = open_source(str(logs["dense"]))
    part = scan_fast(src, MATCHER, rollup=True)
    back = pickle.loads(pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))
    assert back.hits == part.hits
    assert [type(h) for h in back.hits] == [Hit] * len(part.hits)
    pairs = [(a, b) for a, b in zip(part.hits, back.hits, strict=True) if a.rollup]
    assert any(a.rollup and a.rollup.last is a.rollup.peak_first for a, _ in pairs)
    for a, b in pairs:
        assert a.rollup is not None and b.rollup is not None
        assert (b.rollup.last is b.rollup.peak_first) == (a.rollup.last is a.rollup.peak_first)
        assert b.rollup.stats == a.rollup.stats


# --- one open per file: rotation while --jobs workers read (issue 15.3) --------------


def _held_by_hand(hits: list[Hit]) -> int:
    """Hits kept, counted from the hits: a rollup keeps its other member lines too."""
    n = 0
    for h in hits:
        n += 1
        if h.rollup is not None:
            r = h.rollup
            own = (h.line, h.sig, h.text)
            n += len(
                {(m.line, m.sig, m.text) for m in (r.last, r.peak_first, *r.preempting)} - {own}
            )
    return n


def _rotating_run(
    path: Path, rotate: Callable[[], None], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> list[ScanResult]:
    """scan_sources with --jobs 2, where the workers start reading only after the parent
    has run `rotate`: a real rotation of the file while the run reads it."""
    go = tmp_path / "rotated"
    real = parallel.scan_fast

    def after_rotation(*args: Any, **kwargs: Any) -> ScanResult:
        while not go.exists():  # in the worker: wait for the parent's rotation
            time.sleep(0.01)
        return real(*args, **kwargs)

    real_wait = parallel._wait_all

    def rotate_then_wait(*args: Any) -> None:  # in the parent, the workers forked
        rotate()
        go.touch()
        real_wait(*args)

    monkeypatch.setattr(parallel, "scan_fast", after_rotation)
    monkeypatch.setattr(parallel, "_wait_all", rotate_then_wait)
    monkeypatch.setattr(parallel, "DENSE_MIN_BYTES", 100_000)
    src = open_source(str(path))
    assert parallel.plan([src], 2, FINDER)  # cut into ranges for two workers
    # Rollups off: a range boundary cuts a stream-minute in two, so hits differ there.
    return scan_sources([src], MATCHER, 2)


def test_log_renamed_and_recreated_during_jobs_2_is_read_as_the_file_opened(
    logs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "server.log"
    shutil.copy(logs["dense"], path)
    one = scan_sources([open_source(str(path))], MATCHER, 1)[0]

    def logrotate_create() -> None:  # logrotate's default: rename, then a new file
        path.rename(tmp_path / "server.log.1")
        with path.open("wb") as f:
            _bench_generator().generate_dense(f, 200_000, seed=7)

    (two,) = _rotating_run(path, logrotate_create, monkeypatch, tmp_path)
    # Reopening by path, the workers read the new file's bytes at the old offsets.
    assert two.hits == one.hits
    assert (two.lines_read, two.bytes_read, two.skipped) == (
        one.lines_read,
        one.bytes_read,
        one.skipped,
    )


def test_log_cut_by_copytruncate_during_jobs_2_is_refused_not_read_in_part(
    logs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "server.log"
    shutil.copy(logs["dense"], path)
    size = path.stat().st_size

    def copytruncate() -> None:
        shutil.copy(path, tmp_path / "server.log.1")
        with path.open("r+b") as f:
            f.truncate(0)

    with pytest.raises(DiagError) as err:
        _rotating_run(path, copytruncate, monkeypatch, tmp_path)
    assert err.value.message == (
        f"{path}: cut from {size:,} to 0 bytes while being read (log rotation by "
        "copytruncate?); analyze the rotated copy, or rerun"
    )


@pytest.fixture
def two_blocks(tmp_path: Path) -> Path:
    """A dense log of more than one 1 MiB block: a scan reads it in two steps."""
    path = tmp_path / "server.log"
    with path.open("wb") as f:
        _bench_generator().generate_dense(f, 3 << 19, seed=2)
    return path


def test_log_cut_by_copytruncate_during_one_process_scan_is_refused(two_blocks: Path) -> None:
    # The file is cut after the first block is read, as logrotate would.
    path = two_blocks
    size = path.stat().st_size

    def cut(_n: int) -> None:
        with path.open("r+b") as f:
            f.truncate(1000)

    with pytest.raises(DiagError, match=rf"cut from {size:,} to 1,000 bytes while being read"):
        scan_fast(open_source(str(path)), MATCHER, progress=cut)


def test_a_growing_log_is_read_to_its_size_when_opened(two_blocks: Path) -> None:
    # A live log grows while it is read: every reader stops where the file ended when
    # the run opened it, so --jobs 1 and 2 read the same bytes.
    path = two_blocks
    size = path.stat().st_size

    def grow(_n: int) -> None:
        with path.open("ab") as f:
            f.write(
                b"[2025-11-02 23:00:00 TP0] KV cache pool is full. Retract requests. "
                b"#retracted_reqs: 9, #new_token_ratio: 0.7000 -> 0.9000\n"
            )

    grown = scan_fast(open_source(str(path)), MATCHER, progress=grow)
    assert grown.bytes_read == size
    assert path.stat().st_size > size


# --- one --max-events budget for all workers (issue 15.4) ----------------------------


def test_rollup_members_count_against_the_budget(logs: dict[str, Path]) -> None:
    res = scan_fast(open_source(str(logs["dense"])), MATCHER, rollup=True)
    assert any(h.rollup for h in res.hits)
    assert res.held == _held_by_hand(res.hits) > len(res.hits)
    plain = scan_fast(open_source(str(logs["dense"])), MATCHER)
    assert plain.held == len(plain.hits)


def test_budget_is_global_across_workers_and_ranges(
    logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "DENSE_MIN_BYTES", 100_000)
    src = open_source(str(logs["dense"]))
    # Rollups off: a range boundary cuts a rollup in two, so two jobs hold a few more.
    held = scan_fast(src, MATCHER).held
    tasks = parallel.plan([src], 2, FINDER)
    assert len(tasks) == 2 * parallel.RANGES_PER_JOB
    # Each range holds less than the limit; all of them together, more. With a budget
    # per range this passed, and the parent unpickled every range's hits.
    limit = held * 3 // 4
    assert limit > held // len(tasks) * 2
    with pytest.raises(DiagError, match=rf"dense\.log: more than {limit:,} signal events"):
        scan_sources([src], MATCHER, 2, max_hits=limit)
    (ok,) = scan_sources([src], MATCHER, 2, max_hits=held)
    assert ok.held == held


def test_budget_unit_adds_deltas_and_names_its_source() -> None:
    counts = [0, 0]

    class Shared(list[int]):
        def get_lock(self) -> contextlib.nullcontext[None]:
            return contextlib.nullcontext()

    shared = Shared(counts)
    a, b = Budget(shared, 0, 10, "a.log"), Budget(shared, 1, 10, "b.log")
    a.spend(4)
    a.spend(6)  # held is a running figure: 6 in all, not 10
    b.spend(4)
    assert list(shared) == [6, 4]
    with pytest.raises(DiagError, match=r"^b\.log: more than 10 signal events"):
        b.spend(5)
    assert first_over([6, 5], 10) == 1
    assert first_over([11, 0], 10) == 0
    assert first_over([5, 5], 10) is None


# --- found by bench/fuzz.py: ranges cut where no record starts --------------------------

_V1_STATS = (
    "INFO 07-28 06:40:{s:02d} [loggers.py:118] Engine 000: Avg prompt throughput: 0.0 "
    "tokens/s, Avg generation throughput: 239.2 tokens/s, Running: 8 reqs, Waiting: {w} "
    "reqs, GPU KV cache usage: 91.2%, Prefix cache hit rate: 0.0%"
)


@pytest.mark.parametrize("width", [80, 200])
def test_ranges_cut_inside_a_wrapped_run_match_a_single_pass(tmp_path: Path, width: int) -> None:
    # Stats records glued on one line (no newlines), then hard-wrapped by a terminal:
    # no piece opens a record, so a range must start inside a wrapped record. Its
    # worker once rejoined pieces a record above the cut had rejoined already, and a
    # rejoin's read past a range end skipped 64 KiB instead of one line.
    glued = "".join(_V1_STATS.format(s=s % 60, w=s) for s in range(300))
    pieces = [glued[i : i + width] for i in range(0, len(glued), width)]
    path = tmp_path / "wrapped.log"
    path.write_text("\n".join(pieces) + "\n")
    src = open_source(str(path))
    whole = scan_fast(src, MATCHER)
    ranges = parallel.split_ranges(path, 8)
    assert len(ranges) == 8
    merged = parallel.merge(src.name, [scan_fast(src, MATCHER, byte_range=r) for r in ranges])
    assert len(whole.hits) >= 50
    assert merged.hits == whole.hits
    assert merged.skipped == whole.skipped


def test_a_range_cut_below_a_line_longer_than_the_priming_look_back(tmp_path: Path) -> None:
    # Found by bench/fuzz.py (seed 8081, input 4973: NUL runs and glued lines): no whole
    # line within the look-back above a cut, so priming scanned an empty range, which
    # primed itself again: RecursionError in the --jobs worker (exit 3).
    from preemptdiag.scan.passes import _PRIME_MAX_BYTES

    rec = _V1_STATS.format(s=1, w=3)
    path = tmp_path / "long_line.log"
    with path.open("w") as f:
        f.write(rec + "\n" + "x" * (_PRIME_MAX_BYTES + 4096) + "\n")
        f.write("  continued, no record opens here\n")
        f.write("\n".join(_V1_STATS.format(s=s, w=s) for s in range(2, 40)) + "\n")
    src = open_source(str(path))
    whole = scan_fast(src, MATCHER)
    data = path.read_bytes()
    cut = data.index(b"  continued")  # a range that starts on a line no record opens
    parts = [scan_fast(src, MATCHER, byte_range=r) for r in ((0, cut), (cut, len(data)))]
    merged = parallel.merge(src.name, parts)
    assert merged.hits == whole.hits and len(whole.hits) == 39


def _reset_above_whole(data: bytes, start: int, limit: int) -> tuple[int, int] | None:
    # What _prime read before: the whole look-back at once, searched nearest first.
    lo = max(0, start - limit)
    lines = data[lo:start].split(b"\n")[:-1]
    at = len(lines)
    while at > (1 if lo > 0 else 0):
        at -= 1
        if passes._resets(lines[at].rstrip(b"\r")):
            break
    if at >= len(lines):
        return None
    return start - sum(len(ln) + 1 for ln in lines[at:]), len(lines) - at


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(
        st.sampled_from(["", "  more", "x" * 40, "ERROR 05-01 10:00:00 [a.py:1] y", "zz"]),
        max_size=60,
    ),
    cut=st.integers(min_value=0, max_value=60),
    limit=st.sampled_from([16, 100, 512, 4096]),
)
def test_the_growing_look_back_above_a_cut_finds_what_the_whole_one_finds(
    lines: list[str], cut: int, limit: int
) -> None:
    # _prime reads a little above a cut, then twice as much, up to _PRIME_MAX_BYTES,
    # where it read all of it at once (4 MiB, most of a worker's peak memory).
    data = "".join(f"{ln}\n" for ln in lines).encode()
    start = len("".join(f"{ln}\n" for ln in lines[: min(cut, len(lines))]).encode())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(passes, "_PRIME_MAX_BYTES", limit)
        mp.setattr(passes, "_PROBE_BYTES", 8)
        got = passes._reset_above(io.BytesIO(data), start)
    assert got == _reset_above_whole(data, start, limit)


def test_jobs_workers_forked_after_polars_started_never_touch_it(tmp_path: Path) -> None:
    # One process, two analyses (what check does over several files, and the fuzzer):
    # the second forks its --jobs workers after the first started polars' thread pool.
    # A worker that then asks polars anything (bulk's rust_ok once did, before
    # usable()) waits forever on a lock a thread of the parent held at the fork.
    log = tmp_path / "stats.log"
    with log.open("wb") as f:
        _bench_generator().PROFILES["vllm-stats"](f, 6 << 20, 1)
    code = (
        "import sys; from preemptdiag.cli import main; "
        f"argv = ['analyze', {str(log)!r}, '-f', 'json', '--year', '2026', '--jobs', '2', '-q']; "
        "sys.exit(main(argv) + main(argv))"
    )
    # Its own process group: on a hang the forked workers go too, not only the parent.
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("a second analysis in one process hung in its --jobs workers")
    assert proc.returncode == 0, err[-2000:]


def test_workers_scan_with_the_cyclic_collector_paused(
    logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker scans as analyze's own process does, collector off (gcpause.py), even
    when the caller has it on: the pool forks inside scan_parallel's pause."""
    import gc

    real = parallel.scan_fast

    def noting_gc(*args: Any, **kwargs: Any) -> ScanResult:
        result = real(*args, **kwargs)
        result.recognised["gc on in worker"] = int(gc.isenabled())
        result.recognised["worker"] = int(os.getpid() != parent)
        return result

    parent = os.getpid()
    monkeypatch.setattr(parallel, "scan_fast", noting_gc)
    monkeypatch.setattr(parallel, "DENSE_MIN_BYTES", 100_000)
    src = open_source(str(logs["dense"]))
    ranges = len(parallel.plan([src], 2, FINDER))
    assert ranges > 1
    assert gc.isenabled()
    (result,) = scan_sources([src], MATCHER, 2)
    assert result.recognised["worker"] == ranges  # every range, in a worker
    assert result.recognised["gc on in worker"] == 0
    assert gc.isenabled()  # and the caller's collector is as it was


# The pool a forked worker writes half a result into (set before the fork).
_HALF_SENT: dict[str, Any] = {}


def _send_half_a_result() -> None:
    # (in the worker: a result's length, then a few of its bytes, as a worker stopped
    # in the middle of sending a big one leaves the pipe)
    import struct

    writer = _HALF_SENT["pool"]._result_queue._writer
    os.write(writer.fileno(), struct.pack("!i", 1 << 20) + b"x" * 100)
    Path(_HALF_SENT["flag"]).touch()
    time.sleep(60)


def test_stopping_the_workers_ends_a_result_read_cut_in_the_middle(tmp_path: Path) -> None:
    # Ctrl-C while a worker was sending its result left the pool's thread reading the
    # rest for ever; `sys.exit(main())` then hung at exit joining it (the suite, once).
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    flag = tmp_path / "half-sent"
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
    _HALF_SENT.update(pool=pool, flag=str(flag))
    try:
        pool.submit(_send_half_a_result)
        deadline = time.monotonic() + 30
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert flag.exists()
        time.sleep(0.3)  # (the pool's thread is reading the rest by now)
        manager = pool._executor_manager_thread  # type: ignore[attr-defined]
        assert manager is not None and manager.is_alive()
        t0 = time.monotonic()
        parallel._stop_now(pool)
        assert not manager.is_alive() and time.monotonic() - t0 < 4
    finally:
        _HALF_SENT.clear()
