"""Scan one input for signature hits.

The fast path reads large blocks, lets the prefilter pick the few lines that hold a
signature literal, and runs regexes only on those. The reference path reads line by
line and runs every regex on every line; tests hold the two to identical output.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from preemptdiag.lines import (
    engine_ts_before,
    normalise,
    proc_before,
    record_text,
    repeat_count,
    sglang_rank,
)
from preemptdiag.prefilter import HAVE_AHOCORASICK, LineFinder, iter_blocks, number_lines
from preemptdiag.records import Hit
from preemptdiag.signatures import Signature
from preemptdiag.sources import Source, open_binary, was_truncated

if HAVE_AHOCORASICK:
    from ahocorasick_rs import AhoCorasick, MatchKind

# Longer lines are cut: a 50 MB single "line" is a paste accident, not one record.
MAX_LINE_BYTES = 1 << 20
MAX_EVIDENCE_CHARS = 600
TRUNCATED = "truncated gzip: input ended early"

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
_LINE_START_HINTS = ("INFO", "WARNING", "ERROR", "DEBUG", "CRITICAL", "[", "(", "{")


@dataclass
class ScanResult:
    source: str
    hits: list[Hit] = field(default_factory=list)
    lines_read: int = 0
    bytes_read: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    recognised: Counter[str] = field(default_factory=Counter)


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
        self._sig_lits = [frozenset(index[lit] for lit in s.prefilter) for s in self.sigs]
        self._longest = max(map(len, self.literals), default=0)
        self._finder: LineFinder | None = None
        self._ac = (
            AhoCorasick(list(self.literals), matchkind=MatchKind.Standard)
            if HAVE_AHOCORASICK and self.literals
            else None
        )

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
        return [s for s, lits in zip(self.sigs, self._sig_lits, strict=True) if lits & found]

    def match(
        self,
        source: str,
        lineno: int,
        raw: str,
        next_raw: str | None,
        result: ScanResult,
        sigs: Sequence[Signature] | None = None,
    ) -> None:
        if sigs is None:
            decoy = _decoy_position(raw)
            cands = self.candidates(raw, decoy)
            if not cands:
                # Only candidate lines get here: their literals sit in request text.
                if decoy is not None:
                    result.skipped["decoy in request text"] += 1
                return
        else:
            cands = list(sigs)
        if not cands:
            return
        line = normalise(raw)
        if self._emit(
            source,
            lineno,
            line.text,
            cands,
            result,
            line.ts_wrapper,
            line.ts_kind,
            line.rank,
            0,
            line.pod,
            line.uptime,
        ):
            return
        if next_raw is None:
            return
        nxt = next_raw.rstrip("\r\n")
        if not nxt or nxt.lstrip().startswith(_LINE_START_HINTS) or nxt[:4].isdigit():
            return
        # Hard-wrapped paste: the record continues on the next physical line.
        joined = line.text + nxt
        self._emit(
            source,
            lineno,
            joined,
            cands,
            result,
            line.ts_wrapper,
            line.ts_kind,
            line.rank,
            len(line.text),
            line.pod,
            line.uptime,
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
    ) -> bool:
        found = False
        taken: list[tuple[int, int, Signature]] = []
        decoy_at = _decoy_position(text)
        for sig in cands:
            for m in sig.finditer(text):
                start, end = m.span()
                if must_span and not (start < must_span < end):
                    continue
                if decoy_at is not None and start > decoy_at:
                    result.skipped["decoy in request text"] += 1
                    continue
                # Two signatures on one span: the higher priority (sorted first) wins.
                if any(
                    start < e and s < end and o.id != sig.id and not _declared(sig, o)
                    for s, e, o in taken
                ):
                    continue
                taken.append((start, end, sig))
                found = True
                proc = proc_before(text, start) or sglang_rank(rank)
                result.hits.append(
                    Hit(
                        source=source,
                        line=lineno,
                        sig=sig.id,
                        kind=sig.kind,
                        fields=sig.extract(m),
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


def _decode(raw: bytes, result: ScanResult) -> str:
    if len(raw) > MAX_LINE_BYTES:
        result.skipped["over-long line cut to 1 MiB"] += 1
        raw = raw[:MAX_LINE_BYTES]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        result.skipped["invalid UTF-8 (replaced)"] += 1
        return raw.decode("utf-8", errors="replace")


ProgressFn = Callable[[int], None]


def scan_fast(
    src: Source,
    matcher: Matcher,
    progress: ProgressFn | None = None,
    byte_range: tuple[int, int] | None = None,
    first_line: int = 1,
) -> ScanResult:
    result = ScanResult(source=src.name)
    finder = matcher.finder()
    next_line = first_line  # number of the next block's first line
    scratch = ScanResult(source="")  # the look-ahead line is counted when it is read
    # The last line of a block may be a hard-wrapped record whose continuation
    # opens the next block: it waits for that first line before it is matched.
    pending: tuple[int, str] | None = None
    with open_binary(src) as f:
        for block, _offset in iter_blocks(f, byte_range=byte_range):
            size = len(block)
            if pending is not None:
                first_end = block.find(b"\n")
                nxt = _decode(block[: first_end if first_end != -1 else size], scratch)
                matcher.match(src.name, pending[0], pending[1], nxt, result)
                pending = None
            spans = finder.candidate_lines(block)
            numbers, newlines = number_lines(block, spans, next_line)
            for (start, end), lineno in zip(spans, numbers, strict=True):
                raw = _decode(block[start:end], result)
                if end + 1 >= size:
                    pending = (lineno, raw)
                    continue
                nxt_end = block.find(b"\n", end + 1)
                nxt = _decode(block[end + 1 : nxt_end if nxt_end != -1 else size], scratch)
                matcher.match(src.name, lineno, raw, nxt, result)
            result.lines_read += newlines + (0 if block.endswith(b"\n") else 1)
            result.bytes_read += size
            next_line += newlines
            if progress is not None:
                progress(size)
        if pending is not None:
            matcher.match(src.name, pending[0], pending[1], None, result)
        if was_truncated(f):
            result.skipped[TRUNCATED] += 1
    return result


def scan_reference(src: Source, matcher: Matcher) -> ScanResult:
    """Line by line, every signature's regex on every line, no prefilter.

    A regex match on a line without its prefilter literal is reported under
    skipped['prefilter miss'] so tests can fail loudly on such signatures.
    """
    result = ScanResult(source=src.name)
    with open_binary(src) as f:
        data = f.read()
        if was_truncated(f):
            result.skipped[TRUNCATED] += 1
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
        nxt = decoded[i + 1] if i + 1 < len(decoded) else None
        cands = matcher.candidates(raw)
        if not cands:
            line = normalise(raw)
            for s in matcher.sigs:
                if list(s.finditer(line.text)):
                    result.skipped["prefilter miss"] += 1
            continue
        matcher.match(src.name, i + 1, raw, nxt, result)
    return result
