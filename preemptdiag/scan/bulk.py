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
  matches are where two engines' finditer may count differently).
- Only ASCII lines: there `\\d`, `\\w`, `\\s` and case folding mean the same in both
  engines, and character and byte offsets agree. Both engines are leftmost-first,
  so a pattern gives the same match and captures on either.
- Anything but one match in all the set (none, two, a glued second record), a
  request marker in the line, a value that does not convert, or a line inside a
  record a wrap rejoin took: the line goes to Matcher.match, which decides.
tests/test_bulk.py holds the two to identical hits.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import regex

from preemptdiag.model.records import FieldValue
from preemptdiag.scan import lines as ln
from preemptdiag.scan.lines import Line
from preemptdiag.scan.matcher import Matcher, ScanResult, Stamps, decoy_position, new_hit
from preemptdiag.scan.signatures import CONVERTERS, Signature

if TYPE_CHECKING:
    from preemptdiag.scan.wrap import NextLine

# Fewer like lines than this in a block: the per-call cost of polars (tens of us a
# column operation) is more than it saves; they are matched one by one.
MIN_LINES = 48
# Candidate lines a scan matches one by one before it turns to polars: its string
# kernels page in ~10 MiB more of its library (peak RSS of a 1-day stats log: 90 ->
# 101 MiB), worth it only where the per-line cost is seconds (~2.5 days of stats).
AFTER_LINES = 20_000
RETRY_BLOCKS = 64  # blocks matched one by one after a block where bulk did not pay
# Group names for the match's prefix and whole (no signature field is named so).
_PRE, _ALL = "bulk_prefix_", "bulk_match_"


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


# What Rust's regex lacks (look-around, back-references, atomic groups, possessive
# quantifiers, conditionals), seen in the pattern's text: refused without asking
# polars, whose string kernels cost memory to page in (a false alarm only keeps a
# pattern on the regex path).
_NOT_RUST = regex.compile(r"\(\?<?[=!]|\(\?>|\(\?P=|\\[1-9]|[*+?}]\+|\(\?\(")


@cache
def rust_ok(pattern: str) -> bool:
    """Whether polars' Rust regex compiles `pattern` (and it cannot match nothing)."""
    if _NOT_RUST.search(pattern) or regex.search(pattern, "") is not None:
        return False
    import polars as pl

    try:
        pl.Series([""], dtype=pl.Utf8).str.count_matches(pattern)
    except Exception:  # polars raises ComputeError for what Rust's regex rejects
        return False
    return True


def usable() -> bool:
    """polars is there, and safe to use in this process: a worker forked after the
    parent started polars' thread pool may deadlock in it, so it does not."""
    try:
        import polars  # noqa: F401
    except ImportError:
        return False
    return not _FORKED_WITH_POLARS


# Set in a --jobs worker whose parent had imported polars before forking it.
_FORKED_WITH_POLARS = False


def mark_forked() -> None:
    global _FORKED_WITH_POLARS
    _FORKED_WITH_POLARS = "polars" in sys.modules


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
    for k, it in enumerate(items):
        if decoy_position(it.raw) is not None:
            continue  # request text in the line: Matcher.match sorts it out
        cands = matcher.candidates(it.raw)
        if not cands or not all(s.builtin for s in cands):
            continue
        line = ln.normalise(it.raw.rstrip("\r\n"))
        if not line.text.isascii() or decoy_position(line.text) is not None:
            continue
        groups.setdefault(tuple(s.id for s in cands), []).append((k, line, cands))
    ready: dict[int, _Ready] = {}
    for members in groups.values():
        if (
            len(members) >= MIN_LINES
            and _worth_it(members[0][1].text, members[0][2])
            and usable()  # imported only now: lines only `regex` matches never need it
        ):
            ready.update(_find_group(members))
    return ready


def _worth_it(text: str, cands: Sequence[Signature]) -> bool:
    """Whether the signature that matches a group's first line runs in polars: a
    group of lines that only `regex` can match (SGLang's batch lines) gains nothing."""
    matching = [s for s in cands if any(True for _ in s.finditer(text))]
    return len(matching) == 1 and rust_ok(matching[0].pattern)


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
        else:
            for i, (_, line, _) in enumerate(members):
                ms = list(sig.finditer(line.text))
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
        # One pass for the span and the captures: an unanchored search is a lazy
        # any-prefix before the pattern, so the prefix's length is the match start.
        spanned = f"^(?P<{_PRE}>(?s:.*?))(?P<{_ALL}>{sig.pattern})"
        caps = texts.gather(rows).str.extract_groups(spanned).struct.unnest()
        pre = caps.get_column(_PRE).str.len_chars().to_list()
        whole = caps.get_column(_ALL).str.len_chars().to_list()
        names = list(sig.fields)
        columns = [caps.get_column(g).to_list() for g in names]
        for j, i in enumerate(rows):
            groups = {g: col[j] for g, col in zip(names, columns, strict=True)}
            ready[members[i][0]] = _Ready(members[i][1], sig, pre[j], pre[j] + whole[j], groups)
    return ready


def _emit(matcher: Matcher, source: str, lineno: int, r: _Ready, result: ScanResult) -> bool:
    """The hit Matcher._emit makes of this match; False (nothing recorded) when a
    value does not convert, which Matcher.match then counts as it does."""
    if matcher.rejoined_covers(source, lineno):
        return False  # Matcher.match skips it, as a piece of a rejoined record
    sig, line, text = r.sig, r.line, r.line.text
    fields: dict[str, FieldValue] = dict(sig.constants)
    try:
        for name, typ in sig.fields.items():
            raw = r.groups[name]
            fields[name] = None if raw is None else CONVERTERS[typ](raw)
    except (ValueError, OverflowError):
        return False
    head = Stamps(line.ts_wrapper, line.ts_kind, line.rank, line.pod, line.uptime)
    result.add(new_hit(source, lineno, sig, fields, text, r.start, r.end, head))
    result.recognised[sig.family] += 1
    return True
