"""Candidate lines matched in bulk: the regexes of a block's many like lines (a stats
line every 10 s over a month of log) run as one polars column operation.

Measured on a vLLM V1 stats line (~230 characters, seven candidate signatures):
~80 us a line in Matcher.match, of which ~33 us are the `regex` searches and ~14 us
the field extraction; polars' Rust regex runs the same searches over a column at
~1-2 us a line. So the lines of a block that share one set of candidate signatures
are searched together, and a line where exactly one signature matches exactly once
(what nearly every signal line is) becomes its hit straight from the columns.

Exactness: this must give what Matcher.match gives, line by line.
- Only builtin signatures whose pattern polars' Rust regex accepts run in polars
  (no look-around, no back-references); the others of the set run in `regex` per
  line, as before. A pattern that can match the empty string stays out (empty
  matches are where two engines' finditer may count differently). Two exceptions,
  each proved against its definition in the tests: a line whose whole text fits a
  signature's `plain` shape (SGLang's batch lines, whose pattern has bounded
  look-aheads) holds one match of it, read from the shape's captures; and where a
  signature's zero test (rust_regex.zero_test) finds nothing, it matches nothing.
- Only ASCII lines: there `\\d`, `\\w`, `\\s` and case folding mean the same in both
  engines, and character and byte offsets agree. Both engines are leftmost-first,
  so a pattern gives the same match and captures on either.
- Anything but one match in all the set (none, two, a glued second record), a
  request marker in the line, a value that does not convert, or a line inside a
  record a wrap rejoin took: the line goes to Matcher.match, which decides.
tests/test_bulk.py holds the two to identical hits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING, Any

import regex

from preemptdiag.model.records import FieldValue, Hit, Kind
from preemptdiag.scan import lines as ln
from preemptdiag.scan.lines import Line
from preemptdiag.scan.matcher import (
    Matcher,
    ScanResult,
    Stamps,
    cut,
    decoy_position,
    new_hit,
    ts_tag,
)
from preemptdiag.scan.rollup import RollupSink, key_of, space_of, stamp_of
from preemptdiag.scan.rust_regex import ascii_only, rust_ok, usable, zero_test
from preemptdiag.scan.signatures import (
    CONVERTERS,
    FLOAT_LIMIT,
    PERCENT_LIMIT,
    PLAIN_MATCH,
    PLAIN_PRE,
    Signature,
)

if TYPE_CHECKING:
    from preemptdiag.scan.wrap import NextLine

# Fewer like lines than this in a block: the per-call cost of polars (tens of us a
# column operation) is more than it saves; they are matched one by one.
MIN_LINES = 48
# Candidate lines a scan matches one by one before it turns to polars: its string
# kernels page in ~10 MiB more of its library (peak RSS of a 1-day stats log: 90 ->
# 101 MiB), worth it only where the per-line cost is seconds (~2.5 days of stats).
AFTER_LINES = 20_000
# An input this big on disk turns to polars at its first block of DENSE_LINES
# candidate lines or more (a block of stats lines holds ~4,300; that block goes in
# bulk, the lane is tried from the next), not after AFTER_LINES: a 30-day stats log
# spent 2 s of its 10 on its first 20,000 one by one.
# Smaller inputs keep AFTER_LINES (at once, a 1-day stats log was 0.15 s faster but
# 88 -> 102 MiB), and so does a big sparse log (tried from its first block, a 1 GiB
# log with 7 candidate lines a block paid 0.1 s and 4 MiB of lane tries for nothing).
BIG_BYTES = 8 << 20
DENSE_LINES = 1000
RETRY_BLOCKS = 64  # blocks matched one by one after a block where bulk did not pay
# Group names for the match's prefix and whole (no signature field is named so).
_PRE, _ALL = "bulk_prefix_", "bulk_match_"
# Converters polars runs on a column with the same results, on text of this shape
# (a digit string: Python's int and float and polars' casts both give the exact
# integer and the correctly rounded double; 18 digits always fit in 64 bits).
_CAST_SHAPES = {
    "int": r"^\d{1,18}$",
    "int_commas": r"^\d{1,18}$",
    "float": r"^\d+(?:\.\d+)?$",
    "percent": r"^\d+(?:\.\d+)?$",
}


def cast_column(col: Any, typ: str) -> tuple[Any, Any]:
    """(whether each value is one polars converts as CONVERTERS[typ] does, the values
    cast) of a column (Series or expression) of a _CAST_SHAPES type: null, or of the
    shape and inside the converter's range (a digit string is never negative). Out of
    range (a float past 1e15, a percentage past 1000 %, damage), the converter refuses
    the value; cast, it would be aggregated (fuzzed: `usage: 9999...9%` read as 1e41 %)."""
    import polars as pl

    typed = col.cast(pl.Float64 if typ in ("float", "percent") else pl.Int64, strict=False)
    fits = col.str.contains(_CAST_SHAPES[typ])
    if typ == "float":
        fits = fits & (typed < FLOAT_LIMIT)
    elif typ == "percent":
        fits = fits & (typed <= PERCENT_LIMIT)
    return col.is_null() | fits, typed


# vLLM's head before a stats line, `(APIServer pid=1) INFO 06-03 08:00:00
# [loggers.py:236] `: where it is all that precedes the match, proc_before finds the
# name (the only `(... pid=N)`: the name holds no parenthesis) and engine_ts_before
# the stamp (the last one: the bracket holds no space, so no stamp can follow).
_HEAD = (
    r"^(?P<bulk_head_>\((?P<bulk_proc_>[^()\n]{1,80}?) pid=\d+\) "
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) (?P<bulk_ts_>\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\[[\w.]+:\d+\] )"
)


@dataclass(slots=True)
class Item:
    """A candidate line of a block, in order, with what Matcher.match needs."""

    lineno: int
    raw: str
    following: NextLine
    before: NextLine


@dataclass(slots=True)
class _Ready:
    """One line's single match, found in bulk."""

    line: Line
    sig: Signature
    start: int
    end: int
    groups: dict[str, str | None]
    # (proc, engine stamp) as new_hit finds them, where the head before the match has
    # vLLM's plain shape (_HEAD); None: found per line.
    head: tuple[str, str] | None = None
    # The converted fields (in signature order), where polars converted them: None,
    # converted per line.
    typed: dict[str, FieldValue] | None = None


def match_block(
    matcher: Matcher, source: str, items: Sequence[Item], result: ScanResult, bulk: bool
) -> bool:
    """Match `items` in order, as Matcher.match would one by one; with `bulk`, like
    lines together where that pays. True when some did (scan_fast stops trying for
    a while when not: the work to find out is done again per line)."""
    ready: dict[int, _Ready] = {}
    if bulk and len(items) >= MIN_LINES:
        ready = _find(matcher, items)
    for k, it in enumerate(items):
        r = ready.get(k)
        if r is None or not _emit(matcher, source, it.lineno, r, result):
            matcher.match(source, it.lineno, it.raw, it.following, result, prev_raw=it.before)
    return bool(ready)


def _find(matcher: Matcher, items: Sequence[Item]) -> dict[int, _Ready]:
    """The lines (by position in `items`) that hold exactly one match of their
    candidate signatures, with that match."""
    groups: dict[tuple[str, ...], list[tuple[int, Line, list[Signature]]]] = {}
    builtin: dict[tuple[str, ...], bool] = {}  # by set of candidates: all builtin
    for k, it in enumerate(items):
        if decoy_position(it.raw) is not None:
            continue  # request text in the line: Matcher.match sorts it out
        cands = matcher.candidates(it.raw)
        ids = tuple([s.id for s in cands])
        ok = builtin.get(ids)
        if ok is None:
            ok = builtin[ids] = bool(cands) and all(s.builtin for s in cands)
        if not ok:
            continue
        stripped = it.raw.rstrip("\r\n")
        line = ln.normalise(stripped)
        # No marker in the raw line: none in its text either where that is the line.
        if not line.text.isascii() or (
            line.text != stripped and decoy_position(line.text) is not None
        ):
            continue
        groups.setdefault(ids, []).append((k, line, cands))
    ready: dict[int, _Ready] = {}
    for members in groups.values():
        if (
            len(members) >= MIN_LINES
            # usable() first: _worth_it asks polars (rust_ok), which a worker forked
            # from a process whose polars pool runs must never touch (it deadlocks).
            and usable()
            and _worth_it(members[0][1].text, members[0][2])
        ):
            ready.update(_find_group(members))
    return ready


def _worth_it(text: str, cands: Sequence[Signature]) -> bool:
    """Whether the signature that matches a group's first line runs in polars: a
    group of lines that only `regex` can match (SGLang's batch lines) gains nothing."""
    matching = [s for s in cands if any(True for _ in s.finditer(text))]
    if len(matching) != 1:
        return False
    sig = matching[0]
    if rust_ok(sig.pattern):
        return True
    return _plain(sig) is not None and regex.fullmatch(sig.plain, text) is not None


def _plain(sig: Signature) -> str | None:
    """The whole-text pattern of sig's plain shape, where polars runs it; None if not."""
    return _whole(sig.plain) if sig.plain and sig.builtin else None


@cache
def _whole(plain: str) -> str | None:
    whole = f"^(?:{ascii_only(plain) or plain})$"
    return whole if rust_ok(whole) else None


def _find_group(members: list[tuple[int, Line, list[Signature]]]) -> dict[int, _Ready]:
    import polars as pl

    cands = members[0][2]
    texts = pl.Series([line.text for _, line, _ in members], dtype=pl.Utf8)
    n = len(members)
    total = [0] * n
    which: list[Signature | None] = [None] * n
    found: list[Any] = [None] * n  # a regex Match, for a signature run per line
    for sig in cands:
        if rust_ok(sig.pattern):
            counts = texts.str.count_matches(sig.pattern).to_list()
            for i, c in enumerate(counts):
                if c:
                    total[i] += c
                    which[i] = sig
            continue
        # Per line in `regex`, but for the lines polars can decide: a whole text of
        # the signature's plain shape holds one match of it, and where the zero test
        # finds nothing the pattern finds nothing either.
        rest = list(range(n))
        plain = _plain(sig)
        if plain is not None:
            fits = texts.str.contains(plain).to_list()
            for i in rest:
                if fits[i]:
                    total[i] += 1
                    which[i] = sig
            rest = [i for i in rest if not fits[i]]
        zero = zero_test(sig.pattern) if sig.builtin else None
        if zero is not None and rest:
            maybe = texts.gather(rest).str.contains(zero).to_list()
            rest = [i for i, m in zip(rest, maybe, strict=True) if m]
        for i in rest:
            ms = list(sig.finditer(members[i][1].text))
            if ms:
                total[i] += len(ms)
                which[i], found[i] = sig, ms[0]
    ready: dict[int, _Ready] = {}
    by_sig: dict[str, list[int]] = {}
    for i in range(n):
        one = which[i]
        if total[i] != 1 or one is None:
            continue
        if found[i] is not None:
            m = found[i]
            ready[members[i][0]] = _Ready(
                members[i][1], one, m.start(), m.end(), {g: m.group(g) for g in one.fields}
            )
        else:
            by_sig.setdefault(one.id, []).append(i)
    for rows in by_sig.values():
        picked = which[rows[0]]
        assert picked is not None
        sig = picked
        plain = None if rust_ok(sig.pattern) else _plain(sig)
        if plain is None:
            # One pass for the span and the captures: an unanchored search is a lazy
            # any-prefix before the pattern, so the prefix's length is the match start.
            spanned = f"^(?P<{_PRE}>(?s:.*?))(?P<{_ALL}>{sig.pattern})"
            caps = texts.gather(rows).str.extract_groups(spanned).struct.unnest()
            pre = caps.get_column(_PRE).str.len_chars().to_list()
            whole = caps.get_column(_ALL).str.len_chars().to_list()
        else:
            caps = texts.gather(rows).str.extract_groups(plain).struct.unnest()
            pre = caps.get_column(PLAIN_PRE).str.len_chars().to_list()
            whole = caps.get_column(PLAIN_MATCH).str.len_chars().to_list()
            # fields the plain shape has no place for: None, as `pattern` leaves them
            caps = caps.with_columns(
                pl.lit(None, dtype=pl.Utf8).alias(f) for f in sig.fields if f not in caps.columns
            )
        typed = _typed(caps, sig, len(rows))
        names = list(sig.fields)
        # The raw captures are read only where a row's typed ones are missing.
        raw = any(t is None for t in typed)
        columns = [caps.get_column(g).to_list() if raw else [] for g in names]
        heads = texts.gather(rows).str.extract_groups(_HEAD).struct.unnest()
        head_len = heads.get_column("bulk_head_").str.len_chars().to_list()
        procs = heads.get_column("bulk_proc_").to_list()
        stamps = heads.get_column("bulk_ts_").to_list()
        for j, i in enumerate(rows):
            groups = {}
            if typed[j] is None:
                groups = {g: c[j] for g, c in zip(names, columns, strict=True)}
            head = (procs[j], stamps[j]) if head_len[j] == pre[j] else None
            ready[members[i][0]] = _Ready(
                members[i][1], sig, pre[j], pre[j] + whole[j], groups, head, typed[j]
            )
    return ready


def _typed(caps: Any, sig: Signature, n: int) -> list[dict[str, FieldValue] | None]:
    """Each row's fields converted as CONVERTERS would, column by column; None for a
    row where a value has another shape (converted, or refused, per line)."""
    import polars as pl

    ok = pl.Series([True] * n)
    columns: list[list[Any]] = []
    for name, typ in sig.fields.items():
        col = caps.get_column(name)
        if typ == "str":
            columns.append(col.to_list())
        elif typ in _CAST_SHAPES:
            fits, typed_col = cast_column(col, typ)
            ok = ok & fits
            columns.append(typed_col.to_list())
        else:
            # (SGLang's 0-1 usage read as a percentage) the converter itself, once a
            # distinct value: a block of batch lines repeats a few dozen of them.
            values = _converted(col.drop_nulls().unique().to_list(), typ)
            bad = [k for k, v in values.items() if v is _BAD]
            if bad:
                ok = ok & ~col.is_in(pl.Series(bad, dtype=pl.Utf8).implode())
            columns.append([None if v is None else values[v] for v in col.to_list()])
    names = list(sig.fields)
    return [
        dict(zip(names, row, strict=True)) if good else None
        for good, *row in zip(ok.to_list(), *columns, strict=True)
    ]


_BAD = object()  # a value its converter refuses


def _converted(raw: list[str], typ: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in raw:
        try:
            out[v] = CONVERTERS[typ](v)
        except (ValueError, OverflowError):
            out[v] = _BAD
    return out


def _emit(matcher: Matcher, source: str, lineno: int, r: _Ready, result: ScanResult) -> bool:
    """The hit Matcher._emit makes of this match; False (nothing recorded) when a
    value does not convert, which Matcher.match then counts as it does."""
    if matcher.rejoined_covers(source, lineno):
        return False  # Matcher.match skips it, as a piece of a rejoined record
    sig, line, text = r.sig, r.line, r.line.text
    fields: dict[str, FieldValue] = dict(sig.constants)
    if r.typed is not None:
        fields.update(r.typed)
    else:
        try:
            for name, typ in sig.fields.items():
                raw = r.groups[name]
                fields[name] = None if raw is None else CONVERTERS[typ](raw)
        except (ValueError, OverflowError):
            return False
    head = Stamps(line.ts_wrapper, line.ts_kind, line.rank, line.pod, line.uptime)
    made = partial(new_hit, source, lineno, sig, fields, text, r.start, r.end, head)
    sink = result.sink
    if sink is not None and (
        sig.kind is Kind.STATS or (sig.kind is Kind.PREEMPTION and sink.preemptions)
    ):
        _to_sink(sink, _Deferred(made), lineno, r, fields, head)
    else:
        result.add(made())
    result.recognised[sig.family] += 1
    return True


class _Deferred:
    """The hit of a bulk match, made when first asked for (rollup.Deferred)."""

    __slots__ = ("made", "make")

    def __init__(self, make: Callable[[], Hit]) -> None:
        self.make = make
        self.made: Hit | None = None

    def hit(self) -> Hit:
        if self.made is None:
            self.made = self.make()
        return self.made


def _to_sink(
    sink: RollupSink,
    d: _Deferred,
    lineno: int,
    r: _Ready,
    fields: dict[str, FieldValue],
    head: Stamps,
) -> None:
    """RollupSink.add of d's hit (a stats or preemption line's), with the parts of the
    hit the sink reads worked out as new_hit works them out, but without making it:
    most such lines only add to a rollup's aggregates (a thrashing server's
    retractions too: a day of eight ranks printing one a second is ~690,000 lines),
    and a hit (evidence text, record bounds) costs ~10 us."""
    text, start = r.line.text, r.start
    wrapper = ts_tag(head.ts_wrapper, head.ts_kind)
    when = stamp_of(wrapper, r.head[1] if r.head else ln.engine_ts_before(text, start))
    alone = head.uptime is not None or (ln.repeat_count(text) if "[repeated" in text else 1) != 1
    if r.sig.kind is Kind.PREEMPTION:
        space = space_of(r.sig.id, _proc(r, head), head.pod, True)
        sink.add_preemption(d, fields, when, space, wrapper, alone, lineno)
        return
    key = None
    if when[1] is not None and not alone:
        # The hit's text is a part of the line's (plus " …" when cut): what the
        # stream key looks for in it is only worth finding there when the line has it.
        evidence = cut(ln.record_text(text, start, r.end)) if " llm_engine.py:" in text else ""
        key = key_of(r.sig.id, _proc(r, head), head.pod, wrapper, fields, evidence)
    sink.add_ref(d, fields, when, key, lineno)


def _proc(r: _Ready, head: Stamps) -> str | None:
    """The process or rank new_hit gives the hit."""
    text, start = r.line.text, r.start
    return (r.head[0] if r.head else ln.proc_before(text, start)) or ln.sglang_rank(head.rank)
