"""The prefilter must pick exactly the lines the obvious definition picks, fast or not."""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from preemptdiag.scan import prefilter
from preemptdiag.scan.prefilter import (
    Engine,
    LineFinder,
    Span,
    available_engines,
    iter_blocks,
    number_lines,
    split_ranges,
)

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

ENGINES: list[Engine] = ["hyperscan", "aho", "python"]
LITS = [b"reempt", b"KV cache", b"oom", b"OOM", b"Exited (137)", b"ut of memory", b"args: "]


def reference(block: bytes, literals: Sequence[bytes]) -> list[tuple[int, int]]:
    out = []
    start = 0
    while start < len(block):
        end = block.find(b"\n", start)
        if end == -1:
            end = len(block)
        line = block[start:end]
        if any(lit in line for lit in literals):
            out.append((start, end))
        start = end + 1
    return out


def lines_of(block: bytes, spans: Sequence[tuple[int, int, int]]) -> list[bytes]:
    return [block[s:e] for s, e, _ in spans]


def found(finder: LineFinder, block: bytes | bytearray, size: int | None = None) -> list[Span]:
    """The finder's (start, end) lines, after checking each line's `first`: where
    the leftmost occurrence of a kept literal starts."""
    out = []
    for s, e, first in finder.candidate_lines(block, size):
        line = bytes(block[s:e])
        assert first == s + min(i for i in (line.find(lit) for lit in finder.literals) if i >= 0)
        out.append((s, e))
    return out


def blocks_of(f: BinaryIO, **kw: Any) -> list[tuple[bytes, int]]:
    """iter_blocks reuses one buffer: copy each block before reading the next."""
    return [(bytes(buf[:size]), off) for buf, size, off in iter_blocks(f, **kw)]


@pytest.mark.parametrize("engine", ENGINES)
def test_hand_made_block(engine: Engine) -> None:
    block = (
        b"INFO start\r\n"  # no literal, CRLF
        b"oom at start\r\n"  # literal at line start, CR kept in the line
        b"\n"  # empty line
        b"line ends with OOM\n"  # literal at line end
        b"OOM again, right at the next line's start\n"
        b"KV cache and reempt twice oom\n"  # three literals, one entry
        b"Exited (137\n"  # near miss
        b"ends without newline: Exited (137)"
    )
    finder = LineFinder(LITS, engine=engine)
    spans = finder.candidate_lines(block)
    assert found(finder, block) == reference(block, LITS)
    assert lines_of(block, spans) == [
        b"oom at start\r",
        b"line ends with OOM",
        b"OOM again, right at the next line's start",
        b"KV cache and reempt twice oom",
        b"ends without newline: Exited (137)",
    ]
    assert spans[-1][1] == len(block)
    # Only the first `size` bytes count, as with the scanner's reused buffer.
    cut = block.index(b"OOM again")
    assert found(finder, bytearray(block) + b"oom tail", cut) == reference(block[:cut], LITS)


@pytest.mark.parametrize("engine", ENGINES)
def test_edge_literal_sets(engine: Engine) -> None:
    block = b"a\n\nbc\nab"
    assert LineFinder([], engine=engine).candidate_lines(block) == []
    # The empty literal is in every line, even an empty one.
    every = LineFinder([b"zz", b""], engine=engine)
    assert every.candidate_lines(block) == [(0, 1, 0), (2, 2, 2), (3, 5, 3), (6, 8, 6)]
    # A literal holding a newline never fits inside a line.
    assert LineFinder([b"a\nb"], engine=engine).candidate_lines(block) == []
    dup = LineFinder([b"b", b"b", b"bc", b"ab"], engine=engine)
    assert dup.literals == (b"b",)
    # "ab" starts one byte before the kept "b" that stands for it.
    assert dup.candidate_lines(block) == [(3, 5, 3), (6, 8, 7)]
    assert LineFinder([b"x"], engine=engine).candidate_lines(b"") == []


def test_auto_engine_is_the_fastest_installed() -> None:
    assert available_engines() == ENGINES
    assert LineFinder(LITS).engine == "hyperscan"
    with pytest.raises(RuntimeError):
        LineFinder(LITS, engine="nope")  # type: ignore[arg-type]


def test_block_too_big_for_hyperscan(monkeypatch: pytest.MonkeyPatch) -> None:
    block = b"a oom\nb\nc OOM d"
    finder = LineFinder(LITS, engine="hyperscan")
    monkeypatch.setattr(prefilter, "_HS_MAX_BLOCK", 4)
    assert found(finder, block) == [(0, 5), (8, 15)]


# Blocks built from literal pieces, separators and noise, so literals are often cut
# by a newline, glued to neighbours, or repeated on one line.
_PIECES = st.sampled_from(
    [
        b"\n",
        b"\r",
        b"\r\n",
        b" ",
        b"o",
        b"oo",
        b"m",
        b"OO",
        b"KV ",
        b"cache",
        b"reem",
        b"pt",
        b"(137)",
        b"Exited ",
        b"args:",
        b": ",
        b"\xff",
        b"\x00",
        *LITS,
    ]
)
_BLOCKS = st.lists(st.one_of(_PIECES, st.binary(max_size=6)), max_size=60).map(b"".join)
_LITERALS = st.lists(
    st.one_of(st.sampled_from(LITS), st.binary(min_size=1, max_size=4)), min_size=1, max_size=8
)


@settings(max_examples=400, deadline=None)
@given(block=_BLOCKS, literals=_LITERALS)
# Found by this test: Hyperscan's `(?:lits)[^\n]*$` missed a 2-byte literal that
# ends the buffer; and the binding's literal mode cuts a literal at its NUL.
@example(block=b"\n" * 15 + b"\x00\x00", literals=[b"reempt", b"\x00\x00"])
@example(block=b"czabzcb\n\nbcazbaac", literals=[b"ac", b"bbb"])
@example(block=b"a\x00c\na\x00b", literals=[b"a\x00b"])
def test_engines_equal_reference(block: bytes, literals: list[bytes]) -> None:
    want = reference(block, literals)
    for engine in ENGINES:
        finder = LineFinder(literals, engine=engine)
        assert found(finder, block) == want, engine


@given(block=_BLOCKS)
def test_number_lines(block: bytes) -> None:
    spans = [(s, e, s) for s, e in reference(block, LITS)]
    numbers, newlines = number_lines(block, spans, 10)
    assert newlines == block.count(b"\n")
    assert numbers == [10 + block.count(b"\n", 0, s) for s, _, _ in spans]


def test_number_lines_long_lines() -> None:
    # Long lines take the find-per-line path; the answer must not change.
    block = b"".join(b"%s %d\n" % (b"x" * (i * 97 % 3000), i) for i in range(400)) + b"tail oom"
    spans = [(s, e, s) for s, e in reference(block, [b"7", b"oom"])]
    numbers, newlines = number_lines(block, spans, 1)
    assert newlines == 400
    assert numbers == [1 + block.count(b"\n", 0, s) for s, _, _ in spans]
    # Counting stops at `size`, as with the scanner's reused buffer.
    assert number_lines(block + b"\n\n\n", spans, 1, len(block)) == (numbers, 400)
    assert numbers[-1] == 401 and len(numbers) == 77


class _Pipe(io.RawIOBase):
    """A stream that cannot seek, like stdin or a decompressor."""

    def __init__(self, data: bytes) -> None:
        self._src = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b)
        chunk = self._src.read(min(len(view), 3))  # short reads, as pipes give
        view[: len(chunk)] = chunk
        return len(chunk)


LONG = b"x" * 5000 + b" oom " + b"y" * 5000
DATA = b"first\nKV cache 1\n" + LONG + b"\nshort\n\n" + b"z" * 40 + b" OOM\nlast line oom"


def _opened(kind: str, data: bytes, tmp_path: Path) -> BinaryIO:
    if kind == "bytesio":
        return io.BytesIO(data)
    if kind == "file":
        p = tmp_path / "log"
        p.write_bytes(data)
        return open(p, "rb", buffering=0)  # closed by the caller
    return cast(BinaryIO, io.BufferedReader(_Pipe(data), buffer_size=8))


@pytest.mark.parametrize("kind", ["bytesio", "file", "pipe"])
@pytest.mark.parametrize("block_size", [1, 7, 64, 1 << 20])
def test_iter_blocks_whole_lines(kind: str, block_size: int, tmp_path: Path) -> None:
    with _opened(kind, DATA, tmp_path) as f:
        blocks = blocks_of(f, block_size=block_size)
    assert b"".join(b for b, _ in blocks) == DATA
    assert [off for _, off in blocks] == [
        sum(len(b) for b, _ in blocks[:i]) for i in range(len(blocks))
    ]
    assert all(b.endswith(b"\n") for b, _ in blocks[:-1])
    assert any(LONG + b"\n" in b for b, _ in blocks)  # a long line comes whole
    # Candidate lines found block by block, numbered in the same pass, are the
    # lines the reference finds in the whole input.
    finder = LineFinder(LITS)
    hits = []
    next_line = 1
    for block, _ in blocks:
        spans = finder.candidate_lines(block)
        numbers, newlines = number_lines(block, spans, next_line)
        hits += [(n, block[s:e]) for n, (s, e, _) in zip(numbers, spans, strict=True)]
        next_line += newlines
    assert hits == [(2, b"KV cache 1"), (3, LONG), (6, b"z" * 40 + b" OOM"), (7, b"last line oom")]


def test_iter_blocks_empty_and_byte_range(tmp_path: Path) -> None:
    assert blocks_of(io.BytesIO(b"")) == []
    p = tmp_path / "log"
    p.write_bytes(DATA)
    start = DATA.index(b"short")
    end = DATA.index(b"last")
    with open(p, "rb") as f:
        got = blocks_of(f, block_size=4, byte_range=(start, end))
    assert b"".join(b for b, _ in got) == DATA[start:end]
    assert got[0][1] == start


def test_long_line_is_linear() -> None:
    # Re-concatenating a growing carry would copy ~12 GB here (many seconds).
    data = b"a" * (5 << 20) + b"\nb\n"
    t0 = time.perf_counter()
    blocks = [b for b, _ in blocks_of(io.BytesIO(data), block_size=1024)]
    assert time.perf_counter() - t0 < 1.0
    assert b"".join(blocks) == data
    assert blocks[0].startswith(data[:-2])


def test_iter_blocks_reuses_one_buffer_and_shrinks_it_back() -> None:
    # Flat memory: one buffer for the whole input; a giant line grows it, and it
    # returns to the block size once that line has been handed out.
    data = b"a\n" * 100 + b"x" * 5000 + b"\n" + b"b\n" * 10_000
    seen = []
    for buf, size, off in iter_blocks(io.BytesIO(data), block_size=64):
        seen.append((id(buf), len(buf), bytes(buf[:size]), off))
    assert len({i for i, *_ in seen}) == 1
    assert b"".join(chunk for _, _, chunk, _ in seen) == data
    sizes = [n for _, n, _, _ in seen]
    assert max(sizes) >= 5001 and sizes[-1] == 64


def _check_ranges(data: bytes, ranges: list[tuple[int, int]]) -> None:
    assert b"".join(data[s:e] for s, e in ranges) == data
    for s, e in ranges:
        assert s < e
        assert s == 0 or data[s - 1 : s] == b"\n"
        assert e == len(data) or data[e - 1 : e] == b"\n"


@settings(max_examples=150, deadline=None)
@given(data=_BLOCKS, parts=st.integers(1, 9))
def test_split_ranges_cover_once(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, parts: int
) -> None:
    p = tmp_path_factory.mktemp("split") / "log"
    p.write_bytes(data)
    ranges = split_ranges(p, parts)
    assert len(ranges) <= parts
    _check_ranges(data, ranges)


def test_split_ranges_shapes(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_bytes(b"")
    assert split_ranges(p, 4) == []
    p.write_bytes(b"x" * 300_000)  # one line, no newline: cannot be split
    assert split_ranges(p, 4) == [(0, 300_000)]
    lines = b"".join(b"line %05d\n" % i for i in range(1000))  # 11 bytes a line
    p.write_bytes(lines)
    assert split_ranges(p, 2) == [(0, 5500), (5500, 11000)]
    assert split_ranges(p, 3) == [(0, 3674), (3674, 7337), (7337, 11000)]
    with pytest.raises(ValueError):
        split_ranges(p, 0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text("ab c:\n", min_size=1, max_size=4), min_size=1, max_size=6),
    st.text("ab c:\n", max_size=60),
    st.sampled_from(["hyperscan", "aho", "python"]),
)
def test_literals_found_by_every_engine(literals: list[str], text: str, engine: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prefilter, "HAVE_HYPERSCAN", engine == "hyperscan")
        mp.setattr(prefilter, "HAVE_AHOCORASICK", engine == "aho")
        finder = prefilter.Literals(tuple(literals))
    assert finder.found(text.encode()) == {lit for lit in literals if lit in text}
