"""Hard-wrapped records: the lines around a candidate, and which of them continue it.

A terminal (or a paste) cuts a long record into pieces of one width. The scan reads
only candidate lines (those holding a signature literal), so when a candidate does not
match alone its record is rebuilt here: from the full-width pieces above it (the first
piece may hold no literal at all) and the continuation lines below it. Lines come from
the block in memory, then from the lines an earlier block left (`last_lines`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from preemptdiag.scan.lines import starts_record
from preemptdiag.scan.prefilter import Buffer

# A wrapped record is rejoined from at most this many further physical lines.
MAX_WRAP_LINES = 12
# Bytes of one physical line to text (and count what had to be replaced).
Decode = Callable[[Buffer], str]


def pieces_above(prev_raw: NextLine) -> list[str]:
    """The full-width lines just above a continuation, nearest first, up to the one
    that opens the record; [] when they do not make a wrapped record."""
    pieces: list[str] = []
    width = -1
    for k in range(MAX_WRAP_LINES):
        before = prev_raw(k)
        text = None if before is None else before.rstrip("\r\n")
        if not text or (width != -1 and len(text) != width):
            break
        width = len(text)
        pieces.append(text)
        if starts_record(text):
            return pieces
    return []


def continuations(width: int, first: str, next_raw: NextLine) -> list[str]:
    """The lines below that continue a record: the next one when it opens nothing
    (a wrap at any column), then more only while each piece before is exactly
    `width` long, as a terminal wraps."""
    pieces: list[str] = []
    last = len(first)
    for k in range(MAX_WRAP_LINES):
        following = next_raw(k)
        nxt = "" if following is None else following.rstrip("\r\n")
        if not nxt or starts_record(nxt) or (k and last != width):
            break
        pieces.append(nxt)
        last = len(nxt)
    return pieces


def joined_below(text: str, next_raw: NextLine) -> str:
    return text + "".join(continuations(len(text), text, next_raw))


def line_before(
    block: Buffer, start: int, decode: Decode, above: Sequence[str], k: int = 0
) -> str | None:
    """The k-th physical line before the one starting at `start` (0: the one just
    above): from the block, then from `above` (earlier blocks' last lines)."""
    end = start - 1  # the newline that ends the line above
    for i in range(k + 1):
        if end < 0:
            j = k - i
            return above[j] if j < len(above) else None
        begin = block.rfind(b"\n", 0, end) + 1
        line_end, end = end, begin - 1
    return decode(block[begin:line_end])


def tail_start(block: Buffer, size: int) -> int:
    """Where the block's last MAX_WRAP_LINES lines begin: a candidate there may
    continue into the next block."""
    pos = size - 1
    for _ in range(MAX_WRAP_LINES + 1):
        pos = block.rfind(b"\n", 0, pos)
        if pos == -1:
            return 0
    return pos + 1


def last_lines(block: Buffer, size: int, above: Sequence[str], decode: Decode) -> list[str]:
    """The block's last MAX_WRAP_LINES lines, nearest first, topped up from `above`."""
    out: list[str] = []
    end = size - 1 if size and block[size - 1] == 10 else size
    while len(out) < MAX_WRAP_LINES and end >= 0:
        begin = block.rfind(b"\n", 0, end) + 1
        out.append(decode(block[begin:end]))
        if begin == 0:
            return (out + list(above))[:MAX_WRAP_LINES]
        end = begin - 1
    return out


def line_at(block: Buffer, start: int, size: int, decode: Decode, k: int = 0) -> str | None:
    """The k-th physical line from `start` (decoded only when asked for); None past
    the end of the block."""
    for _ in range(k):
        nl = block.find(b"\n", start, size)
        if nl == -1:
            return None
        start = nl + 1
    if start >= size:
        return None
    end = block.find(b"\n", start, size)
    return decode(block[start : end if end != -1 else size])


# next_raw(k): the k-th physical line after the candidate (0: the next one), or None.
NextLine = Callable[[int], str | None]


class LinesAfter:
    """The lines after a candidate: first `head` (already decoded), then `more(k)`."""

    def __init__(self, head: Sequence[str], more: NextLine | None = None) -> None:
        self.head, self.more = head, more

    def __call__(self, k: int) -> str | None:
        if k < len(self.head):
            return self.head[k]
        return self.more(k - len(self.head)) if self.more else None
