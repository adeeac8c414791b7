"""The lane's commonest block, in Python's `re`: plain V1 (or V0) stats lines, without
polars.

A month of a vLLM server's log is a V1 stats line every 10 s per engine, and little
else. The polars lane (lane.py) reads any mix of stats lines, heads and odd lines,
at ~50 ms a 1 MiB block in ~44 queries, and importing polars costs a --jobs worker
~55 MiB of its pages. A block whose candidate lines are plain V1 stats lines, with a
few odd ones among them (start-up lines, a KV cache line), needs none of that: one
`re.finditer` of vLLM's head and the signature's pattern takes every line's groups
(~2 us a line), each stream-minute's aggregates are added up as Builder adds them
(rollup.py) a column at a time, and the odd lines are matched as line by line. A
block of anything else is the polars lane's to judge (`take` returns None, having
recorded nothing), or the line-by-line scan's where the polars lane would refuse it
too (False).

Exactness: this takes a block only where its plain lines would be plain to the
polars lane too (its docstring says why a plain line's hits are the line-by-line
scan's; a V0 line's reasons are a V1 line's: normalise leaves it as it is, its stamp
and no process name are the head's) and its odd lines odd to it, and gives what the
line-by-line scan gives:

- Each line is vLLM's head at INFO (bulk._HEAD's groups, or V0's `INFO MM-DD
  HH:MM:SS metrics.py:396] ` with no process name) followed by one match of the V1 or
  V0 stats pattern that runs to the line's end (a plain line), or any other line.
  (V0's lines are the polars lane's to refuse: it reads bulk._HEAD only.)
  The other lines that hold a literal of any signature (one scan of them, hyperscan's
  where it is installed) are the odd lines: at most lane.MAX_ODD, matched as line by
  line before anything is recorded, their hits in their place (lane.walk).
- The pattern's first match is the one right after the head, and the only one:
  every match holds `Avg prompt throughput: `, which each plain line holds once
  (counted); a match starting in the head would have to hold its `] ` in what
  precedes that literal, which is `Engine N: `, `N Engines Aggregated: ` or nothing
  (V1), or nothing (V0's starts with it). (Which is why only these signatures go this
  way: PLAIN_SIGS.)
- What follows the head holds no record start (a level word and a space: only the
  head's `INFO ` in each line, counted) and no stop literal of the lane (request
  text, Ray's repeat mark, V0's tag, rsyslog's escape). Every other signature the
  plain lines are candidates of (the literals they hold) is shown to match none of
  them: a literal its pattern requires is in no plain line, or (a pattern after a
  literal look-behind, `(?<!L)R`) every R follows an L.
- Every value converts (bulk._converted, the converters themselves), every stamp is
  a real time (rollup.stamp_of).

tests/test_lane.py holds every block to the line-by-line scan with this on and off;
tests/test_lane_plain.py holds its calm minutes to the polars lane's, and each of its
shortcuts (_requires, _convert, prefilter.Literals, _sum, _means) to its long way.
"""

from __future__ import annotations

import re
import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from functools import cache, partial, reduce
from importlib import import_module
from itertools import pairwise
from operator import add
from typing import Any, overload
from weakref import WeakKeyDictionary

from preemptdiag.model.records import CALM_COLUMNS, CALM_MEANS, CalmRows, Columns, column_of
from preemptdiag.scan import lane
from preemptdiag.scan.bulk import _BAD, _converted
from preemptdiag.scan.matcher import Matcher, ScanResult
from preemptdiag.scan.prefilter import Literals
from preemptdiag.scan.rollup import (
    AGG_FIELDS,
    KV,
    RUNNING,
    STREAM_FIELDS,
    WAITING,
    snap6,
    stamp,
    stamp_of,
    stats_preemptions,
)
from preemptdiag.scan.rust_regex import anchored, ascii_only
from preemptdiag.scan.signatures import _INT_LIMIT, FLOAT_LIMIT, PERCENT_LIMIT, Signature

# re's own parser (sre_parse): what literal text a pattern requires (_requires)
_parser: Any = import_module("re._parser")
ENABLED = True  # tests turn it off to hold the polars lane to the line-by-line scan
# The signatures whose match cannot start in vLLM's head (the docstring's argument).
PLAIN_SIGS = ("vllm.v1.stats", "vllm.v0.stats")
# bulk._HEAD at INFO (a stats line's level), with the line captured whole, its process
# and the `[` before the file optional: V0's is `INFO MM-DD HH:MM:SS metrics.py:396] `.
# (Any mix of the two goes as line by line does: tests/test_lane.py, bench/lane_fuzz.py.)
_HEAD = (
    r"(?:\((?P<lane_proc>[^()\n]{1,80}?) pid=\d+\) )?INFO "
    r"(?P<lane_ts>\d\d-\d\d \d\d:\d\d:\d\d) \[?[\w.]+:\d+\] "
)
# Level words after which a record could start (lines._RECORD_START), but `INFO `.
_LEVELS = ("DEBUG ", "WARN", "ERROR ", "CRITICAL ")


class _Full:
    """A signature's line pattern: a plain line's groups, or any other line whole."""

    def __init__(self, sig: Signature, pattern: str) -> None:
        self.regex = re.compile(
            rf"^(?:(?P<lane_line>{_HEAD}(?P<lane_m>{pattern}))(?P<lane_tail>[^\n]*)"
            r"|(?P<lane_other>[^\n]*))",
            re.M,
        )
        at = {name: k - 1 for name, k in self.regex.groupindex.items()}
        self.line, self.m, self.tail, self.other = (
            at[f"lane_{k}"] for k in ("line", "m", "tail", "other")
        )
        self.proc, self.ts = at["lane_proc"], at["lane_ts"]
        self.fields = {name: at[name] for name in sig.fields}
        (self.literal,) = sig.prefilter


# By signature (a Signature holds dicts: no hash); the signature is kept beside it, so
# its id is not reused.
_FULL: dict[int, tuple[Signature, _Full | None]] = {}


def _full(sig: Signature) -> _Full | None:
    got = _FULL.get(id(sig))
    if got is None:
        got = _FULL[id(sig)] = (sig, _made(sig))
    return got[1]


def _made(sig: Signature) -> _Full | None:
    # (its ASCII spelling: the same matches on ASCII text, and `re` reads it as
    # `regex` does; not rust_ok, which would import polars)
    pattern = ascii_only(sig.pattern)
    if (
        pattern is None
        or anchored(sig.pattern)
        or len(sig.prefilter) != 1
        or not lane.fields_readable(sig)
    ):
        return None
    try:
        return _Full(sig, pattern)
    except re.error:
        return None


_PLAIN: WeakKeyDictionary[Matcher, tuple[Signature, ...]] = WeakKeyDictionary()


def _plain_sigs(matcher: Matcher) -> tuple[Signature, ...]:
    got = _PLAIN.get(matcher)
    if got is None:
        got = _PLAIN[matcher] = tuple(
            s for s in matcher.sigs if s.builtin and s.id in PLAIN_SIGS and _full(s) is not None
        )
    return got


# A block is worth this lane with at least this many lines holding a plain
# signature's literal, and one in WORTH_SHARE of its lines: fewer cost less one at a
# time than a finditer over the whole block (a GiB of request logging, a stats line
# among hundreds of request lines: none tried). Its first WORTH_SAMPLE bytes are
# counted first: counting a whole block's newlines and literal is ~0.75 ms, 0.8 s of
# CPU over a GiB of request logging (measured), and its head says no in ~30 us.
WORTH_LINES, WORTH_SHARE, WORTH_SAMPLE = 64, 8, 64 << 10


def worth(matcher: Matcher, block: bytearray, size: int) -> bool:
    """Whether block[:size] is dense enough with plain lines to try (bytes counted)."""
    if not ENABLED:
        return False
    head = min(size, WORTH_SAMPLE)
    for sig in _plain_sigs(matcher):
        full = _full(sig)
        assert full is not None
        literal = full.literal.encode()
        sampled = block.count(literal, 0, head)
        # (a few in 64 KiB: no need to count its lines)
        if sampled < 4 or sampled * WORTH_SHARE < block.count(b"\n", 0, head):
            continue
        n = block.count(literal, 0, size)
        if n >= WORTH_LINES and n * WORTH_SHARE >= block.count(b"\n", 0, size):
            return True
    return False


def take(
    matcher: Matcher,
    source: str,
    text: str,
    first_line: int,
    result: ScanResult,
    odd: lane.Odd,
) -> bool | None:
    """Match and roll up the block's text (ASCII, whole lines) as the line-by-line
    scan would, if its candidate lines are plain V1 stats lines and a few odd ones
    (matched as line by line: `odd`, as lane.try_block has it): True. False, with
    nothing recorded, when the polars lane would not take the block either (a
    candidate line too long or with a stop literal); None when it is the polars
    lane's to judge."""
    if not ENABLED:
        return None
    got = _lines(matcher, text)
    if got is None:
        return None
    sig, full, rows, index, odd_lines = got
    if any(len(t) > lane.MAX_LINE or _holds_stop(t) for _, _, t in odd_lines):
        return False
    block = _Block.of(sig, full, rows, index, first_line)
    if block is None:
        return None
    plain = text if index is None else "\n".join(block.rows.texts)
    if not _alone(matcher, sig, full, block, plain):
        return None
    sink = result.sink
    assert sink is not None
    others = _odd_hits(matcher, odd_lines, odd, block, index, first_line, sink.clock)
    if isinstance(others, bool):
        return None if others else False
    _roll(source, block, index, others, result)
    return True


Lines = tuple[
    Signature,
    _Full,
    list[tuple[str | None, ...]],
    list[int] | None,
    list[tuple[int, int, str]],
]


def _lines(matcher: Matcher, text: str) -> Lines | None:
    """(the signature, its pattern, each plain line's groups, their line indexes in
    the block (None when every line is one), the other candidate lines (line index,
    where it starts, its text)), or None when the block does not qualify: no plain
    line, too many other candidate lines."""
    sig = _first(matcher, text)
    if sig is None:
        return None
    full = _full(sig)
    assert full is not None
    got = [m.groups() for m in full.regex.finditer(text)]
    lines = text.count("\n") + (not text.endswith("\n"))
    if len(got) == lines + 1:
        got.pop()  # the empty match after the last newline
    if len(got) != lines:
        return None
    m, tail, other = full.m, full.tail, full.other
    rows = [g for g in got if g[m] is not None]
    if not rows or any(g[tail] for g in rows):
        return None  # (something after the match: the polars lane's to judge)
    if len(rows) == len(got):
        return sig, full, rows, None, []
    rest: list[str] = [g[other] for g in got if g[m] is None]
    found = Literals.of(matcher.literals).found("\n".join(rest).encode("ascii"))
    index = [k for k, g in enumerate(got) if g[m] is not None]
    if not found:
        return sig, full, rows, index, []
    # The candidate lines among the others (a literal in them: the prefilter's test)
    # and where each starts (ASCII: a character is a byte).
    cands = [k for k, g in enumerate(got) if g[m] is None and any(lit in g[other] for lit in found)]
    if len(cands) > lane.MAX_ODD:
        return None
    line, starts = full.line, [0]
    for g in got:
        starts.append(starts[-1] + 1 + (len(g[other]) if g[m] is None else len(g[line])))
    return sig, full, rows, index, [(k, starts[k], got[k][other]) for k in cands]


def _holds_stop(text: str) -> bool:
    return any(lit in text for lit in lane._STOP)


def _odd_hits(
    matcher: Matcher,
    odd_lines: list[tuple[int, int, str]],
    odd: lane.Odd,
    block: _Block,
    index: list[int] | None,
    first_line: int,
    clock: tuple[str, str] | None,
) -> dict[int, ScanResult] | bool:
    """lane._odd_lines: the odd candidate lines matched as line by line (by line
    index). False when the block must go line by line: one in the block's tail, one a
    wrapped record's rejoin reached from, a hit that would move the clock or has no
    stamp (the polars lane finds the same of the same lines: a line with no stats hit
    is odd to it too). True when one gives a stats hit (the polars lane may read it
    as a plain line of another signature)."""
    if not odd_lines:
        return {}
    assert index is not None
    out = lane.match_odd(
        matcher,
        odd,
        ((k, start, start + len(line), first_line + k) for k, start, line in odd_lines),
    )
    if isinstance(out, bool):
        return out
    # Each odd hit's clock must be the one the sink has there: the last plain line's
    # above it. Above the first plain line, the sink's before the block or the first
    # plain line's: the sink closes the open rollups of another clock on that hit as
    # it would line by line, and the block's first edges find its clock set. (lane.py
    # allows only the sink's: a log's start-up lines, above its first stats line,
    # sent its first block line by line.)
    ts = block.rows.ts
    first = ("e", ts[0][:5]) if ts[0] is not None else None
    for k, got in out.items():
        above = bisect_left(index, k) - 1
        stamp_now = ts[above] if above >= 0 else None
        allowed = {("e", stamp_now[:5])} if stamp_now is not None else {clock, first}
        for h in got.hits:
            when = stamp(h)
            if when[0] is None or when[1] is None or when[0] not in allowed:
                return False
    return out


def _first(matcher: Matcher, text: str) -> Signature | None:
    """The plain signature of the block's first line holding one of their literals."""
    sigs = _plain_sigs(matcher)
    best, at = None, len(text)
    for sig in sigs:
        full = _full(sig)
        assert full is not None
        p = text.find(full.literal, 0, at)
        if p == -1:
            continue
        start = text.rfind("\n", 0, p) + 1
        m = full.regex.match(text, start)
        if m is not None and m.group("lane_m") is not None:
            best, at = sig, p
    return best


class _Block:
    """A block's plain lines as columns (lane._Rows) and what the rollups read."""

    __slots__ = ("floats", "lower", "minutes", "npre", "rows", "secs", "streams")

    def __init__(self, rows: lane._Rows, minutes: list[str], secs: list[str]) -> None:
        self.rows = rows
        self.minutes = minutes
        self.secs = secs
        self.streams: list[tuple[object, ...]] | None = None  # None: one stream
        # AGG_FIELDS' values as floats (rollup.number), None for a field not there
        self.floats: list[list[float | None] | None] = []
        self.npre: list[int] | None = None  # None: no line carries a count
        self.lower: list[bool] | None = None

    @classmethod
    def of(
        cls,
        sig: Signature,
        full: _Full,
        groups: list[tuple[str | None, ...]],
        index: list[int] | None,
        first_line: int,
    ) -> _Block | None:
        """The columns, None when a value does not convert or a stamp is no time.
        Empties `groups`, and lets each field's texts go once converted: a 1 MiB
        block's groups are ~5 MB of str objects, most of its peak memory."""
        cols: list[Sequence[Any]] = list(zip(*groups, strict=True))
        groups.clear()
        typed: dict[str, list[Any]] = {}
        for name, typ in sig.fields.items():
            raw = cols[full.fields[name]]
            cols[full.fields[name]] = ()  # (its texts go with `raw`)
            if typ == "str":
                typed[name] = list(raw)
                continue
            distinct = set(raw)
            if len(distinct) * 2 > len(raw) and None not in distinct:
                # (most values differ, throughputs: each converted, not each distinct)
                each = _convert_each(raw, typ)
                if each is not None:
                    typed[name] = each
                    continue
            conv = _convert([v for v in distinct if v is not None], typ)
            if conv is None:
                return None
            conv[None] = None
            typed[name] = list(map(conv.__getitem__, raw))
        ts: list[str | None] = list(cols[full.ts])  # (a plain line's stamp: never None)
        minutes = [t[:11] for t in ts if t is not None]
        secs = [t[12:] for t in ts if t is not None]
        if not _real(minutes, secs):
            return None
        texts: list[str] = list(cols[full.line])
        matched: Sequence[str] = cols[full.m]
        n = len(texts)
        lineno = (
            list(range(first_line, first_line + n))
            if index is None
            else [first_line + k for k in index]
        )
        rows = lane._Rows(
            sig=sig,
            lineno=lineno,
            texts=texts,
            start=_Starts(texts, matched),
            proc=_one_each(list(cols[full.proc])),
            ts=ts,
            wrapper=None,
            typed=typed,
        )
        block = cls(rows, minutes, secs)
        block._derive()
        return block

    def _derive(self) -> None:
        """Stream keys, the aggregated fields as floats, preemption counts."""
        r = self.rows
        n = len(r.lineno)
        parts: list[Sequence[object]] = [r.proc]
        for name in r.sig.fields:
            col = r.typed[name]
            nulls = col.count(None)
            if 0 < nulls < n:  # (constant in the block otherwise)
                parts.append([v is None for v in col])
        parts += [r.typed[k] for k in STREAM_FIELDS if k in r.sig.fields]
        if any(len(set(p)) > 1 for p in parts):
            self.streams = list(zip(*parts, strict=True))
        for k in AGG_FIELDS:
            values = r.typed.get(k)
            nulls = n if values is None else values.count(None)
            if values is None or nulls == n:
                self.floats.append(None)
            elif nulls == 0:
                # (a float field's values are floats; an int field's are made floats)
                exact = r.sig.fields[k] in ("float", "percent", "fraction_percent")
                self.floats.append(values if exact else list(map(float, values)))
            else:
                self.floats.append([None if v is None else float(v) for v in values])
        counts = [r.typed[k] for k in lane._PREEMPT_FIELDS if k in r.typed]
        if any(col.count(None) < n for col in counts):
            pairs = [_preemptions(r, i) for i in range(n)]
            self.npre = [p for p, _ in pairs]
            self.lower = [low for _, low in pairs]


# Digits and points only (with the NULs that join them): a number the converters
# read as float() or int() does, no comma or sign to take off first.
_DIGITS = re.compile(r"[0-9.\x00]*")
_FAST = {"float": (float, FLOAT_LIMIT), "percent": (float, PERCENT_LIMIT)}
_FAST_INT = {"int": _INT_LIMIT, "int_commas": _INT_LIMIT}


class _Starts(Sequence[int]):
    """Where each line's match starts (after its head), worked out when asked: the
    hits and calm minutes ask for a few lines of a block. It keeps the matches'
    lengths, not the matches (~0.9 MB of a 1 MiB block's peak)."""

    __slots__ = ("_lines", "_matched")

    def __init__(self, lines: list[str], matched: Sequence[str]) -> None:
        self._lines = lines
        self._matched = array("i", map(len, matched))  # (each match's length)

    def __len__(self) -> int:
        return len(self._lines)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...
    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice):
            return [len(a) - b for a, b in zip(self._lines[i], self._matched[i], strict=True)]
        return len(self._lines[i]) - self._matched[i]

    def at(self, rows: list[int]) -> list[int]:
        """[self[i] for i in rows], without a method call a row."""
        lines, matched = self._lines, self._matched
        return [len(lines[i]) - matched[i] for i in rows]


def _convert_each(raw: Sequence[str], typ: str) -> list[Any] | None:
    """Digit strings converted in their order as CONVERTERS[typ] converts them (float()
    or int() at once: the converters' own checks are their ranges, checked on the
    maximum); None where the converter's long way is needed."""
    if not raw or not _DIGITS.fullmatch("\x00".join(raw)):
        return None
    try:
        if typ in _FAST:
            make, limit = _FAST[typ]
            values: list[Any] = list(map(make, raw))
            top = max(values)
            return values if top <= limit and (typ == "percent" or top < limit) else None
        if typ in _FAST_INT:
            values = list(map(int, raw))
            return values if max(values) < _FAST_INT[typ] else None
    except ValueError:
        pass  # (`1.2.3`: the converter says so)
    return None


def _convert(raw: list[str], typ: str) -> dict[Any, Any] | None:
    """Each distinct value converted as CONVERTERS[typ] converts it; None when one does
    not convert. (Digit strings, nearly all of them: _convert_each.)"""
    values = _convert_each(raw, typ)
    if values is not None:
        return dict(zip(raw, values, strict=True))
    conv = _converted(raw, typ)
    if any(v is _BAD for v in conv.values()):
        return None
    return dict(conv)


def _real(minutes: list[str], secs: list[str]) -> bool:
    """Whether every `MM-DD HH:MM` and seconds is a real time (rollup.stamp_of): each
    hour's day and hour, then minutes and seconds up to 59."""
    hours = {m[:8] for m in set(minutes)}
    if any(stamp_of(None, f"{h}:00:00")[1] is None for h in hours):
        return False
    return max(secs) <= "59" and max(m[9:] for m in set(minutes)) <= "59"


def _one_each(values: list[str | None]) -> list[str | None]:
    """lane._shared: equal values one object (a block's lines nearly always have one
    process name: that in C, ~0.7 ms a block less)."""
    if values.count(values[0]) == len(values):
        return [values[0]] * len(values)
    return lane._shared(values)


def _preemptions(r: lane._Rows, i: int) -> tuple[int, bool]:
    """rollup.stats_preemptions of line i."""
    return stats_preemptions({k: r.typed[k][i] for k in lane._PREEMPT_FIELDS if k in r.typed})


def _alone(matcher: Matcher, sig: Signature, full: _Full, block: _Block, text: str) -> bool:
    """Whether the plain lines (`text`, joined) are candidates of `sig` alone, or of
    others that match none of them, with nothing in them that sends a line another way."""
    texts = block.rows.texts
    if max(map(len, texts)) > lane.MAX_LINE:
        return False
    n = len(texts)
    if text.count("INFO ") != n or text.count(full.literal) != n:
        return False
    data = text.encode("ascii")
    present = [lit for lit in matcher.literals if lit in texts[0]]
    rest = [lit for lit in matcher.literals if lit not in present]
    stops = (*lane._STOP, *_LEVELS)
    # One scan for what must not be there (a stop literal, a level word) and the
    # other literals (a line holding one is a candidate of more signatures), one for
    # what those signatures' patterns require. (Two databases: hyperscan compiled the
    # ~145 literals of both in one with a ~19 MiB peak, against ~4 MiB for the two.)
    found = Literals.of((*stops, *rest)).found(data)
    if any(lit in found for lit in stops):
        return False
    # (a `Preemptions: N` on some lines, say: their signatures are shown too)
    needs = _needs(matcher, sig, present + [lit for lit in rest if lit in found])
    if needs is None:
        return False
    found = Literals.of(_required(needs)).found(data)
    return all(_matches_none(need, found, text) for need in needs)


Need = tuple[tuple[str, ...], tuple[str, str] | None]


def _needs(matcher: Matcher, sig: Signature, present: list[str]) -> list[Need] | None:
    """What each other signature the literals make the lines candidates of requires
    (_requires); None when one is not builtin or cannot be read, or `sig` is not one."""
    cands = matcher.candidates(" \n ".join(present))
    if sig not in cands or not all(s.builtin for s in cands):
        return None
    needs = [_requires(s.pattern) for s in cands if s is not sig]
    return None if any(need is None for need in needs) else needs  # type: ignore[return-value]


def _required(needs: list[Need]) -> tuple[str, ...]:
    return tuple(sorted({lit for need in needs for lit in need[0]}))


def _matches_none(need: Need, found: set[str], text: str) -> bool:
    """Whether a pattern that requires `need` (_requires) matches none of the lines of
    `text` (shown, not tried): a literal it requires is not in it (`found`: those that
    are), or it starts with a literal look-behind `(?<!L)` before a literal R, and every
    R in `text` follows an L."""
    literals, behind = need
    if any(lit not in found for lit in literals):
        return True
    if behind is not None:
        # (R overlaps no other R: each LR holds its own R, so equal counts mean every
        # R follows an L; an R near a line's start has a newline, no L, before it)
        before, after = behind
        return text.count(after) == text.count(before + after)
    return False


@cache
def _requires(pattern: str) -> tuple[tuple[str, ...], tuple[str, str] | None] | None:
    """(runs of literal text every match of `pattern` holds, longest first; (L, R)
    where it starts `(?<!L)R` with literal L and R), None when it cannot be read."""
    try:
        parsed = _parser.parse(pattern)
    except (re.error, RecursionError):
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None
    runs: list[str] = []
    current: list[str] = []

    def flush() -> None:
        if current:
            runs.append("".join(current))
            current.clear()

    def walk(items: Any) -> bool:
        for op, av in items:
            if op is _parser.LITERAL:
                current.append(chr(av))
            elif op is _parser.SUBPATTERN:
                if av[1] & re.IGNORECASE:
                    return False
                if not walk(av[3]):
                    return False
            elif op in (_parser.MAX_REPEAT, _parser.MIN_REPEAT) and av[0] >= 1:
                flush()
                if not walk(av[2]):
                    return False
                flush()
            else:
                flush()
        return True

    if not walk(parsed):
        return None
    flush()
    behind = None
    items = list(parsed)
    if len(items) >= 2 and items[0][0] is _parser.ASSERT_NOT and items[0][1][0] == -1:
        before = _literal_text(items[0][1][1])
        after = _leading_literal(items[1:])
        if before and after and "\n" not in before + after and _border_free(after):
            behind = (before, after)
    return tuple(sorted(set(runs), key=lambda r: (-len(r), r))), behind


def _literal_text(items: Any) -> str | None:
    out = []
    for op, av in items:
        if op is not _parser.LITERAL:
            return None
        out.append(chr(av))
    return "".join(out)


def _border_free(s: str) -> bool:
    """No proper prefix of s is also its suffix: two of its occurrences never overlap."""
    return all(s[:k] != s[-k:] for k in range(1, len(s)))


def _leading_literal(items: Any) -> str:
    out = []
    for op, av in items:
        if op is not _parser.LITERAL:
            break
        out.append(chr(av))
    return "".join(out)


# --- the rollups ---------------------------------------------------------------------

Seg = tuple[int, int, list[int], int, bool, object, int]
# Builder adds a field's values one at a time; sum() does that for floats up to 3.11
# and adds with compensation from 3.12 (then: reduce, ~3x slower).
_sum: Callable[[list[float]], float] = (
    partial(sum, start=0.0) if sys.version_info < (3, 12) else partial(reduce, add, initial=0.0)
)


def _roll(
    source: str,
    block: _Block,
    index: list[int] | None,
    others: dict[int, ScanResult],
    result: ScanResult,
) -> None:
    """lane._roll of the block's lines: segments (one stream, one clock minute, stamps
    not going back, no change of clock between), the edges through the sink, the
    inner ones aggregated as Builder aggregates, as calm minutes where they are, the
    odd lines' hits (`others`, by line index) in their place."""
    sink = result.sink
    assert sink is not None
    segs = _segments(block, index)
    inner = [s for s in segs if not s[4]]
    agg = _Aggs(block, [s[2] for s in inner])
    calm: set[int] = set()
    kv_limit = result.calm_kv
    if kv_limit is not None and "cumulative" not in block.rows.sig.fields:
        quiet = {inner[j][0] for j in agg.quiet(block, kv_limit)}
        if quiet:
            calm = lane.calm_of(
                quiet, ((s[0], block.minutes[s[0]], s[3], s[4]) for s in segs), others
            )
    if calm:
        chosen = [j for j, s in enumerate(inner) if s[0] in calm]
        result.calm.append(_calm_rows(source, block, agg, chosen))
    aggs = {s[0]: agg.one(j) for j, s in enumerate(inner) if s[0] not in calm}
    lane.walk(source, [block.rows], segs, aggs, calm, others, sink, result)


def _segments(block: _Block, index: list[int] | None) -> list[Seg]:
    """The block's segments in order of their first lines: (seg: its first line,
    where it is among the block's lines (`index`), members, clock run, edge, stream,
    set 0)."""
    minutes, secs = block.minutes, block.secs
    n = len(minutes)
    if block.streams is None:
        # One stream: a segment ends where the minute changes or the seconds go back.
        cuts = [
            i
            for i, a, b, x, y in zip(
                range(1, n), minutes, minutes[1:], secs, secs[1:], strict=False
            )
            if a != b or x > y
        ]
        bounds = [0, *cuts, n]
        out: list[list[Any]] = []
        run, clock = 0, minutes[0][:5]
        for a, b in pairwise(bounds):
            if minutes[a][:5] != clock:
                clock = minutes[a][:5]
                run += 1
            out.append([a, a, list(range(a, b)), run, False, None, 0])
        return _edges(out, run, index)
    streams = block.streams
    open_: dict[object, list[Any]] = {}  # stream -> [minute, sec, run, members]
    segs: list[list[Any]] = []
    run, minute_now, clock = 0, minutes[0], minutes[0][:5]
    for i, (minute, sec, stream) in enumerate(zip(minutes, secs, streams, strict=True)):
        if minute != minute_now:
            minute_now = minute
            if minute[:5] != clock:
                clock = minute[:5]
                run += 1
        o = open_.get(stream)
        if o is not None and o[0] == minute and o[1] <= sec and o[2] == run:
            o[1] = sec
            o[3].append(i)
            continue
        members = [i]
        open_[stream] = [minute, sec, run, members]
        segs.append([i, i, members, run, False, stream, 0])
    return _edges(segs, run, index)


def _edges(segs: list[list[Any]], last_run: int, index: list[int] | None) -> list[Seg]:
    """The segments with their edge flags (the first of each stream in the block's
    first clock, the last of each in its last one: they go through the sink) and
    their first lines' places among the block's lines."""
    first_of: dict[object, int] = {}
    last_of: dict[object, int] = {}
    for k, s in enumerate(segs):
        first_of.setdefault(s[5], k)
        last_of[s[5]] = k
    for k in {*first_of.values(), *last_of.values()}:
        s = segs[k]
        s[4] = (s[3] == 0 and first_of[s[5]] == k) or (s[3] == last_run and last_of[s[5]] == k)
    if index is not None:
        for s in segs:
            s[1] = index[s[0]]
    return [tuple(s) for s in segs]


class _Aggs:
    """What Builder accumulates over each inner segment's lines (rollup.Builder.add),
    a column at a time: per AGG_FIELDS field its sums, counts and maxima, and the
    segments' line counts, preemptions, lines with Waiting > 0, evidence line, peak
    KV and fewest running at it."""

    def __init__(self, block: _Block, members: list[list[int]]) -> None:
        self.members = members
        self.n = n = [len(m) for m in members]
        contiguous = all(m[-1] - m[0] + 1 == len(m) for m in members)

        def parts(col: Sequence[Any]) -> list[Any]:
            if contiguous:
                return [col[m[0] : m[-1] + 1] for m in members]
            return [[col[i] for i in m] for m in members]

        none: list[Any] = [None] * len(members)
        self.sums: list[list[float]] = []
        self.counts: list[list[int]] = []
        self.maxes: list[list[float | None]] = []
        values: list[list[Any] | None] = []
        for col in block.floats:
            if col is None:
                self.sums.append([0.0] * len(members))
                self.counts.append([0] * len(members))
                self.maxes.append(none)
                values.append(None)
                continue
            groups = parts(col)
            # (a field is there on every line of a stream or on none)
            there = [g[0] is not None for g in groups]
            self.sums.append([_sum(g) if t else 0.0 for g, t in zip(groups, there, strict=True)])
            self.counts.append([k if t else 0 for k, t in zip(n, there, strict=True)])
            self.maxes.append([max(g) if t else None for g, t in zip(groups, there, strict=True)])
            values.append(groups)
        self.npre = none if block.npre is None else parts(block.npre)
        self.pre = [0] * len(members) if block.npre is None else list(map(sum, self.npre))
        self.lower = (
            [False] * len(members) if block.lower is None else list(map(any, parts(block.lower)))
        )
        waits = values[WAITING]
        self.waiting_pos = [
            0 if w is None or w[0] is None or mx is None or mx <= 0 else sum(v > 0 for v in w)
            for w, mx in zip(waits or none, self.maxes[WAITING], strict=True)
        ]
        kv = block.floats[KV]
        # Builder's evidence pick: the first line with the highest (KV or -1,
        # preemptions); its peak KV (-1 on a line without one) and the fewest running
        # on a line at it.
        if kv is None:
            picks = filled = parts([-1.0] * len(block.minutes))
        else:
            # (a KV of 0 picks as -1, as a missing one; the column itself where it has
            # neither)
            whole = None not in kv
            filled = parts(kv if whole else [-1.0 if v is None else v for v in kv])
            picks = filled if whole and 0.0 not in kv else parts([v or -1.0 for v in kv])
        self.peak_at = [
            g.index(max(g)) if not pre else _first_max(list(zip(g, p, strict=True)))
            for g, pre, p in zip(picks, self.pre, self.npre, strict=True)
        ]
        self.peak_kv = list(map(max, filled))
        runs = values[RUNNING]
        self.peak_running = [
            None if r is None or r[0] is None else _fewest(r, f, pk)
            for r, f, pk in zip(runs or none, filled, self.peak_kv, strict=True)
        ]

    def quiet(self, block: _Block, kv_limit: float) -> list[int]:
        """lane._calm_segments' test: no line preempted or carries a preemption count
        (a stream's lines all do or none), every line says how many wait, KV under the
        limit. The segments' positions."""
        counted = block.rows.typed.get("preemptions")
        out = []
        for j, (m, k) in enumerate(zip(self.members, self.n, strict=True)):
            kv = self.maxes[KV][j]
            if (
                self.pre[j] == 0
                and not self.lower[j]
                and (counted is None or counted[m[0]] is None)
                and self.counts[WAITING][j] == k
                and not (kv is not None and kv >= kv_limit)
            ):
                out.append(j)
        return out

    def one(self, j: int) -> lane._Agg:
        m = self.members[j]
        pre = self.npre[j]
        return lane._Agg(
            rows=tuple(m),
            n=self.n[j],
            preemptions=self.pre[j],
            lower=self.lower[j],
            sums=tuple(s[j] for s in self.sums),
            counts=tuple(c[j] for c in self.counts),
            maxes=tuple(x[j] for x in self.maxes),
            waiting_pos=self.waiting_pos[j],
            peak_row=m[self.peak_at[j]],
            peak_kv=self.peak_kv[j],
            peak_running=self.peak_running[j],
            preempting=()
            if pre is None
            else tuple(i for i, p in zip(m, pre, strict=True) if p > 0)[:2],
        )


def _first_max(keys: list[Any]) -> int:
    return keys.index(max(keys))


def _fewest(runs: list[float], filled: list[float], peak: float) -> int:
    if filled.count(peak) == 1:
        return int(runs[filled.index(peak)])
    return min(int(r) for r, f in zip(runs, filled, strict=True) if f == peak)


def _calm_rows(source: str, block: _Block, agg: _Aggs, chosen: list[int]) -> CalmRows:
    """lane._calm_set's rows of the chosen inner segments, from Python lists."""
    r = block.rows
    sig = r.sig
    members = [agg.members[j] for j in chosen]
    first = [m[0] for m in members]
    last = [m[-1] for m in members]
    peak = [agg.members[j][agg.peak_at[j]] for j in chosen]
    ts: list[str] = r.ts  # type: ignore[assignment]

    def take(values: Sequence[Any], which: list[int]) -> list[Any]:
        return [values[i] for i in which]

    every = len(chosen) == len(agg.members)  # (the usual: every inner segment, in order)

    def pick(values: list[Any]) -> list[Any]:
        return values if every else [values[j] for j in chosen]

    stamp_first = take(ts, first)
    stamp_peak = take(ts, peak)
    swapped, waiting = r.typed.get("swapped"), r.typed.get("waiting")
    cols: dict[str, tuple[str, list[Any]]] = {
        "first_line": ("q", take(r.lineno, first)),
        "first_second": ("q", [int(t[12:14]) for t in stamp_first]),
        "last_line": ("q", take(r.lineno, last)),
        "last_second": ("q", [int(t[12:14]) for t in take(ts, last)]),
        "last_pos": ("q", _starts_at(r.start, last)),
        "day": ("s", [t[:5] for t in stamp_first]),
        "hour": ("q", [int(t[6:8]) for t in stamp_first]),
        "minute": ("q", [int(t[9:11]) for t in stamp_first]),
        "n": ("q", pick(agg.n)),
        "peak_kv": ("d", pick(agg.peak_kv)),
        "peak_running": ("q", pick(agg.peak_running)),
        "swapped_first": ("", [None] * len(chosen) if swapped is None else take(swapped, first)),
        "swapped_last": ("", [None] * len(chosen) if swapped is None else take(swapped, last)),
        "waiting_first": ("", [None] * len(chosen) if waiting is None else take(waiting, first)),
        "waiting_last": ("", [None] * len(chosen) if waiting is None else take(waiting, last)),
        "waiting_pos": ("q", pick(agg.waiting_pos)),
        "peak_line": ("q", take(r.lineno, peak)),
        "peak_pos": ("q", _starts_at(r.start, peak)),
        "peak_text": ("s", take(r.texts, peak)),
        "peak_second": ("q", [int(t[12:14]) for t in stamp_peak]),
        "peak_proc": ("s", take(r.proc, peak)),
    }
    for k, name in enumerate(AGG_FIELDS):
        sums, counts = pick(agg.sums[k]), pick(agg.counts[k])
        cols[f"sum_{name}"] = ("d", sums)
        cols[f"cnt_{name}"] = ("q", counts)
        cols[f"max_{name}"] = ("d", pick(agg.maxes[k]))
        if name in CALM_MEANS:
            cols[f"mean_{name}"] = ("d", _means(sums, counts))
    names = (*CALM_COLUMNS, *(f"f_{n}" for n in sig.fields))
    data = [_column(*cols[c]) for c in CALM_COLUMNS]
    data += [_column(_KIND.get(sig.fields[n], ""), take(r.typed[n], peak)) for n in sig.fields]
    return lane.calm_rows(source, sig, False, Columns(names, tuple(data)))


_KIND = {"int": "q", "int_commas": "q", "float": "d", "percent": "d", "str": "s"}


def _starts_at(starts: Sequence[int], rows: list[int]) -> list[int]:
    """Where the match of each of `rows` starts (a block's _Starts, or any sequence)."""
    return starts.at(rows) if isinstance(starts, _Starts) else [starts[i] for i in rows]


def _means(sums: list[float], counts: list[int]) -> list[float | None]:
    """windows.snapped_mean of each minute's sum and count, as lane._calm_set: snap6
    of snap6(sum) over the count. (Sums of digit strings are finite and not negative,
    where snap6 is its rounding alone; any other goes through snap6 itself.)"""
    if all(0.0 <= s < 1e300 for s in sums):
        return [
            round(round(s * 1e6) / 1e6 / c * 1e6) / 1e6 if c else None
            for s, c in zip(sums, counts, strict=True)
        ]
    return [snap6(snap6(s + 0.0) / c) if c else None for s, c in zip(sums, counts, strict=True)]


def _column(code: str, values: list[Any]) -> Sequence[Any]:
    """A column as lane.plain_columns keeps it (records.column_of): `d` floats, `q`
    ints, `s` strings."""
    return column_of(values, code if code in ("d", "q") else None)
