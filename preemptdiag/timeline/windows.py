"""Events -> fixed windows of log time per replica, aggregated with polars.

Polars holds the (small) events table, never raw lines (design.md section 5).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from preemptdiag.model.config import Thresholds
from preemptdiag.model.records import Event, Kind, Window
from preemptdiag.scan.rollup import AGG_FIELDS, number, snap6

# (replica, time of a counter read) -> the earliest a preemption counted after that read
# can have happened (build_windows)
CountedSince = Callable[[str, datetime], datetime]

if TYPE_CHECKING:
    import polars as pl

MAX_EVIDENCE_PER_WINDOW = 6

_COLUMNS = {
    "idx": "Int64",
    "replica": "Utf8",
    "wstart": "Int64",
    "kind": "Utf8",
    "source": "Utf8",
    "lines": "Int64",  # log lines the row stands for (a rollup: many)
    "stats_lines": "Int64",
    "preemptions": "Float64",
    "lower": "Boolean",
    "cumulative": "Int64",
    "kv_max": "Float64",
    "kv_sum": "Float64",
    "kv_n": "Int64",
    "running_max": "Int64",
    "running_sum": "Float64",
    "running_n": "Int64",
    "waiting_first": "Int64",
    "waiting_last": "Int64",
    "waiting_max": "Int64",
    "waiting_pos": "Int64",
    "waiting_n": "Int64",
    "swapped_first": "Int64",
    "swapped_last": "Int64",
    "swapped_max": "Int64",
    "prompt_sum": "Float64",
    "prompt_n": "Int64",
    "gen_sum": "Float64",
    "gen_n": "Int64",
    # Order key (with source) of the row's last line.
    "last_us": "Int64",
    "last_line": "Int64",
    "last_pos": "Int64",  # records glued on one line: where each starts in it
    "last_sig": "Utf8",
    "peak_kv": "Float64",  # highest KV usage (-1: none)
    "peak_running": "Int64",  # fewest running on a line at peak_kv
}
# The order of rows' last lines: in the log's order whatever the rows' order
# (_log_order's, for one row's last line: fuzz seed 8081 input 8048).
_LAST_ORDER = ("last_us", "source", "last_line", "last_pos", "last_sig")


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def window_start(ts: datetime | None, seconds: int) -> int | None:
    if ts is None:
        return None
    epoch = int(ts.timestamp())
    return epoch - epoch % seconds


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _micros(ts: datetime | None) -> int | None:
    if ts is None:
        return None
    d = ts - _EPOCH  # (d // timedelta(microseconds=1)), in integers: a third of the time
    return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds


def _rows(events: Sequence[Event], seconds: int) -> Iterator[tuple[Any, ...]]:
    """The events table's rows, in _COLUMNS order. A row is one event or one rollup of
    stats lines (rollup.py). It carries sums, counts and maxima, its first and last
    values, and the order keys of its last line, so the aggregation in build_windows
    gives what it gives line by line."""
    for i, e in enumerate(events):
        is_stats = e.kind is Kind.STATS
        r = e.rollup
        last = r.last if r else e
        if r is not None:
            peak: tuple[Any, ...] = (r.stats.peak_kv, r.stats.peak_running)
        elif is_stats:
            kv = number(e.fields.get("kv_usage"))
            # (a scrape of several engines: the running of the one whose KV usage it is)
            running = e.fields.get("peak_running", e.fields.get("running"))
            peak = (-1.0 if kv is None else kv, _int(running))
        else:
            peak = (-1.0, None)
        yield (
            i,
            e.replica,
            window_start(e.ts, seconds),
            e.kind.value,
            e.source,
            r.stats.n if r else 1,  # e.lines
            (r.stats.n if r else 1) if is_stats else 0,
            float(e.preemptions),
            e.lower_bound,
            r.stats.highest if r and not is_stats else _int(e.fields.get("cumulative")),
            *(_stats_cells(e) if is_stats else _NO_STATS),
            _micros(last.ts),
            last.line,
            last.pos,
            last.sig,
            *peak,
        )


def _table(events: Sequence[Event], seconds: int) -> pl.DataFrame:
    """The events table (_rows) as a polars frame, made a chunk at a time: the whole
    table as Python columns (8 bytes a cell and an object a value) was ~35 MiB of a
    month of stats lines' peak, left in the allocator's arenas after."""
    import polars as pl

    schema: dict[str, Any] = {name: getattr(pl, dtype) for name, dtype in _COLUMNS.items()}
    frames: list[pl.DataFrame] = []
    rows: list[tuple[Any, ...]] = []
    for row in _rows(events, seconds):
        if len(rows) == _CHUNK:
            frames.append(_frame(rows, schema))
        rows.append(row)
    frames.append(_frame(rows, schema))
    return frames[0] if len(frames) == 1 else pl.concat(frames, rechunk=True)


_CHUNK = 4096  # rows held as tuples at a time: their memory, not the table's, is the cost


def _frame(rows: list[tuple[Any, ...]], schema: dict[str, Any]) -> pl.DataFrame:
    """`rows` as a frame of the events table, column by column; empties `rows`."""
    import polars as pl

    cols: dict[str, Sequence[Any]] = {n: () for n in _COLUMNS}
    if rows:
        cols = dict(zip(_COLUMNS, zip(*rows, strict=True), strict=True))
    rows.clear()
    return pl.DataFrame(cols, schema=schema)


_KV, _RUNNING, _WAITING, _SWAPPED, _PROMPT, _GEN = (
    AGG_FIELDS.index(k)
    for k in ("kv_usage", "running", "waiting", "swapped", "prompt_tput", "gen_tput")
)
# The stats cells of an event that is no stats line, in _COLUMNS order (kv_max ...
# gen_n): no values, and counts (of lines with a value, with Waiting > 0) of 0.
_STATS_COLUMNS = tuple(_COLUMNS)[
    tuple(_COLUMNS).index("kv_max") : tuple(_COLUMNS).index("gen_n") + 1
]
_NO_STATS = tuple(0 if c.endswith("_n") or c == "waiting_pos" else None for c in _STATS_COLUMNS)


def _stats_cells(e: Event) -> tuple[Any, ...]:
    """Sums, counts, maxima, first and last values of a stats line or rollup, in
    _COLUMNS order (kv_max ... gen_n)."""
    maxes: tuple[float | None, ...]
    if e.rollup is None:
        maxes = tuple(number(e.fields.get(k)) for k in AGG_FIELDS)
        sums = tuple(v or 0.0 for v in maxes)
        counts = tuple(0 if v is None else 1 for v in maxes)
        w = _int(e.fields.get("waiting"))
        pos = 1 if w is not None and w > 0 else 0
        first = last = e.fields
    else:
        r = e.rollup
        st = r.stats
        sums, counts, maxes, pos = st.sums, st.counts, st.maxes, st.waiting_pos
        # Every line of a rollup has the same fields present: its first and last
        # values are its first and last line's.
        first, last = e.fields, r.last.fields
    return (
        maxes[_KV],
        sums[_KV] if counts[_KV] else None,
        counts[_KV],
        _int(maxes[_RUNNING]),
        sums[_RUNNING] if counts[_RUNNING] else None,
        counts[_RUNNING],
        _int(first.get("waiting")),
        _int(last.get("waiting")),
        _int(maxes[_WAITING]),
        pos,
        counts[_WAITING],
        _int(first.get("swapped")),
        _int(last.get("swapped")),
        _int(maxes[_SWAPPED]),
        sums[_PROMPT] if counts[_PROMPT] else None,
        counts[_PROMPT],
        sums[_GEN] if counts[_GEN] else None,
        counts[_GEN],
    )


def snapped_mean(num: str, den: str) -> pl.Expr:
    """A window's mean of column `num` over the counts in `den`, the same whatever
    order its partial sums come in. Partial sums (rollups, --jobs ranges cutting one)
    and line-by-line sums differ in the last bits. The sum is snapped to 6 decimals
    first (every value an engine prints has at most 2, so the exact sum has too, and
    float error is far below 5e-7): the mean is then one division of one number
    whatever the order, and rounding it to 6 decimals cannot fall either side of a tie."""
    import polars as pl

    mean = pl.col(num).sum().round(6) / pl.col(den).sum()
    return pl.when(pl.col(den).sum() > 0).then(mean.round(6))


# Up to this many table rows (events and rollups) the windows are aggregated in Python
# (_aggregated_small), with the polars query's results: importing polars (~0.12 s of
# CPU and ~40 MiB) was a third of a small log's run and half its memory. Above it polars
# is paid for. tests/timeline/test_windows_small.py holds the two to equal windows.
# Python was faster and leaner at every size measured: an SGLang server thrashing for
# days, 27,650 retraction events (50 MiB of log), 6.2 s and 117 MiB against 6.7 s and
# 180 MiB; 83,000 (150 MiB), 11.7 s and 258 MiB against 12.8 s and 359 MiB (both tables
# are built from the events in Python; polars adds its import and its copy). It was
# 5,000 until session 30.
SMALL_TABLE = 1 << 18
# The aggregate columns the V0 counter spread reads.
_SPREAD_COLUMNS = ("replica", "wstart", "preemptions", "kv_max")


def build_windows(
    events: Sequence[Event],
    seconds: int,
    thr: Thresholds,
    counted_since: CountedSince | None = None,
) -> list[Window]:
    """The windows of `events`. `counted_since(replica, read)`: for a replica whose
    /metrics counter counts late (V1: visibility.Settled), the earliest a preemption
    counted after that read can have happened; its deltas spread back to there."""
    if not events:
        return []
    warnings = [
        e
        for e in events
        if e.kind is Kind.PREEMPTION and isinstance(e.fields.get("cumulative"), int) and e.ts
    ]
    rows: Iterable[Mapping[str, Any]]
    if len(events) <= SMALL_TABLE:
        rows = small = _aggregated_small(events, seconds)
        columns = partial(_columns_of, small)
    else:
        agg = _aggregated(events, seconds)
        rows = _agg_rows(agg)
        columns = partial(_frame_columns, agg)
    # (no delta between two warnings: each window keeps its own count)
    spread, spread_over = (
        _spread_counter_deltas(warnings, columns(), seconds, thr, counted_since)
        if len(warnings) > 1
        else ({}, {})
    )
    return [_window(r, events, spread, spread_over, seconds) for r in rows]


def _aggregated(events: Sequence[Event], seconds: int) -> pl.DataFrame:
    """The windows' aggregates, a row a (replica, window start), by polars."""
    # Imported here: polars costs ~0.12 s to import, and analyze starts that import
    # in the background (preload_polars) while a pipe is scanned.
    import polars as pl

    df = _table(events, seconds)
    kind = pl.col("kind")

    def last_by(col: str, *keys: str) -> pl.Expr:
        # The value of the last line in log order: rows are in the order of their
        # first line, but a rollup's last line can come after a later row's.
        return pl.col(col).sort_by(list(keys), maintain_order=True).drop_nulls().last()

    return (
        df.group_by(["replica", "wstart"], maintain_order=True)
        .agg(
            n_events=pl.col("lines").sum(),
            n_stats=pl.col("stats_lines").sum(),
            preemptions=pl.col("preemptions").sum(),
            lower=pl.col("lower").any(),
            max_cum=pl.col("cumulative").max(),
            kv_max=pl.col("kv_max").max(),
            kv_mean=snapped_mean("kv_sum", "kv_n"),
            running_max=pl.col("running_max").max(),
            running_mean=snapped_mean("running_sum", "running_n"),
            waiting_first=pl.col("waiting_first").drop_nulls().first(),
            waiting_last=last_by("waiting_last", *_LAST_ORDER),
            waiting_max=pl.col("waiting_max").max(),
            waiting_share=snapped_mean("waiting_pos", "waiting_n"),
            swapped_first=pl.col("swapped_first").drop_nulls().first(),
            swapped_last=last_by("swapped_last", *_LAST_ORDER),
            swapped_max=pl.col("swapped_max").max(),
            prompt=snapped_mean("prompt_sum", "prompt_n"),
            gen=snapped_mean("gen_sum", "gen_n"),
            # The fewest running on a line at the window's highest KV usage: KV ties
            # are common at 99 %, and the fewest running is the largest footprint
            # per request (what sizes --max-num-seqs), not an accident of order.
            peak_running=pl.col("peak_running")
            .filter(pl.col("peak_kv") == pl.col("peak_kv").max())
            .min(),
            alloc=(kind == Kind.ALLOC_FAILURE.value).sum(),
            host=(kind == Kind.HOST_OOM.value).sum(),
            dead=(kind == Kind.ENGINE_DEAD.value).sum(),
            swapw=(kind == Kind.SWAP_WARNING.value).sum(),
            idxs=pl.col("idx"),
        )
        .sort(["replica", "wstart"], nulls_last=True)
    )


def _agg_rows(agg: pl.DataFrame) -> Iterator[dict[str, Any]]:
    """The aggregates row by row, read as Python lists a chunk of windows at a time (a
    dict per row from iter_rows(named=True) cost a third of build_windows; a month's
    windows as Python columns at once ~10 MiB)."""
    names = agg.columns
    for k in range(0, agg.height, _CHUNK):
        part = agg.slice(k, _CHUNK).to_dict(as_series=False)
        for values in zip(*part.values(), strict=True):
            yield dict(zip(names, values, strict=True))


def _frame_columns(agg: pl.DataFrame) -> dict[str, list[Any]]:
    return agg.select(*_SPREAD_COLUMNS).to_dict(as_series=False)


def _columns_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    return {name: [r[name] for r in rows] for name in _SPREAD_COLUMNS}


def _window(
    r: Mapping[str, Any],
    events: Sequence[Event],
    spread: Mapping[tuple[str, int | None], float],
    spread_over: Mapping[tuple[str, int | None], int],
    seconds: int,
) -> Window:
    key = (r["replica"], r["wstart"])
    start = datetime.fromtimestamp(r["wstart"], tz=UTC) if r["wstart"] is not None else None
    return Window(
        replica=r["replica"],
        start=start,
        end=start + timedelta(seconds=seconds) if start else None,
        n_events=r["n_events"],
        n_stats=r["n_stats"],
        preemptions=round(spread.get(key, r["preemptions"]), 2),
        preemptions_spread_over=spread_over.get(key),
        preemptions_lower_bound=bool(r["lower"]),
        max_cumulative=r["max_cum"],
        kv_max=r["kv_max"],
        kv_mean=r["kv_mean"],
        running_max=r["running_max"],
        running_mean=r["running_mean"],
        waiting_first=r["waiting_first"],
        waiting_last=r["waiting_last"],
        waiting_max=r["waiting_max"],
        swapped_first=r["swapped_first"],
        swapped_last=r["swapped_last"],
        swapped_max=r["swapped_max"],
        prompt_tput=r["prompt"],
        gen_tput=r["gen"],
        alloc_failures=r["alloc"],
        host_ooms=r["host"],
        engine_deaths=r["dead"],
        swap_warnings=r["swapw"],
        evidence=_pick_evidence([events[i] for i in r["idxs"]]),
        kv_peak_running=r["peak_running"],
        waiting_share=r["waiting_share"],
    )


# _COLUMNS' positions, for the rows _aggregated_small reads.
_AT = {name: i for i, name in enumerate(_COLUMNS)}
# What a value of a column becomes in the polars table (its dtype), for the same rows.
_CAST: dict[str, Callable[[Any], Any]] = {"Int64": int, "Float64": float, "Boolean": bool}
_CASTS = tuple(_CAST.get(dtype) for dtype in _COLUMNS.values())


def _aggregated_small(events: Sequence[Event], seconds: int) -> list[dict[str, Any]]:
    """What _aggregated gives, row for row, value for value, in Python: the same table
    rows (cast as polars casts them), grouped in order of first appearance and sorted
    by (replica, window start, a missing start last); sums, maxima and firsts skip
    missing values as polars does, a `last` is taken in the stable order of the last
    line's keys (a missing key first), and means are snapped as snapped_mean snaps."""
    groups: dict[tuple[str, int | None], list[tuple[Any, ...]]] = {}
    for row in _rows(events, seconds):
        typed = tuple(
            v if cast is None or v is None else cast(v) for v, cast in zip(row, _CASTS, strict=True)
        )
        groups.setdefault((typed[_AT["replica"]], typed[_AT["wstart"]]), []).append(typed)
    ordered = sorted(groups.items(), key=lambda g: (g[0][0], g[0][1] is None, g[0][1] or 0))
    return [_group(replica, wstart, rows) for (replica, wstart), rows in ordered]


def _group(replica: str, wstart: int | None, rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    def col(name: str) -> list[Any]:
        at = _AT[name]
        return [r[at] for r in rows]

    def present(name: str) -> list[Any]:
        return [v for v in col(name) if v is not None]

    def most(name: str) -> Any:
        values = present(name)
        return max(values) if values else None

    def first(name: str) -> Any:
        values = present(name)
        return values[0] if values else None

    keys = [_AT[k] for k in _LAST_ORDER]
    # (stable; a missing key sorts first, as polars' sort_by without nulls_last)
    by_last = sorted(rows, key=lambda r: tuple((0,) if r[k] is None else (1, r[k]) for k in keys))

    def last(name: str) -> Any:
        at = _AT[name]
        values = [r[at] for r in by_last if r[at] is not None]
        return values[-1] if values else None

    def mean(num: str, den: str) -> float | None:
        n = sum(col(den))
        if not n > 0:
            return None
        return snap6(snap6(_float_sum(present(num))) / n)

    peak_kv = col("peak_kv")
    top = max(peak_kv)
    at_peak = [p for p, kv in zip(col("peak_running"), peak_kv, strict=True) if kv == top]
    running_at_peak = [p for p in at_peak if p is not None]
    kinds = col("kind")
    return {
        "replica": replica,
        "wstart": wstart,
        "n_events": sum(col("lines")),
        "n_stats": sum(col("stats_lines")),
        "preemptions": _float_sum(col("preemptions")),
        "lower": any(col("lower")),
        "max_cum": most("cumulative"),
        "kv_max": most("kv_max"),
        "kv_mean": mean("kv_sum", "kv_n"),
        "running_max": most("running_max"),
        "running_mean": mean("running_sum", "running_n"),
        "waiting_first": first("waiting_first"),
        "waiting_last": last("waiting_last"),
        "waiting_max": most("waiting_max"),
        "waiting_share": mean("waiting_pos", "waiting_n"),
        "swapped_first": first("swapped_first"),
        "swapped_last": last("swapped_last"),
        "swapped_max": most("swapped_max"),
        "prompt": mean("prompt_sum", "prompt_n"),
        "gen": mean("gen_sum", "gen_n"),
        "peak_running": min(running_at_peak) if running_at_peak else None,
        "alloc": kinds.count(Kind.ALLOC_FAILURE.value),
        "host": kinds.count(Kind.HOST_OOM.value),
        "dead": kinds.count(Kind.ENGINE_DEAD.value),
        "swapw": kinds.count(Kind.SWAP_WARNING.value),
        "idxs": col("idx"),
    }


def _float_sum(values: list[float]) -> float:
    """Left to right, one rounding an addition (sum() compensates from Python 3.12 on,
    which a window's counts do not need and snapped means must not depend on)."""
    total = 0.0
    for v in values:
        total += v
    return total


def _spread_counter_deltas(
    warnings: Sequence[Event],
    agg: Mapping[str, list[Any]],
    seconds: int,
    thr: Thresholds,
    counted_since: CountedSince | None = None,
) -> tuple[dict[tuple[str, int | None], float], dict[tuple[str, int | None], int]]:
    """Spread a V0 counter delta over the windows between two warnings.

    Warnings are sampled (#1, #51, ...), so the 50 preemptions between two of them
    happened somewhere in between; preemption needs an exhausted pool, so they go to
    the windows in that span whose KV usage was at the pressure threshold (one such
    window takes it all). With no such window the delta stays where the warning was
    printed. V1's counter (/metrics scrapes) is spread the same way, and further back:
    it counts a preemption when its request runs again (visibility.py), so a delta
    since one read may hold preemptions from before it, back to the last empty queue
    (`counted_since`). A real 0.20.2 counted 3 preemptions at a scrape with KV at 0 %,
    a minute after the one window at 96.8 %; a real 0.11.0 counted none for 100 s of a
    pinned pool, then 231 as the preempted requests ran again. Also returns, per
    window that received a share, over how many windows its delta was spread (the
    count there is an estimate, not a measurement). `warnings`: the V0 counter
    warnings (stamped), in order; `agg`: the windows' _SPREAD_COLUMNS.
    """
    keys = list(zip(agg["replica"], agg["wstart"], strict=True))
    totals: dict[tuple[str, int | None], float] = dict(zip(keys, agg["preemptions"], strict=True))
    kv_by_window = dict(zip(keys, agg["kv_max"], strict=True))
    last_seen: dict[str, datetime] = {}
    by_replica: defaultdict[str, list[int]] = defaultdict(list)
    for key in totals:
        if key[1] is not None:
            by_replica[key[0]].append(key[1])
    for starts in by_replica.values():
        starts.sort()  # bisected below: each warning looks only at its own span
    spread_over: dict[tuple[str, int | None], int] = {}
    for e in warnings:
        assert e.ts is not None
        prev = last_seen.get(e.replica)
        last_seen[e.replica] = e.ts
        # A rollup of warnings (rollup.PreemptionBuilder) is one clock minute, one
        # window: its members' deltas stay there, as they would line by line; its
        # carrier's spreads back to the warning before it.
        own_count = e.preemptions
        if e.rollup is not None:
            own_count -= e.rollup.stats.preemptions
            last_seen[e.replica] = e.rollup.last.ts or e.ts
        if prev is None or own_count <= 1:
            continue
        own = (e.replica, window_start(e.ts, seconds))
        if counted_since is not None and e.engine == "prometheus":
            prev = min(prev, counted_since(e.replica, prev))
        lo = window_start(prev, seconds)
        hi = own[1]
        if lo is None or hi is None:
            continue
        starts = by_replica[e.replica]
        span = starts[bisect_left(starts, lo) : bisect_right(starts, hi)]
        targets = [
            w for w in span if (kv_by_window.get((e.replica, w)) or 0.0) >= thr.kv_pressure_pct
        ]
        if not targets or targets == [hi]:
            continue
        totals[own] -= own_count
        share = own_count / len(targets)
        for w in targets:
            totals[(e.replica, w)] += share
            key = (e.replica, w)
            spread_over[key] = max(spread_over.get(key, 0), len(targets))
    return totals, spread_over


_EVIDENCE_ORDER = {
    Kind.ALLOC_FAILURE: 0,
    Kind.HOST_OOM: 1,
    Kind.ENGINE_DEAD: 2,
    Kind.PREEMPTION: 3,
    Kind.SWAP_WARNING: 4,
    Kind.STATS: 5,
    Kind.CAPACITY: 6,
    Kind.CONFIG: 7,
    Kind.CONTEXT: 8,
}


def _log_order(e: Event) -> tuple[bool, datetime, str, int, int, str]:
    # Records glued on one line at one second (several streams, or prefill and decode)
    # go by where they start in it, not by the order the events come in: rollups list
    # a member at its carrier's place (fuzz seed 8081 input 8048).
    return (e.ts is None, e.ts or _EPOCH, e.source, e.line, e.pos, e.sig)


def _stats_lines(evs: Sequence[Event]) -> Iterator[Event]:
    """The stats lines evidence can pick: plain ones, and a rollup's members that
    could be its peak or among its first preempting lines."""
    for e in evs:
        if e.kind is not Kind.STATS:
            continue
        if e.rollup is None:
            yield e
        else:
            seen: set[int] = set()
            for m in (e.rollup.peak_first, *e.rollup.preempting):
                if id(m) not in seen:
                    seen.add(id(m))
                    yield m


def _lines(evs: Sequence[Event]) -> Iterator[Event]:
    """The events, a rollup of preemption lines with the members evidence can pick
    (its first ones: the carrier is the first line of its signature in the window or
    comes after that one, and the rest go by line number)."""
    for e in evs:
        yield e
        if e.rollup is not None and e.kind is not Kind.STATS:
            yield from e.rollup.preempting


def _pick_evidence(evs: Sequence[Event]) -> tuple[Event, ...]:
    """The lines that decide a window: failures first, then preemptions, then the
    stats line with the highest KV usage (and a preempting stats line)."""
    chosen: list[Event] = []
    # Within a kind: the kernel's kill line, then the first line of each signature,
    # then repeats, so a report's `Tasks state` table cannot push the kill out.
    firsts = {id(e) for e in {e.sig: e for e in reversed(evs)}.values()}

    def order(e: Event) -> tuple[object, ...]:
        kill = e.fields.get("subtype") == "kernel_kill"
        # (ties on a line number, from two files or records glued on one line, go by
        # time: a rollup's members come after its carrier, not in the window's order)
        first = id(e) not in firsts
        return (_EVIDENCE_ORDER[e.kind], not kill, first, e.ts is None, e.line, *_log_order(e))

    for e in sorted(_lines(evs), key=order):
        if e.kind is Kind.STATS:
            continue
        if e.kind in (Kind.CAPACITY, Kind.CONFIG, Kind.CONTEXT):
            continue
        chosen.append(e)
    stats = sorted(_stats_lines(evs), key=_log_order)
    if stats:
        peak = max(stats, key=lambda e: (number(e.fields.get("kv_usage")) or -1.0, e.preemptions))
        preempting = [e for e in stats if e.preemptions > 0 and e is not peak]
        chosen.append(peak)
        chosen.extend(preempting[:1])
    return tuple(chosen[:MAX_EVIDENCE_PER_WINDOW])
