"""Events -> fixed windows of log time per replica, aggregated with polars.

Polars holds the (small) events table, never raw lines (design.md section 5).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from preemptdiag.model.config import Thresholds
from preemptdiag.model.records import Event, Kind, Window
from preemptdiag.scan.rollup import AGG_FIELDS, number

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
    return None if ts is None else (ts - _EPOCH) // timedelta(microseconds=1)


def _columns(events: Sequence[Event], seconds: int) -> dict[str, list[Any]]:
    """The events table, column by column: a list per column costs 8 bytes a cell,
    where a dict per row would cost ~1 KB a row (measured: 30 MB on a 4 GiB log).

    A row is one event or one rollup of stats lines (rollup.py). It carries sums,
    counts and maxima, its first and last values, and the order keys of its last
    line, so the aggregation in build_windows gives what it gives line by line."""
    cols: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
    put = {name: col.append for name, col in cols.items()}
    for i, e in enumerate(events):
        is_stats = e.kind is Kind.STATS
        last = e.rollup.last if e.rollup else e
        put["idx"](i)
        put["replica"](e.replica)
        put["wstart"](window_start(e.ts, seconds))
        put["kind"](e.kind.value)
        put["source"](e.source)
        put["lines"](e.lines)
        put["stats_lines"](e.lines if is_stats else 0)
        put["preemptions"](float(e.preemptions))
        put["lower"](e.lower_bound)
        put["cumulative"](_int(e.fields.get("cumulative")))
        for name, value in _stats_cells(e).items():
            put[name](value)
        put["last_us"](_micros(last.ts))
        put["last_line"](last.line)
        put["last_pos"](last.pos)
        put["last_sig"](last.sig)
        if e.rollup is not None:
            put["peak_kv"](e.rollup.stats.peak_kv)
            put["peak_running"](e.rollup.stats.peak_running)
        else:
            kv = number(e.fields.get("kv_usage")) if is_stats else None
            put["peak_kv"](-1.0 if kv is None else kv)
            put["peak_running"](_int(e.fields.get("running")) if is_stats else None)
    return cols


def _stats_cells(e: Event) -> dict[str, Any]:
    """Sums, counts, maxima, first and last values of a stats line or rollup (the
    same cells, empty, for other events)."""
    n_fields = len(AGG_FIELDS)
    maxes: tuple[float | None, ...]
    if e.kind is not Kind.STATS:
        sums, counts, maxes, pos = (0.0,) * n_fields, (0,) * n_fields, (None,) * n_fields, 0
        first: Mapping[str, object] = {}
        last: Mapping[str, object] = {}
    elif e.rollup is None:
        values = [number(e.fields.get(k)) for k in AGG_FIELDS]
        sums = tuple(v or 0.0 for v in values)
        counts = tuple(0 if v is None else 1 for v in values)
        maxes = tuple(values)
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

    def total(k: str) -> float | None:
        i = AGG_FIELDS.index(k)
        return sums[i] if counts[i] else None

    def count(k: str) -> int:
        return counts[AGG_FIELDS.index(k)]

    def top(k: str) -> float | None:
        return maxes[AGG_FIELDS.index(k)]

    return {
        "kv_max": top("kv_usage"),
        "kv_sum": total("kv_usage"),
        "kv_n": count("kv_usage"),
        "running_max": _int(top("running")),
        "running_sum": total("running"),
        "running_n": count("running"),
        "waiting_first": _int(first.get("waiting")),
        "waiting_last": _int(last.get("waiting")),
        "waiting_max": _int(top("waiting")),
        "waiting_pos": pos,
        "waiting_n": count("waiting"),
        "swapped_first": _int(first.get("swapped")),
        "swapped_last": _int(last.get("swapped")),
        "swapped_max": _int(top("swapped")),
        "prompt_sum": total("prompt_tput"),
        "prompt_n": count("prompt_tput"),
        "gen_sum": total("gen_tput"),
        "gen_n": count("gen_tput"),
    }


def build_windows(events: Sequence[Event], seconds: int, thr: Thresholds) -> list[Window]:
    if not events:
        return []
    # Imported here: polars costs ~0.2 s to import, and analyze starts that import
    # in the background (preload_polars) while the scan runs.
    import polars as pl

    schema: dict[str, Any] = {name: getattr(pl, dtype) for name, dtype in _COLUMNS.items()}
    df = pl.DataFrame(_columns(events, seconds), schema=schema)
    kind = pl.col("kind")

    def ratio(num: str, den: str) -> pl.Expr:
        # Partial sums (rollups, --jobs ranges cutting one) and line-by-line sums differ
        # in the last bits. The sum is snapped to 6 decimals first (every value an
        # engine prints has at most 2, so the exact sum has too, and float error is far
        # below 5e-7): the mean is then one division of one number whatever the order,
        # and rounding it to 6 decimals cannot fall either side of a tie.
        mean = pl.col(num).sum().round(6) / pl.col(den).sum()
        return pl.when(pl.col(den).sum() > 0).then(mean.round(6))

    def last_by(col: str, *keys: str) -> pl.Expr:
        # The value of the last line in log order: rows are in the order of their
        # first line, but a rollup's last line can come after a later row's.
        return pl.col(col).sort_by(list(keys), maintain_order=True).drop_nulls().last()

    agg = (
        df.group_by(["replica", "wstart"], maintain_order=True)
        .agg(
            n_events=pl.col("lines").sum(),
            n_stats=pl.col("stats_lines").sum(),
            preemptions=pl.col("preemptions").sum(),
            lower=pl.col("lower").any(),
            max_cum=pl.col("cumulative").max(),
            kv_max=pl.col("kv_max").max(),
            kv_mean=ratio("kv_sum", "kv_n"),
            running_max=pl.col("running_max").max(),
            running_mean=ratio("running_sum", "running_n"),
            waiting_first=pl.col("waiting_first").drop_nulls().first(),
            waiting_last=last_by("waiting_last", *_LAST_ORDER),
            waiting_max=pl.col("waiting_max").max(),
            waiting_share=ratio("waiting_pos", "waiting_n"),
            swapped_first=pl.col("swapped_first").drop_nulls().first(),
            swapped_last=last_by("swapped_last", *_LAST_ORDER),
            swapped_max=pl.col("swapped_max").max(),
            prompt=ratio("prompt_sum", "prompt_n"),
            gen=ratio("gen_sum", "gen_n"),
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
    spread, spread_over = _spread_counter_deltas(events, agg, seconds, thr)
    windows: list[Window] = []
    for r in agg.iter_rows(named=True):
        key = (r["replica"], r["wstart"])
        evs = [events[i] for i in r["idxs"]]
        start = datetime.fromtimestamp(r["wstart"], tz=UTC) if r["wstart"] is not None else None
        windows.append(
            Window(
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
                evidence=_pick_evidence(evs),
                kv_peak_running=r["peak_running"],
                waiting_share=r["waiting_share"],
            )
        )
    return windows


def _spread_counter_deltas(
    events: Sequence[Event], agg: pl.DataFrame, seconds: int, thr: Thresholds
) -> tuple[dict[tuple[str, int | None], float], dict[tuple[str, int | None], int]]:
    """Spread a V0 counter delta over the windows between two warnings.

    Warnings are sampled (#1, #51, ...), so the 50 preemptions between two of them
    happened somewhere in between; preemption needs an exhausted pool, so they go to
    the windows in that span whose KV usage was at the pressure threshold. With no
    such window the delta stays where the warning was printed. Also returns, per
    window that received a share, over how many windows its delta was spread (the
    count there is an estimate, not a measurement).
    """
    totals: dict[tuple[str, int | None], float] = {
        (r["replica"], r["wstart"]): r["preemptions"] for r in agg.iter_rows(named=True)
    }
    kv_by_window = {(r["replica"], r["wstart"]): r["kv_max"] for r in agg.iter_rows(named=True)}
    last_seen: dict[str, datetime] = {}
    by_replica: defaultdict[str, list[int]] = defaultdict(list)
    for key in totals:
        if key[1] is not None:
            by_replica[key[0]].append(key[1])
    for starts in by_replica.values():
        starts.sort()  # bisected below: each warning looks only at its own span
    spread_over: dict[tuple[str, int | None], int] = {}
    for e in events:
        if e.kind is not Kind.PREEMPTION or not isinstance(e.fields.get("cumulative"), int):
            continue
        if e.ts is None:
            continue
        prev = last_seen.get(e.replica)
        last_seen[e.replica] = e.ts
        if prev is None or e.preemptions <= 1:
            continue
        own = (e.replica, window_start(e.ts, seconds))
        lo = window_start(prev, seconds)
        hi = own[1]
        if lo is None or hi is None:
            continue
        starts = by_replica[e.replica]
        span = starts[bisect_left(starts, lo) : bisect_right(starts, hi)]
        targets = [
            w for w in span if (kv_by_window.get((e.replica, w)) or 0.0) >= thr.kv_pressure_pct
        ]
        if len(targets) <= 1:
            continue
        totals[own] -= e.preemptions
        share = e.preemptions / len(targets)
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


def _pick_evidence(evs: Sequence[Event]) -> tuple[Event, ...]:
    """The lines that decide a window: failures first, then preemptions, then the
    stats line with the highest KV usage (and a preempting stats line)."""
    chosen: list[Event] = []
    # Within a kind: the kernel's kill line, then the first line of each signature,
    # then repeats, so a report's `Tasks state` table cannot push the kill out.
    firsts = {id(e) for e in {e.sig: e for e in reversed(evs)}.values()}

    def order(e: Event) -> tuple[int, bool, bool, bool, int]:
        kill = e.fields.get("subtype") == "kernel_kill"
        return (_EVIDENCE_ORDER[e.kind], not kill, id(e) not in firsts, e.ts is None, e.line)

    for e in sorted(evs, key=order):
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
