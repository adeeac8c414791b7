"""Scan one input for signature hits.

The fast path reads large blocks, lets the prefilter pick the few lines that hold a
signature literal, and runs regexes only on those. The reference path reads line by
line and runs every regex on every line; tests hold the two to identical output.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

from preemptdiag.model import request_text
from preemptdiag.model.records import CalmRows, FieldValue, Hit, WrapperStamp
from preemptdiag.model.request_text import Span
from preemptdiag.scan.lines import (
    Line,
    Marks,
    normalise,
    repeat_count,
    sglang_rank,
    starts_record,
)
from preemptdiag.scan.prefilter import (
    HAVE_AHOCORASICK,
    Buffer,
    LineFinder,
)
from preemptdiag.scan.rollup import RollupSink
from preemptdiag.scan.signatures import RegexTimeout, Signature, reset_user_budget
from preemptdiag.scan.wrap import (
    MAX_WRAP_LINES,
    NextLine,
    continuations,
    joined_below,
    pieces_above,
)

if HAVE_AHOCORASICK:
    from ahocorasick_rs import AhoCorasick, MatchKind

# Longer lines are cut: a 50 MB single "line" is a paste accident, not one record.
MAX_LINE_BYTES = 1 << 20
MAX_EVIDENCE_CHARS = 600
# No terminal is wider: longer lines of equal length are repeated records, not the
# pieces of one line a terminal wrapped.
_MAX_WRAP_WIDTH = 1024
# {codec}: gzip, bzip2, xz or zstd (compression.py).
TRUNCATED = "truncated {codec}: input ended early"
DAMAGED = "damaged {codec} data: read up to the damage"
DECOY = "decoy in request text"
# skipped["unparsed: <signature id>"]: the signature's literal was there, its regex failed.
UNPARSED = "unparsed: "
# skipped["unreadable value: <signature id>"]: matched, but a field would not convert
# (a number past 64 bits, a word where a user signature wants a number).
UNREADABLE = "unreadable value: "
# skipped["regex timed out: <signature id>"]: a user pattern ran out of time there.
TIMED_OUT = "regex timed out: "


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
    # Lines a closed rollup keeps besides its carrier (its last, peak, preempting
    # lines): each costs what a hit does, so the memory guard counts them (limits.py).
    members: int = 0
    # With calm minutes on (lane.py): the KV usage they stay under, and the minutes
    # kept as numbers instead of hits (rows of columns, a block and signature each).
    calm_kv: float | None = None
    # The windows calm minutes go to: (minutes a window, the offset in minutes of the
    # zone stamps are read in), so the lane keeps a window all calm minutes or all
    # events (lane.calm_of).
    calm_window: tuple[int, int] = (1, 0)
    calm: list[CalmRows] = field(default_factory=list)

    @property
    def calm_minutes(self) -> int:
        return sum(c.height for c in self.calm)

    @property
    def held(self) -> int:
        """Hit objects this result keeps: what --max-events bounds. (A calm minute
        becomes a window with an evidence event.)"""
        held = len(self.hits) + self.members + self.calm_minutes
        return held + (self.sink.members if self.sink else 0)

    def add(self, hit: Hit) -> None:
        if self.sink is None:
            self.hits.append(hit)
        else:
            self.sink.add(hit)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
            self.members += self.sink.members
            self.sink = None


class Matcher:
    """Runs the signatures on one candidate line and turns matches into Hits."""

    def __init__(self, sigs: Sequence[Signature]) -> None:
        reset_user_budget()  # one Matcher per run
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

    def candidates(self, raw: str, decoys: Sequence[Span] = ()) -> list[Signature]:
        """Signatures with a literal in `raw` outside the `decoys` (request text: a
        literal inside a logged request's text cannot start evidence)."""
        if self._ac is None:
            return [s for s in self.sigs if any(_outside(raw, lit, decoys) for lit in s.prefilter)]
        found = {
            i
            for i, start, _ in self._ac.find_matches_as_indexes(raw, overlapping=True)
            if not decoys or not request_text.inside(start, decoys)
        }
        if not found:
            return []
        if len(found) == 1:
            (only,) = found
            return [self.sigs[pos] for pos in self._lit_sigs[only]]
        return [self.sigs[pos] for pos in sorted({p for i in found for p in self._lit_sigs[i]})]

    def rejoined_covers(self, source: str, lineno: int) -> bool:
        """Whether line `lineno` is a piece of the wrapped record matched whole last."""
        done = self._rejoined
        return done is not None and done[0] == source and done[1] < lineno <= done[2]

    @property
    def rejoined(self) -> tuple[str, int, int] | None:
        """The wrapped record matched whole last (source, first line, last line)."""
        return self._rejoined

    @rejoined.setter
    def rejoined(self, done: tuple[str, int, int] | None) -> None:
        # lane.py matches a block's odd lines before it knows it takes the block: a
        # block it gives back is matched again line by line from the state before.
        self._rejoined = done

    def rejoined_reaches(self, source: str, lineno: int) -> bool:
        """Whether the wrapped record matched whole last covers line `lineno` or later."""
        done = self._rejoined
        return done is not None and done[0] == source and done[2] >= lineno

    def decoy_only(self, block: Buffer, start: int, end: int, first: int) -> bool:
        """True when every literal in the line sits inside request text.

        A cheap test on the raw bytes first: a request-text key must start before
        the prefilter's `first` (the leftmost kept literal; a longer literal it
        stands for starts at most `longest - 1` bytes earlier). Only then is the
        line decoded and its request text found, exactly as `match` does, so a
        prompt line quoting signal text is skipped before any regex runs. False
        means "look closer".
        """
        if end - start > MAX_LINE_BYTES:
            return False  # cut before decoding; the slow path decides
        hi = first - self._longest_bytes
        if hi < start:
            return False
        if not request_text.trigger_starts_in(block, start, hi):
            return False
        raw = bytes(block[start:end]).decode("utf-8", errors="replace")
        if not starts_record(raw.rstrip("\r\n")):
            # A line that opens no record may continue request text from above (a
            # quote left open there closes here, and what follows is a record): only
            # `match` looks above (fuzz: `prompt:'` over `prompt:…'Engine core proc
            # A died unexpectedly`, the death counts).
            return False
        decoys = request_text.spans(raw)
        return bool(decoys) and not self.candidates(raw, decoys)

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
        if self.rejoined_covers(source, lineno):
            return  # a piece of a wrapped record matched whole already
        text = raw.rstrip("\r\n")
        # A line below one whose request text was left open (a multi-line prompt, a
        # wrapped one): its text up to where that request text ends is not a record.
        prefix = None if starts_record(text) else _cr_decoy_prefix(prev_raw, text)
        if prefix:
            if self.candidates(text[:prefix]):
                result.skipped[DECOY] += 1
            if prefix >= len(text):
                return
            # Blanked, not cut: offsets stay, and no pattern can match into it (a
            # record glued after the closing quote is matched on its own).
            text = " " * prefix + text[prefix:]
            raw = text
        if sigs is None:
            decoys = request_text.spans(raw)
            cands = self.candidates(raw, decoys)
            if not cands:
                # Only candidate lines get here: their literals sit in request text.
                if decoys and not prefix:
                    result.skipped[DECOY] += 1
                return
        else:
            cands = list(sigs)
        if not cands:
            return
        line = normalise(text)
        if self._emit_line(source, lineno, line.text, line, 0, cands, result):
            return
        # A piece inside a record that a narrow terminal wrapped: the record starts
        # above, where the first piece held no literal.
        if prev_raw is not None and not starts_record(text):
            above = pieces_above(prev_raw)
            if above and self._rejoin(source, lineno, text, above, next_raw, cands, result):
                return
        if not self._rejoin(source, lineno, text, [], next_raw, cands, result):
            _count_unparsed(joined_below(text, next_raw), cands, result)

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
        pieces = [] if ends_here else continuations(width, text, next_raw)
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
            head.crs if text is head.text else (),
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
        crs: Sequence[int] = (),
    ) -> bool:
        found = False
        # Kept spans, sorted by start; the longest bounds how far back one can
        # overlap a new match (a scan of all of them per match is quadratic on a
        # line of a thousand glued records).
        taken: list[tuple[int, int, Signature]] = []
        longest = 0
        # Request text is found with the line's \r back where normalise put spaces: a
        # \r joins what it separates there (a key cut in two, `mes\rsage='…`), as it
        # did when the raw line picked its candidates. Where that finds request text
        # the spaces hide, the hits' text keeps the \r too, so the redactor finds it
        # as well (evidence of a record glued after it may hold the line's start).
        evidence = text
        decoys = request_text.spans(text)
        if crs:
            back = _put_back(text, crs)
            joined = request_text.spans(back)
            if joined != decoys:
                decoys, evidence = joined, back
        marks = Marks(evidence)
        repeat = repeat_count(text) if "[repeated" in text else 1  # once, not per match
        for sig in cands:
            try:
                found_here = sig.finditer(text)
            except RegexTimeout as exc:
                result.skipped[f"{TIMED_OUT}{exc.sig_id}"] += 1
                found = True  # judged (as skipped); a rejoin must not run it again
                continue
            for m in found_here:
                start, end = m.span()
                if must_span and not (start < must_span < end):
                    continue
                if reach and end <= reach:
                    continue
                if decoys and request_text.inside(start, decoys):
                    result.skipped[DECOY] += 1
                    # Judged with the record's request text in view: a narrower
                    # rejoin (this line and below only) must not judge it again.
                    found = True
                    continue
                # Two signatures on one span: the higher priority (sorted first) wins.
                if _overlaps_other(taken, longest, start, end, sig):
                    continue
                try:
                    fields = sig.extract(m)
                except (ValueError, OverflowError):
                    result.skipped[f"{UNREADABLE}{sig.id}"] += 1
                    found = True  # recognised, and counted as skipped: not "unparsed"
                    continue
                bisect.insort(taken, (start, end, sig), key=lambda t: t[0])
                longest = max(longest, end - start)
                found = True
                stamp = Stamps(ts_wrapper, ts_kind, rank, pod, uptime)
                result.add(
                    new_hit(source, lineno, sig, fields, evidence, start, end, stamp, marks, repeat)
                )
                result.recognised[sig.family] += 1
        return found


@dataclass(frozen=True, slots=True)
class Stamps:
    """What normalise took off a line's head, as a hit keeps it."""

    ts_wrapper: str | None
    ts_kind: str | None
    rank: str | None
    pod: str | None
    uptime: float | None


def new_hit(
    source: str,
    lineno: int,
    sig: Signature,
    fields: dict[str, FieldValue],
    text: str,
    start: int,
    end: int,
    head: Stamps,
    marks: Marks | None = None,
    repeat: int | None = None,
) -> Hit:
    """The hit of one match of `sig` at text[start:end]. `marks` and `repeat`, when the
    caller has them for the line, save a rescan per match (a line of a thousand glued
    records would be quadratic otherwise)."""
    mk = marks if marks is not None else Marks(text)
    if repeat is None:
        repeat = repeat_count(text) if "[repeated" in text else 1
    return Hit(
        source=source,
        line=lineno,
        sig=sig.id,
        kind=sig.kind,
        fields=fields,
        # (one character past the cut: cut then cuts exactly as on all of it)
        text=cut(mk.record_text(start, end, MAX_EVIDENCE_CHARS + 1)),
        ts_wrapper=ts_tag(head.ts_wrapper, head.ts_kind),
        ts_engine=mk.engine_ts_before(start),
        proc=mk.proc_before(start) or sglang_rank(head.rank),
        repeat=repeat,
        pod=head.pod,
        uptime=head.uptime,
        engine=sig.engine,
        pos=start,
    )


def _count_unparsed(text: str, cands: Iterable[Signature], result: ScanResult) -> None:
    """A line that holds a diagnostic literal but matched nothing: a format change
    (or a cut line) that must be visible in the footer, named by the signature."""
    sig = next((s for s in cands if any(u in text for u in s.unparsed_if)), None)
    if sig is not None:
        result.skipped[f"{UNPARSED}{sig.id}"] += 1


def cut(text: str, limit: int = MAX_EVIDENCE_CHARS) -> str:
    """Shorten evidence at a space so no token is split: a secret cut in half would
    be too short for the redactor to recognise."""
    if len(text) <= limit:
        return text
    i = text.rfind(" ", 0, limit)
    return text[: i if i > limit // 2 else limit] + " …"


def _overlaps_other(
    taken: list[tuple[int, int, Signature]], longest: int, start: int, end: int, sig: Signature
) -> bool:
    """Whether [start, end) overlaps a kept span of another signature that this one
    does not declare: the higher priority (kept first) wins."""
    i = bisect.bisect_left(taken, start - longest, key=lambda t: t[0])
    while i < len(taken) and taken[i][0] < end:
        _, e, other = taken[i]
        if start < e and other.id != sig.id and not _declared(sig, other):
            return True
        i += 1
    return False


def _declared(a: Signature, b: Signature) -> bool:
    return b.id in a.overlaps or a.id in b.overlaps


def ts_tag(ts: str | None, kind: str | None) -> WrapperStamp | None:
    """Keep the wrapper format with its text so events can parse it without guessing."""
    if ts is None:
        return None
    return WrapperStamp(kind or "", ts)


def _put_back(text: str, crs: Sequence[int]) -> str:
    """`text` with a \r at each of `crs` (same length: normalise made them spaces)."""
    chars = list(text)
    for i in crs:
        if i < len(chars):
            chars[i] = "\r"
    return "".join(chars)


def decoy_position(text: str) -> int | None:
    """Where the first request text of `text` starts (model/request_text.py), or None."""
    found = request_text.spans(text)
    return found[0].start if found else None


def _outside(raw: str, lit: str, decoys: Sequence[Span]) -> bool:
    """Whether `lit` occurs in `raw` somewhere outside the request-text `decoys`."""
    i = raw.find(lit)
    while i != -1:
        if not request_text.inside(i, decoys):
            return True
        i = raw.find(lit, i + 1)
    return False


def _cr_decoy_prefix(prev_raw: NextLine | None, text: str) -> int | None:
    """_decoy_prefix, where this line or the one above holds a lone \r, on the pieces
    the \r separate: a wrapped line whose newlines became \r (mixed line ends) is
    pieces as wide as the wrap only when cut there (fuzz seed 8081 input 774, seed
    9091 input 5317). Empty pieces (`\r\r`) are no lines."""
    if prev_raw is None:
        return None
    above = prev_raw(0)
    if "\r" not in text and (above is None or "\r" not in above.rstrip("\r\n")):
        return _decoy_prefix(prev_raw, text)
    # The physical lines may be the wrap as well (as wide as it, \r and all): the
    # more request text either reading finds, the safer (fuzz seed 10101 input 9511).
    whole = _decoy_prefix(prev_raw, text)
    pieces = _piece_decoy_prefix(prev_raw, text)
    if whole is None or pieces is None:
        return pieces if whole is None else whole
    return max(whole, pieces)


def _piece_decoy_prefix(prev_raw: NextLine, text: str) -> int | None:
    """_cr_decoy_prefix on the pieces a \r separates."""
    got: list[str] = []  # pieces above, bottom up
    lines = 0

    def before(k: int) -> str | None:
        nonlocal lines
        while len(got) <= k:
            line = prev_raw(lines)
            if line is None:
                return None
            lines += 1
            got.extend(p for p in reversed(line.rstrip("\r\n").split("\r")) if p)
        return got[k]

    done = 0  # characters of text judged request text so far
    own: list[str] = []  # this line's pieces above the one judged, bottom up
    for piece in text.split("\r"):
        if piece:
            if own and starts_record(piece):
                break
            carried = _decoy_prefix(partial(_piece_above, tuple(own), before), piece)
            if carried is None:
                break
            if carried < len(piece):
                return done + carried
            own.insert(0, piece)
        done += len(piece) + 1
    return min(done, len(text)) if done and own else None


def _piece_above(own: Sequence[str], before: NextLine, k: int) -> str | None:
    """The k-th piece above: the line's own ones first (bottom up), then `before`'s."""
    return own[k] if k < len(own) else before(k - len(own))


def _decoy_prefix(prev_raw: NextLine | None, text: str) -> int | None:
    """How much of this continuation line `text` is request text that the lines above
    opened: up to where a quote left open closes (all of it if it does not), all of
    it below a key that ends its line (`Prompt after formatting:`), or, when the
    lines are pieces of one line a terminal wrapped, what the rejoined line's request
    text covers. None: nothing carried. Looks up to the nearest line that opens a
    record."""
    if prev_raw is None:
        return None
    between: list[str] = []  # lines between the one above and this one, nearest first
    for k in range(MAX_WRAP_LINES):
        above = prev_raw(k)
        if above is None:
            return None
        above = above.rstrip("\r\n")
        if _wrapped(above, between, text):
            joined = above + "".join(reversed(between)) + text
            off = len(joined) - len(text)
            for sp in request_text.spans(joined):
                if sp.start < off < sp.end:
                    return min(sp.end - off, len(text))
        top_down = between[::-1]
        j = _wrapped_end(above, top_down)
        if j is not None:
            # `above` and the lines below it up to a shorter one are the pieces of one
            # wrapped line (its key may be cut in two, `…16P` / `rompt after
            # formatting:`): what that whole line leaves open carries down to here.
            carried = _left_open(above + "".join(top_down[:j]), text, top_down[j:])
            if carried is not None:
                return carried
        found = request_text.spans(above)
        if found and found[-1].end >= len(above) and found[-1].open is not None:
            return _left_open(above, text, between)
        if not between:
            cut = _key_cut(above, text, found)
            if cut is not None:
                return cut
        if starts_record(above):
            return None
        between.append(above)
    return None


def _key_cut(above: str, text: str, found: Sequence[request_text.Span]) -> int | None:
    """How much of `text` is request text whose key the line end above cut in two
    (`…Promp` / `t: …`), whatever the widths: pieces of a wrapped line glued to other
    lines are no longer as wide as the wrap (fuzz seed 8081 input 774). None if no
    key runs across the line end."""
    off = len(above)
    starts = {sp.start for sp in found}
    for sp in request_text.spans(above + text):
        if sp.start < off < sp.end and sp.start not in starts:
            return min(sp.end - off, len(text))
    return None


def _left_open(above: str, text: str, between: Sequence[str]) -> int | None:
    """How much of `text` the request text `above` leaves open at its end covers: all
    of it below a raw key, up to the quote that closes (all if none does); None if
    nothing is left open, or a line `between` closed it."""
    found = request_text.spans(above)
    last = found[-1] if found and found[-1].end >= len(above) else None
    if last is None or last.open is None:
        return None
    if last.open == "raw":
        return len(text)
    # a quote left open: closed on a line between, or here, or still open
    if any(request_text.closing_quote(p, last.open) != -1 for p in between):
        return None
    close = request_text.closing_quote(text, last.open)
    return len(text) if close == -1 else close + 1


def _wrapped_end(first: str, below: Sequence[str]) -> int | None:
    """How many of the lines `below` (top down) finish the line a terminal wrapped at
    `first`'s width: pieces as wide as it, then a shorter last one. None if they do
    not (or the line would go on past them)."""
    width = len(first)
    if width > _MAX_WRAP_WIDTH:
        return None
    for i, piece in enumerate(below):
        if len(piece) != width:
            return i + 1 if 0 < len(piece) < width else None
    return None


def _wrapped(first: str, between: Sequence[str], text: str) -> bool:
    """Whether `first`, the lines `between` and `text` are pieces of one line a
    terminal wrapped: every piece but the last as wide as the first."""
    width = len(first)
    return (
        width <= _MAX_WRAP_WIDTH
        and all(len(p) == width for p in between)
        and 0 < len(text) <= width
    )


def decode_line(raw: Buffer, result: ScanResult) -> str:
    if len(raw) > MAX_LINE_BYTES:
        result.skipped["over-long line cut to 1 MiB"] += 1
        raw = raw[:MAX_LINE_BYTES]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        result.skipped["invalid UTF-8 (replaced)"] += 1
        return raw.decode("utf-8", errors="replace")
