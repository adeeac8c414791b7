"""Whole blocks of plain stats lines, matched and rolled up as columns.

A month of a quiet server's log is a stats line every 10 s and little else. Line by
line (bulk.py included) each of them costs tens of microseconds of Python: the
prefilter's callbacks, candidate selection, decoy checks, a regex per candidate
signature, the rollup sink. Here a block whose candidate lines are all plain stats
lines (vLLM's `(Proc pid=N) LEVEL MM-DD HH:MM:SS [file:line] ` head and one stats
match) is read as one polars column: the candidate test, the match counts, the
captures, the typed fields, the stamps and the stream keys are column operations, and
so are the stream-minute rollups (rollup.py) of every minute that opens and closes
inside the block. Python touches only the lines a rollup keeps (its carrier, peak,
preempting lines) and the few lines at a block's edges, which go through the rollup
sink one by one so an open rollup carries on into the next block exactly.

Exactness: this must give what the line-by-line scan gives. A block qualifies only
when every line in it is ASCII without control characters, and every candidate line
(one holding a prefilter literal) holds no request text (no trigger of
model/request_text.py), no Ray repeat mark, no V0 `llm_engine.py:` tag, has vLLM's
plain head right before its single match of a builtin stats signature, no match of
any other candidate signature, fields of digit-string shape, and a stamp that is a
real time. Such a line opens a record (so no wrapped record, decoy carry or rejoin
touches it) and normalise leaves it as it is. Anything else, and the block goes the
line-by-line way (passes.py). tests/test_lane.py holds the two to identical hits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from preemptdiag.model import request_text
from preemptdiag.model.records import FieldValue, Hit, Kind, Rollup, RollupStats
from preemptdiag.scan.bulk import _CAST_SHAPES, _HEAD, _Deferred
from preemptdiag.scan.lines import _RECORD_START
from preemptdiag.scan.matcher import MAX_EVIDENCE_CHARS, Matcher, ScanResult, cut
from preemptdiag.scan.rollup import (
    AGG_FIELDS,
    LAST_FIELDS,
    RollupSink,
    _with,
    key_of,
    stamp_of,
)
from preemptdiag.scan.rust_regex import anchored, ascii_only, rust_ok, zero_test
from preemptdiag.scan.signatures import Signature

if TYPE_CHECKING:
    import polars as pl

# A block qualifies only with no byte outside printable ASCII but its newlines.
_UNPLAIN = re.compile(rb"[^\x20-\x7e\n]")
# Candidate lines that go the line-by-line way whatever they hold.
_STOP = ("[repeated", " llm_engine.py:", *request_text.TRIGGERS)
MAX_LINE = 4096  # a longer candidate line: not a plain stats line
_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # 2001: no Feb 29 here
_PRE, _ALL = "lane_prefix_", "lane_match_"
ENABLED = True  # tests turn it off to hold the lane to the line-by-line scan
_NUMERIC = ("int", "int_commas", "float", "percent")
_PREEMPT_FIELDS = ("preemptions", "preempted_reqs", "retracted_reqs")


@dataclass(slots=True)
class Lane:
    """Per scan: when to try the lane again after a block it did not take."""

    misses: int = 0
    retry_at: int = 0

    def due(self, block: int) -> bool:
        return block >= self.retry_at

    def missed(self, block: int) -> None:
        self.misses += 1
        self.retry_at = block + min(64, 1 << min(self.misses, 6))

    def took(self) -> None:
        self.misses = 0


@dataclass(slots=True)
class _Rows:
    """The candidate lines of a block that one stats signature matched, as columns."""

    sig: Signature
    lineno: list[int]
    texts: list[str]
    start: list[int]
    end: list[int]
    proc: list[str]
    ts: list[str]
    typed: dict[str, list[Any]]  # field -> values, in signature order
    frame: Any  # polars DataFrame: row, key, minute, sec, run, numbers


def try_block(
    matcher: Matcher,
    source: str,
    block: bytearray,
    size: int,
    first_line: int,
    result: ScanResult,
) -> int | None:
    """Match and roll up block[:size] as the line-by-line scan would; the number of
    newlines in it when done, None (nothing recorded) when the block does not qualify."""
    sink = result.sink
    assert sink is not None
    body = bytes(block[:size])
    if _UNPLAIN.search(body):
        return None
    text = body.decode("ascii")
    newlines = text.count("\n")
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
        or c.str.contains_any(list(_STOP)).any()
    ):
        return None
    found = _find(matcher, c)
    if found is None:
        return None
    sig, caps = found
    built = _columns(sig, c, caps, rows, first_line)
    if built is None:
        return None
    _roll(source, built, sink, result)
    result.recognised[sig.family] += len(c)
    return newlines


def _find(matcher: Matcher, c: pl.Series) -> tuple[Signature, pl.DataFrame] | None:
    """The one stats signature every line matches once (and no other candidate
    signature anywhere), with the captures; None when the lines are not all so."""
    import polars as pl

    line0 = c[0]
    present = [lit for lit in matcher.literals if lit in line0]
    absent = [lit for lit in matcher.literals if lit not in present]
    if absent and c.str.contains_any(absent).any():
        # (a `Preemptions: N` among them, say) the literals any line holds
        extra = c.str.extract_many(absent, overlapping=True).explode().drop_nulls()
        present += extra.unique().to_list()
    # Every line's candidate signatures are among these: all must find nothing, but
    # the one stats signature, once a line.
    cands = matcher.candidates(" \n ".join(present))
    if not cands or not all(s.builtin for s in cands):
        return None
    matching = [s for s in cands if any(True for _ in s.finditer(line0))]
    if len(matching) != 1 or matching[0].kind is not Kind.STATS:
        return None
    lane = matching[0]
    pattern = ascii_only(lane.pattern)
    if pattern is None or not rust_ok(pattern) or anchored(lane.pattern):
        return None
    zero = [zero_test(s.pattern) for s in cands if s is not lane]
    if any(z is None for z in zero):
        return None
    if not c.str.contains_any(list(lane.prefilter)).all():
        return None  # a line that is no candidate of it: matched otherwise
    if zero and c.str.contains("|".join(f"(?:{z})" for z in zero)).any():
        return None
    heads = c.str.extract_groups(ascii_only(_HEAD) or _HEAD).struct.unnest()
    head = heads.get_column("bulk_head_").str.len_chars()
    if head.null_count() or not (
        (c.str.find(pattern) == head).all() and (c.str.count_matches(pattern) == 1).all()
    ):
        return None
    # One record in each line, the one its head opens (a record start matches there,
    # ending at the stamp; none can start in the `[file:line] ` after it): the hit's
    # text is then the line (cut), as Marks.record_text finds it.
    starts = ascii_only(_RECORD_START.pattern) or _RECORD_START.pattern
    if c.str.slice(head).str.contains(starts).any():
        return None
    # The match starts right after the head (a space), so it reads the same there as
    # in the whole line: a `\\b` sees a non-word character either way, `^` is refused.
    caps = c.str.slice(head).str.extract_groups(f"^(?P<{_ALL}>{pattern})").struct.unnest()
    frame = pl.concat([caps, heads], how="horizontal").with_columns(head.alias(_PRE))
    return lane, frame


def _columns(
    sig: Signature, c: pl.Series, caps: pl.DataFrame, rows: pl.Series, first_line: int
) -> _Rows | None:
    """The lines' fields, stamps and stream keys; None when a value or stamp is of a
    shape the line-by-line scan might read otherwise."""
    import polars as pl

    if any(k in sig.constants for k in (*AGG_FIELDS, *_PREEMPT_FIELDS)):
        return None
    if not all(t == "str" or t in _CAST_SHAPES for t in sig.fields.values()):
        return None
    # Builder reads these as numbers (an int preemption count): other types, other
    # readings.
    if any(sig.fields.get(k, "int") not in _NUMERIC for k in AGG_FIELDS) or any(
        sig.fields.get(k, "int") not in ("int", "int_commas") for k in _PREEMPT_FIELDS
    ):
        return None
    typed: dict[str, pl.Series] = {}
    for name, typ in sig.fields.items():
        col = caps.get_column(name)
        if typ == "str":
            typed[name] = col
            continue
        if not (col.is_null() | col.str.contains(_CAST_SHAPES[typ])).all():
            return None
        typed[name] = col.cast(pl.Float64 if typ in ("float", "percent") else pl.Int64)
    ts = caps.get_column("bulk_ts_")
    month = ts.str.slice(0, 2).cast(pl.Int64)
    day = ts.str.slice(3, 2).cast(pl.Int64)
    hms = [ts.str.slice(k, 2).cast(pl.Int64) for k in (6, 9, 12)]
    days = pl.Series(_DAYS).gather((month - 1).clip(0, 11))
    real = (
        (month >= 1)
        & (month <= 12)
        & (day >= 1)
        & (day <= days)
        & (hms[0] <= 23)
        & (hms[1] <= 59)
        & (hms[2] <= 59)
    )
    if not real.all():
        return None
    proc = caps.get_column("bulk_proc_")
    # The stream key (rollup.key_of) of a plain line: its process and which fields
    # are missing (the rest is the same on every line here).
    stream = pl.select(
        pl.concat_str(
            [proc, *(typed[n].is_null().cast(pl.Utf8) for n in sig.fields)], separator="\x00"
        )
    ).to_series()
    clock = ts.str.slice(0, 5)
    frame = pl.DataFrame(
        {
            "row": pl.int_range(0, len(c), eager=True),
            "stream": stream,
            "minute": ts.str.slice(0, 11),
            "sec": hms[2],
            "run": (clock != clock.shift(1)).fill_null(False).cast(pl.Int64).cum_sum(),
            **{f"v_{k}": typed[k].cast(pl.Float64) for k in AGG_FIELDS if k in typed},
            **{f"p_{k}": typed[k] for k in _PREEMPT_FIELDS if k in typed},
        }
    )
    pre = caps.get_column(_PRE)
    whole = caps.get_column(_ALL).str.len_chars()
    return _Rows(
        sig=sig,
        lineno=(rows + first_line).to_list(),
        texts=c.to_list(),
        start=pre.to_list(),
        end=(pre + whole).to_list(),
        proc=proc.to_list(),
        ts=ts.to_list(),
        typed={k: v.to_list() for k, v in typed.items()},
        frame=frame,
    )


def _fields(r: _Rows, i: int) -> dict[str, FieldValue]:
    out: dict[str, FieldValue] = dict(r.sig.constants)
    for name in r.sig.fields:
        out[name] = r.typed[name][i]
    return out


def _hit(
    source: str,
    r: _Rows,
    i: int,
    fields: dict[str, FieldValue] | None = None,
    text: str | None = None,
) -> Hit:
    """The hit new_hit makes of line i: its text is the line (one record, cut), its
    stamp and process the head's (the only ones before the match), no wrapper, pod,
    uptime or repeat (_find saw to all that). With `fields` and `text`: that hit
    slimmed as Builder._kept_last slims a rollup's last line."""
    return Hit(
        source,
        r.lineno[i],
        r.sig.id,
        r.sig.kind,
        _fields(r, i) if fields is None else fields,
        cut(r.texts[i][: MAX_EVIDENCE_CHARS + 1]) if text is None else text,
        None,
        r.ts[i],
        r.proc[i],
        1,
        None,
        None,
        None,
        r.sig.engine,
        r.start[i],
    )


def _key(r: _Rows, i: int, fields: dict[str, FieldValue]) -> tuple[object, ...]:
    return key_of(r.sig.id, r.proc[i], None, None, fields, "")


def _roll(source: str, r: _Rows, sink: RollupSink, result: ScanResult) -> None:
    """Add the block's lines to `sink` as RollupSink.add_ref would one by one: the
    segments (one stream, one clock minute, stamps not going back, no change of
    month-day between) that open and close inside the block are aggregated as
    columns; the first of each stream in the block's first month-day and the last of
    each stream in its last one go through the sink, line by line."""
    import polars as pl

    f = r.frame
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
            rows=pl.col("row"),
            run=pl.col("run").first(),
            stream=pl.col("stream").first(),
        )
        .with_columns(
            edge=(pl.col("run") == 0) & pl.col("stream").is_first_distinct()
            | (pl.col("run") == last_run) & pl.col("stream").is_last_distinct()
        )
    )
    inner = segs.filter(~pl.col("edge")).get_column("seg")
    aggs = _aggregates(r, f.filter(pl.col("seg").is_in(inner.implode())))
    run_now = 0
    # The sink's key of each stream whose last segment so far went to it line by line:
    # the stream's next segment closes that rollup (its first line is one the rollup
    # does not accept), as the sink would on that line. Left open, a later segment fed
    # to the sink might join it: a stream whose clock goes back to that minute (two
    # pods' logs one after the other) had its two runs of the minute merged.
    fed: dict[str, tuple[object, ...]] = {}
    for seg, first, members, run, edge, stream in segs.select(
        "seg", "first", "rows", "run", "edge", "stream"
    ).iter_rows():
        if run != run_now:
            # Another month-day: the sink would close every open rollup (they all
            # have the old one) on the first line stamped with it.
            run_now = run
            for k in list(sink.open):
                sink._close(sink.open.pop(k))
            fed.clear()
            sink.clock = ("e", r.ts[first][:5])
        key = fed.pop(stream, None)
        if key is not None and (open_one := sink.open.pop(key, None)) is not None:
            sink._close(open_one)
        if edge:
            for i in members:
                fed[stream] = _feed(source, r, i, sink)
        else:
            _close_segment(source, r, aggs[seg], sink)
    # As the sink leaves it line by line: the line added last (each of these lines
    # holds one hit, so the next line's first hit may join any rollup).
    sink.line, sink.went_to = r.lineno[-1], sink.went_to if edge else None


def _feed(source: str, r: _Rows, i: int, sink: RollupSink) -> tuple[object, ...]:
    """Line i to the sink as RollupSink.add_ref would take it; its stream key."""
    fields = _fields(r, i)
    made = partial(_hit, source, r, i)
    key = _key(r, i, fields)
    sink.add_ref(_Deferred(made), fields, stamp_of(None, r.ts[i]), key, r.lineno[i])
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


def _aggregates(r: _Rows, f: pl.DataFrame) -> dict[int, _Agg]:
    """What Builder accumulates over each segment's lines, as polars aggregations."""
    import polars as pl

    if f.height == 0:
        return {}
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
    agg = f.group_by("seg", maintain_order=True).agg(
        rows=pl.col("row"),
        n=pl.len(),
        pre=pl.col("npre").sum(),
        lower=pl.col("lower").any(),
        # Builder adds line by line: a running sum is that order of additions.
        **{f"sum_{k}": value(k).fill_null(0.0).cum_sum().last() for k in AGG_FIELDS},
        **{f"cnt_{k}": value(k).is_not_null().sum() for k in AGG_FIELDS},
        **{f"max_{k}": value(k).max() for k in AGG_FIELDS},
        wpos=(value("waiting") > 0).fill_null(False).sum(),
        peak_row=pl.col("row")
        .filter(at_pick & (pl.col("npre") == pl.col("npre").filter(at_pick).max()))
        .first(),
        peak_kv=pl.col("filled").max(),
        peak_running=running.filter(at_peak).min(),
        preempting=pl.col("row").filter(pl.col("npre") > 0).head(2),
    )
    col = agg.to_dict(as_series=False)
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


def _close_segment(source: str, r: _Rows, a: _Agg, sink: RollupSink) -> None:
    """Append the hit Builder.build gives for this closed segment to the sink."""
    carrier_row = a.rows[0]
    made: dict[int, Hit] = {}

    def hit(i: int) -> Hit:
        h = made.get(i)
        if h is None:
            h = made[i] = _hit(source, r, i)
        return h

    carrier = hit(carrier_row)
    if a.n == 1:
        sink.hits.append(carrier)
        return
    last_row = a.rows[-1]
    keep_last = last_row == a.peak_row or last_row in a.preempting
    if keep_last:
        last = hit(last_row)
    else:
        fields = _fields(r, last_row)
        kept = {k: fields[k] for k in LAST_FIELDS if k in fields}
        last = _hit(source, r, last_row, kept, "")
    stats = RollupStats(
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
    rollup = Rollup(stats, last, hit(a.peak_row), tuple(hit(i) for i in a.preempting))
    sink.hits.append(_with(carrier, carrier.fields, carrier.text, rollup))
    kept_rows = {last_row, a.peak_row, *a.preempting} - {carrier_row}
    sink.members += len(kept_rows)
