"""Whole blocks of plain stats lines, matched and rolled up as columns.

A month of a quiet server's log is a stats line every 10 s and little else; a dense
SGLang log two batch lines a second. Line by line (bulk.py included) each of them
costs tens of microseconds of Python: the prefilter's callbacks, candidate selection,
decoy checks, a regex per candidate signature, the rollup sink. Here a block whose
candidate lines are nearly all plain stats lines is read as polars columns: the
candidate test, the match counts, the captures, the typed fields, the stamps and the
stream keys are column operations, and so are the stream-minute rollups (rollup.py)
of every minute that opens and closes inside the block. Python touches only the lines
a rollup keeps (its carrier, peak, preempting lines), the few lines at a block's
edges, which go through the rollup sink one by one so an open rollup carries on into
the next block exactly, and the block's odd candidate lines.

A plain stats line: vLLM's `(Proc pid=N) LEVEL MM-DD HH:MM:SS [file:line] ` head
right before its single match of a builtin stats signature (polars runs the pattern),
or SGLang's `[YYYY-MM-DD HH:MM:SS RANK] ` head before a whole text of a stats
signature's plain shape (signatures.py; one match of its pattern, which polars cannot
run). Several stats signatures may share a block (decode and prefill batches).

Exactness: this must give what the line-by-line scan gives. A block qualifies only
when every line in it is ASCII without control characters, and every candidate line
(one holding a prefilter literal) holds no request text (no trigger of
model/request_text.py; no trigger holds a newline, so none runs in from the line, and
the scanner's decoy test finds none), no Ray repeat mark, no V0 `llm_engine.py:` tag,
no rsyslog `#033[` escape. A plain line also matches no other candidate signature
(zero tests), has fields its converters read (inside their ranges) and a stamp that is
a real time. Such a line opens a record (so no wrapped record, decoy carry or rejoin
touches it) and normalise leaves it as it is (vLLM), or takes off exactly the head
(SGLang: no pod, no other stamp, no quote mark). The other candidate lines (an SGLang
retraction among the batch lines, at most MAX_ODD a block) are matched as line by
line, before anything is recorded; the block goes line by line after all when one of
them lies in the block's tail, rejoins a wrapped record, gives a stats hit (it might
join or end a rollup the lane builds alone) or a hit stamped with another clock than
the sink's there (it would end open rollups). Their hits go to the sink in their
place. tests/test_lane.py holds the two ways to identical hits.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from functools import cache, lru_cache, partial
from heapq import merge
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from preemptdiag.model import request_text
from preemptdiag.model.records import (
    CALM_COLUMNS,
    CALM_MEANS,
    CalmRows,
    Columns,
    Const,
    CopyKey,
    FieldValue,
    Hit,
    Kind,
    Packed,
    PackedNumbers,
    Rollup,
    RollupStats,
    WrapperStamp,
    column_of,
)
from preemptdiag.model.timeparse import parse_iso
from preemptdiag.scan import rust_regex
from preemptdiag.scan.bulk import (
    _BAD,
    _CAST_SHAPES,
    _HEAD,
    _converted,
    _Deferred,
    _plain,
    cast_column,
)
from preemptdiag.scan.lines import _LEVEL_WORDS, _RECORD_START, sglang_rank
from preemptdiag.scan.matcher import MAX_EVIDENCE_CHARS, Matcher, ScanResult, cut
from preemptdiag.scan.rollup import (
    AGG_FIELDS,
    KV,
    STREAM_FIELDS,
    WAITING,
    RollupSink,
    Stamp,
    copy_key,
    key_of,
    last_fields,
    space_of,
    stamp,
    stamp_of,
)
from preemptdiag.scan.rust_regex import anchored, ascii_only, rust_ok, zero_test
from preemptdiag.scan.signatures import PLAIN_PRE, Signature

if TYPE_CHECKING:
    import polars as pl

T = TypeVar("T")

# A block qualifies only with no byte outside printable ASCII but its newlines: what
# is left when those are deleted must be empty (translate: ~0.6 ms a MiB, a regex
# search for the others ~6 ms).
_PLAIN_BYTES = bytes(range(0x20, 0x7F)) + b"\n"
# Candidate lines that go the line-by-line way whatever they hold (`#033[`: rsyslog's
# escaped ESC, which lines.normalise takes out of the text and the process name).
_STOP = ("[repeated", " llm_engine.py:", "#033[", *request_text.TRIGGERS)
# The same test as a pattern: contains_any builds its automaton each call (~2 ms a
# block for these), polars keeps a compiled pattern (~0.6 ms), measured.
_STOP_PATTERN = "|".join(re.escape(lit) for lit in _STOP)
MAX_LINE = 4096  # a longer candidate line: not a plain stats line
_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # 2001: no Feb 29 here
_ALL = "lane_match_"
ENABLED = True  # tests turn it off to hold the lane to the line-by-line scan
_NUMERIC = ("int", "int_commas", "float", "percent")
# Converted once a distinct value (bulk._converted) where Builder aggregates: SGLang's
# 0-1 usage, read as a percentage.
_CONVERTED = ("fraction_percent",)
# SGLang's head, as lines.normalise takes it off (_BRACKET_FULL, with no fraction in
# the stamp and one space after it: printable ASCII has no other white space).
_SG = "lane_sg_"
_SG_HEAD = (
    rf"^(?P<{_SG}head>\[(?P<{_SG}ts>[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}} [0-9]{{2}}:[0-9]{{2}}:[0-9]{{2}})"
    rf"(?P<{_SG}rank>(?: [A-Z_]+[0-9]+)*)\] )"
)
# Odd candidate lines a block may hold and still go the lane's way (each is matched
# as line by line first; a dense SGLang log has ~7 retraction lines a block).
MAX_ODD = 32
# lane.try_block's way to match one odd line as line by line: (start, end, lineno)
# -> what it recorded, None when that line would wait for the next block.
Odd = Callable[[int, int, int], ScanResult | None]
_PREEMPT_FIELDS = ("preemptions", "preempted_reqs", "retracted_reqs")


@dataclass(slots=True)
class Lane:
    """Per scan: when to try the lane again after a block it did not take."""

    misses: int = 0
    retry_at: int = 0

    def due(self, block: int) -> bool:
        return block >= self.retry_at

    def missed(self, block: int) -> None:
        # (the next block after a first miss: a log's start-up lines send its first
        # block line by line, and the one after it is plain stats lines again)
        self.misses += 1
        self.retry_at = block + (1 << min(self.misses - 1, 6))

    def took(self) -> None:
        self.misses = 0


def try_block(
    matcher: Matcher,
    source: str,
    block: bytearray,
    size: int,
    first_line: int,
    result: ScanResult,
    odd: Odd,
    tail: int,
    polars: Callable[[], bool] = lambda: True,
) -> tuple[int, int] | None:
    """Match and roll up block[:size] as the line-by-line scan would: (the newlines, the
    bytes) of what it took when done: the whole block, or (lane_plain.py) its lines
    above an odd line among its last ones (from `tail` on), which the line-by-line
    scan takes on from; None (nothing recorded) when the block does not qualify.
    `odd(start, end, lineno)` matches the line at block[start:end] as the line-by-line
    scan does, into a ScanResult of its own (None where that scan would wait for the
    next block: a line in the block's tail). lane_plain.py tries it first; `polars()`
    says whether polars may be paid for where it leaves the block to this lane."""
    sink = result.sink
    assert sink is not None
    with memoryview(block) as view:  # (one copy, not two: ~0.9 ms a MiB less)
        body = bytes(view[:size])
    if body.translate(None, _PLAIN_BYTES):
        return None
    text = body.decode("ascii")
    # (imported here: lane_plain reads this module's records)
    from preemptdiag.scan import lane_plain

    plain = lane_plain.take(matcher, source, text, first_line, result, odd, tail)
    if plain is not None:
        return (text.count("\n", 0, plain), plain) if plain else None
    if not polars() or not rust_regex.usable():
        return None  # (usable: not in a worker forked with polars running)
    newlines = _try_polars(matcher, source, text, text.count("\n"), first_line, result, odd)
    return None if newlines is None else (newlines, size)


def _try_polars(
    matcher: Matcher,
    source: str,
    text: str,
    newlines: int,
    first_line: int,
    result: ScanResult,
    odd: Odd,
) -> int | None:
    """try_block's polars lane."""
    sink = result.sink
    assert sink is not None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    import polars as pl

    s = pl.Series("t", lines, dtype=pl.Utf8)
    cand = s.str.contains_any(list(matcher.literals))
    if not cand.any():
        return newlines
    rows = pl.int_range(0, len(lines), eager=True).filter(cand)
    c = s.filter(cand)
    if (
        c.str.len_chars().max() > MAX_LINE  # type: ignore[operator]
        or c.str.contains(_STOP_PATTERN).any()
    ):
        return None
    plan = _plan(matcher, c, rows, first_line)
    if plan is None:
        return None
    others = _odd_lines(matcher, plan, s, rows, odd, sink.clock)
    if others is None:
        return None
    _roll(source, plan, others, sink, result)
    return newlines


@dataclass(slots=True)
class _Rows:
    """The candidate lines of a block that one stats signature matched, as columns."""

    sig: Signature
    lineno: list[int]
    texts: list[str]  # the record's text: the line, or what follows SGLang's head
    start: Sequence[int]  # where the match starts in the record's text
    proc: list[str | None]
    ts: list[str | None]  # the engine stamp (vLLM's head)
    wrapper: list[str] | None  # the wrapper stamps (SGLang's head), one a line
    typed: dict[str, list[Any]]  # field -> values, in signature order
    wrapper_kind: str = "sql"  # how they read (WrapperStamp.kind): `iso`, kubectl's


@dataclass(slots=True)
class _Plan:
    """A block's candidate lines: which go the lane's way (by set of _Rows), and the
    columns their rollups are aggregated from."""

    sets: list[_Rows]
    n: int  # candidate lines
    rows: list[int]  # the lane's lines (by candidate), in order
    lineno: list[int]  # candidate -> its line number
    frame: Any  # polars DataFrame, one row a lane line: row, set, i, stream, ...


def _candidates(matcher: Matcher, c: pl.Series) -> list[Signature] | None:
    """Every signature any of the lines is a candidate of (a superset per line); None
    when one is not builtin."""
    line0 = c[0]
    present = [lit for lit in matcher.literals if lit in line0]
    absent = [lit for lit in matcher.literals if lit not in present]
    if absent and c.str.contains_any(absent).any():
        # (a `Preemptions: N` among them, say) the literals any line holds
        extra = c.str.extract_many(absent, overlapping=True).explode().drop_nulls()
        present += extra.unique().to_list()
    cands = matcher.candidates(" \n ".join(present))
    if not cands or not all(s.builtin for s in cands):
        return None
    return cands


def _plan(matcher: Matcher, c: pl.Series, rows: pl.Series, first_line: int) -> _Plan | None:
    """Which candidate lines are plain stats lines, with their columns; None when the
    block is not worth the lane (no such line, a candidate signature polars cannot
    rule out, a signature whose fields the lane does not read as Builder does)."""
    import polars as pl

    cands = _candidates(matcher, c)
    if cands is None:
        return None
    zero = {s.id: zero_test(s.pattern) for s in cands}
    if any(z is None for z in zero.values()):
        return None
    lanes = [s for s in cands if s.kind is Kind.STATS and _readable(s)]
    if not lanes:
        return None
    n = len(c)
    line = pl.col("line")
    # Few polars queries (each eager call costs a query's overhead): the heads present
    # (a block of vLLM lines has no SGLang head to look for, and the other way round)
    # and what follows them, then which signature each line may be of, then per
    # signature and head its plain lines' captures (_columns).
    firsts = set(c.str.slice(0, 1).unique().to_list())
    heads: list[pl.Expr] = []
    for mark, head, names in (
        ("(", ascii_only(_HEAD) or _HEAD, ("bulk_head_", "bulk_proc_", "bulk_ts_")),
        ("[", _SG_HEAD, (_SG + "head", _SG + "rank", _SG + "ts")),
    ):
        groups = line.str.extract_groups(head)
        for name in names:
            heads.append(
                groups.struct.field(name).alias(name)
                if mark in firsts
                else pl.lit(None, dtype=pl.Utf8).alias(name)
            )
    v_len = pl.col("bulk_head_").str.len_chars().cast(pl.Int64)
    s_len = pl.col(_SG + "head").str.len_chars().cast(pl.Int64)
    rest = pl.col("rest")
    # SGLang's record is what follows its head; nothing in it may time, name or cut
    # the record otherwise (no level word: no engine stamp or record start; no pid).
    sg_plain = (
        s_len.is_not_null()
        & ~line.str.contains_any([*_LEVEL_WORDS, " pid="])
        & ~rest.str.starts_with(">")
    )
    starts = ascii_only(_RECORD_START.pattern) or _RECORD_START.pattern
    v_plain = v_len.is_not_null() & ~rest.str.contains(starts)
    base = (
        pl.DataFrame({"line": c})
        .lazy()
        .with_columns(*heads)
        .with_columns(v_len=v_len, s_len=s_len)
        .with_columns(rest=line.str.slice(pl.col("v_len").fill_null(pl.col("s_len")).fill_null(0)))
        .with_row_index("idx")
        .collect(engine="in-memory")
    )
    # The stats signatures the block's lines are of: the first line's, and one more
    # for each line a zero test finds another's in (SGLang's prefill lines among its
    # decode lines); each zero test of a signature not among them is one pass.
    seen = [s for s in lanes if any(True for _ in s.finditer(c[0]))][:1] or lanes[:1]
    while True:
        table = base.with_columns(_sorting(cands, lanes, seen, zero))
        # (one pass for all the other signatures; the stats ones among them only on
        # the lines it found something in)
        unseen = [s for s in lanes if s not in seen]
        hits = table.filter(pl.col("clash")).filter(_any_of(unseen, zero))
        if hits.height == 0:
            break
        text = hits.get_column("line")[0]
        more = [s for s in unseen if any(True for _ in s.finditer(text))]
        if len(more) != 1:
            break  # such lines go line by line (as odd ones, or the block does)
        seen.append(more[0])
    alone = ~pl.col("clash") & (
        pl.sum_horizontal(*(pl.col(f"z{j}") for j in range(len(seen)))) == 1
    )
    lineno = (rows + first_line).to_list()
    sets: list[_Rows] = []
    frames: list[pl.DataFrame] = []
    for j, sig in enumerate(seen):
        # The one match is where the lane reads it: right after vLLM's head, or the
        # whole of what follows SGLang's. (Lazy: the lines are copied once, filtered.)
        pattern, whole = _lane_pattern(sig), _plain(sig)
        mine = table.lazy().filter(alone & pl.col(f"z{j}"))
        heads_of: list[tuple[bool, pl.Expr]] = []
        if pattern is not None and "(" in firsts:
            found = (line.str.find(pattern) == v_len) & (line.str.count_matches(pattern) == 1)
            heads_of.append((False, v_plain & found))
        if whole is not None and "[" in firsts:
            heads_of.append((True, sg_plain & rest.str.contains(whole)))
        for sglang, fits in heads_of:
            built = _columns(sig, mine.filter(fits.fill_null(False)), sglang, lineno, len(sets))
            if built is not None:
                got, frame = built
                sets.append(got)
                frames.append(frame)
    if not frames:
        return None
    # (filters keep the lines' order: one set's frame is in order already)
    frame = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal").sort("row")
    key = frame.get_column("clock")
    frame = frame.with_columns(
        run=(key != key.shift(1)).fill_null(False).cast(pl.Int64).cum_sum()
    ).drop("clock")
    return _Plan(sets, n, frame.get_column("row").to_list(), lineno, frame)


def _sorting(
    cands: list[Signature],
    lanes: list[Signature],
    seen: list[Signature],
    zero: dict[str, str | None],
) -> list[pl.Expr]:
    """Columns of which signature each line may be of: `z{j}` for seen[j] (its
    literal, and with several seen its zero test: a superset of its matches), and
    `clash` for all the other candidate signatures."""
    import polars as pl

    line = pl.col("line")
    z = [
        (
            line.str.contains_any(list(sig.prefilter))
            & (line.str.contains(zero[sig.id] or "") if len(seen) > 1 else pl.lit(True))
        )
        .fill_null(False)
        .alias(f"z{j}")
        for j, sig in enumerate(seen)
    ]
    others = [s for s in cands if s not in seen]
    return [*z, _any_of(others, zero).alias("clash")]


def _any_of(sigs: list[Signature], zero: dict[str, str | None]) -> pl.Expr:
    """Whether a line may hold a match of one of `sigs` (their zero tests)."""
    import polars as pl

    if not sigs:
        return pl.lit(False)
    either = "|".join(f"(?:{zero[s.id]})" for s in sigs)
    return pl.col("line").str.contains(either).fill_null(True)


def _lane_pattern(sig: Signature) -> str | None:
    """sig's pattern, where polars runs it as `regex` does (vLLM's stats lines)."""
    return _runnable(sig.pattern)


@cache
def _runnable(pattern: str) -> str | None:
    # (cached: a block asks for each candidate signature's, and anchored() parses it)
    ascii = ascii_only(pattern)
    if ascii is None or not rust_ok(ascii) or anchored(pattern):
        return None
    return ascii


def _readable(sig: Signature) -> bool:
    """Whether the lane runs sig's pattern (in polars, or its plain shape) and reads
    its fields as Builder would (fields_readable)."""
    if _lane_pattern(sig) is None and _plain(sig) is None:
        return False
    return fields_readable(sig)


def fields_readable(sig: Signature) -> bool:
    """Whether sig's fields are read as Builder reads them: numbers where Builder
    aggregates (an int preemption count), no constant in their place."""
    if any(k in sig.constants for k in (*AGG_FIELDS, *_PREEMPT_FIELDS)):
        return False
    return not any(
        sig.fields.get(k, "int") not in (*_NUMERIC, *_CONVERTED) for k in AGG_FIELDS
    ) and not any(sig.fields.get(k, "int") not in ("int", "int_commas") for k in _PREEMPT_FIELDS)


def _columns(
    sig: Signature, part: pl.LazyFrame, sglang: bool, lineno: list[int], which: int
) -> tuple[_Rows, pl.DataFrame] | None:
    """The fields, stamps and stream keys of the lines (all with SGLang's head, or all
    with vLLM's) whose values and stamps the lane reads as the line-by-line scan does
    (the others go that way); None when there are none, or the converter gives what
    the lane cannot hold as a column."""
    import polars as pl

    rest = pl.col("rest")
    # Per head: vLLM's lines run the pattern after the head (it starts there); SGLang's
    # fit the plain shape whole.
    if sglang:
        whole = _plain(sig)
        assert whole is not None
        caps = rest.str.extract_groups(whole)
        pre = caps.struct.field(PLAIN_PRE).str.len_chars()
        text, ts = rest, pl.col(_SG + "ts")
        proc = pl.col(_SG + "rank").str.strip_chars()
        shape = set(re.compile(whole).groupindex)
    else:
        pattern = _lane_pattern(sig)
        assert pattern is not None
        caps = rest.str.extract_groups(f"^(?P<{_ALL}>{pattern})")
        pre = pl.col("v_len")
        text, ts, proc = pl.col("line"), pl.col("bulk_ts_"), pl.col("bulk_proc_")
        shape = set(sig.fields)
    # fields the plain shape has no place for: None, as `pattern` leaves them
    raw = [
        (caps.struct.field(f) if f in shape else pl.lit(None, dtype=pl.Utf8)).alias(f)
        for f in sig.fields
    ]
    lines = part.select(
        pl.col("idx").cast(pl.Int64).alias("row"),
        text.alias("text"),
        pre.cast(pl.Int64).alias("start"),
        ts.alias("ts"),
        proc.alias("proc"),
        *raw,
    ).collect(engine="in-memory")
    if lines.height == 0:
        return None
    ok = pl.lit(True)
    typed: list[pl.Expr] = []
    for name, typ in sig.fields.items():
        col = pl.col(name)
        if typ == "str":
            typed.append(col.alias(f"f_{name}"))
        elif typ in _CAST_SHAPES:
            fits, cast = cast_column(col, typ)
            ok = ok & fits
            typed.append(cast.alias(f"f_{name}"))
        else:
            # (SGLang's 0-1 usage read as a percentage) the converter itself, once a
            # distinct value: a block of batch lines repeats a few dozen of them.
            values = _converted(lines.get_column(name).drop_nulls().unique().to_list(), typ)
            good = {k: v for k, v in values.items() if v is not _BAD}
            if not all(type(v) is float for v in good.values()):
                return None  # a column of floats holds only what the converter gave
            bad = [k for k, v in values.items() if v is _BAD]
            if bad:
                ok = ok & ~col.is_in(pl.Series(bad, dtype=pl.Utf8).implode())
            typed.append(
                col.replace_strict(good, default=None, return_dtype=pl.Float64).alias(f"f_{name}")
            )
    real, clock, minute, sec = _stamps(pl.col("ts"), sglang)
    if sglang:
        dates = lines.get_column("ts").str.slice(0, 10).unique().to_list()
        wrong = [d for d in dates if parse_iso(f"{d} 00:00:00") is None]
        if wrong:
            real = real & ~pl.col("ts").str.slice(0, 10).is_in(pl.Series(wrong).implode())
        names = {r: sglang_rank(r or None) for r in lines.get_column("proc").unique().to_list()}
        proc = pl.col("proc").replace_strict(names, default=None, return_dtype=pl.Utf8)
    else:
        proc = pl.col("proc")
    kind = "sql" if sglang else ""
    # The stream key (rollup.key_of) of a plain line: its signature, process, which
    # fields are missing and its STREAM_FIELDS' values (the rest is the same on every
    # line of one head here).
    stream = pl.concat_str(
        [
            pl.lit(f"{sig.id}\x00{kind}"),
            pl.col("proc").fill_null("\x01"),
            *(pl.col(f"f_{n}").is_null().cast(pl.Utf8) for n in sig.fields),
            *(
                pl.col(f"f_{n}").cast(pl.Utf8).fill_null("\x01")
                for n in STREAM_FIELDS
                if n in sig.fields
            ),
        ],
        separator="\x00",
    )
    table = (
        lines.lazy()
        .with_columns(*typed, proc=proc, clock=clock, minute=minute, sec=sec)
        .filter((ok & real).fill_null(False))
        .with_columns(stream=stream, set=pl.lit(which, dtype=pl.Int64), i=pl.int_range(pl.len()))
        .collect(engine="in-memory")
    )
    if table.height == 0:
        return None
    values = {n: table.get_column(f"f_{n}").to_list() for n in sig.fields}
    number = [
        pl.col(f"f_{k}").cast(pl.Float64).alias(f"v_{k}") for k in AGG_FIELDS if k in sig.fields
    ]
    counts = [pl.col(f"f_{k}").alias(f"p_{k}") for k in _PREEMPT_FIELDS if k in sig.fields]
    frame = table.select("row", "set", "i", "stream", "minute", "sec", "clock", *number, *counts)
    ts_list = table.get_column("ts").to_list()
    rows = _Rows(
        sig=sig,
        lineno=[lineno[r] for r in table.get_column("row").to_list()],
        texts=table.get_column("text").to_list(),
        start=table.get_column("start").to_list(),
        proc=_shared(table.get_column("proc").to_list()),
        ts=[None] * len(ts_list) if sglang else ts_list,
        wrapper=ts_list if sglang else None,
        typed=values,
    )
    return rows, frame


def _shared(values: list[T]) -> list[T]:
    """`values` with equal values one object. A month's rollups keep ~30 values a
    minute that polars made one object per line (the same process name on every
    line, KV usages and throughputs that repeat within a block): shared, ~5 % of
    the memory a month of stats lines holds at the end of a run (10 days, tracemalloc)."""
    seen: dict[T, T] = {}
    return [seen.setdefault(v, v) for v in values]


def _stamps(ts: pl.Expr, sglang: bool) -> tuple[pl.Expr, pl.Expr, pl.Expr, pl.Expr]:
    """(a real time, the clock it sets, its minute, its seconds) of each head stamp:
    vLLM's `MM-DD HH:MM:SS` (no Feb 29: its year is unknown here), SGLang's
    `YYYY-MM-DD HH:MM:SS` (the caller checks its date with parse_iso), as
    rollup.stamp_of has them."""
    import polars as pl

    at = 5 if sglang else 0  # where the month starts
    month = ts.str.slice(at, 2).cast(pl.Int64, strict=False)
    day = ts.str.slice(at + 3, 2).cast(pl.Int64, strict=False)
    hms = [ts.str.slice(at + k, 2).cast(pl.Int64, strict=False) for k in (6, 9, 12)]
    real = (hms[0] <= 23) & (hms[1] <= 59) & (hms[2] <= 59)
    if sglang:
        clock = pl.concat_str([pl.lit("w"), ts.str.slice(0, 10)])
        minute = ts.str.slice(0, 16)
    else:
        days = pl.lit(pl.Series(_DAYS)).gather((month - 1).clip(0, 11))
        real = real & (month >= 1) & (month <= 12) & (day >= 1) & (day <= days)
        clock = pl.concat_str([pl.lit("e"), ts.str.slice(0, 5)])
        minute = ts.str.slice(0, 11)
    return real, clock, minute, hms[2]


def _odd_lines(
    matcher: Matcher,
    plan: _Plan,
    lines: pl.Series,
    rows: pl.Series,
    odd: Odd,
    clock: tuple[str, str] | None,
) -> dict[int, ScanResult] | None:
    """The candidate lines that are no lane line, matched as line by line (by
    candidate); None when the block must go line by line after all: too many, one
    in the block's tail, one a wrapped record's rejoin reached from, one that gives a
    stats hit (it could join or end a rollup the lane aggregates alone), or a hit
    that would move the clock (and so end open rollups) or has no stamp."""
    odd_rows = sorted(set(range(plan.n)).difference(plan.rows))
    if len(odd_rows) > MAX_ODD:
        return None
    if not odd_rows:
        return {}
    import polars as pl

    # ASCII: a character is a byte. Where each line starts in the block.
    begins = (lines.str.len_bytes() + 1).cum_sum().shift(1, fill_value=0)
    at = begins.gather(rows.gather(pl.Series(odd_rows))).to_list()
    size = lines.gather(rows.gather(pl.Series(odd_rows))).str.len_bytes().to_list()
    out = match_odd(
        matcher,
        odd,
        (
            (k, start, start + n, plan.lineno[k])
            for k, start, n in zip(odd_rows, at, size, strict=True)
        ),
    )
    if isinstance(out, bool):
        return None
    # Each odd hit's clock must be the one the sink has there: the last lane line's
    # above it (or the sink's before the block).
    for k, got in out.items():
        above = bisect_left(plan.rows, k) - 1
        if above >= 0:
            line = plan.frame.row(above, named=True)
            now: tuple[str, str] | None = _clock(plan.sets[line["set"]], line["i"])
        else:
            now = clock
        for h in got.hits:
            when = stamp(h)
            if when[0] is None or when[1] is None or when[0] != now:
                return None
    return out


def match_odd(
    matcher: Matcher, odd: Odd, lines: Iterable[tuple[int, int, int, int]]
) -> dict[int, ScanResult] | bool:
    """The odd lines (key, start, end, line number) matched as line by line, by key;
    False when one lies in the block's tail or a wrapped record's rejoin is reached
    from one (the block goes line by line), True when one gives a stats hit (it could
    join or end a rollup the lane aggregates alone)."""
    before = matcher.rejoined
    out: dict[int, ScanResult] = {}
    for k, start, end, lineno in lines:
        got = odd(start, end, lineno)
        if got is None or matcher.rejoined != before:
            matcher.rejoined = before
            return False
        if any(h.kind is Kind.STATS for h in got.hits):
            return True
        out[k] = got
    return out


def _clock(r: _Rows, i: int) -> tuple[str, str]:
    """The clock line i sets (rollup.stamp_of)."""
    return ("e", r.ts[i][:5]) if r.wrapper is None else ("w", r.wrapper[i][:10])  # type: ignore[index]


def _fields(r: _Rows, i: int) -> dict[str, FieldValue]:
    out: dict[str, FieldValue] = dict(r.sig.constants)
    for name in r.sig.fields:
        out[name] = r.typed[name][i]
    return out


def _wrapper(r: _Rows, i: int) -> WrapperStamp | None:
    return None if r.wrapper is None else WrapperStamp(r.wrapper_kind, r.wrapper[i])


def _hit(
    source: str,
    r: _Rows,
    i: int,
    fields: Mapping[str, FieldValue] | None = None,
    text: str | None = None,
    rollup: Rollup[Hit] | None = None,
) -> Hit:
    """The hit new_hit makes of line i: its text is the record (the line, or what
    follows SGLang's head; one record, cut), its stamp and process the head's (the
    only ones before the match), no pod, uptime or repeat (_plan saw to all that).
    With `fields` and `text`: that hit slimmed as Builder._kept_last slims a
    rollup's last line; with `rollup`: the carrier of that rollup."""
    return Hit(
        source,
        r.lineno[i],
        r.sig.id,
        r.sig.kind,
        _fields(r, i) if fields is None else fields,
        cut(r.texts[i][: MAX_EVIDENCE_CHARS + 1]) if text is None else text,
        _wrapper(r, i),
        r.ts[i],
        r.proc[i],
        1,
        None,
        None,
        rollup,
        r.sig.engine,
        r.start[i],
    )


def _roll(
    source: str,
    plan: _Plan,
    others: dict[int, ScanResult],
    sink: RollupSink,
    result: ScanResult,
) -> None:
    """Add the block's lines to `sink` as RollupSink.add_ref would one by one: the
    segments (one stream, one clock minute, stamps not going back, no change of
    clock between) that open and close inside the block are aggregated as columns;
    the first of each stream in the block's first clock and the last of each stream
    in its last one go through the sink, line by line; the odd lines' hits go to it
    in their place among the segments (by first line)."""
    import polars as pl

    f = plan.frame
    prev = [pl.col(k).shift(1).over("stream") for k in ("minute", "sec", "run")]
    f = f.with_columns(
        new=(
            prev[0].is_null()
            | (prev[0] != pl.col("minute"))
            | (prev[1] > pl.col("sec"))
            | (prev[2] != pl.col("run"))
        )
    ).with_columns(
        # a segment is named by its first line (streams interleave)
        seg=pl.when(pl.col("new")).then(pl.col("row")).forward_fill().over("stream")
    )
    last_run = f.get_column("run").max()
    segs = (
        f.group_by("seg", maintain_order=True)
        .agg(
            first=pl.col("row").first(),
            members=pl.col("i"),
            run=pl.col("run").first(),
            stream=pl.col("stream").first(),
            set=pl.col("set").first(),
            minute=pl.col("minute").first(),
        )
        .with_columns(
            edge=(pl.col("run") == 0) & pl.col("stream").is_first_distinct()
            | (pl.col("run") == last_run) & pl.col("stream").is_last_distinct()
        )
    )
    inner = segs.filter(~pl.col("edge")).get_column("seg")
    agg = _agg_frame(f.filter(pl.col("seg").is_in(inner.implode())))
    calm = _calm_segments(plan, segs, agg, others, result.calm_kv, result.calm_window)
    if calm:
        chosen = pl.col("seg").is_in(pl.Series(sorted(calm), dtype=pl.Int64).implode())
        result.calm.extend(_calm_rows(source, plan, agg.filter(chosen)))
        agg = agg.filter(~chosen)
    aggs = _agg_dict(agg)
    rows = segs.select("seg", "first", "members", "run", "edge", "stream", "set").iter_rows()
    walk(source, plan.sets, rows, aggs, calm, others, sink, result)


def walk(
    source: str,
    sets: Sequence[_Rows],
    segs: Iterable[tuple[int, int, Sequence[int], int, bool, object, int]],
    aggs: Mapping[int, _Agg],
    calm: set[int],
    others: Mapping[int, ScanResult],
    sink: RollupSink,
    result: ScanResult,
    given: Sequence[Fed] = (),
) -> None:
    """The block's segments, in order of their first lines (seg, first line, members,
    clock run, edge, stream, set), to `sink` as RollupSink.add_ref would take their
    lines one by one: an edge's lines through the sink, an inner segment's hit
    (`aggs`) appended closed unless it went as a calm minute (`calm`), the odd lines'
    hits (`others`, by candidate) and the `given` lines (feed_preemption) in their place
    before the segment after them."""
    run_now = 0
    # The sink's key of each stream whose last segment so far went to it line by line:
    # the stream's next segment closes that rollup (its first line is one the rollup
    # does not accept), as the sink would on that line. Left open, a later segment fed
    # to the sink might join it: a stream whose clock goes back to that minute (two
    # pods' logs one after the other) had its two runs of the minute merged.
    fed: dict[object, tuple[object, ...]] = {}
    odd: Iterator[tuple[int, ScanResult | Fed]] = iter(sorted(others.items()))
    if given:
        odd = merge(odd, ((f[0], f) for f in given), key=itemgetter(0))
    nxt = next(odd, None)
    last_line, went_to = 0, sink.went_to
    for seg, first, members, run, edge, stream, which in segs:
        while nxt is not None and nxt[0] < first:
            last_line, went_to = _replay(source, nxt[1], result, last_line), None
            nxt = next(odd, None)
        r = sets[which]
        if run != run_now:
            # Another clock (month-day, date): the sink would close every open rollup
            # (they all have the old one) on the first line stamped with it.
            run_now = run
            sink.close()
            fed.clear()
            sink.clock = _clock(r, members[0])
        key = fed.pop(stream, None)
        if key is not None and (open_one := sink.open.pop(key, None)) is not None:
            sink._close(open_one)
        if edge:
            for i in members:
                fed[stream] = _feed(source, r, i, sink)
            went_to = sink.went_to
        else:
            if seg not in calm:
                _close_segment(source, r, aggs[seg], sink)
            went_to = None
        result.recognised[r.sig.family] += len(members)
        last_line = max(last_line, r.lineno[members[-1]])
    while nxt is not None:
        last_line, went_to = _replay(source, nxt[1], result, last_line), None
        nxt = next(odd, None)
    # As the sink leaves it line by line: the line added last (each line holds one
    # hit of the lane's, so the next line's first hit may join any rollup).
    sink.line, sink.went_to = last_line, went_to


def _replay(source: str, got: ScanResult | Fed, result: ScanResult, last_line: int) -> int:
    """An odd line's hits and counts into `result`, as its match made them (a fed
    line: feed_preemption)."""
    if not isinstance(got, ScanResult):
        return max(last_line, feed_preemption(source, result, *got[2:]))
    for h in got.hits:
        result.add(h)
        last_line = max(last_line, h.line)
    result.skipped.update(got.skipped)
    result.recognised.update(got.recognised)
    return last_line


# A line walk gives the sink itself, in its place (lane_plain's retraction lines): its
# line index in the block, its minute, its rows and row.
Fed = tuple[int, str, "_Rows", int]


def feed_preemption(source: str, result: ScanResult, r: _Rows, i: int) -> int:
    """Preemption line i to the sink as RollupSink.add would take its hit (made only
    if a rollup keeps the line), counted as Matcher.match counts it; its line number."""
    sink = result.sink
    assert sink is not None
    line = r.lineno[i]
    if sink.preemptions:
        rec = _record(r, i)
        sink.add_preemption(
            _Deferred(partial(_hit, source, r, i)),
            rec.fields,
            rec.when,
            space_of(r.sig.id, r.proc[i], None, True),
            rec.wrapper,
            False,  # (no Ray repeat, no uptime: the lane's lines have none)
            line,
            rec.key,
        )
    else:
        result.add(_hit(source, r, i))
    result.recognised[r.sig.family] += 1
    return line


class _Record(NamedTuple):
    """What feed_preemption reads of a line's record and stamps: its fields, their
    copy key, its wrapper stamp and stamp(), each made from those texts alone. (A
    tuple: one is made for each record a rank prints, and a frozen dataclass's
    __init__ cost a one-rank thrash log more than it saved.)"""

    sig: Signature
    text: str
    wrapper_text: str | None
    ts: str | None
    fields: dict[str, FieldValue]
    key: CopyKey
    wrapper: WrapperStamp | None
    when: Stamp


# feed_preemption's last record. What it holds is made from its key's texts alone, so
# it stands across files, scans and forked workers.
_LAST: _Record | None = None


def _record(r: _Rows, i: int) -> _Record:
    """Line i's _Record: the last one's where its record and stamps are the last one's.
    Ranks print each record alike, one after the other (eight a second in a thrash
    loop), so only the first of them is read (~18 % fewer instructions for such a log);
    under a wrapper's stamp, which differs for each copy (its nanosecond), only the
    stamp is read again."""
    global _LAST
    text, ts = r.texts[i], r.ts[i]
    stamp_text = r.wrapper[i] if r.wrapper is not None else None
    last = _LAST
    if last is not None and last.text == text and last.sig is r.sig:
        if (
            last.wrapper_text == stamp_text
            and (last.wrapper is None or last.wrapper.kind == r.wrapper_kind)
            and last.ts == ts
        ):
            return last
        fields, key = last.fields, last.key
    else:
        fields = _fields(r, i)
        key = copy_key(fields)
    wrapper = _wrapper(r, i)
    # (_make: ~2,000 instructions a record fewer than the generated _Record(...))
    _LAST = _Record._make(
        (r.sig, text, stamp_text, ts, fields, key, wrapper, stamp_of(wrapper, ts))
    )
    return _LAST


def _feed(source: str, r: _Rows, i: int, sink: RollupSink) -> tuple[object, ...]:
    """Line i to the sink as RollupSink.add_ref would take it; its stream key."""
    fields = _fields(r, i)
    made = partial(_hit, source, r, i)
    wrapper = _wrapper(r, i)
    key = key_of(r.sig.id, r.proc[i], None, wrapper, fields, "")
    sink.add_ref(_Deferred(made), fields, stamp_of(wrapper, r.ts[i]), key, r.lineno[i])
    return key


@dataclass(frozen=True, slots=True)
class _Agg:
    rows: tuple[int, ...]
    n: int
    preemptions: int
    lower: bool
    sums: tuple[float, ...]
    counts: tuple[int, ...]
    maxes: tuple[float | None, ...]
    waiting_pos: int
    peak_row: int
    peak_kv: float
    peak_running: int | None
    preempting: tuple[int, ...]


def _agg_frame(f: pl.DataFrame) -> pl.DataFrame:
    """What Builder accumulates over each segment's lines, as polars aggregations: a
    row a segment (seg, set, rows, n, pre, lower, sum_/cnt_/max_ of AGG_FIELDS, wpos,
    peak_row, peak_kv, peak_running, preempting, counted: a line carries a preemption
    count)."""
    import polars as pl

    cols = set(f.columns)

    def value(k: str) -> pl.Expr:
        return pl.col(f"v_{k}") if f"v_{k}" in cols else pl.lit(None, dtype=pl.Float64)

    def raw(k: str) -> pl.Expr:
        return pl.col(f"p_{k}") if f"p_{k}" in cols else pl.lit(None, dtype=pl.Int64)

    # rollup.stats_preemptions, per line
    p, pr, rr = raw("preemptions"), raw("preempted_reqs"), raw("retracted_reqs")
    npre = (
        pl.when(p > 0).then(p).when(pr > 0).then(pr).when(rr > 0).then(rr).otherwise(0).fill_null(0)
    )
    lower = (~(p > 0).fill_null(False)) & (pr > 0).fill_null(False)
    kv = value("kv_usage")
    pick = pl.when(kv.is_null() | (kv == 0)).then(-1.0).otherwise(kv)
    filled = kv.fill_null(-1.0)
    f = f.with_columns(npre=npre, lower=lower, pick=pick, filled=filled)
    at_pick = pl.col("pick") == pl.col("pick").max()
    at_peak = pl.col("filled") == pl.col("filled").max()
    running = value("running").cast(pl.Int64)
    return f.group_by("seg", maintain_order=True).agg(
        set=pl.col("set").first(),
        rows=pl.col("i"),
        n=pl.len(),
        pre=pl.col("npre").sum(),
        lower=pl.col("lower").any(),
        # Builder adds line by line: a running sum is that order of additions.
        **{f"sum_{k}": value(k).fill_null(0.0).cum_sum().last() for k in AGG_FIELDS},
        **{f"cnt_{k}": value(k).is_not_null().sum() for k in AGG_FIELDS},
        **{f"max_{k}": value(k).max() for k in AGG_FIELDS},
        wpos=(value("waiting") > 0).fill_null(False).sum(),
        peak_row=pl.col("i")
        .filter(at_pick & (pl.col("npre") == pl.col("npre").filter(at_pick).max()))
        .first(),
        peak_kv=pl.col("filled").max(),
        peak_running=running.filter(at_peak).min(),
        preempting=pl.col("i").filter(pl.col("npre") > 0).head(2),
        # (a literal's test in a group_by panics polars 2.1: a column's only)
        counted=pl.col("p_preemptions").is_not_null().any()
        if "p_preemptions" in cols
        else pl.lit(False),
    )


def _agg_dict(agg: pl.DataFrame) -> dict[int, _Agg]:
    """_agg_frame's rows as _Agg, by segment."""
    if agg.height == 0:
        return {}
    col = {
        k: _shared(v) if k.startswith(("sum_", "max_")) else v
        for k, v in agg.to_dict(as_series=False).items()
    }
    sums = zip(*(col[f"sum_{k}"] for k in AGG_FIELDS), strict=True)
    counts = zip(*(col[f"cnt_{k}"] for k in AGG_FIELDS), strict=True)
    maxes = zip(*(col[f"max_{k}"] for k in AGG_FIELDS), strict=True)
    return {
        seg: _Agg(
            tuple(rows), n, int(pre), bool(low), s, c, m, int(w), pk, float(pkv), prun, tuple(pp)
        )
        for seg, rows, n, pre, low, s, c, m, w, pk, pkv, prun, pp in zip(
            col["seg"],
            col["rows"],
            col["n"],
            col["pre"],
            col["lower"],
            sums,
            counts,
            maxes,
            col["wpos"],
            col["peak_row"],
            col["peak_kv"],
            col["peak_running"],
            col["preempting"],
            strict=True,
        )
    }


def _calm_segments(
    plan: _Plan,
    segs: pl.DataFrame,
    agg: pl.DataFrame,
    others: dict[int, ScanResult],
    kv_limit: float | None,
    window: tuple[int, int],
) -> set[int]:
    """The inner segments that go as calm minutes, with calm minutes on (`kv_limit`:
    the KV usage they stay under), in windows of `window` (calm_of). Calm: every line
    says how many wait, none preempted or carries a preemption count (V1's
    `Preemptions:` makes every stats line a read of a late counter:
    diagnose/visibility.py), no V0 cumulative counter, KV under
    `kv_limit` (analyze.CALM_KV: none, but where a V0 counter delta may be spread onto
    such a window, windows.py). Such a window is suspected preemption, a stall,
    queueing or healthy whatever else the log holds, by its own numbers: no rule
    before PD107 can take it (window_rules.calm_judge).
    Not: the first segment of each clock in the block that is no edge (a calm minute
    is dated by the hit before it: timeline/calm.py), nor one in a clock minute that
    anything else of the block is in (an edge, another segment, an odd line): a window
    is all calm minutes or all events (a clash across blocks makes analyze scan again
    without them)."""
    if kv_limit is None or agg.height == 0:
        return set()
    import polars as pl

    counters = [j for j, r in enumerate(plan.sets) if "cumulative" in r.sig.fields]
    kv = f"max_{AGG_FIELDS[KV]}"
    quiet = (
        (pl.col("pre") == 0)
        & ~pl.col("lower")
        & ~pl.col("counted")
        & ~pl.col("set").is_in(pl.Series(counters, dtype=pl.Int64).implode())
        & (pl.col(f"cnt_{AGG_FIELDS[WAITING]}") == pl.col("n"))
        # (as `kv >= kv_limit` in Python: a NaN is under it)
        & ~(pl.col(kv) >= kv_limit).fill_null(False)
    )
    calm = set(agg.filter(quiet.fill_null(False)).get_column("seg").to_list())
    if not calm:
        return calm
    return calm_of(
        calm, segs.select("seg", "minute", "run", "edge").iter_rows(), others, (), window
    )


def calm_of(
    quiet: set[int],
    segs: Iterable[tuple[int, str, int, bool]],
    others: Mapping[int, ScanResult],
    fed: Iterable[str] = (),
    window: tuple[int, int] = (1, 0),
) -> set[int]:
    """Of the `quiet` inner segments, those that go as calm minutes (_calm_segments),
    from every segment of the block in order (seg, minute, clock run, edge); `fed`:
    the minutes of lines walk gives the sink itself (their hits', as an odd line's);
    `window`: (minutes a window, the zone's offset in minutes), window_of."""
    every, shift = window
    key = (lambda m: m) if every == 1 else (lambda m: window_of(m, every, shift))
    out: dict[int, str | int | None] = {}
    busy = {key(stamp(h)[1]) for got in others.values() for h in got.hits}
    busy.update(map(key, fed))
    run_now, anchored = 0, True
    for seg, minute, run, edge in segs:
        if run != run_now:
            run_now, anchored = run, False
        if edge or not anchored or seg not in quiet:
            busy.add(key(minute))
            anchored = True
        else:
            out[seg] = key(minute)
    return {seg for seg, at in out.items() if at not in busy}


# A stamp's clock minute (rollup.stamp's `minute`): its day (`MM-DD` of vLLM's engine
# stamp, `YYYY-MM-DD` of a wrapper's), hour, minute and zone.
_MINUTE = re.compile(
    r"(?:(?P<year>\d{4})-)?(?P<month>\d{2})-(?P<day>\d{2})[ T]"
    r"(?P<hour>\d{2}):(?P<minute>\d{2})"
    r"(?P<zone>Z|(?P<sign>[+-])(?P<zh>\d{2}):?(?P<zm>\d{2}))?"
)


def window_of(minute: str | None, every: int, shift: int) -> str | int | None:
    """Which window of `every` minutes the clock minute `minute` (rollup.stamp's) is
    in, as a key: windows start at multiples of their length in UTC, on the clock
    `shift` minutes behind the stamp's (for a zone that many minutes ahead of UTC),
    or its own zone's where it has one (a wrapper's). Its day counts from its date (a
    year-less one's in a leap year: a window across a new year has a key each side).
    A key is only ever compared with the others of its log: two for one window make
    its minutes clash, and analyze scan again without calm minutes; exact either way."""
    m = _MINUTE.fullmatch(minute) if minute else None
    day = _day_number(m["year"], m["month"], m["day"]) if m else None
    if m is None or day is None:
        return minute
    if m["sign"]:
        ahead = int(m["zh"]) * 60 + int(m["zm"])
        shift = ahead if m["sign"] == "+" else -ahead
    elif m["zone"]:
        shift = 0  # (`Z`)
    return (day * 1440 + int(m["hour"]) * 60 + int(m["minute"]) - shift) // every


@lru_cache(maxsize=64)
def _day_number(year: str | None, month: str, day: str) -> int | None:
    try:
        return date(int(year) if year else 2000, int(month), int(day)).toordinal()
    except ValueError:
        return None


def _calm_rows(source: str, plan: _Plan, agg: pl.DataFrame) -> list[CalmRows]:
    """The calm segments' rows (records.CalmRows), one CalmRows a signature set."""
    return [
        _calm_set(source, plan.sets[int(which[0])], part)
        for which, part in agg.partition_by("set", maintain_order=True, as_dict=True).items()
    ]


def _calm_set(source: str, r: _Rows, part: pl.DataFrame) -> CalmRows:
    """The calm rows of one set: their numbers from the aggregates, their first, last
    and peak lines' from the set's columns. (Taken from the Python lists, not
    gathered from a polars column: a gathered string keeps its block's whole buffer
    alive, ~1 MiB a block, measured.)"""
    import polars as pl

    sglang = r.wrapper is not None
    stamps = r.wrapper if r.wrapper is not None else r.ts
    rows = part.get_column("rows")
    first, last = rows.list.first().to_list(), rows.list.last().to_list()
    peak = part.get_column("peak_row").to_list()
    at = 11 if sglang else 6  # the hour in `YYYY-MM-DD HH:MM:SS` / `MM-DD HH:MM:SS`

    def take(values: Sequence[Any], which: list[int], dtype: Any = None) -> pl.Series:
        return pl.Series([values[i] for i in which], dtype=dtype)

    stamp_first = take(stamps, first, pl.Utf8)
    stamp_peak = take(stamps, peak, pl.Utf8)
    # (a signature without the field: None, as its typed column would be)
    swapped = r.typed.get("swapped", [None] * len(r.lineno))
    waiting = r.typed.get("waiting", [None] * len(r.lineno))
    # windows.snapped_mean of a minute's sum and count (snap6 is polars' round(6),
    # tests/timeline/test_windows_small.py): here, not per window after the scan
    means = part.select(
        pl.when(pl.col(f"cnt_{k}") > 0)
        .then(((pl.col(f"sum_{k}") + 0.0).round(6) / pl.col(f"cnt_{k}")).round(6))
        .alias(f"mean_{k}")
        for k in CALM_MEANS
    )
    columns: dict[str, pl.Series] = {
        "first_line": take(r.lineno, first, pl.Int64),
        "first_us": _two_digits(stamp_first, at + 6) * _US,
        "last_line": take(r.lineno, last, pl.Int64),
        "last_us": _two_digits(take(stamps, last, pl.Utf8), at + 6) * _US,
        "last_pos": take(r.start, last, pl.Int64),
        "day": stamp_first.str.slice(0, at - 1),
        "hour": _two_digits(stamp_first, at),
        "minute": _two_digits(stamp_first, at + 3),
        "n": part.get_column("n").cast(pl.Int64),
        **{c: part.get_column(c) for c in CALM_COLUMNS if c.startswith(("sum_", "max_"))},
        **{c: part.get_column(c).cast(pl.Int64) for c in CALM_COLUMNS if c.startswith("cnt_")},
        **{c: means.get_column(c) for c in CALM_COLUMNS if c.startswith("mean_")},
        "peak_kv": part.get_column("peak_kv"),
        "peak_running": part.get_column("peak_running"),
        "swapped_first": take(swapped, first),
        "swapped_last": take(swapped, last),
        "waiting_first": take(waiting, first),
        "waiting_last": take(waiting, last),
        "waiting_pos": part.get_column("wpos").cast(pl.Int64),
        "peak_line": take(r.lineno, peak, pl.Int64),
        "peak_pos": take(r.start, peak, pl.Int64),
        "peak_text": take(r.texts, peak, pl.Utf8),
        "peak_us": _two_digits(stamp_peak, at + 6) * _US,
        "peak_proc": take(r.proc, peak, pl.Utf8),
    }
    sig = r.sig
    frame = pl.DataFrame(
        [
            *(columns[c].alias(c) for c in CALM_COLUMNS),
            *(take(r.typed[n], peak).alias(f"f_{n}") for n in sig.fields),
        ]
    )
    return calm_rows(source, sig, sglang, plain_columns(frame))


def calm_rows(
    source: str, sig: Signature, sglang: bool, frame: Columns, zone: str | None = None
) -> CalmRows:
    """A block's calm minutes of `sig` (frame: CALM_COLUMNS, then f_ and each field),
    their peak lines' texts packed (records.Packed: a month's are ~10 MB as texts,
    ~1 MB packed, held by the report and sent by a --jobs worker so); `zone`:
    CalmRows.zone."""
    return CalmRows(
        source,
        sig.id,
        sig.kind,
        sig.engine,
        sig.constants,
        tuple(sig.fields),
        sglang,
        _packed(frame),
        zone,
    )


_PEAK_TEXT = CALM_COLUMNS.index("peak_text")
PACK_MIN = 16  # (fewer texts are kept as they are: packing them saves little)


def _packed(frame: Columns) -> Columns:
    """The frame with its peak lines' texts packed (records.Packed) and its columns
    of numbers (records.PackedNumbers: a month's are ~6 MiB as arrays, ~2 MiB so),
    when it has PACK_MIN rows or more."""
    data = list(frame.data)
    if frame.height < PACK_MIN:
        return frame
    texts = data[_PEAK_TEXT]
    if not isinstance(texts, Const):
        data[_PEAK_TEXT] = Packed.of(texts) or texts
    for j, column in enumerate(data):
        if isinstance(column, array):
            data[j] = PackedNumbers.of(column)
    return Columns(frame.names, tuple(data))


def plain_columns(frame: pl.DataFrame) -> Columns:
    """`frame` as records.Columns (records.column_of): a column of one value a Const,
    of floats or of 64-bit-safe integers with no null an array of them, any other its
    to_list, with equal strings one object (a day, a process name, `GPU` on every row:
    ~7 MiB of a month's, and pickled once)."""
    import polars as pl

    data: list[Sequence[Any]] = []
    for col in frame.get_columns():
        dtype = col.dtype
        code = (
            "d"
            if dtype == pl.Float64
            else "q"
            if dtype.is_integer() and dtype != pl.UInt64  # (one past int64 would not fit)
            else None
        )
        data.append(column_of(col.to_list(), code))
    return Columns(tuple(frame.columns), tuple(data))


_US = 1_000_000  # (CalmRows' seconds are microseconds into the minute)


def _two_digits(text: pl.Series, start: int) -> pl.Series:
    """The number a stamp prints at `start` (two digits: the lane checked its shape)."""
    import polars as pl

    return text.str.slice(start, 2).cast(pl.Int64)


def _stats(a: _Agg) -> RollupStats:
    """What Builder.build sums up of the segment's lines."""
    return RollupStats(
        n=a.n,
        preemptions=a.preemptions,
        lower=a.lower,
        sums=a.sums,
        counts=a.counts,
        maxes=a.maxes,
        waiting_pos=a.waiting_pos,
        peak_kv=a.peak_kv,
        peak_running=a.peak_running,
    )


def _close_segment(source: str, r: _Rows, a: _Agg, sink: RollupSink) -> None:
    """Append the hit Builder.build gives for this closed segment to the sink (each
    hit made once: the carrier with its rollup, the last line slimmed unless kept)."""
    carrier_row = a.rows[0]
    if a.n == 1:
        sink.hits.append(_hit(source, r, carrier_row))
        return
    made: dict[int, Hit] = {}

    def hit(i: int) -> Hit:
        h = made.get(i)
        if h is None:
            h = made[i] = _hit(source, r, i)
        return h

    last_row = a.rows[-1]
    if last_row == a.peak_row or last_row in a.preempting:
        last = hit(last_row)
    else:
        last = _hit(source, r, last_row, last_fields(_fields(r, last_row)), "")
    rollup = Rollup(_stats(a), last, hit(a.peak_row), tuple(hit(i) for i in a.preempting))
    sink.hits.append(_hit(source, r, carrier_row, rollup=rollup))
    kept_rows = {last_row, a.peak_row, *a.preempting} - {carrier_row}
    sink.members += len(kept_rows)
