"""--jobs: scan big files in byte ranges, and several files at once, in forked
worker processes.

Processes, not threads. Hyperscan releases the GIL while it scans, but it calls
back into Python (GIL needed) for every literal hit, and the rest of the scan
(newline counting, the regexes on hit lines) holds the GIL too: measured on 1 GiB,
two threads took longer than one (each callback waits for the other thread's
switch interval). Forked workers inherit the built Matcher (no pickling, no second
Hyperscan compile) and send back only their hits.

The pool takes tasks: a byte range of a big plain file, or a whole file that cannot
be cut at byte offsets (compressed, CR-only line ends) or is not worth cutting. So
ten rotated `.gz` files, or thirty 20 MB logs, use every core too. While the workers
scan, the parent has nothing to do but wait, so it runs `while_waiting` as results
come in (analyze imports polars there when they hold more hits than Python
aggregates) and draws the progress bar from a shared byte counter.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

from preemptdiag.ingest.snapshot import Snapshot, take
from preemptdiag.ingest.sources import Source
from preemptdiag.model.errors import DiagError
from preemptdiag.model.evolve import evolve
from preemptdiag.model.gcpause import cyclic_gc_paused
from preemptdiag.model.records import CalmRows, Hit, spill_off
from preemptdiag.scan.limits import Budget, SharedCounts, first_over, too_many
from preemptdiag.scan.matcher import Matcher, ScanResult
from preemptdiag.scan.passes import ProgressFn, scan_fast
from preemptdiag.scan.prefilter import LineFinder, split_ranges
from preemptdiag.scan.rollup import Rollups, map_rollup
from preemptdiag.scan.rust_regex import mark_forked

# Smaller files are scanned in-process: forking and merging cost more than they save.
PARALLEL_MIN_BYTES = 64 << 20
# ...unless nearly every line is a signal line (~80 us each to match and keep, against
# ~1 us a line to find): then a few MiB are seconds of work (SGLang batch lines).
DENSE_MIN_BYTES = 4 << 20
DENSE_SHARE = 0.25  # of the head's lines holding a signature literal
# A compressed byte costs ~8 plain ones to scan (decompression: 200 MB of log as an
# 80 MB .gz took 0.85 s against 0.2 s plain).
COMPRESSED_WEIGHT = 8
_POLL_S = 0.1
RANGES_PER_JOB = 4
# ...and no range over this: a worker holds a range's results until it ends (and
# reads it a block at a time), so its memory stays flat in the file's size; a
# worker that finishes early takes the next, so the last ones end closer together.
MAX_RANGE_BYTES = 8 << 20

# (index of the source, byte range of it; None: the whole input)
Task = tuple[int, tuple[int, int] | None]

# Set by the parent just before it forks; the children inherit it.
_INHERITED: dict[str, Any] = {}


def work(src: Source, finder: LineFinder | None = None) -> int:
    """The cost of scanning `src`, in bytes of a plain log with few signal lines:
    compressed bytes and (given the prefilter to judge the head) bytes dense in
    signal lines weigh more. stdin: 0 (it is read in this process)."""
    if src.path is None:
        return 0
    size = src.size or 0
    if src.codec is not None:
        size *= COMPRESSED_WEIGHT
    if finder is not None and dense(src.head, finder):
        size *= max(1, PARALLEL_MIN_BYTES // DENSE_MIN_BYTES)  # 16: dense from 4 MiB
    return size


def can_split(src: Source, jobs: int, finder: LineFinder | None = None) -> bool:
    """Whether `src` is cut into byte ranges for several processes: a plain, seekable
    file that is large, or (given the prefilter to judge its head) dense in signal
    lines."""
    if not (jobs > 1 and src.path is not None and src.codec is None and not src.cr_only):
        return False
    # Asked last: it imports multiprocessing (~10 ms), which small inputs never need.
    return work(src, finder) >= PARALLEL_MIN_BYTES and _fork_available()


def plan(sources: Sequence[Source], jobs: int, finder: LineFinder | None = None) -> list[Task]:
    """What forked workers scan, costliest first (so no big file starts last); empty
    when this process should scan everything itself: one job, little work in all,
    a single task, or no fork. stdin is never a task."""
    if jobs < 2:
        return []
    costs = [work(s, finder) for s in sources]
    if sum(costs) < PARALLEL_MIN_BYTES:
        return []
    weighted: list[tuple[int, int, tuple[int, int] | None]] = []
    for i, (src, cost) in enumerate(zip(sources, costs, strict=True)):
        if src.path is None:
            continue
        if can_split(src, jobs, finder):
            assert src.path is not None
            # More ranges than workers: a worker that finishes early takes the next
            # one, so a dense stretch (slower to match) does not hold up the rest.
            parts = max(jobs * RANGES_PER_JOB, -(-(src.size or 0) // MAX_RANGE_BYTES))
            ranges = split_ranges(src.path, parts)
            weighted.extend((cost // len(ranges), i, r) for r in ranges)
        else:
            weighted.append((cost, i, None))
    if len(weighted) < 2 or not _fork_available():
        return []
    weighted.sort(key=lambda t: -t[0])
    return [(i, r) for _, i, r in weighted]


def dense(head: bytes, finder: LineFinder) -> bool:
    """Whether a quarter of `head`'s lines or more hold a signature literal."""
    lines = head.count(b"\n")
    return lines > 0 and len(finder.candidate_lines(head)) >= DENSE_SHARE * lines


def _fork_available() -> bool:
    # fork shares the parent's Matcher for free; macOS and Windows do not fork
    # safely, and a spawned child would rebuild everything, so they scan in-process.
    if sys.platform != "linux":
        return False
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


def _count_progress(n: int) -> None:
    counter = _INHERITED["counter"]
    with counter.get_lock():
        counter.value += n


def _worker_init() -> None:
    # Ctrl-C reaches the whole process group: a worker would die with a traceback
    # of its own. The parent alone answers it (_stop_now, then one line from cli).
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    mark_forked()
    spill_off()  # (the parent's file: it spills what it loads of the results)


def _wait_all(
    futures: Sequence[Any],
    counter: Any,
    start_progress: Callable[[], ProgressFn | None] | None,
    while_waiting: Callable[[int], bool] | None,
) -> None:
    """Wait for the workers, drawing progress; stop at the first failure. Each time
    results come in, `while_waiting` is told how many hits they hold so far, until
    it answers that it has done its work."""
    from concurrent.futures import FIRST_EXCEPTION, wait

    # Only now, with the children forked: a progress bar runs a thread.
    progress = start_progress() if start_progress is not None else None
    reported = hits = 0
    pending = set(futures)
    while pending:
        _done, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_EXCEPTION)
        if progress is not None and counter.value > reported:
            progress(counter.value - reported)
            reported = counter.value
        if any(f.exception() is not None for f in _done):
            for f in pending:
                f.cancel()  # tasks not started yet; running ones finish
            break
        if while_waiting is not None and _done:
            hits += sum(len(f.result().hits) for f in _done)
            if while_waiting(hits):
                while_waiting = None


def _stop_now(pool: Any) -> None:
    """Ctrl-C: drop the queued ranges and end the running ones now, instead of
    waiting for every range to be scanned (leaving the `with`, or the interpreter's
    exit, waits for all). The worker list and the pool's manager thread are read
    first: shutdown forgets them. The manager thread is waited for too: left running,
    it closed its wake-up pipe while the interpreter's exit hook was writing to it
    (Python 3.11's race), and `Exception ignored ... Bad file descriptor` followed
    the one line (CI, once, under load).

    A worker stopped in the middle of sending its result left the manager thread
    reading the rest for ever: the parent's own write end of the result pipe kept it
    open, and `sys.exit(main())` then hung at exit joining that thread (the suite,
    once, a dense log). With that end closed too, once the workers are gone, the read
    ends, the pool counts itself broken and the thread ends."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(timeout=5)
    if writer is not None:
        writer.close()
    if manager is not None:
        manager.join(timeout=5)


def _scan_part(args: tuple[int, Source, tuple[int, int] | None]) -> ScanResult:
    i, src, byte_range = args
    limit = _INHERITED["max_hits"]
    budget = None if limit is None else Budget(_INHERITED["held"], i, limit, src.name)
    # The collector stays off, as scan_parallel forked the worker: the scan makes no
    # reference cycles (tests/test_scan.py), and the pool pickles the result after
    # this returns, which makes no garbage either; with the collector on, it walked
    # the result's objects again and again (gcpause.py): 0.96 -> 0.58 s to pickle a
    # month's hits.
    result = scan_fast(
        src,
        _INHERITED["matcher"],
        _count_progress,
        byte_range=byte_range,
        rollup=_INHERITED["rollup"],
        snap=_INHERITED["snaps"][i],
        budget=budget,
        calm_kv=_INHERITED["calm_kv"],
        calm_window=_INHERITED["calm_window"],
    )
    return result


def scan_parallel(
    sources: Sequence[Source],
    tasks: Sequence[Task],
    matcher: Matcher,
    jobs: int,
    start_progress: Callable[[], ProgressFn | None] | None = None,
    while_waiting: Callable[[int], bool] | None = None,
    max_hits: int | None = None,
    rollup: int = Rollups.NONE,
    calm_kv: float | None = None,
    calm_window: tuple[int, int] = (1, 0),
) -> dict[int, ScanResult]:
    """Scan `tasks` (see plan) in up to `jobs` processes; the result of each source
    they cover, by its index in `sources`.

    Each is exactly what one scan_fast over the whole source returns: ranges start
    on line starts and are merged in file order, and a range's last line reads the
    next range's first line when it must rejoin a hard-wrapped record. Every file
    is opened once, here, before the fork: the workers read the descriptor they
    inherit (snapshot.py), so a log rotated meanwhile is still read as one file.
    `max_hits` is one budget for all workers (limits.Budget); past it, the
    DiagError names the source where input order crosses it.
    """
    # Imported here: only big inputs need them (~15 ms of start-up otherwise).
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    matcher.finder()  # build the prefilter once, before the children copy it
    counter = ctx.Value("q", 0)
    held = ctx.Array("q", len(sources))
    snaps: dict[int, Snapshot] = {}
    try:
        for i in sorted({i for i, _ in tasks}):
            path = sources[i].path
            assert path is not None  # plan never gives stdin to a worker
            snaps[i] = take(path, sources[i].name)
            _check_cut(snaps[i], [r for j, r in tasks if j == i and r is not None])
        _INHERITED.update(matcher=matcher, counter=counter, max_hits=max_hits, rollup=rollup)
        _INHERITED.update(calm_kv=calm_kv, calm_window=calm_window)
        _INHERITED.update(held=held, snaps=snaps)  # what workers hold; the files opened
        # Unpickling the workers' results and moving their line numbers make objects
        # and no garbage: without the collector, 1.1 -> 0.4 s to load a month's hits.
        with cyclic_gc_paused():
            return _run(sources, tasks, jobs, ctx, start_progress, while_waiting, held, max_hits)
    finally:
        _INHERITED.clear()
        for snap in snaps.values():
            snap.close()


def _check_cut(snap: Snapshot, ranges: Sequence[tuple[int, int]]) -> None:
    """The ranges were cut on the file as plan() saw it: refuse if it is not the
    file just opened (replaced or resized in between, by rotation)."""
    if ranges and max(end for _, end in ranges) != snap.size:
        raise DiagError(
            f"{snap.name}: changed size while being read (log rotation?); rerun, or "
            "analyze the rotated copy"
        )


def _run(
    sources: Sequence[Source],
    tasks: Sequence[Task],
    jobs: int,
    ctx: Any,
    start_progress: Callable[[], ProgressFn | None] | None,
    while_waiting: Callable[[int], bool] | None,
    held: SharedCounts,
    max_hits: int | None,
) -> dict[int, ScanResult]:
    from concurrent.futures import ProcessPoolExecutor

    counter = _INHERITED["counter"]  # progress: bytes the workers scanned
    try:
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(tasks)), mp_context=ctx, initializer=_worker_init
        ) as pool:
            try:
                futures = [pool.submit(_scan_part, (i, sources[i], rng)) for i, rng in tasks]
                _wait_all(futures, counter, start_progress, while_waiting)
            except KeyboardInterrupt:
                _stop_now(pool)
                raise
            done = [(i, rng, f.result()) for (i, rng), f in zip(tasks, futures, strict=True)]
    except DiagError:
        if max_hits is not None:
            over = first_over([held[i] for i in range(len(sources))], max_hits)
            if over is not None:
                raise too_many(sources[over].name, max_hits) from None
        raise
    parts: dict[int, list[tuple[int, ScanResult]]] = {}
    for i, rng, result in done:
        parts.setdefault(i, []).append((rng[0] if rng else 0, result))
    return {
        i: merge(sources[i].name, [r for _, r in sorted(ps, key=lambda p: p[0])])
        for i, ps in sorted(parts.items())
    }


def _shifted(h: Hit, offset: int) -> Hit:
    """`h` with its line numbers (and its rollup members') counted from the file start.
    A rollup cut by a range boundary stays two rollups: windows add them up.

    A line with several roles in a rollup (its last line and its peak, say) is one
    object, and stays one: events and evidence tell members apart by identity."""
    if offset == 0:
        return h
    if h.rollup is None:
        return evolve(h, line=h.line + offset)  # replace, faster (every hit)
    made: dict[int, Hit] = {}

    def shift(m: Hit) -> Hit:
        got = made.get(id(m))
        if got is None:
            got = made[id(m)] = evolve(m, line=m.line + offset)
        return got

    return evolve(h, line=h.line + offset, rollup=map_rollup(h.rollup, shift))


def _calm_shifted(rows: CalmRows, offset: int) -> CalmRows:
    """`rows` with their line numbers counted from the file start."""
    if offset == 0:
        return rows
    assert rows.frame is not None
    lines = ("first_line", "last_line", "peak_line")
    return dataclasses.replace(rows, frame=rows.frame.shifted(lines, offset))


def merge(name: str, parts: list[ScanResult]) -> ScanResult:
    """One result from the results of consecutive byte ranges, in file order."""
    merged = ScanResult(source=name)
    offset = 0
    for part in parts:
        merged.hits.extend(_shifted(h, offset) for h in part.hits)
        merged.calm.extend(_calm_shifted(c, offset) for c in part.calm)
        merged.calm_kv, merged.calm_window = part.calm_kv, part.calm_window
        offset += part.lines_read
        merged.lines_read += part.lines_read
        merged.bytes_read += part.bytes_read
        merged.skipped.update(part.skipped)
        merged.recognised.update(part.recognised)
        merged.members += part.members
    return merged
