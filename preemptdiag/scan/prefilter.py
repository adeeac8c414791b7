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
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import pairwise
from typing import Any, BinaryIO, ClassVar, Literal, cast

from preemptdiag.model.errors import DiagError
from preemptdiag.scan.lines import starts_record

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
# (line start, line end without its newline, where the leftmost literal starts)
Candidate = tuple[int, int, int]
# Blocks are bytes in tests and small inputs, a reused bytearray in the scan loop.
Buffer = bytes | bytearray


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


def hs_database(literals: Sequence[bytes], flags: int = 0) -> hyperscan.Database:
    # One pattern per literal, every byte escaped as \xHH: literals may hold regex
    # syntax or any byte (the binding's pure-literal mode stops at a NUL). A cleverer
    # single pattern, `(?:lits)[^\n]*$`, would report each line once, but this build
    # misses it when a 2-byte literal ends the buffer (found by the property test);
    # plain literals scan as fast (measured). `flags` for each (lane_plain.py: each
    # literal reported once).
    patterns = [b"".join(b"\\x%02x" % c for c in lit) for lit in literals]
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=patterns, ids=list(range(len(patterns))), flags=[flags] * len(patterns))
    return db


class LineFinder:
    """The lines of a block that contain at least one literal.

    `candidate_lines` returns (start, end, first) per line: `end` excludes the
    newline, `first` is where the leftmost occurrence of a kept literal starts (a
    literal dropped by `_reduce` as containing a kept one may start up to
    `len(literal) - 1` bytes earlier). One finder can serve several threads.
    """

    def __init__(self, literals: Sequence[bytes], engine: Engine = "auto") -> None:
        self.literals, self._every_line = _reduce(literals)
        if engine == "auto":
            engine = available_engines()[0]
        if engine not in available_engines():
            raise RuntimeError(f"prefilter engine {engine!r} is not installed")
        self.engine: Engine = engine
        self._hs: hyperscan.Database | None = None
        self._ac: BytesAhoCorasick | None = None
        self._lengths = tuple(len(lit) for lit in self.literals)
        # Hyperscan scratch space is per thread (the binding releases the GIL while
        # it scans, so threads scan in parallel); the database itself is shared.
        self._local = threading.local()
        if not self.literals:
            return
        if engine == "hyperscan":
            self._hs = hs_database(self.literals)
        elif engine == "aho":
            # Leftmost-first is what enables the SIMD prefilter (standard matching
            # disables it); it still reports at least one match in every line that
            # holds a literal, because a match never spans a newline, and a line's
            # first reported match is its leftmost one.
            self._ac = BytesAhoCorasick(self.literals, matchkind=MatchKind.LeftmostFirst)

    def candidate_lines(self, block: Buffer, size: int | None = None) -> list[Candidate]:
        """Sorted candidate lines of `block[:size]` (all of it by default)."""
        n = len(block) if size is None else size
        if self._every_line:
            return _all_lines(block, n)
        if not self.literals or not n:
            return []
        if self._hs is not None and n < _HS_MAX_BLOCK:
            return self._lines_hs(self._hs, block, n)
        if self._ac is not None:
            return self._lines_aho(self._ac, block, n)
        return self._lines_find(block, n)

    def _scratch(self, db: hyperscan.Database) -> hyperscan.Scratch:
        scratch: hyperscan.Scratch | None = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = db.scratch.clone()
        return scratch

    def _lines_hs(self, db: hyperscan.Database, block: Buffer, n: int) -> list[Candidate]:
        starts: list[int] = []
        ends: list[int] = []
        firsts: list[int] = []
        line_end = -1
        rfind = block.rfind
        find = block.find
        lengths = self._lengths

        def on_match(lit: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            # Matches come in end-offset order; `to` lies inside the literal's line.
            nonlocal line_end
            at = to - lengths[lit]
            if to <= line_end:
                # Another literal on a line already taken: it may start further left.
                if at < firsts[-1]:
                    firsts[-1] = at
                return
            line_end = find(b"\n", to, n)
            if line_end == -1:
                line_end = n
            starts.append(rfind(b"\n", 0, to) + 1)
            ends.append(line_end)
            firsts.append(at)

        with memoryview(block) as view, view[:n] as data:
            db.scan(cast(bytes, data), match_event_handler=on_match, scratch=self._scratch(db))
        return list(zip(starts, ends, firsts, strict=True))

    @staticmethod
    def _lines_aho(ac: BytesAhoCorasick, block: Buffer, n: int) -> list[Candidate]:
        out: list[Candidate] = []
        line_end = -1
        rfind = block.rfind
        find = block.find
        with memoryview(block) as view, view[:n] as data:
            matches = ac.find_matches_as_indexes(data)
        for _, start, end in matches:
            if start < line_end:
                continue  # another literal on a line already taken
            s = rfind(b"\n", 0, start) + 1
            line_end = find(b"\n", end, n)
            if line_end == -1:
                line_end = n
            out.append((s, line_end, start))
        return out

    def _lines_find(self, block: Buffer, n: int) -> list[Candidate]:
        found: dict[int, tuple[int, int]] = {}
        find = block.find
        rfind = block.rfind
        for lit in self.literals:
            i = find(lit, 0, n)
            while i != -1:
                s = rfind(b"\n", 0, i) + 1
                e = find(b"\n", i + len(lit), n)
                if e == -1:
                    e = n
                prev = found.get(s)
                found[s] = (e, i if prev is None else min(i, prev[1]))
                # Resume on the next line: more hits on this one change nothing.
                i = find(lit, e + 1, n)
        return [(s, e, first) for s, (e, first) in sorted(found.items())]


def _all_lines(block: Buffer, n: int) -> list[Candidate]:
    out: list[Candidate] = []
    start = 0
    while start < n:
        e = block.find(b"\n", start, n)
        if e == -1:
            e = n
        out.append((start, e, start))
        start = e + 1
    return out


def number_lines(
    block: Buffer, spans: Sequence[Candidate], first_line: int, size: int | None = None
) -> tuple[list[int], int]:
    """1-based line numbers of the candidate lines `spans` (sorted) and the newline
    count of `block[:size]`.

    `first_line` is the number of the block's first line. One counting pass over
    the block in total: counting newlines costs about as much as the prefilter, so
    it must not be done twice.
    """
    n = len(block) if size is None else size
    count: Callable[[bytes, int, int], int] = (
        partial(_sparse_count, block) if _lines_are_long(block, n) else block.count
    )
    numbers: list[int] = []
    line = first_line
    pos = 0
    for span in spans:
        start = span[0]
        line += count(b"\n", pos, start)
        pos = start
        numbers.append(line)
    newlines = line - first_line + count(b"\n", pos, n)
    return numbers, newlines


# bytes.count walks byte by byte (~1.5-2.3 GB/s here); a loop of memchr-backed
# bytes.find costs ~0.1 us a line but skips long lines at SIMD speed, so it wins
# once lines average more than ~300 bytes (request-logging logs: ~1.7 KB).
_LONG_LINE = 512
_SAMPLE = 16 << 10


def _lines_are_long(block: Buffer, size: int) -> bool:
    n = min(size, _SAMPLE)
    return n > 0 and block.count(b"\n", 0, n) * _LONG_LINE < n


def _sparse_count(block: Buffer, _nl: bytes, lo: int, hi: int) -> int:
    """block.count(b"\n", lo, hi), one find per line."""
    n = 0
    find = block.find
    i = find(b"\n", lo, hi)
    while i != -1:
        n += 1
        i = find(b"\n", i + 1, hi)
    return n


def iter_blocks(
    f: BinaryIO,
    block_size: int = DEFAULT_BLOCK_SIZE,
    byte_range: tuple[int, int] | None = None,
) -> Iterator[tuple[bytearray, int, int]]:
    """Yield (buffer, size, offset): `buffer[:size]` holds whole lines read from `f`,
    starting at byte `offset` of the stream (absolute in the file with `byte_range`).

    One buffer is reused for the whole stream, so its content is valid only until
    the next item is requested (copy what must outlive it). Reading into it with
    readinto costs no allocation, no page fault and no copy of the block; the
    partial line at its end is moved to the front for the next read. Every block
    ends just after a newline, except the last one when the input does not end
    with a newline. A line longer than the buffer grows it (doubling), so it comes
    whole; the buffer shrinks back afterwards.

    `byte_range` (start, end) limits reading to that slice of a seekable file; the
    ranges from `split_ranges` start and end on line boundaries.
    """
    if block_size < 1:
        raise ValueError("block_size must be positive")
    offset, left = 0, -1
    if byte_range is not None:
        offset, end = byte_range
        left = end - offset
        f.seek(offset)
    buf = bytearray(block_size)
    filled = 0  # bytes in buf: the carried partial line, then new data
    while True:
        scanned = filled  # the carried part holds no newline
        filled, eof = _fill(f, buf, filled, left)
        if left >= 0:
            left -= filled - scanned
        if filled == 0:
            return
        cut = filled if eof else buf.rfind(b"\n", scanned, filled) + 1
        if cut == 0:
            buf.extend(bytes(len(buf)))  # one line fills the buffer: make room
            continue
        yield buf, cut, offset
        if eof:
            return
        tail = filled - cut
        buf[:tail] = buf[cut:filled]
        offset += cut
        filled = tail
        if len(buf) > block_size:
            del buf[max(block_size, filled) :]  # a giant line is gone: give it back


def _fill(f: BinaryIO, buf: bytearray, filled: int, left: int) -> tuple[int, bool]:
    """Read into buf[filled:] until it is full, `left` bytes were read or the input
    ends; returns (bytes now in buf, whether the input ended)."""
    readinto = cast(io.RawIOBase, f).readinto  # every stream open_binary gives has it
    with memoryview(buf) as view:
        while filled < len(buf):
            want = len(buf) - filled if left < 0 else min(len(buf) - filled, left)
            if want <= 0:
                return filled, True
            with view[filled : filled + want] as dest:
                got = readinto(dest)
            if not got:
                return filled, True
            filled += got
            if left >= 0:
                left -= got
    return filled, False


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
                cut = _record_start(f, _next_line_start(f, target - 1, size), size)
                if cut >= size:
                    break
                cuts.append(cut)
    except OSError as exc:
        raise DiagError(f"{os.fspath(path)}: cannot read: {exc.strerror}") from None
    if size == 0:
        return []
    cuts.append(size)
    return list(pairwise(cuts))


def _record_start(f: BinaryIO, pos: int, size: int) -> int:
    """The first line at or after `pos` that opens a record: a range never starts
    inside a hard-wrapped record, so each worker rejoins exactly what one pass does
    (scan.Matcher looks back at most MAX_WRAP_LINES lines, within its range)."""
    first = pos
    for _ in range(64):
        if pos >= size:
            break
        f.seek(pos)
        head = f.read(_PROBE).split(b"\n", 1)[0]
        if starts_record(head.decode("utf-8", errors="replace").rstrip("\r")):
            return pos
        pos = _next_line_start(f, pos, size)
    return first  # no record structure nearby: any line start will do


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


class Literals:
    """Which of some ASCII literals occur in a text: hyperscan (each literal reported
    once), else ahocorasick_rs (every occurrence, overlapping), else `in`. Made once
    for each tuple of literals (`of`); one can serve several threads."""

    _made: ClassVar[dict[tuple[str, ...], Literals]] = {}

    def __init__(self, literals: tuple[str, ...]) -> None:
        # (a literal outside ASCII is in no block lane_plain reads; redact.py has none)
        self.literals = tuple(sorted({lit for lit in literals if lit and lit.isascii()}))
        self._bytes = [lit.encode() for lit in self.literals]
        self._hs: Any = None
        self._ac: Any = None
        self._local = threading.local()
        if not self.literals:
            return
        if HAVE_HYPERSCAN:
            self._hs = hs_database(self._bytes, hyperscan.HS_FLAG_SINGLEMATCH)
        elif HAVE_AHOCORASICK:
            self._ac = BytesAhoCorasick(self._bytes, matchkind=MatchKind.Standard)

    @classmethod
    def of(cls, literals: Sequence[str]) -> Literals:
        key = tuple(literals)
        got = cls._made.get(key)
        if got is None:
            got = cls._made[key] = cls(key)
        return got

    def found(self, data: bytes) -> set[str]:
        if not self.literals or not data:
            return set()
        ids: set[int] = set()
        if self._hs is not None and len(data) < (1 << 32) - 1:
            scratch = getattr(self._local, "scratch", None)
            if scratch is None:
                scratch = self._local.scratch = self._hs.scratch.clone()
            self._hs.scan(data, match_event_handler=lambda i, *_: ids.add(i), scratch=scratch)
        elif self._ac is not None:
            ids = {i for i, _, _ in self._ac.find_matches_as_indexes(data, overlapping=True)}
        else:
            ids = {i for i, lit in enumerate(self._bytes) if lit in data}
        return {self.literals[i] for i in ids}
