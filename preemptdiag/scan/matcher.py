"""Scan one input for signature hits.

The fast path reads large blocks, lets the prefilter pick the few lines that hold a
signature literal, and runs regexes only on those. The reference path reads line by
line and runs every regex on every line; tests hold the two to identical output.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import BinaryIO

from preemptdiag.ingest.sources import Source, compressed_bytes, open_binary, was_truncated
from preemptdiag.model.records import Hit
from preemptdiag.scan.limits import too_many
from preemptdiag.scan.lines import (
    Line,
    engine_ts_before,
    normalise,
    proc_before,
    record_text,
    repeat_count,
    sglang_rank,
    starts_record,
)
from preemptdiag.scan.prefilter import (
    HAVE_AHOCORASICK,
    Buffer,
    LineFinder,
    iter_blocks,
    number_lines,
)
from preemptdiag.scan.rollup import RollupSink
from preemptdiag.scan.signatures import Signature

if HAVE_AHOCORASICK:
    from ahocorasick_rs import AhoCorasick, MatchKind

# Longer lines are cut: a 50 MB single "line" is a paste accident, not one record.
MAX_LINE_BYTES = 1 << 20
MAX_EVIDENCE_CHARS = 600
# {codec}: gzip, bzip2, xz or zstd (compression.py).
TRUNCATED = "truncated {codec}: input ended early"
DECOY = "decoy in request text"
# skipped["unparsed: <signature id>"]: the signature's literal was there, its regex failed.
UNPARSED = "unparsed: "
# skipped["value out of range: <signature id>"]: matched, but a number would not fit.
UNREADABLE = "value out of range: "

# A match that starts after one of these markers sits inside a logged request:
# user text quoting a signal line is a decoy, never evidence.
_DECOY_MARKERS = (
    "Received request",
    "prompt: ",
    "prompt_token_ids",
    '"prompt"',
    '"messages"',
    '"content"',
)
_DECOY_BYTES = tuple(m.encode() for m in _DECOY_MARKERS)
# A wrapped record is rejoined from at most this many further physical lines.
MAX_WRAP_LINES = 12


@dataclass
class ScanResult:
    source: str
    hits: list[Hit] = field(default_factory=list)
    lines_read: int = 0
    bytes_read: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    recognised: Counter[str] = field(default_factory=Counter)
    # Set while scanning with rollups on (rollup.py); closed before the result leaves.
    sink: RollupSink | None = None

    def add(self, hit: Hit) -> None:
        if self.sink is None:
            self.hits.append(hit)
        else:
            self.sink.add(hit)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
            self.sink = None


class Matcher:
    """Runs the signatures on one candidate line and turns matches into Hits."""

    def __init__(self, sigs: Sequence[Signature]) -> None:
        self.sigs = tuple(sorted(sigs, key=lambda s: -s.priority))
        lits: dict[str, None] = {}
        for s in self.sigs:
            for lit in s.prefilter:
                lits.setdefault(lit, None)
        self.literals = tuple(lits)
        self.literal_bytes = tuple(lit.encode() for lit in self.literals)
        # Which signatures each literal can start, so one automaton pass over a
        # candidate line (prompts make some lines 100 KB long) picks the regexes to run.
        index = {lit: i for i, lit in enumerate(self.literals)}
        # literal -> positions (in self.sigs) of the signatures it can start
        self._lit_sigs: list[list[int]] = [[] for _ in self.literals]
        for pos, sig in enumerate(self.sigs):
            for i in sorted({index[lit] for lit in sig.prefilter}):
                self._lit_sigs[i].append(pos)
        self._longest = max(map(len, self.literals), default=0)
        self._longest_bytes = max(map(len, self.literal_bytes), default=0)
        self._finder: LineFinder | None = None
        # (source, first line, last line) of the last wrapped record matched whole:
        # its other pieces that hold a literal must not match it a second time.
        self._rejoined: tuple[str, int, int] | None = None
        self._ac = (
            AhoCorasick(list(self.literals), matchkind=MatchKind.Standard)
            if HAVE_AHOCORASICK and self.literals
            else None
        )

    def begin(self) -> None:
        """Forget the last rejoined record: each scan (file or range) starts afresh."""
        self._rejoined = None

    def finder(self) -> LineFinder:
        """The block prefilter for these literals, built once (compiling it costs
        tens of milliseconds, which adds up over many small files in `check`)."""
        if self._finder is None:
            self._finder = LineFinder(self.literal_bytes)
        return self._finder

    def candidates(self, raw: str, before: int | None = None) -> list[Signature]:
        """Signatures with a literal in `raw` (starting before `before`, when given:
        literals inside a logged request's text cannot start evidence)."""
        if self._ac is None:
            head = raw if before is None else raw[: before + self._longest]
            return [
                s
                for s in self.sigs
                if any(
                    0 <= head.find(lit) < (before if before is not None else len(raw))
                    for lit in s.prefilter
                )
            ]
        # Only the head of the line can hold evidence: search just that part.
        head = raw if before is None else raw[: before + self._longest]
        found = {
            i
            for i, start, _ in self._ac.find_matches_as_indexes(head, overlapping=True)
            if before is None or start < before
        }
        if not found:
            return []
        if len(found) == 1:
            (only,) = found
            return [self.sigs[pos] for pos in self._lit_sigs[only]]
        return [self.sigs[pos] for pos in sorted({p for i in found for p in self._lit_sigs[i]})]

    def decoy_only(self, block: Buffer, start: int, end: int, first: int) -> bool:
        """True when a request marker opens the line before every literal in it.

        Decided on the raw bytes from the prefilter's `first` (the leftmost kept
        literal; a longer literal it stands for starts at most `longest - 1` bytes
        earlier), so a prompt line quoting signal text is skipped without decoding
        it. `match` would reach the same verdict on the decoded line: no literal
        starts before the marker, so no signature runs. False means "look closer".
        """
        if end - start > MAX_LINE_BYTES:
            return False  # cut before decoding; the slow path decides
        hi = first - self._longest_bytes
        if hi < start:
            return False
        find = block.find
        return any(find(m, start, hi + len(m)) != -1 for m in _DECOY_BYTES)

    def match(
        self,
        source: str,
        lineno: int,
        raw: str,
        next_raw: NextLine,
        result: ScanResult,
        sigs: Sequence[Signature] | None = None,
        prev_raw: NextLine | None = None,
    ) -> None:
        """Match one candidate line; `next_raw(k)` / `prev_raw(k)` give the k-th
        physical line after / before it (None where unknown), read only when a
        hard-wrapped record must be rejoined."""
        done = self._rejoined
        if done is not None and done[0] == source and done[1] < lineno <= done[2]:
            return  # a piece of a wrapped record matched whole already
        if sigs is None:
            decoy = _decoy_position(raw)
            cands = self.candidates(raw, decoy)
            if not cands:
                # Only candidate lines get here: their literals sit in request text.
                if decoy is not None:
                    result.skipped[DECOY] += 1
                return
        else:
            cands = list(sigs)
        if not cands:
            return
        text = raw.rstrip("\r\n")
        line = normalise(text)
        if self._emit_line(source, lineno, line.text, line, 0, cands, result):
            return
        # A piece inside a record that a narrow terminal wrapped: the record starts
        # above, where the first piece held no literal.
        if prev_raw is not None and not starts_record(text):
            above = _pieces_above(prev_raw)
            if above and self._rejoin(source, lineno, text, above, next_raw, cands, result):
                return
        if not self._rejoin(source, lineno, text, [], next_raw, cands, result):
            _count_unparsed(_joined_below(text, next_raw), cands, result)

    def _rejoin(
        self,
        source: str,
        lineno: int,
        text: str,
        above: Sequence[str],
        next_raw: NextLine,
        cands: Sequence[Signature],
        result: ScanResult,
    ) -> bool:
        """Match the record that holds this line, rejoined from the full-width pieces
        `above` (first piece last) and the continuation lines below. A rejoined
        match must reach into this line (the other pieces are matched on their own)."""
        head = normalise(above[-1] if above else text)
        top = lineno - len(above)
        before = head.text + "".join(reversed(above[:-1])) if above else ""
        cut = len(before) if above else len(head.text)
        joined = (before + text) if above else head.text
        width = len(above[0]) if above else len(text)
        ends_here = bool(above) and len(text) != width  # the last piece: shorter
        pieces = [] if ends_here else _continuations(width, text, next_raw)
        if not pieces and not above:
            return False
        joined += "".join(pieces)
        # Rebuilt from above, the match may start anywhere but must reach this line;
        # joined below, it must start on this line and run on past it.
        span, reach = (0, cut) if above else (cut, 0)
        if not self._emit_line(source, top, joined, head, span, cands, result, reach):
            return False
        self._rejoined = (source, top, lineno + len(pieces))
        return True

    def _emit_line(
        self,
        source: str,
        lineno: int,
        text: str,
        head: Line,
        must_span: int,
        cands: Sequence[Signature],
        result: ScanResult,
        reach: int = 0,
    ) -> bool:
        return self._emit(
            source,
            lineno,
            text,
            cands,
            result,
            head.ts_wrapper,
            head.ts_kind,
            head.rank,
            must_span,
            head.pod,
            head.uptime,
            reach,
        )

    def _emit(
        self,
        source: str,
        lineno: int,
        text: str,
        cands: Iterable[Signature],
        result: ScanResult,
        ts_wrapper: str | None,
        ts_kind: str | None,
        rank: str | None,
        must_span: int,
        pod: str | None,
        uptime: float | None = None,
        reach: int = 0,
    ) -> bool:
        found = False
        taken: list[tuple[int, int, Signature]] = []
        decoy_at = _decoy_position(text)
        for sig in cands:
            for m in sig.finditer(text):
                start, end = m.span()
                if must_span and not (start < must_span < end):
                    continue
                if reach and end <= reach:
                    continue
                if decoy_at is not None and start > decoy_at:
                    result.skipped[DECOY] += 1
                    continue
                # Two signatures on one span: the higher priority (sorted first) wins.
                if any(
                    start < e and s < end and o.id != sig.id and not _declared(sig, o)
                    for s, e, o in taken
                ):
                    continue
                try:
                    fields = sig.extract(m)
                except (ValueError, OverflowError):
                    result.skipped[f"{UNREADABLE}{sig.id}"] += 1
                    found = True  # recognised, and counted as skipped: not "unparsed"
                    continue
                taken.append((start, end, sig))
                found = True
                proc = proc_before(text, start) or sglang_rank(rank)
                result.add(
                    Hit(
                        source=source,
                        line=lineno,
                        sig=sig.id,
                        kind=sig.kind,
                        fields=fields,
                        text=_cut(record_text(text, start, end)),
                        ts_wrapper=_ts_tag(ts_wrapper, ts_kind),
                        ts_engine=engine_ts_before(text, start),
                        proc=proc,
                        repeat=repeat_count(text) if "[repeated" in text else 1,
                        pod=pod,
                        uptime=uptime,
                    )
                )
                result.recognised[sig.family] += 1
        return found


def _pieces_above(prev_raw: NextLine) -> list[str]:
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


def _continuations(width: int, first: str, next_raw: NextLine) -> list[str]:
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


def _joined_below(text: str, next_raw: NextLine) -> str:
    return text + "".join(_continuations(len(text), text, next_raw))


def _count_unparsed(text: str, cands: Iterable[Signature], result: ScanResult) -> None:
    """A line that holds a diagnostic literal but matched nothing: a format change
    (or a cut line) that must be visible in the footer, named by the signature."""
    sig = next((s for s in cands if any(u in text for u in s.unparsed_if)), None)
    if sig is not None:
        result.skipped[f"{UNPARSED}{sig.id}"] += 1


def _cut(text: str, limit: int = MAX_EVIDENCE_CHARS) -> str:
    """Shorten evidence at a space so no token is split: a secret cut in half would
    be too short for the redactor to recognise."""
    if len(text) <= limit:
        return text
    i = text.rfind(" ", 0, limit)
    return text[: i if i > limit // 2 else limit] + " …"


def _declared(a: Signature, b: Signature) -> bool:
    return b.id in a.overlaps or a.id in b.overlaps


def _ts_tag(ts: str | None, kind: str | None) -> str | None:
    """Keep the wrapper format with its text so events.py can parse it without guessing."""
    if ts is None:
        return None
    return f"{kind}|{ts}"


def _decoy_position(text: str) -> int | None:
    best: int | None = None
    for marker in _DECOY_MARKERS:
        i = text.find(marker)
        if i != -1 and (best is None or i < best):
            best = i
    return best


def _decode(raw: Buffer, result: ScanResult) -> str:
    if len(raw) > MAX_LINE_BYTES:
        result.skipped["over-long line cut to 1 MiB"] += 1
        raw = raw[:MAX_LINE_BYTES]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        result.skipped["invalid UTF-8 (replaced)"] += 1
        return raw.decode("utf-8", errors="replace")


ProgressFn = Callable[[int], None]
# next_raw(k): the k-th physical line after the candidate (0: the next one), or None.
NextLine = Callable[[int], str | None]


def _no_line(k: int) -> None:
    return None


class _LinesAfter:
    """The lines after a candidate: first `head` (already decoded), then `more(k)`."""

    def __init__(self, head: Sequence[str], more: NextLine | None = None) -> None:
        self.head, self.more = head, more

    def __call__(self, k: int) -> str | None:
        if k < len(self.head):
            return self.head[k]
        return self.more(k - len(self.head)) if self.more else None


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
            break
        pieces.append(chunk)
        size += len(chunk)
    if not pieces:
        return None
    return _decode(b"".join(pieces), counts)


def _line_before(
    block: Buffer, start: int, counts: ScanResult, above: Sequence[str], k: int = 0
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
    return _decode(block[begin:line_end], counts)


def _tail_start(block: Buffer, size: int) -> int:
    """Where the block's last MAX_WRAP_LINES lines begin: a candidate there may
    continue into the next block."""
    pos = size - 1
    for _ in range(MAX_WRAP_LINES + 1):
        pos = block.rfind(b"\n", 0, pos)
        if pos == -1:
            return 0
    return pos + 1


def _last_lines(block: Buffer, size: int, above: Sequence[str], counts: ScanResult) -> list[str]:
    """The block's last MAX_WRAP_LINES lines, nearest first, topped up from `above`."""
    out: list[str] = []
    end = size - 1 if size and block[size - 1] == 10 else size
    while len(out) < MAX_WRAP_LINES and end >= 0:
        begin = block.rfind(b"\n", 0, end) + 1
        out.append(_decode(block[begin:end], counts))
        if begin == 0:
            return (out + list(above))[:MAX_WRAP_LINES]
        end = begin - 1
    return out


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
            self.after.append(_decode(block[start:end], counts))
            start = end + 1

    def match(self, source: str, matcher: Matcher, result: ScanResult, more: NextLine) -> None:
        after = _LinesAfter(self.after, more)
        matcher.match(
            source, self.lineno, self.raw, after, result, prev_raw=_LinesAfter(self.before)
        )


def _line_at(block: Buffer, start: int, size: int, counts: ScanResult, k: int = 0) -> str | None:
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
    return _decode(block[start : end if end != -1 else size], counts)


def scan_fast(
    src: Source,
    matcher: Matcher,
    progress: ProgressFn | None = None,
    byte_range: tuple[int, int] | None = None,
    first_line: int = 1,
    max_hits: int | None = None,
    rollup: bool = False,
) -> ScanResult:
    """Scan `src` (or `byte_range` of it); more than `max_hits` hits is a DiagError,
    raised as soon as a block crosses it (see limits.py). With `rollup`, stats lines
    of one stream and clock minute come back merged (rollup.py)."""
    result = ScanResult(source=src.name)
    matcher.begin()
    if rollup:
        result.sink = RollupSink(result.hits)
    finder = matcher.finder()
    next_line = first_line  # number of the next block's first line
    scratch = ScanResult(source="")  # the look-ahead line is counted when it is read
    # A candidate among a block's last lines may be a hard-wrapped record whose
    # continuation opens the next block: it waits, with the lines around it, for
    # that block. `above` keeps the previous blocks' last lines (nearest first) for
    # the pieces of a wrapped record that start before a block.
    pending: list[_Pending] = []
    above: list[str] = []
    with open_binary(src) as f:
        # Progress counts what the bar's total counts: bytes on disk.
        on_disk, reported = compressed_bytes(f), 0
        for block, size, _offset in iter_blocks(f, byte_range=byte_range):
            if pending:
                # Each waiting candidate takes the lines it needs from this block;
                # those that have all they need go, in order (tiny blocks may need
                # several blocks to fill one).
                for p in pending:
                    p.extend(block, 0, size, scratch)
                while pending and pending[0].complete:
                    pending.pop(0).match(src.name, matcher, result, _no_line)
            cands = finder.candidate_lines(block, size)
            numbers, newlines = number_lines(block, cands, next_line, size)
            tail = _tail_start(block, size)
            for (start, end, first), lineno in zip(cands, numbers, strict=True):
                if matcher.decoy_only(block, start, end, first):
                    result.skipped[DECOY] += 1
                    continue
                raw = _decode(block[start:end], result)
                before: NextLine = partial(_line_before, block, start, scratch, above)
                if start >= tail:
                    pending.append(_Pending(lineno, raw, block, end + 1, size, scratch, before))
                    continue
                following: NextLine = partial(_line_at, block, end + 1, size, scratch)
                matcher.match(src.name, lineno, raw, following, result, prev_raw=before)
            above = _last_lines(block, size, above, scratch)
            result.lines_read += newlines + (0 if block[size - 1] == 10 else 1)
            result.bytes_read += size
            next_line += newlines
            if max_hits is not None and len(result.hits) > max_hits:
                raise too_many(src.name, max_hits)
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
        if was_truncated(f):
            result.skipped[TRUNCATED.format(codec=src.codec)] += 1
    result.close()
    return result


def scan_reference(src: Source, matcher: Matcher) -> ScanResult:
    """Line by line, every signature's regex on every line, no prefilter.

    A regex match on a line without its prefilter literal is reported under
    skipped['prefilter miss'] so tests can fail loudly on such signatures.
    """
    result = ScanResult(source=src.name)
    matcher.begin()
    with open_binary(src) as f:
        data = f.read()
        if was_truncated(f):
            result.skipped[TRUNCATED.format(codec=src.codec)] += 1
    if not data:
        return result
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    result.bytes_read = len(data)
    result.lines_read = len(raw_lines)
    decoded = [_decode(r, ScanResult(source="")) for r in raw_lines]
    for i, raw_b in enumerate(raw_lines):
        raw = _decode(raw_b, result)
        cands = matcher.candidates(raw)
        if not cands:
            line = normalise(raw)
            for s in matcher.sigs:
                if list(s.finditer(line.text)):
                    result.skipped["prefilter miss"] += 1
            continue
        after = _LinesAfter(decoded[i + 1 : i + 1 + MAX_WRAP_LINES])
        above = _LinesAfter(decoded[max(0, i - MAX_WRAP_LINES) : i][::-1])
        matcher.match(src.name, i + 1, raw, after, result, prev_raw=above)
    return result
