"""Hits -> events: resolve timestamps, assign replicas, count preemptions honestly.

Counting rules (design.md section 2):
- V0 warns only on preemption #1, #51, #101, ...: count from the cumulative counter
  (deltas), never by counting warning lines; a counter that goes down is a restart.
- V1 has code for `Preemptions: N` per stats interval (omitted when zero), but
  releases through 0.34 never print it (vllm PR #38452): its absence proves nothing.
- SGLang retractions carry `#retracted_reqs: N`; each TP rank prints the same line, so
  identical lines at the same second from different ranks count once.
- Ray's `[repeated Nx across cluster]` stands for N more engines printing the line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from itertools import pairwise
from typing import TypeVar

from packaging.version import InvalidVersion, Version

from preemptdiag.ingest.rotation import Span, rotated_sets
from preemptdiag.model.records import (
    CopyKey,
    EngineInfo,
    Event,
    FieldValue,
    Hit,
    Kind,
    Rollup,
    WrapperStamp,
)
from preemptdiag.model.timeparse import (
    YearTracker,
    in_range,
    month_number,
    parse_any,
    parse_iso,
    parse_month_day,
)
from preemptdiag.scan.rollup import (
    WHOLE_SECONDS,
    copy_key,
    copy_space,
    map_rollup,
    member_time,
    stats_preemptions,
)

_NO_TIME = datetime.min.replace(tzinfo=UTC)
S = TypeVar("S", str, WrapperStamp)  # a stamp as the engine or a wrapper printed it


@dataclass(frozen=True, slots=True)
class TimeContext:
    year: int | None = None  # --year
    tz: timezone = UTC  # --tz, for stamps that carry no zone
    boot_time: datetime | None = None  # --boot-time, for dmesg uptime stamps


@dataclass
class _SourceClock:
    """Per-source timestamp state: year tracking and the last wrapper date seen."""

    years: YearTracker
    mtime: datetime | None
    last_date: datetime | None = None
    day_offset: int = 0
    last_clock: int | None = None


def _wrapper_ts(tag: WrapperStamp, clock: _SourceClock, ctx: TimeContext) -> datetime | None:
    kind, text = tag.kind, tag.text
    if kind == "iso":
        return parse_iso(text)
    if kind == "sql":
        dt = parse_iso(text)
        return dt.replace(tzinfo=ctx.tz) if dt else None
    if kind == "dmesg_t":
        dt = parse_any(text)
        return dt.replace(tzinfo=ctx.tz) if dt else None
    if kind == "syslog":
        month = month_number(text[:3])
        if month is None:
            return None
        return parse_month_day(text, clock.years.resolve(month), ctx.tz)
    if kind == "clock":
        return _clock_ts(text, clock, ctx)
    if kind == "uptime" and ctx.boot_time is not None:
        return ctx.boot_time + timedelta(seconds=float(text))
    return None


def _clock_ts(text: str, clock: _SourceClock, ctx: TimeContext) -> datetime | None:
    """`HH:MM:SS` alone: date it from the last dated line, else the file's mtime."""
    try:
        h, m, s = (int(x) for x in text.split(":"))
    except ValueError:
        return None
    secs = h * 3600 + m * 60 + s
    if clock.last_clock is not None and secs + 12 * 3600 < clock.last_clock:
        clock.day_offset += 1  # passed midnight
    clock.last_clock = secs
    base = clock.last_date or clock.mtime or datetime(1970, 1, 1, tzinfo=UTC)
    day = datetime(base.year, base.month, base.day, tzinfo=ctx.tz) + timedelta(
        days=clock.day_offset
    )
    return day + timedelta(seconds=secs)


def _engine_ts(text: str, clock: _SourceClock, ctx: TimeContext) -> datetime | None:
    try:
        month = int(text[:2])
    except ValueError:
        return None
    return parse_month_day(text, clock.years.resolve(month), ctx.tz)


def _base_year(hits: Sequence[Hit], mtime: datetime | None, ctx: TimeContext) -> int:
    if ctx.year is not None:
        return ctx.year
    for h in hits:
        if h.ts_wrapper and h.ts_wrapper.kind in ("iso", "sql"):
            dt = _wrapper_ts(h.ts_wrapper, _SourceClock(YearTracker(1970), None), ctx)
            if dt is not None:
                return dt.year
    return (mtime or datetime.now(tz=UTC)).year


def infer_boot_time(hits: Sequence[Hit], ctx: TimeContext) -> datetime | None:
    """Boot time from a line that carries both a dated stamp and a dmesg uptime
    (journald/syslog `kernel: [12345.678] ...`)."""
    clock = _SourceClock(YearTracker(_base_year(hits, None, ctx)), None)
    for h in hits:
        if h.uptime is not None and h.ts_wrapper:
            ts = _wrapper_ts(h.ts_wrapper, clock, ctx)
            if ts is not None:
                return ts - timedelta(seconds=h.uptime)
    return None


def _stamp_from_context(out: list[tuple[Hit, datetime | None]], ctx: TimeContext) -> None:
    """A context line with an `at` field (kubectl describe `Finished:`) dates the
    unstamped lines of its block just above it (Reason, Exit Code)."""
    for i, (h, _) in enumerate(out):
        at = h.fields.get("at")
        if not isinstance(at, str):
            continue
        when = parse_any(at)
        if when is None:
            continue
        out[i] = (h, when)
        for j in range(i - 1, -1, -1):
            prev, pts = out[j]
            if h.line - prev.line > 8 or pts is not None:
                break
            out[j] = (prev, when)


def _safe(
    parse: Callable[[S, _SourceClock, TimeContext], datetime | None],
    text: S,
    clock: _SourceClock,
    ctx: TimeContext,
) -> datetime | None:
    """A stamp that cannot be a time (month 13, 25:61:61, a boot time plus 10^14 s, a
    date a zone shift pushes out of range) is no stamp: the line takes its neighbours'."""
    try:
        dt = parse(text, clock, ctx)
    except (ValueError, OverflowError):
        return None
    return None if dt is None else in_range(dt)


def resolve_times(
    hits: Sequence[Hit], mtime: datetime | None, ctx: TimeContext
) -> list[tuple[Hit, datetime | None]]:
    """Timestamp every hit of one source (wrapper stamp wins: it has a date and zone)."""
    clock = _SourceClock(YearTracker(_base_year(hits, mtime, ctx)), mtime)
    out: list[tuple[Hit, datetime | None]] = []
    for h in hits:
        ts = _safe(_wrapper_ts, h.ts_wrapper, clock, ctx) if h.ts_wrapper else None
        if ts is not None and h.ts_wrapper and h.ts_wrapper.kind in ("iso", "sql"):
            clock.last_date = ts
            clock.years.year = ts.year
            clock.years.last_month = ts.month
        if ts is None and h.ts_engine:
            ts = _safe(_engine_ts, h.ts_engine, clock, ctx)
        out.append((h, ts))
    # Year-less stamps take their year from mtime, or on stdin from the time it is
    # read: a log cannot end after it was written. (Piped on Dec 2, a log of Dec 20 to
    # Jan 9 was dated to the coming Dec 20 and January, in the future.)
    if ctx.year is None:
        written = mtime if mtime is not None else datetime.now(tz=UTC)
        dated = [
            max(member_time(m, h, t) or t for m in (h.rollup.last, h.rollup.peak_first))
            if h.rollup
            else t
            for h, t in out
            if t is not None and not _has_own_year(h)
        ]
        if dated and max(dated) > written + timedelta(days=2):
            out = [
                (h, _minus_year(t) if t is not None and not _has_own_year(h) else t) for h, t in out
            ]
    if not isinstance(ctx.tz, timezone):  # a named zone: its clocks change
        out = _in_utc(out, ctx.tz)
    _stamp_from_context(out, ctx)
    # Lines with no stamp of their own inherit the previous line's (tracebacks, bare
    # errors); the ones before the first stamp take the first.
    first = next((t for _, t in out if t is not None), None)
    filled: list[tuple[Hit, datetime | None]] = []
    last, last_line = first, 0
    # The last line of a rollup (rollup.py) comes after its carrier in the file: an
    # unstamped line after it takes its time (the sink closed the rollup there); a
    # member glued on the carrier's own line (lost newline) comes after it too.
    member: tuple[int, datetime | None] = (0, None)
    # The rollup that set `member` was the last stamped hit: an unstamped record
    # glued after its members on their own line closed it (the sink closes every
    # rollup at an unstamped hit), so it follows them and takes their time too.
    member_last = False
    for h, t in out:
        if t is not None:
            last, last_line = t, h.line
            member_last = False
            # (>=: a later rollup whose last line is the same glued line ends later)
            if h.rollup and h.rollup.last.line >= member[0]:
                member = (h.rollup.last.line, member_time(h.rollup.last, h, t))
                member_last = True
        elif (member_last or last_line < member[0]) and member[0] <= h.line:
            # The member came after the last stamped hit. On the member's own line, a
            # stamped hit of its own follows it (the sink lets members join only at a
            # line's start or right after their rollup's hits): it is later unless it
            # is the carrier that set `member`. A record glued after the member on its
            # line follows it too (the sink had added the member, else the member
            # would carry a rollup of its own).
            t = member[1]
        filled.append((h, t if t is not None else last))
    return filled


# How far back a line may be stamped from the one above before a wall-clock time in
# an hour a DST change repeats reads as its second pass: records of several processes
# glued into one log can be seconds out of order.
_FOLD_SKEW = timedelta(seconds=60)


def _in_utc(
    out: list[tuple[Hit, datetime | None]], tz: tzinfo
) -> list[tuple[Hit, datetime | None]]:
    """The stamps that took their zone from --tz, in UTC, and in the hour a change back
    from summer time repeats (02:00-03:00 twice in Europe/Berlin), read as its second
    pass where the first would go back an hour from the line above: `02:10 CET` after
    `02:59 CEST` is 01:10 UTC, not 00:10 (its windows merged two hours of lines and left
    the next hour empty). In UTC from here, because datetimes of one zone compare by
    their wall clocks: 02:10 CET sorted before 02:45 CEST."""
    done: list[tuple[Hit, datetime | None]] = []
    last: datetime | None = None
    for h, t in out:
        if t is not None and t.tzinfo is tz:
            t = read_pass(t, last)
        if t is not None:
            last = t if last is None or t > last else last
        done.append((h, t))
    return done


def read_pass(t: datetime, last: datetime | None) -> datetime:
    """Wall clock `t` of a named zone (fold 0) in UTC, read after the latest stamp
    `last` (_in_utc's rule; calm._Shifts reads calm minutes by it too): its first pass,
    or, in an hour a shift repeats, its second where the first would go back more than
    _FOLD_SKEW from `last` and the second would not."""
    first = t.astimezone(UTC)
    if last is not None and first < last - _FOLD_SKEW:
        # (only then: the second reading costs as much as the first)
        second = t.replace(fold=1).astimezone(UTC)
        return second if second >= last - _FOLD_SKEW else first
    return first


def _has_own_year(h: Hit) -> bool:
    return bool(h.ts_wrapper and h.ts_wrapper.dated)


def _minus_year(t: datetime) -> datetime:
    try:
        return t.replace(year=t.year - 1)
    except ValueError:  # Feb 29
        return t.replace(year=t.year - 1, day=28)


def _replica(h: Hit, rotated: Mapping[str, str]) -> str:
    if h.pod:
        return h.pod
    return rotated.get(h.source, h.source)


def _dedupe_ranks(
    pairs: list[tuple[Hit, datetime | None]], doubts: set[str]
) -> list[tuple[Hit, datetime | None]]:
    """The same record printed by several ranks/workers at the same second counts once
    (records of one copy space: rollup.copy_space): an engine's line by the second,
    not the instant, as a wrapper stamps each copy with the nanosecond it read it
    (`kubectl logs --timestamps`: eight ranks' copies of a retraction were eight;
    rollup.WHOLE_SECONDS). Where the stamped records' times
    never go back (the usual: _in_time_order), a record's copies are together, and
    only each space's current stamp's records are kept, not every record's (a
    thrashing server's 83,000 retractions held ~60 MiB of them).

    A rollup of preemption lines (rollup.PreemptionBuilder) counted its own copies
    once and brings the records of its first and last stamp. Where that cannot stand
    for its lines, `doubts` says why: a copy of a record of its first stamp before it,
    a line of its space inside its span, or times that go back (its middle stamps'
    records are gone)."""
    forward = all(a <= b for a, b in pairwise(t for _, t in pairs if t is not None))
    # (forward) per space: the stamp seen last, its second's records, and the latest
    # time seen
    now: dict[tuple[object, ...], tuple[datetime | None, set[CopyKey], datetime]] = {}
    seen: set[tuple[object, ...]] = set()  # (not forward) every record
    unstamped: set[tuple[object, ...]] = set()
    out: list[tuple[Hit, datetime | None]] = []
    for h, t in pairs:
        if h.kind in (Kind.STATS, Kind.CONFIG, Kind.CAPACITY):
            out.append((h, t))
            continue
        space, r = copy_space(h), h.rollup
        if not forward or t is None:
            if r is not None:
                doubts.add(_COPIES_ACROSS)
            key = (space, _copy_time(h, t), copy_key(h.fields))
            keys = unstamped if t is None else seen
            if key in keys:
                continue
            keys.add(key)
            out.append((h, t))
            continue
        state = now.get(space)
        records, latest = (set(), t) if state is None else (state[1], state[2])
        if state is not None:
            # Inside a rollup's span (at its last line's time or not): line by line it
            # would sit among the rollup's members, whose records are gone.
            if t < latest or (t == latest and state[0] != t):
                doubts.add(_COPIES_ACROSS)
            if _copy_time(h, state[0]) != _copy_time(h, t):
                records = set()
        if r is None:
            record = copy_key(h.fields)
            if record in records:
                continue
            records.add(record)
            now[space] = (t, records, max(latest, t))
            out.append((h, t))
            continue
        first = r.stats.first_copies or (copy_key(h.fields),)
        if not records.isdisjoint(first):
            if r.stats.n == 1:
                continue  # copies of one record already counted (its lines all are)
            doubts.add(_COPIES_ACROSS)
        records.update(first)
        end = member_time(r.last, h, t) or t
        if _copy_time(h, end) != _copy_time(h, t):
            records = set(r.stats.last_copies or (copy_key(r.last.fields),))
        ends = (end, member_time(r.peak_first, h, t) or t)
        now[space] = (end, records, max(latest, *ends))
        out.append((h, t))
    return out


_COPIES_ACROSS = "preemption lines merged a minute at a time cannot show their copies here"


def _copy_time(h: Hit, t: datetime | None) -> datetime | None:
    """The stamp the copies of `h`'s record share (_dedupe_ranks): its second where an
    engine printed it (rollup.WHOLE_SECONDS), else its time."""
    if t is None or not t.microsecond or h.engine not in WHOLE_SECONDS:
        return t
    return t.replace(microsecond=0)


def build_events(
    hits_by_source: Iterable[tuple[Sequence[Hit], datetime | None]],
    ctx: TimeContext,
    doubts: set[str] | None = None,
) -> list[Event]:
    """The hits of every source as events, timed and counted. `doubts` gets why the
    rollups of preemption lines among the hits cannot stand for their lines, if they
    cannot (then scan again without them)."""
    doubts = set() if doubts is None else doubts
    sources = list(hits_by_source)
    if ctx.boot_time is None:
        # One node's dmesg uptime stamps can borrow the boot time another file shows.
        boot = next((b for hits, _ in sources if (b := infer_boot_time(hits, ctx))), None)
        if boot is not None:
            ctx = replace(ctx, boot_time=boot)
    timed = [resolve_times(hits, mtime, ctx) for hits, mtime in sources]
    names = [next((h.source for h in hits), "") for hits, _ in sources]
    spans = [_span(p) for p in timed]
    rotated = rotated_sets(dict(zip(names, spans, strict=True)), names)
    # A rotated set is read as one log, oldest file first: one replica, one V0 counter.
    groups: dict[str, list[tuple[Span | None, list[tuple[Hit, datetime | None]]]]] = {}
    for name, span, pairs in zip(names, spans, timed, strict=True):
        groups.setdefault(rotated.get(name, f"\0{name}"), []).append((span, pairs))
    events: list[Event] = []
    for parts in groups.values():
        if len(parts) > 1:  # a rotated set: every member has a span
            parts.sort(key=lambda part: part[0] or (_NO_TIME, _NO_TIME))
        joined = _in_time_order([pair for _, part in parts for pair in part])
        events.extend(_count_preemptions(_dedupe_ranks(joined, doubts), rotated, doubts))
    events.sort(key=lambda e: (e.ts is None, e.ts or _NO_TIME, e.source, e.line))
    return _shutdown_races(events)


def _shutdown_races(events: list[Event]) -> list[Event]:
    """An engine-death line after a requested stop is the shutdown race (a real
    0.32.0 prints an EngineDeadError traceback on about one clean stop in four),
    not a crash: it becomes context, marked, until the engine starts again."""
    stopping: set[str] = set()
    out: list[Event] = []
    for e in events:
        if e.kind is Kind.CONTEXT and e.fields.get("subtype") == "shutdown":
            stopping.add(e.replica)
        elif e.kind in (Kind.CONFIG, Kind.CAPACITY):
            stopping.discard(e.replica)
        elif e.kind is Kind.ENGINE_DEAD and e.replica in stopping:
            e = replace(e, kind=Kind.CONTEXT, fields={**e.fields, "after_shutdown": True})
        out.append(e)
    return out


def _in_time_order(
    pairs: list[tuple[Hit, datetime | None]],
) -> list[tuple[Hit, datetime | None]]:
    """The hits of one replica by time (stable: equal and unstamped ones keep their
    order), so a cumulative counter is read as it grew: out-of-order or reversed lines
    would otherwise look like restarts and count everything again."""
    if all(a[1] is None or b[1] is None or a[1] <= b[1] for a, b in pairwise(pairs)):
        return pairs
    keys: list[datetime] = []
    last = _NO_TIME
    for _, ts in pairs:
        last = ts if ts is not None else last
        keys.append(last)
    order = sorted(range(len(pairs)), key=keys.__getitem__)
    return [pairs[i] for i in order]


def _span(pairs: Sequence[tuple[Hit, datetime | None]]) -> Span | None:
    """First and last timestamp of one source's hits."""
    stamps = [t for _, t in pairs if t is not None]
    return (min(stamps), max(stamps)) if stamps else None


def _count_preemptions(
    pairs: Sequence[tuple[Hit, datetime | None]], rotated: Mapping[str, str], doubts: set[str]
) -> list[Event]:
    counters: dict[tuple[str, str], int] = {}
    started: set[str] = set()  # replicas whose engine start is in the log
    # per replica: where its last rollup of V0 warnings ended (time, source, line)
    reach: dict[str, tuple[datetime, str, int]] = {}
    out: list[Event] = []
    for h, ts in pairs:
        replica = _replica(h, rotated)
        n = 0
        lower = False
        f = h.fields
        if h.kind in (Kind.CONFIG, Kind.CAPACITY):
            # A new engine start resets the V0 counter.
            started.add(replica)
            for key in [k for k in counters if k[0] == replica]:
                del counters[key]
            end = reach.get(replica)
            if end is not None and ts is not None and _inside(ts, h, end):
                # (line by line it would reset the counter among the rollup's lines)
                doubts.add(_START_INSIDE)
        if h.kind is Kind.PREEMPTION:
            cum = f.get("cumulative")
            count = f.get("count")
            if isinstance(cum, int):
                key = (replica, (h.proc or "").split("@")[-1] if h.proc and "@" in h.proc else "")
                prev = counters.get(key)
                if prev is None:
                    # Before the first warning we cannot see how many came: #1 is exact;
                    # a later number seen first is counted once, as a lower bound, unless
                    # the engine start is in the log (then everything since start counts).
                    if cum <= 1 or replica in started:
                        n = cum
                    else:
                        n, lower = 1, True
                elif cum >= prev:
                    n = cum - prev
                else:
                    n = cum  # counter went down: engine restarted
                counters[key] = max(cum, 0)
                if h.rollup is not None and h.rollup.stats.cumulative is not None:
                    counters[key] = h.rollup.stats.cumulative
                    last = h.rollup.last
                    end_ts = member_time(last, h, ts)
                    if end_ts is not None:
                        reach[replica] = max(
                            reach.get(replica, (end_ts, last.source, last.line)),
                            (end_ts, last.source, last.line),
                        )
            elif isinstance(count, int):
                n = count
            else:
                n, lower = 1, True
            if h.rollup is not None:  # (what its members after the carrier count)
                n += h.rollup.stats.preemptions
                lower = lower or h.rollup.stats.lower
        elif h.kind is Kind.STATS:
            st = h.rollup.stats if h.rollup else None
            n, lower = (st.preemptions, st.lower) if st else stats_preemptions(f)
        kind = h.kind
        if kind is Kind.CAPACITY and _no_kv_room(f):
            # "# GPU blocks: 0" / a zero or negative KV size: start-up cannot serve.
            kind = Kind.ALLOC_FAILURE
            f = {**f, "subtype": "zero_blocks", "phase": "startup"}
        rollup = _member_events(h, ts, replica) if h.rollup else None
        out.append(_event(h, ts, replica, n, lower, kind=kind, fields=f, rollup=rollup))
    return out


_START_INSIDE = "an engine start falls among V0 warnings merged a minute at a time"


def _inside(ts: datetime, h: Hit, end: tuple[datetime, str, int]) -> bool:
    """Whether a start-up line at `ts` falls before the end of a rollup (`end`) already
    counted: the sink ends them at such a line, so only one out of time order does."""
    at, source, line = end
    return ts < at or (ts == at and not (h.source == source and h.line > line))


def _event(
    h: Hit,
    ts: datetime | None,
    replica: str,
    n: int,
    lower: bool,
    kind: Kind | None = None,
    fields: Mapping[str, FieldValue] | None = None,
    rollup: Rollup[Event] | None = None,
) -> Event:
    return Event(
        source=h.source,
        line=h.line,
        sig=h.sig,
        kind=kind or h.kind,
        ts=ts,
        fields=h.fields if fields is None else fields,
        text=h.text,
        proc=h.proc,
        replica=replica,
        engine=h.engine,
        preemptions=n * max(h.repeat, 1),
        lower_bound=lower,
        repeat=h.repeat,
        rollup=rollup,
        pos=h.pos,
    )


def stamp_event(h: Hit, ts: datetime | None, replica: str) -> Event:
    """The event of a stats line that is no rollup, as build_events makes it."""
    n, lower = stats_preemptions(h.fields)
    return _event(h, ts, replica, n, lower)


def _member_events(h: Hit, ts: datetime | None, replica: str) -> Rollup[Event]:
    """The rollup's member lines as events of their own (evidence, ordering)."""
    assert h.rollup is not None
    made: dict[int, Event] = {}  # one event per line, however many roles it has

    def event(m: Hit) -> Event:
        if id(m) in made:
            return made[id(m)]
        n, lower = stats_preemptions(m.fields) if m.kind is Kind.STATS else _own(m.fields)
        made[id(m)] = _event(m, member_time(m, h, ts), replica, n, lower)
        return made[id(m)]

    return map_rollup(h.rollup, event)


def _own(f: Mapping[str, FieldValue]) -> tuple[int, bool]:
    """What a preemption line counts by itself (a V0 warning's delta needs the one
    before it: here one, a lower bound); a rollup member's, for evidence."""
    count = f.get("count")
    return (count, False) if isinstance(count, int) else (1, True)


def _no_kv_room(f: Mapping[str, FieldValue]) -> bool:
    for key in ("gpu_blocks", "kv_tokens"):
        v = f.get(key)
        if isinstance(v, int) and v <= 0:
            return True
    v = f.get("kv_gib")
    return isinstance(v, float) and v <= 0


def detect_engine(
    events: Sequence[Event],
    calm: Iterable[tuple[Mapping[str, FieldValue], str, int]] = (),
) -> EngineInfo:
    """The engine, generation and version the events' lines are mostly of. `calm`:
    (fields, engine, lines) of stats lines that are no event (timeline/calm.py)."""
    engines: defaultdict[str, int] = defaultdict(int)
    gens: defaultdict[str, int] = defaultdict(int)
    version: str | None = None
    lines = ((e.fields, e.engine, e.lines) for e in events)
    for fields, engine, n in (*lines, *calm):
        eng = fields.get("engine")
        if isinstance(eng, str) and eng in ("vllm", "sglang"):
            engines[eng] += n
        elif engine in ("vllm", "sglang"):
            engines[engine] += n
        gen = fields.get("generation")
        if isinstance(gen, str) and gen in ("v0", "v1"):
            gens[gen] += n
        v = fields.get("version")
        if isinstance(v, str) and v and version is None:
            version = v.lstrip("v")
    engine = max(engines, key=lambda k: engines[k]) if engines else "unknown"
    generation = max(gens, key=lambda k: gens[k]) if gens and engine == "vllm" else None
    if generation is None and engine == "vllm" and version:
        parsed = parse_version(version)
        if parsed is not None:
            generation = "v1" if parsed.release >= (0, 8, 0) else "v0"
    return EngineInfo(engine=engine, generation=generation, version=version)


def parse_version(v: str) -> Version | None:
    """A release as PEP 440 orders it (`0.11.0+cu126` is 0.11.0 with a local tag, not
    0.11.126); None for text that is no version."""
    try:
        return Version(v.strip().lstrip("vV"))
    except InvalidVersion:
        return None


def version_at_least(info: EngineInfo, *want: int) -> bool | None:
    """Whether the engine's release is at least `want`; None when unknown."""
    parsed = parse_version(info.version) if info.version else None
    if parsed is None:
        return None
    return parsed.release >= want


def rollup_ends(events: Iterable[Event]) -> Iterator[Event]:
    """The lines that end the rollups among `events` in time: a stats rollup's last
    (its lines only go forward) and peak, a preemption rollup's latest record (a
    rank's copy may come late; its last line may be a copy, which line by line is no
    event: a wrapper stamps each copy with a nanosecond of its own)."""
    for e in events:
        if e.rollup is not None:
            if e.kind is not Kind.PREEMPTION:
                yield e.rollup.last
            yield e.rollup.peak_first


def with_text(e: Event, text: str) -> Event:
    return replace(e, text=text)
