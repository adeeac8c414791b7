"""The hot loop: find the few lines of a big log that contain any signature literal.

Everything here works on raw bytes in large blocks; no line object is created for
the bulk of a log. Three engines give the same answer, exactly what
`[line for line in lines if any(lit in line for lit in literals)]` gives; measured on
a 2-core box, one core, in memory (bench/README.md):

| engine                                   | 56 signature literals | 31 literals  |
|------------------------------------------|-----------------------|--------------|
| `hyperscan` (Hyperscan/Vectorscan)       | 1.7-2.8 GB/s          | 0.6-0.8 GB/s |
| `ahocorasick_rs` (Rust, leftmost-first)  | 0.8 GB/s              | 1.2-1.6 GB/s |
| `bytes.find`, one pass per literal       | 0.03 GB/s             | 0.05 GB/s    |

The built-in signatures alone carry 50+ literals and user signatures add more, the
range where Hyperscan wins; so the order is hyperscan, then ahocorasick_rs, then the
pure-Python loop, whichever imports first. The libraries report literal hits; the
lines around them are found here with bytes.rfind/find.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import pairwise
from typing import BinaryIO, Literal

from preemptdiag.errors import DiagError

try:
    import hyperscan

    HAVE_HYPERSCAN = True
except ImportError:  # pragma: no cover - exercised only where the wheel is missing
    HAVE_HYPERSCAN = False
try:
    from ahocorasick_rs import BytesAhoCorasick, MatchKind

    HAVE_AHOCORASICK = True
except ImportError:  # pragma: no cover - exercised only where the wheel is missing
    HAVE_AHOCORASICK = False

# Blocks of 256 KiB-1 MiB measured alike and fastest (a block stays in L2 while the
# prefilter and the newline count walk it); 8 MiB blocks were ~25 % slower.
DEFAULT_BLOCK_SIZE = 1 << 20
# Read size when hunting for the next newline at a split point.
_PROBE = 64 << 10
# Hyperscan takes a 32-bit length; a bigger block (one absurd line) uses the loop.
_HS_MAX_BLOCK = (1 << 32) - 1

Engine = Literal["auto", "hyperscan", "aho", "python"]
Span = tuple[int, int]


def available_engines() -> list[Engine]:
    """Engines usable here, fastest first (what "auto" picks is the first)."""
    engines: list[Engine] = []
    if HAVE_HYPERSCAN:
        engines.append("hyperscan")
    if HAVE_AHOCORASICK:
        engines.append("aho")
    engines.append("python")
    return engines


def _reduce(literals: Sequence[bytes]) -> tuple[tuple[bytes, ...], bool]:
    """Literals that can decide a line, and whether every line is a candidate.

    A literal holding a newline never fits inside a line; one that contains another
    literal is redundant (the shorter one already picks that line). Dropping them
    changes no answer and makes every engine faster.
    """
    lits = {bytes(lit) for lit in literals if b"\n" not in lit}
    if b"" in lits:
        return (), True
    kept = sorted(
        (lit for lit in lits if not any(o != lit and o in lit for o in lits)),
        key=lambda b: (len(b), b),
    )
    return tuple(kept), False


def _hs_database(literals: Sequence[bytes]) -> hyperscan.Database:
    # One pattern per literal, every byte escaped as \xHH: literals may hold regex
    # syntax or any byte (the binding's pure-literal mode stops at a NUL). A cleverer
    # single pattern, `(?:lits)[^\n]*$`, would report each line once, but this build
    # misses it when a 2-byte literal ends the buffer (found by the property test);
    # plain literals scan as fast (measured).
    patterns = [b"".join(b"\\x%02x" % c for c in lit) for lit in literals]
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=patterns, ids=list(range(len(patterns))), flags=0)
    return db


class LineFinder:
    """Offsets of the lines in a block that contain at least one literal."""

    def __init__(self, literals: Sequence[bytes], engine: Engine = "auto") -> None:
        self.literals, self._every_line = _reduce(literals)
        if engine == "auto":
            engine = available_engines()[0]
        if engine not in available_engines():
            raise RuntimeError(f"prefilter engine {engine!r} is not installed")
        self.engine: Engine = engine
        self._hs: hyperscan.Database | None = None
        self._ac: BytesAhoCorasick | None = None
        if not self.literals:
            return
        if engine == "hyperscan":
            self._hs = _hs_database(self.literals)
        elif engine == "aho":
            # Leftmost-first is what enables the SIMD prefilter (standard matching
            # disables it); it still reports at least one match in every line that
            # holds a literal, because a match never spans a newline.
            self._ac = BytesAhoCorasick(self.literals, matchkind=MatchKind.LeftmostFirst)

    def candidate_lines(self, block: bytes) -> list[Span]:
        """Sorted (start, end) of every candidate line; end excludes the newline."""
        if self._every_line:
            return _all_lines(block)
        if not self.literals or not block:
            return []
        if self._hs is not None and len(block) < _HS_MAX_BLOCK:
            return self._lines_hs(self._hs, block)
        if self._ac is not None:
            return self._lines_aho(self._ac, block)
        return self._lines_find(block)

    @staticmethod
    def _lines_hs(db: hyperscan.Database, block: bytes) -> list[Span]:
        out: list[Span] = []
        line_end = -1
        rfind = block.rfind
        find = block.find

        def on_match(_id: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            # Matches come in end-offset order; `to` lies inside the literal's line.
            nonlocal line_end
            if to <= line_end:
                return  # another literal on a line already taken
            line_end = find(b"\n", to)
            if line_end == -1:
                line_end = len(block)
            out.append((rfind(b"\n", 0, to) + 1, line_end))

        db.scan(block, match_event_handler=on_match)
        return out

    @staticmethod
    def _lines_aho(ac: BytesAhoCorasick, block: bytes) -> list[Span]:
        out: list[Span] = []
        line_end = -1
        rfind = block.rfind
        find = block.find
        for _, start, end in ac.find_matches_as_indexes(block):
            if start < line_end:
                continue  # another literal on a line already taken
            s = rfind(b"\n", 0, start) + 1
            line_end = find(b"\n", end)
            if line_end == -1:
                line_end = len(block)
            out.append((s, line_end))
        return out

    def _lines_find(self, block: bytes) -> list[Span]:
        found: dict[int, int] = {}
        find = block.find
        rfind = block.rfind
        n = len(block)
        for lit in self.literals:
            i = find(lit)
            while i != -1:
                s = rfind(b"\n", 0, i) + 1
                e = find(b"\n", i + len(lit))
                if e == -1:
                    e = n
                found[s] = e
                # Resume on the next line: more hits on this one change nothing.
                i = find(lit, e + 1)
        return sorted(found.items())


def _all_lines(block: bytes) -> list[Span]:
    out: list[Span] = []
    start = 0
    n = len(block)
    while start < n:
        e = block.find(b"\n", start)
        if e == -1:
            e = n
        out.append((start, e))
        start = e + 1
    return out


def number_lines(block: bytes, spans: Sequence[Span], first_line: int) -> tuple[list[int], int]:
    """1-based line numbers of `spans` (sorted) and the block's newline count.

    `first_line` is the number of the block's first line. One counting pass over
    the block in total: counting newlines costs about as much as the prefilter, so
    it must not be done twice.
    """
    count: Callable[[bytes, int, int], int] = (
        partial(_sparse_count, block) if _lines_are_long(block) else block.count
    )
    numbers: list[int] = []
    line = first_line
    pos = 0
    for start, _ in spans:
        line += count(b"\n", pos, start)
        pos = start
        numbers.append(line)
    newlines = line - first_line + count(b"\n", pos, len(block))
    return numbers, newlines


# bytes.count walks byte by byte (~1.5-2.3 GB/s here); a loop of memchr-backed
# bytes.find costs ~0.2 us a line but skips long lines at SIMD speed, so it wins
# once lines average more than ~300 bytes (request-logging logs: ~1.7 KB).
_LONG_LINE = 512
_SAMPLE = 16 << 10


def _lines_are_long(block: bytes) -> bool:
    n = min(len(block), _SAMPLE)
    return n > 0 and block.count(b"\n", 0, n) * _LONG_LINE < n


def _sparse_count(block: bytes, _nl: bytes, lo: int, hi: int) -> int:
    """block.count(b"\n", lo, hi), one find per line."""
    n = 0
    find = block.find
    i = find(b"\n", lo, hi)
    while i != -1:
        n += 1
        i = find(b"\n", i + 1, hi)
    return n


def _seeks_cheaply(f: BinaryIO) -> bool:
    # A plain file or memory buffer seeks in O(1). A gzip stream claims to be
    # seekable too, but a backward seek re-decompresses from the start.
    raw = getattr(f, "raw", f)
    return isinstance(raw, (io.FileIO, io.BytesIO)) and f.seekable()


def iter_blocks(
    f: BinaryIO,
    block_size: int = DEFAULT_BLOCK_SIZE,
    byte_range: Span | None = None,
) -> Iterator[tuple[bytes, int]]:
    """Yield (block, offset): blocks of whole lines, and where each starts.

    Every block ends just after a newline, except the last one when the input does
    not end with a newline. A line longer than `block_size` comes whole in one
    larger block (pieces are joined once, never re-concatenated). `offset` is the
    block's byte position in the stream (absolute in the file when `byte_range` is
    given). Line numbers come from `number_lines`, in the same pass that finds them.

    `byte_range` (start, end) limits reading to that slice of a seekable file; the
    ranges from `split_ranges` start and end on line boundaries.
    """
    if block_size < 1:
        raise ValueError("block_size must be positive")
    start, end = 0, -1
    if byte_range is not None:
        start, end = byte_range
        f.seek(start)
    if _seeks_cheaply(f):
        yield from _blocks_seek(f, block_size, start, end)
    else:
        yield from _blocks_carry(f, block_size, start, end)


def _blocks_seek(f: BinaryIO, block_size: int, pos: int, end: int) -> Iterator[tuple[bytes, int]]:
    # Read, cut after the last newline, seek back to re-read the partial line with
    # the next block. Cheaper than carrying it over: slicing the new partial line
    # onto the front of the next read costs two large copies per block.
    pieces: list[bytes] = []
    block_at = pos
    while True:
        want = block_size if end < 0 else min(block_size, end - pos)
        chunk = f.read(want) if want > 0 else b""
        if not chunk:
            if pieces:
                yield b"".join(pieces), block_at
            return
        pos += len(chunk)
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            pieces.append(chunk)  # a line longer than a block: keep reading
            continue
        if cut < len(chunk):
            f.seek(cut - len(chunk), io.SEEK_CUR)
            pos -= len(chunk) - cut
            chunk = chunk[:cut]
        if pieces:
            pieces.append(chunk)
            chunk = b"".join(pieces)
            pieces.clear()
        yield chunk, block_at
        block_at = pos


def _blocks_carry(f: BinaryIO, block_size: int, pos: int, end: int) -> Iterator[tuple[bytes, int]]:
    pieces: list[bytes] = []  # the partial line read so far
    block_at = pos
    while True:
        want = block_size if end < 0 else min(block_size, end - pos)
        chunk = f.read(want) if want > 0 else b""
        if not chunk:
            if pieces:
                yield b"".join(pieces), block_at
            return
        pos += len(chunk)
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            pieces.append(chunk)
            continue
        pieces.append(chunk[:cut] if cut < len(chunk) else chunk)
        block = b"".join(pieces) if len(pieces) > 1 else pieces[0]
        pieces = [chunk[cut:]] if cut < len(chunk) else []
        yield block, block_at
        block_at += len(block)


def split_ranges(path: str | os.PathLike[str], n_parts: int) -> list[Span]:
    """Split a file into at most `n_parts` byte ranges that start on a line start.

    The ranges are contiguous, non-empty and cover the file exactly once; each
    ends just after a newline (or at end of file). A file with fewer lines than
    parts, or one huge line, gives fewer ranges. An empty file gives none.
    """
    if n_parts < 1:
        raise ValueError("n_parts must be at least 1")
    try:
        size = os.path.getsize(path)
        cuts = [0]
        with open(path, "rb") as f:
            for k in range(1, n_parts):
                target = size * k // n_parts
                if target <= cuts[-1]:
                    continue
                cut = _next_line_start(f, target - 1, size)
                if cut >= size:
                    break
                cuts.append(cut)
    except OSError as exc:
        raise DiagError(f"{os.fspath(path)}: cannot read: {exc.strerror}") from None
    if size == 0:
        return []
    cuts.append(size)
    return list(pairwise(cuts))


def _next_line_start(f: BinaryIO, pos: int, size: int) -> int:
    """Position just after the first newline at or after `pos` (size if none)."""
    f.seek(pos)
    while pos < size:
        chunk = f.read(_PROBE)
        if not chunk:
            break
        i = chunk.find(b"\n")
        if i != -1:
            return pos + i + 1
        pos += len(chunk)
    return size
