"""--jobs: scan byte ranges of one big file in forked worker processes.

Processes, not threads. Hyperscan releases the GIL while it scans, but it calls
back into Python (GIL needed) for every literal hit, and the rest of the scan
(newline counting, the regexes on hit lines) holds the GIL too: measured on 1 GiB,
two threads took longer than one (each callback waits for the other thread's
switch interval). Forked workers inherit the built Matcher (no pickling, no second
Hyperscan compile) and send back only their hits.

While the workers scan, the parent has nothing to do but wait, so it runs
`while_waiting` (analyze imports polars there) and draws the progress bar from a
shared byte counter.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from preemptdiag.prefilter import LineFinder, split_ranges
from preemptdiag.records import Hit
from preemptdiag.rollup import map_rollup
from preemptdiag.scan import Matcher, ProgressFn, ScanResult, scan_fast
from preemptdiag.sources import Source

# Smaller files are scanned in-process: forking and merging cost more than they save.
PARALLEL_MIN_BYTES = 64 << 20
# ...unless nearly every line is a signal line (~80 us each to match and keep, against
# ~1 us a line to find): then a few MiB are seconds of work (SGLang batch lines).
DENSE_MIN_BYTES = 4 << 20
DENSE_SHARE = 0.25  # of the head's lines holding a signature literal
_POLL_S = 0.1
RANGES_PER_JOB = 4

# Set by the parent just before it forks; the children inherit it.
_INHERITED: dict[str, Any] = {}


def can_split(src: Source, jobs: int, finder: LineFinder | None = None) -> bool:
    """Whether `src` is scanned by several processes: a plain, seekable file that is
    large, or (given the prefilter to judge its head) dense in signal lines."""
    if not (jobs > 1 and src.path is not None and src.codec is None and not src.cr_only):
        return False
    size = src.size or 0
    big = size >= PARALLEL_MIN_BYTES or (
        finder is not None and size >= DENSE_MIN_BYTES and _dense(src.head, finder)
    )
    # Asked last: it imports multiprocessing (~10 ms), which small inputs never need.
    return big and _fork_available()


def _dense(head: bytes, finder: LineFinder) -> bool:
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


def _scan_part(args: tuple[Source, tuple[int, int]]) -> ScanResult:
    src, byte_range = args
    return scan_fast(
        src,
        _INHERITED["matcher"],
        _count_progress,
        byte_range=byte_range,
        max_hits=_INHERITED["max_hits"],
        rollup=_INHERITED["rollup"],
    )


def scan_parallel(
    src: Source,
    matcher: Matcher,
    jobs: int,
    start_progress: Callable[[], ProgressFn | None] | None = None,
    while_waiting: Callable[[], None] | None = None,
    max_hits: int | None = None,
    rollup: bool = False,
) -> ScanResult:
    """Scan `src` in up to `jobs` processes and merge the parts in file order.

    The result is exactly what one scan_fast over the whole file returns: ranges
    start on line starts, and a range's last line reads the next range's first
    line when it must rejoin a hard-wrapped record. Each part stops past
    `max_hits`; the caller checks the merged total.
    """
    assert src.path is not None
    # Imported here: only a big file needs them (~15 ms of start-up otherwise).
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    # More ranges than workers: a worker that finishes early takes the next one, so
    # a dense stretch of signal lines (slower to match) does not hold up the rest.
    ranges = split_ranges(src.path, jobs * RANGES_PER_JOB)
    ctx = multiprocessing.get_context("fork")
    matcher.finder()  # build the prefilter once, before the children copy it
    counter = ctx.Value("q", 0)
    _INHERITED.update(matcher=matcher, counter=counter, max_hits=max_hits, rollup=rollup)
    try:
        with ProcessPoolExecutor(max_workers=min(jobs, len(ranges)), mp_context=ctx) as pool:
            futures = [pool.submit(_scan_part, (src, rng)) for rng in ranges]
            # Only now, with the children forked: a progress bar runs a thread.
            progress = start_progress() if start_progress is not None else None
            if while_waiting is not None:
                while_waiting()
            reported = 0
            pending = set(futures)
            while pending:
                _done, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_EXCEPTION)
                if progress is not None and counter.value > reported:
                    progress(counter.value - reported)
                    reported = counter.value
                if any(f.exception() is not None for f in _done):
                    for f in pending:
                        f.cancel()  # ranges not started yet; running ones finish
                    break
            parts = [f.result() for f in futures]
    finally:
        _INHERITED.clear()
    return merge(src.name, parts)


def _shifted(h: Hit, offset: int) -> Hit:
    """`h` with its line numbers (and its rollup members') counted from the file start.
    A rollup cut by a range boundary stays two rollups: windows add them up."""
    if h.rollup is None:
        return replace(h, line=h.line + offset)
    rollup = map_rollup(h.rollup, lambda m: replace(m, line=m.line + offset))
    return replace(h, line=h.line + offset, rollup=rollup)


def merge(name: str, parts: list[ScanResult]) -> ScanResult:
    """One result from the results of consecutive byte ranges, in file order."""
    merged = ScanResult(source=name)
    offset = 0
    for part in parts:
        merged.hits.extend(_shifted(h, offset) for h in part.hits)
        offset += part.lines_read
        merged.lines_read += part.lines_read
        merged.bytes_read += part.bytes_read
        merged.skipped.update(part.skipped)
        merged.recognised.update(part.recognised)
    return merged
