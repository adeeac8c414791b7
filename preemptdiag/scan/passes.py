"""The passes over one input: the fast one (blocks, prefilter, regexes on candidate
lines only, wrapped records completed across block ends) and the reference one (every
signature on every line), which tests hold to identical output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import BinaryIO

from preemptdiag.ingest.snapshot import Snapshot, check, take
from preemptdiag.ingest.sources import (
    Source,
    compressed_bytes,
    open_binary,
    was_damaged,
    was_truncated,
)
from preemptdiag.scan import bulk as bulk_mod
from preemptdiag.scan import lane as lane_mod
from preemptdiag.scan import lane_plain, rust_regex
from preemptdiag.scan.bulk import Item, match_block
from preemptdiag.scan.limits import Budget, too_many
from preemptdiag.scan.lines import normalise, starts_record
from preemptdiag.scan.matcher import (
    DAMAGED,
    DECOY,
    MAX_LINE_BYTES,
    TRUNCATED,
    Matcher,
    ScanResult,
    decode_line,
)
from preemptdiag.scan.prefilter import Buffer, LineFinder, iter_blocks, number_lines
from preemptdiag.scan.rollup import Rollups, RollupSink
from preemptdiag.scan.signatures import found_in
from preemptdiag.scan.wrap import (
    MAX_WRAP_LINES,
    Decode,
    LinesAfter,
    NextLine,
    last_lines,
    line_at,
    line_before,
    tail_start,
)

ProgressFn = Callable[[int], None]
# skipped[NUL_BYTES]: NUL bytes (a crashed writer's padding), counted, never matched.
NUL_BYTES = "NUL bytes (a crash's padding)"
# How far above a --jobs range its lines above are looked for (MAX_WRAP_LINES of them).
_LOOK_BACK_BYTES = 256 << 10
# How far above a --jobs range _prime looks for a line no wrapped record continues
# into (on a run of glued, wrapped records with none, it starts there anyway).
_PRIME_MAX_BYTES = 4 << 20
_PROBE_BYTES = 64 << 10
# The scan's read size (tests make it small, so blocks end in every possible place).
BLOCK_BYTES = 1 << 20


def _no_line(k: int) -> None:
    return None


class _FileLines:
    """Physical lines read on from `f` past the end of a --jobs byte range."""

    def __init__(self, f: BinaryIO, counts: ScanResult) -> None:
        self.f, self.counts, self.lines = f, counts, list[str | None]()

    def __call__(self, k: int) -> str | None:
        while len(self.lines) <= k and (not self.lines or self.lines[-1] is not None):
            self.lines.append(_read_line(self.f, self.counts))
        return self.lines[k] if k < len(self.lines) else None


def _read_line(f: BinaryIO, counts: ScanResult) -> str | None:
    """The next physical line of `f` (None at the end); reads at most ~1 MiB."""
    pieces: list[bytes] = []
    size = 0
    while size <= MAX_LINE_BYTES:
        chunk = f.read(64 << 10)
        if not chunk:
            break
        i = chunk.find(b"\n")
        if i != -1:
            pieces.append(chunk[:i])
            size += i
            # Back to just after the newline: the next call reads the next line
            # (it read from 64 KiB on, so a record wrapped past a range end was
            # rejoined from its first piece below the cut only).
            f.seek(i + 1 - len(chunk), 1)
            break
        pieces.append(chunk)
        size += len(chunk)
    if not pieces:
        return None
    return decode_line(b"".join(pieces), counts)


class _Pending:
    """A candidate near a block's end, with the lines after it in that block (copied:
    the buffer is reused), matched once the next block (or the end) is known."""

    def __init__(
        self,
        lineno: int,
        raw: str,
        block: Buffer,
        start: int,
        size: int,
        counts: ScanResult,
        before: NextLine,
    ) -> None:
        self.lineno, self.raw = lineno, raw
        self.after: list[str] = []
        self.extend(block, start, size, counts)
        self.before = [b for k in range(MAX_WRAP_LINES) if (b := before(k)) is not None]

    @property
    def complete(self) -> bool:
        return len(self.after) >= MAX_WRAP_LINES

    def extend(self, block: Buffer, start: int, size: int, counts: ScanResult) -> None:
        while start < size and not self.complete:
            end = block.find(b"\n", start, size)
            end = size if end == -1 else end
            self.after.append(decode_line(block[start:end], counts))
            start = end + 1

    def match(self, source: str, matcher: Matcher, result: ScanResult, more: NextLine) -> None:
        after = LinesAfter(self.after, more)
        matcher.match(
            source, self.lineno, self.raw, after, result, prev_raw=LinesAfter(self.before)
        )


def scan_fast(
    src: Source,
    matcher: Matcher,
    progress: ProgressFn | None = None,
    byte_range: tuple[int, int] | None = None,
    first_line: int = 1,
    max_hits: int | None = None,
    rollup: int = Rollups.NONE,
    snap: Snapshot | None = None,
    budget: Budget | None = None,
    calm_kv: float | None = None,
    calm_window: tuple[int, int] = (1, 0),
) -> ScanResult:
    """Scan `src` (or `byte_range` of it); more than `max_hits` events held is a
    DiagError, raised as soon as a block crosses it (see limits.py), and so is a
    shared `budget` (--jobs workers) running out. With `rollup` (rollup.Rollups: True
    is STATS), stats lines of one stream and clock minute come back merged, and with
    PREEMPTIONS preemption lines too (rollup.py); with `calm_kv` too, the
    stream-minutes the lane finds calm come back as numbers (ScanResult.calm), in
    windows of `calm_window` (ScanResult.calm_window).

    A file is read from `snap` (one open for the run, snapshot.py), or from one taken
    here; a file cut shorter while it is read is a DiagError."""
    if snap is None and src.path is not None:
        own = take(src.path, src.name)
        try:
            return scan_fast(
                src,
                matcher,
                progress,
                byte_range,
                first_line,
                max_hits,
                rollup,
                own,
                budget,
                calm_kv,
                calm_window,
            )
        finally:
            own.close()
    result = ScanResult(source=src.name)
    matcher.begin()
    if byte_range is not None and byte_range[0] > 0 and first_line == 1:
        _prime(src, matcher, byte_range[0], snap)
    if rollup:
        mid_file = byte_range is not None and byte_range[0] > 0
        result.sink = RollupSink(result.hits, bool(rollup & Rollups.PREEMPTIONS), mid_file=mid_file)
        result.calm_kv, result.calm_window = calm_kv, calm_window
    finder = matcher.finder()
    next_line = first_line  # number of the next block's first line
    scratch = ScanResult(source="")  # the look-ahead line is counted when it is read
    look = partial(decode_line, result=scratch)
    # A candidate among a block's last lines may be a hard-wrapped record whose
    # continuation opens the next block: it waits, with the lines around it, for
    # that block. `above` keeps the previous blocks' last lines (nearest first) for
    # the pieces of a wrapped record that start before a block.
    pending: list[_Pending] = []
    above: list[str] = []
    # bulk.match_block: candidate lines and blocks matched so far, and the block
    # from which like lines are tried in bulk again.
    seen = blocks = retry_at = 0
    # A big file (bulk.BIG_BYTES) turns to polars after its first block that is dense
    # with candidate lines, not after AFTER_LINES of them: a month of stats lines
    # spent 2 s on its first 20,000, while a big sparse log never pays polars' pages.
    big = (src.size or 0) >= bulk_mod.BIG_BYTES
    if byte_range is not None and not big:
        # A --jobs range of a smaller file split for its density: polars pays at once
        # (each range is under AFTER_LINES lines, and was matched one by one). A big
        # file's ranges go by its dense blocks, as the whole file does: from their first
        # block, a GiB of request logging's ~9 candidate lines a block paid polars each
        # time (--jobs 2 took 2.8 s of CPU against 1.9 s on one worker).
        seen = bulk_mod.AFTER_LINES
    lane = lane_mod.Lane()
    with open_binary(src, snap) as f:
        if byte_range is not None and byte_range[0] > 0:
            above = _lines_before(f, byte_range[0], look)
        # Progress counts what the bar's total counts: bytes on disk.
        on_disk, reported = compressed_bytes(f), 0
        for block, size, _offset in iter_blocks(f, BLOCK_BYTES, byte_range=byte_range):
            if pending:
                # Each waiting candidate takes the lines it needs from this block;
                # those that have all they need go, in order (tiny blocks may need
                # several blocks to fill one).
                for p in pending:
                    p.extend(block, 0, size, scratch)
                while pending and pending[0].complete:
                    pending.pop(0).match(src.name, matcher, result, _no_line)
            newlines = -1
            lane_now = (
                lane_mod.ENABLED
                and result.sink is not None
                and not pending
                and lane.due(blocks)
                and not matcher.rejoined_reaches(src.name, next_line)
            )
            # A block dense with plain stats lines (vLLM's, SGLang's batch lines) tries
            # the lane at once, any file: lane_plain.py reads it without polars.
            plain = lane_now and lane_plain.worth(matcher, block, size)
            density = _Density(finder, block, size, big, seen >= bulk_mod.AFTER_LINES)
            if lane_now and not plain:
                lane_now = density()
            upto = 0  # (the lane took the block's bytes up to here)
            # (a candidate from here on may be a wrapped record going on in the next block)
            tail = tail_start(block, size)
            if lane_now:
                # A block of plain stats lines, matched and rolled up as columns.
                odd = partial(_odd_line, matcher, src.name, block, size, look, above, tail)
                took = lane_mod.try_block(
                    matcher, src.name, block, size, next_line, result, odd, tail, density
                )
                if took is None:
                    lane.missed(blocks)
                else:
                    lane.took()
                    part, upto = took
                    if upto == size:
                        newlines = part
                    # (polars paid for: like lines in bulk from now on; lane_plain.py's
                    # blocks pay nothing)
                    seen = (
                        max(seen + part, bulk_mod.AFTER_LINES) if density.granted else seen + part
                    )
            if newlines < 0:
                cands = density.cands
                if cands is None:
                    cands = finder.candidate_lines(block, size)
                if upto:
                    # (the lines the lane left: an odd line among the block's last ones,
                    # which waits for the next block, and those after it)
                    cands = [c for c in cands if c[0] >= upto]
                numbers, newlines = number_lines(block, cands, next_line, size)
                items: list[Item] = []
                for (start, end, first), lineno in zip(cands, numbers, strict=True):
                    if matcher.decoy_only(block, start, end, first):
                        result.skipped[DECOY] += 1
                        continue
                    raw = decode_line(block[start:end], result)
                    before: NextLine = partial(line_before, block, start, look, above)
                    if start >= tail:
                        pending.append(_Pending(lineno, raw, block, end + 1, size, scratch, before))
                        continue
                    following: NextLine = partial(line_at, block, end + 1, size, look)
                    items.append(Item(lineno, raw, following, before))
                # In line order, before the tail's pending lines (matched with the next
                # block), and while `block` still holds the lines around them.
                # (a big file's first block dense with candidate lines among them:
                # polars is paid for the blocks after it anyway; not for a block of
                # plain stats lines the plain lane refused, as it refuses a V0 log's
                # first block for its start-up lines, or a dense SGLang block with a
                # retraction among its last lines, which waits for the next block: the
                # blocks around it are its own)
                dense = big and len(items) >= bulk_mod.DENSE_LINES and not plain
                bulk = (
                    (seen >= bulk_mod.AFTER_LINES or dense)
                    and blocks >= retry_at
                    and (not plain or rust_regex.loaded())
                )
                if not match_block(matcher, src.name, items, result, bulk) and bulk:
                    retry_at = blocks + bulk_mod.RETRY_BLOCKS
                seen += len(items)
                if dense:
                    seen = max(seen, bulk_mod.AFTER_LINES)
            blocks += 1
            above = last_lines(block, size, above, look)
            if block.find(b"\x00", 0, size) != -1:
                result.skipped[NUL_BYTES] += block.count(b"\x00", 0, size)
            result.lines_read += newlines + (0 if block[size - 1] == 10 else 1)
            result.bytes_read += size
            next_line += newlines
            if max_hits is not None and result.held > max_hits:
                raise too_many(src.name, max_hits)
            if budget is not None:
                budget.spend(result.held)
            if progress is not None:
                if on_disk is None:
                    progress(size)
                else:
                    progress(on_disk() - reported)
                    reported = on_disk()
        if pending:
            # At the end of a --jobs byte range the next physical line is the first
            # of the next range: read it, so a record wrapped across the split is
            # rejoined exactly as in a single pass.
            last: NextLine = _FileLines(f, scratch) if byte_range else _no_line
            for p in pending:
                p.match(src.name, matcher, result, last)
        _note_early_end(f, src, result)
    if snap is not None:
        check(snap)
    result.close()
    if budget is not None:
        budget.spend(result.held)
    return result


@dataclass(slots=True)
class _Density:
    """Whether the polars lane may be tried on a block: after AFTER_LINES candidate
    lines (`after`), or a big file's block dense with them (asked once; the candidate
    lines it finds are kept for the line-by-line scan)."""

    finder: LineFinder
    block: bytearray
    size: int
    big: bool
    after: bool
    cands: list[tuple[int, int, int]] | None = None
    granted: bool = False

    def __call__(self) -> bool:
        # Before polars is paid for: only a big file's block dense with candidate
        # lines (a month of stats lines, a dense SGLang log) tries the lane; a big
        # sparse log never pays polars' pages.
        if not self.after and self.big and self.cands is None:
            self.cands = self.finder.candidate_lines(self.block, self.size)
        self.granted = self.after or (
            self.cands is not None and len(self.cands) >= bulk_mod.DENSE_LINES
        )
        return self.granted


def _odd_line(
    matcher: Matcher,
    source: str,
    block: Buffer,
    size: int,
    look: Decode,
    above: list[str],
    tail: int,
    start: int,
    end: int,
    lineno: int,
) -> ScanResult | None:
    """A candidate line of a lane block matched as the loop in scan_fast matches it,
    into a result of its own (lane.Odd); None when it lies in the block's tail (the
    loop would have it wait for the next block). The lane refuses a block whose
    candidate lines hold request text, so decoy_only has nothing to find here."""
    if start >= tail:
        return None
    got = ScanResult(source=source)
    raw = decode_line(block[start:end], got)
    following: NextLine = partial(line_at, block, end + 1, size, look)
    before: NextLine = partial(line_before, block, start, look, above)
    matcher.match(source, lineno, raw, following, got, prev_raw=before)
    return got


def _note_early_end(f: BinaryIO, src: Source, result: ScanResult) -> None:
    """Count a compressed input that ended early, or met damage (everything before
    the damage was read)."""
    if was_truncated(f):
        note = DAMAGED if was_damaged(f) else TRUNCATED
        result.skipped[note.format(codec=src.codec)] += 1


def _prime(src: Source, matcher: Matcher, start: int, snap: Snapshot | None) -> None:
    """Leave `matcher` as a single pass leaves it at `start`: a wrapped record that a
    line above the cut rejoined may cover the range's first lines, whose pieces must
    then not match again. No rejoin crosses into a line that opens a record or is
    empty, so the lines from the nearest such line above are scanned for that state
    alone (their hits belong to the range before), numbered so the range's own
    lines are 1, 2, ... A cut at such a line needs nothing. It reads the run's one
    open of the file (`snap`), as the range does."""
    with open_binary(src, snap) as f:
        f.seek(start)
        first = f.readline(_PROBE_BYTES).rstrip(b"\r\n")
        if _resets(first):
            return
        found = _reset_above(f, start)
    if found is None:
        return
    begin, above = found
    scan_fast(src, matcher, byte_range=(begin, start), first_line=1 - above, snap=snap)


def _reset_above(f: BinaryIO, start: int) -> tuple[int, int] | None:
    """Where the lines from the nearest line above `start` that resets begin, and how
    many lines that is; the topmost whole line within _PRIME_MAX_BYTES when none
    does; None when no whole line is within reach (one line longer than the look-back,
    a NUL run: nothing to prime, and a scan of nothing would prime itself again).

    The look-back grows from _PROBE_BYTES, doubling: the line above a cut nearly
    always resets, and reading 4 MiB for it was most of a --jobs worker's peak
    memory (the bytes read and their copy). A line whole in a smaller look-back is
    whole in a larger one, and each is searched nearest first, so the first reset
    found is the one the whole look-back finds."""
    size = _PROBE_BYTES
    while True:
        lo = max(0, start - min(size, _PRIME_MAX_BYTES))
        f.seek(lo)
        lines = f.read(start - lo).split(b"\n")[:-1]  # the range starts after a newline
        at, bottom = len(lines), (1 if lo > 0 else 0)  # a cut first line is not whole
        while at > bottom:
            at -= 1
            if _resets(lines[at].rstrip(b"\r")):
                break
        else:
            if lo > 0 and size < _PRIME_MAX_BYTES:
                size *= 2
                continue
            if at >= len(lines):
                return None
        return start - sum(len(ln) + 1 for ln in lines[at:]), len(lines) - at


def _resets(line: bytes) -> bool:
    """Whether no wrapped record continues into this line: it is empty or opens one."""
    return not line or starts_record(line[:_PROBE_BYTES].decode("utf-8", errors="replace"))


def _lines_before(f: BinaryIO, start: int, decode: Decode) -> list[str]:
    """The lines just above a --jobs range, nearest first, as a single pass has them
    in `above` there: a line of the range that continues a record or a prompt
    opened above the cut is read as a single pass reads it."""
    lo = max(0, start - _LOOK_BACK_BYTES)
    f.seek(lo)
    block = f.read(start - lo)
    lines = block.split(b"\n")[:-1]  # the range starts just after a newline
    if lo > 0 and lines:
        lines = lines[1:]  # cut in the middle: not a whole line
    return [decode(b) for b in reversed(lines[-MAX_WRAP_LINES:])]


def scan_reference(src: Source, matcher: Matcher) -> ScanResult:
    """Line by line, every signature's regex on every line, no prefilter.

    A regex match on a line without its prefilter literal is reported under
    skipped['prefilter miss'] so tests can fail loudly on such signatures.
    """
    result = ScanResult(source=src.name)
    matcher.begin()
    with open_binary(src) as f:
        data = f.read()
        _note_early_end(f, src, result)
    if not data:
        return result
    if b"\x00" in data:
        result.skipped[NUL_BYTES] += data.count(b"\x00")
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    result.bytes_read = len(data)
    result.lines_read = len(raw_lines)
    decoded = [decode_line(r, ScanResult(source="")) for r in raw_lines]
    for i, raw_b in enumerate(raw_lines):
        raw = decode_line(raw_b, result)
        cands = matcher.candidates(raw)
        if not cands:
            line = normalise(raw)
            for s in matcher.sigs:
                if found_in(s, line.text):
                    result.skipped["prefilter miss"] += 1
            continue
        after = LinesAfter(decoded[i + 1 : i + 1 + MAX_WRAP_LINES])
        above = LinesAfter(decoded[max(0, i - MAX_WRAP_LINES) : i][::-1])
        matcher.match(src.name, i + 1, raw, after, result, prev_raw=above)
    return result
