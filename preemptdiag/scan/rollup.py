"""Stats lines of one stream and clock minute, merged as they are scanned.

An event per stats line makes memory grow with the log's duration (SGLang prints a
batch line twice a second: ~17 MiB per 10 MiB of log). Windows need only sums,
maxima, the first and last values and a few evidence lines, so consecutive stats
lines of one stream (same source, signature, process, pod and set of fields present)
stamped within the same clock minute become one hit that carries those aggregates
(`Rollup`: sums, counts, maxima, lines with Waiting > 0, the highest KV usage and the
fewest running at it) and the lines evidence and ordering can need: the last line,
the first line with the highest KV usage, the first two lines that preempted.

Any line whose stamp would move the source's clock differently from the open
rollups' (another date or month-day, an unmodelled wrapper, no stamp) closes them
first: members are timed from their carrier, which is only right while nothing in
between changed the clock (events.resolve_times).

Exactness: windows are multiples of 60 s (checked by the caller), so a clock minute
never straddles two windows; stamps only move forward within a rollup, so line order
is time order; every line of a rollup has the same fields present, so its first and
last values are its first and last line's. Windows, rules and compare read the
aggregates and give what they give line by line (tests/test_rollup.py holds the two
paths to the same report).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntFlag
from functools import lru_cache
from typing import Protocol, TypeVar

from preemptdiag.model.records import (
    CALM_AGG_FIELDS,
    CopyKey,
    FieldValue,
    Hit,
    Kind,
    Rollup,
    RollupStats,
    WrapperStamp,
)
from preemptdiag.model.timeparse import parse_iso

T = TypeVar("T")
U = TypeVar("U")


class Rollups(IntFlag):
    """What a scan merges a minute at a time (`True` is STATS)."""

    NONE = 0
    STATS = 1  # stats lines per stream (Builder)
    PREEMPTIONS = 2  # preemption lines per copy space (PreemptionBuilder)
    ALL = STATS | PREEMPTIONS


# The fields windows and compare aggregate, in Rollup.sums/counts/maxes order.
AGG_FIELDS = CALM_AGG_FIELDS  # (defined beside the calm minutes' columns, which list them)
KV, RUNNING, WAITING = 0, 1, 2
# Fields whose value makes a stream of its own: data-parallel engines behind one API
# server print a line each (`Engine 000: ...`, `Engine 001: ...`), with a KV pool, a
# queue and a running batch each; one rollup holds one engine's lines.
STREAM_FIELDS = ("engine_idx",)
# The fields windows read off a rollup's last line (its last values).
LAST_FIELDS = ("waiting", "swapped")

_ISO = re.compile(
    r"(?P<minute>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}):(?P<sec>\d{2}(?:[.,]\d+)?)"
    r"(?P<zone>Z|[+-]\d{2}:?\d{2})?"
)
_ENGINE = re.compile(r"(?P<minute>\d{2}-\d{2} \d{2}:\d{2}):(?P<sec>\d{2})")


def stats_preemptions(f: Mapping[str, FieldValue]) -> tuple[int, bool]:
    """Preemptions one stats line reports, and whether that is a lower bound."""
    n, lower = 0, False
    p = f.get("preemptions")
    if isinstance(p, int) and p > 0:
        n = p
    pr = f.get("preempted_reqs")
    if isinstance(pr, int) and pr > 0 and n == 0:
        n, lower = pr, True
    r = f.get("retracted_reqs")
    if isinstance(r, int) and r > 0 and n == 0:
        n = r
    return n, lower


def snap6(x: float) -> float:
    """polars' `round(6)` of a float (half to even on x * 1e6, as polars 2 rounds;
    tests/timeline/test_windows_small.py checks it against the installed polars)."""
    y = x * 1e6
    if not math.isfinite(y):
        return x
    r = round(y) / 1e6
    return math.copysign(r, x) if r == 0 else r


def number(v: object) -> float | None:
    """A field as windows aggregate it (bools and text are not numbers)."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


Stamp = tuple[tuple[str, str] | None, str | None, str | None]
Instant = tuple[int, int]  # a stamp's second and microsecond in its minute (_instant)


def stamp(h: Hit) -> Stamp:
    """(clock, minute, seconds) of the stamp a hit will be timed by.

    clock: what timing the hit does to its source's clock in events.resolve_times: an
    ISO/SQL wrapper stamp sets the date (and year), an engine stamp resolves its month
    against the year tracker; None when not modelled (other wrappers) or when there is
    no stamp (the line then takes the time of the line before it, which may be a
    rollup member). minute and seconds: set when a rollup may use the stamp: an
    ISO/SQL wrapper stamp that parses, or a vLLM `MM-DD HH:MM:SS` engine stamp (not
    Feb 29, whose year is unknown here)."""
    return stamp_of(h.ts_wrapper, h.ts_engine)


@lru_cache(maxsize=256)
def stamp_of(wrapper: WrapperStamp | None, engine: str | None) -> Stamp:
    """stamp() of a hit with these stamps (bulk.py asks before it makes the hit)."""
    # Cached: a dense log repeats each second's stamp on several lines.
    if wrapper:
        kind, text = wrapper.kind, wrapper.text
        m = _ISO.fullmatch(text) if kind in ("iso", "sql") else None
        if m is None:
            return None, None, None
        clock = ("w", text[:10])
        if not _real_iso(text, m):
            return clock, None, None
        # (`,` read as `.`: a Builder orders its lines by this text, and `59,25` sorts
        # before `59.0036` as text though it is later)
        return clock, m["minute"] + (m["zone"] or ""), m["sec"].replace(",", ".")
    if engine:
        clock = ("e", engine[:5])
        m = _ENGINE.fullmatch(engine)
        if m is None or engine.startswith("02-29"):
            return clock, None, None
        try:
            # a day and a time of day that exist: a leap second (`:60`) or `25:61`
            # is no stamp to events, so none to a rollup either
            hh, mm, ss = (int(x) for x in engine[6:].split(":"))
            datetime(2001, int(engine[:2]), int(engine[3:5]), hh, mm, ss)
        except ValueError:
            return clock, None, None
        return clock, m["minute"], m["sec"]
    return None, None, None


def _real_iso(text: str, m: re.Match[str]) -> bool:
    """Whether _ISO's match `m` of `text` is a time timeparse.parse_iso reads: its
    minute is one (and with it every second up to 59 of it: timeparse.in_range reads
    the year; cached, as a wrapper's stamp differs on every line by its nanosecond),
    or, where its digits are not all ASCII, the whole stamp is."""
    if text.isascii():
        return m["sec"][:2] <= "59" and _real_minute(m["minute"], m["zone"] or "")
    return parse_iso(text) is not None


@lru_cache(maxsize=1024)
def _real_minute(minute: str, zone: str) -> bool:
    return parse_iso(f"{minute}:00{zone}") is not None


# Who prints whole seconds (Signature.engine): the engines. A fraction on one of their
# lines is a wrapper's (`kubectl logs --timestamps`: the nanosecond it read the line,
# another for each rank's copy), so their copies are told by the second; the
# kernel's, kubelet's and Ray's own stamps have fractions, and two of their lines a
# few microseconds apart are two records.
WHOLE_SECONDS = frozenset({"vllm", "sglang", "any"})


def copy_key(fields: Mapping[str, FieldValue]) -> CopyKey:
    """What tells a printed record from a copy of it at the same stamp (another rank
    printed it too): its fields (events._dedupe_ranks)."""
    return tuple(sorted([(k, str(v)) for k, v in fields.items()]))


def copy_space(h: Hit) -> tuple[object, ...]:
    """Which records may be copies of one another: one signature, one Ray host (its
    ip: hosts are separate engines), one pod (so are pods), and for a preemption line
    one SGLang data-parallel rank (`DP1 TP3`: each DP rank schedules, and retracts, on
    its own, and the TP ranks of one print its records alike). Other lines every DP
    rank prints alike (a start-up failure each hits) stay one event: their number is
    not what they tell, and eight equal evidence lines would hide the rest."""
    return space_of(h.sig, h.proc, h.pod, h.kind is Kind.PREEMPTION)


@lru_cache(maxsize=1024)
def space_of(sig: str, proc: str | None, pod: str | None, ranked: bool) -> tuple[object, ...]:
    """copy_space() of a hit with these parts (`ranked`: a preemption line's). Cached:
    a thrash loop's lines name a few ranks, processes and pods, each line once."""
    host = proc.split("@", 1)[1] if proc and "@" in proc else None
    dp = m[1] if ranked and proc and (m := _DP_RANK.match(proc)) else None
    return (sig, host, pod, dp)


_DP_RANK = re.compile(r"DP(\d+) ")


def stream_key(h: Hit) -> tuple[object, ...] | None:
    """Which open rollup a stats hit may join; None when it must stay a line."""
    if h.kind is not Kind.STATS or h.repeat != 1 or h.uptime is not None or h.rollup:
        return None
    return key_of(h.sig, h.proc, h.pod, h.ts_wrapper, h.fields, h.text)


def key_of(
    sig: str,
    proc: str | None,
    pod: str | None,
    wrapper: WrapperStamp | None,
    fields: Mapping[str, FieldValue],
    text: str,
) -> tuple[object, ...]:
    """stream_key() of a one-line stats hit with these parts (`text`: its text)."""
    return (
        sig,
        proc,
        pod,
        wrapper.kind if wrapper else "",
        tuple([v is None for v in fields.values()]),
        " llm_engine.py:" in text,  # rules.preemption_visibility reads it
        tuple([fields.get(k) for k in STREAM_FIELDS]),
    )


class Deferred(Protocol):
    """A stats line matched in bulk whose hit is made only if a rollup keeps it (most
    lines only add to the aggregates): hit() makes it, the same object every time,
    and it is the hit Matcher.match would have made of the line."""

    def hit(self) -> Hit: ...


Ref = Hit | Deferred


def real(ref: Ref) -> Hit:
    return ref if isinstance(ref, Hit) else ref.hit()


class Builder:
    """An open rollup: the carrier (first line) and running aggregates. The lines it
    may keep are held as refs: a Deferred line costs a hit only if it stays one."""

    __slots__ = (
        "carrier",
        "clock",
        "counts",
        "last",
        "lower",
        "maxes",
        "minute",
        "n",
        "numeric",
        "peak_first",
        "peak_first_key",
        "peak_kv",
        "peak_running",
        "preempting",
        "preemptions",
        "sec",
        "slot",
        "sums",
        "waiting_pos",
    )

    def __init__(
        self, slot: int, hit: Hit, minute: str, sec: str, clock: tuple[str, str] | None
    ) -> None:
        self.slot = slot
        # (position in AGG_FIELDS, field name) of the fields that hold numbers. The
        # same for every member: one stream has one signature (so one type per field)
        # and one set of fields present (stream_key).
        self.numeric = tuple(
            (i, name)
            for i, name in enumerate(AGG_FIELDS)
            if number(hit.fields.get(name)) is not None
        )
        self.minute = minute
        self.clock = clock
        self.carrier = hit
        self.n = 0
        self.preemptions = 0
        self.lower = False
        self.sums = [0.0] * len(AGG_FIELDS)
        self.counts = [0] * len(AGG_FIELDS)
        self.maxes: list[float | None] = [None] * len(AGG_FIELDS)
        self.waiting_pos = 0
        self.peak_first: Ref = hit
        self.peak_first_key = (-2.0, -1)
        self.peak_kv = -2.0
        self.peak_running: int | None = None
        self.preempting: list[Ref] = []
        self.last: Ref = hit
        self.sec = sec
        self.add(hit, hit.fields, sec)

    def accepts(self, minute: str, sec: str) -> bool:
        return minute == self.minute and sec >= self.sec

    def add(self, hit: Ref, fields: Mapping[str, FieldValue], sec: str) -> None:
        """Add a line: `fields` are its hit's fields."""
        self.n += 1
        self.sec = sec
        self.last = hit
        n, lower = stats_preemptions(fields)
        self.preemptions += n
        self.lower = self.lower or lower
        values: list[float | None] = [None] * len(AGG_FIELDS)
        sums, counts, maxes = self.sums, self.counts, self.maxes
        for i, name in self.numeric:
            v = values[i] = float(fields[name])  # type: ignore[arg-type]
            sums[i] += v
            counts[i] += 1
            old = maxes[i]
            maxes[i] = v if old is None or v > old else old
        w = values[WAITING]
        if w is not None and w > 0:
            self.waiting_pos += 1
        # windows._pick_evidence: the first line with the highest (KV or -1,
        # preemptions), where a KV of 0 counts as -1 as it does there.
        pick = (values[KV] or -1.0, n)
        if pick > self.peak_first_key:
            self.peak_first, self.peak_first_key = hit, pick
        # windows' kv_peak_running: the fewest running on a line at the highest KV.
        kv = values[KV]
        filled = -1.0 if kv is None else kv
        running = values[RUNNING]
        run = None if running is None else int(running)
        if filled > self.peak_kv:
            self.peak_kv, self.peak_running = filled, run
        elif (
            filled == self.peak_kv
            and run is not None
            and (self.peak_running is None or run < self.peak_running)
        ):
            self.peak_running = run
        if n > 0 and len(self.preempting) < 2:
            self.preempting.append(hit)

    def members(self) -> int:
        """The lines build() keeps besides the carrier (one object may hold two roles)."""
        if self.n == 1:
            return 0
        kept = {id(h) for h in (self.last, self.peak_first, *self.preempting)}
        return len(kept - {id(self.carrier)})

    def build(self) -> Hit:
        if self.n == 1:
            return self.carrier
        stats = RollupStats(
            n=self.n,
            preemptions=self.preemptions,
            lower=self.lower,
            sums=tuple(self.sums),
            counts=tuple(self.counts),
            maxes=tuple(self.maxes),
            waiting_pos=self.waiting_pos,
            peak_kv=self.peak_kv,
            peak_running=self.peak_running,
        )
        preempting = tuple(real(p) for p in self.preempting)
        rollup = Rollup(stats, self._kept_last(), real(self.peak_first), preempting)
        return _with(self.carrier, self.carrier.fields, self.carrier.text, rollup)

    def _kept_last(self) -> Hit:
        """The last line as far as anything reads it: its order keys, its stamp (its
        time) and the fields windows take last values of. Its text and other fields
        (~0.7 KB a minute) go, unless it also plays a role evidence can pick."""
        if self.last is self.peak_first or any(self.last is p for p in self.preempting):
            return real(self.last)
        last = real(self.last)
        return _with(last, last_fields(last.fields), "", None)


# The members after its carrier a rollup of preemption lines keeps with their text:
# what a window's evidence can pick of them (windows.MAX_EVIDENCE_PER_WINDOW, less
# the carrier). Evidence takes a window's preemption lines first of each signature,
# then by line number, and a rollup's members come in line order.
KEPT_PREEMPTIONS = 5


class PreemptionBuilder:
    """An open rollup of preemption lines (SGLang's retractions, V0's sampled warnings,
    ...): one copy space (copy_space) and clock minute. A thrashing server prints one
    every few seconds, and a hit and an event each were ~1.6 KB: its log's memory grew
    with its retractions (~190 MiB at 150 MiB of log).

    Exactness (held to line by line by the same tests as stats rollups): a copy of a
    record at the same stamp (another rank's) counts once here, as in
    events._dedupe_ranks; the records of its first and last line's stamps go with the
    rollup, so copies across its edges are found there, and where they cannot be (a
    line of its space inside its span, out of time order) events says so and analyze
    scans again without these rollups. Ranks print a second's copies a little out of
    order: a line stamped before the one above joins, unless it is before the carrier
    (which stays the first line in time) or carries a V0 counter (read in time order).
    Counts: SGLang's `count` summed; a V0 warning's counter delta from the one before
    (a counter that went down: the engine restarted, all of it counts), the carrier's
    own left to events (it depends on the lines before); a line with neither: one, a
    lower bound. A start-up line (config, capacity) resets V0 counters in events: it
    ends the open rollups that carry one."""

    __slots__ = (
        "carrier",
        "clock",
        "copies",
        "counted",
        "counter",
        "first",
        "highest",
        "kept",
        "last",
        "last_at",
        "latest",
        "latest_at",
        "lower",
        "minute",
        "n",
        "preemptions",
        "slot",
        "whole",
        "wrapper",
    )

    def __init__(
        self,
        slot: int,
        hit: Hit,
        minute: str,
        instant: Instant,
        clock: tuple[str, str] | None,
    ) -> None:
        self.slot = slot
        self.carrier = hit
        self.clock = clock
        self.minute = minute
        self.first = self.last_at = self.latest_at = instant
        self.wrapper = hit.ts_wrapper.kind if hit.ts_wrapper else ""
        cum = hit.fields.get("cumulative")
        self.counted = isinstance(cum, int)
        self.counter = self.highest = max(cum, 0) if isinstance(cum, int) else None
        self.n = 1
        self.preemptions = 0
        self.lower = False
        # every stamp's records so far (the minute's lines of one space: a few dozen;
        # an engine's by the second, as events._dedupe_ranks tells copies: a wrapper's
        # stamp has each copy's own nanosecond)
        self.whole = hit.engine in WHOLE_SECONDS
        self.copies: dict[Instant, set[CopyKey]] = {self._at(instant): {copy_key(hit.fields)}}
        self.kept: list[Ref] = []  # the first members after the carrier
        self.last: Ref = hit
        self.latest: Ref = hit

    def accepts(
        self, fields: Mapping[str, FieldValue], wrapper: str, minute: str, instant: Instant
    ) -> bool:
        """Whether a line with these fields, wrapper stamp kind, minute and stamp joins."""
        return (
            minute == self.minute
            and instant >= (self.last_at if self.counted else self.first)
            and wrapper == self.wrapper
            and isinstance(fields.get("cumulative"), int) == self.counted
        )

    def add(
        self,
        ref: Ref,
        f: Mapping[str, FieldValue],
        instant: Instant,
        record: CopyKey | None = None,
    ) -> None:
        """Add a line (its hit's fields `f`; `record`: their copy_key, where the caller
        has it): a Deferred one costs a hit only if kept."""
        # (a copy too is the last line: the one an unstamped line after it is timed by)
        self.last, self.last_at = ref, instant
        records = self.copies.setdefault(self._at(instant), set())
        key = copy_key(f) if record is None else record
        if key in records:
            return  # another rank's copy: counted once, its time none of the span's
        records.add(key)
        if instant >= self.latest_at:
            self.latest, self.latest_at = ref, instant
        self.n += 1
        cum, count = f.get("cumulative"), f.get("count")
        if isinstance(cum, int):
            assert self.counter is not None
            self.preemptions += cum - self.counter if cum >= self.counter else cum
            self.counter = max(cum, 0)
            self.highest = max(self.highest or 0, cum)
        elif isinstance(count, int):
            self.preemptions += count
        else:
            self.preemptions += 1
            self.lower = True
        if len(self.kept) < KEPT_PREEMPTIONS:
            self.kept.append(ref)

    def _at(self, instant: Instant) -> Instant:
        """The stamp a record's copies share: an engine's second (WHOLE_SECONDS)."""
        return (instant[0], 0) if self.whole else instant

    def _alone(self) -> bool:
        return self.n == 1 and self.last is self.carrier

    def members(self) -> int:
        if self._alone():
            return 0
        own = {id(self.carrier), *map(id, self.kept)}
        return len(self.kept) + len({id(self.last), id(self.latest)} - own)

    def build(self) -> Hit:
        if self._alone():
            return self.carrier
        stats = RollupStats(
            n=self.n,
            preemptions=self.preemptions,
            lower=self.lower,
            sums=(),
            counts=(),
            maxes=(),
            waiting_pos=0,
            peak_kv=-1.0,
            peak_running=None,
            first_copies=_several(self.copies[self._at(self.first)]),
            last_copies=_several(self.copies[self._at(self.last_at)]),
            cumulative=self.counter,
            highest=self.highest,
        )
        # Evidence reads the kept members' text, place and time, not their fields
        # (~40 % of what they held). The last line is read for its time, order and
        # fields (its stamp's record, where it is the one: _several), the latest in time
        # for a replica's end and compare's minutes; one object for a line's roles.
        made: dict[int, Hit] = {id(self.carrier): self.carrier}
        for ref in self.kept:
            h = real(ref)
            made[id(ref)] = _with(h, _NO_FIELDS, h.text, None)
        last = real(self.last)
        text = made[id(self.last)].text if id(self.last) in made else ""
        made[id(self.last)] = _with(last, last.fields, text, None)
        if id(self.latest) not in made:
            made[id(self.latest)] = _with(real(self.latest), _NO_FIELDS, "", None)
        kept = tuple(made[id(ref)] for ref in self.kept)
        c = self.carrier
        rollup = Rollup(stats, made[id(self.last)], made[id(self.latest)], kept)
        return _with(c, c.fields, c.text, rollup)


def _instant(sec: str) -> Instant:
    """A stamp's seconds and microseconds within its minute, as events reads them
    (timeparse.parse_iso: a fraction's first six digits; `,` or `.`): with the minute
    (which carries the stamp's zone) the time events gives the line."""
    whole, _, frac = sec.replace(",", ".").partition(".")
    return int(whole), int((frac + "000000")[:6]) if frac.isdigit() else 0


_NO_FIELDS: Mapping[str, FieldValue] = {}  # (shared, never written)
_ONE: frozenset[CopyKey] = frozenset()


def _several(copies: set[CopyKey] | frozenset[CopyKey]) -> frozenset[CopyKey]:
    """A stamp's records, kept where there are several: where there is one, it is the
    carrier's or the last line's own, and events._dedupe_ranks reads it off that line."""
    return frozenset(copies) if len(copies) > 1 else _ONE


def last_fields(fields: Mapping[str, FieldValue]) -> Mapping[str, FieldValue]:
    """The fields a rollup keeps of its last line (LAST_FIELDS), one shared mapping
    for equal values: a healthy server's last lines are nearly all `Waiting: 0`, and a
    dict a minute was ~5 % of what a month of rollups holds."""
    return _last_fields(tuple([(k, fields[k]) for k in LAST_FIELDS if k in fields]))


@lru_cache(maxsize=4096)
def _last_fields(items: tuple[tuple[str, FieldValue], ...]) -> Mapping[str, FieldValue]:
    return dict(items)


def _with(h: Hit, fields: Mapping[str, FieldValue], text: str, rollup: Rollup[Hit] | None) -> Hit:
    """dataclasses.replace(h, fields=, text=, rollup=), spelt out: replace looks the
    fields up each call, ~10 us, and a rollup calls it twice a minute of each stream."""
    return Hit(
        h.source,
        h.line,
        h.sig,
        h.kind,
        fields,
        text,
        h.ts_wrapper,
        h.ts_engine,
        h.proc,
        h.repeat,
        h.pod,
        h.uptime,
        rollup,
        h.engine,
        h.pos,
    )


@dataclass(slots=True)
class RollupSink:
    """Appends hits to `hits`, merging stats lines into per-stream rollups and, with
    `preemptions`, preemption lines into per-copy-space ones."""

    hits: list[Hit]
    # Preemption lines merged too (PreemptionBuilder); analyze scans again without
    # where events finds they cannot stand for their lines.
    preemptions: bool = False
    open: dict[tuple[object, ...], Builder] = field(default_factory=dict)  # by stream_key
    opened: dict[tuple[object, ...], PreemptionBuilder] = field(default_factory=dict)  # copy_space
    # The clock of the last stamped hit: every open rollup has it (closing below keeps
    # that true), so a hit with the same clock need not look at them.
    clock: tuple[str, str] | None = None
    members: int = 0  # lines the closed rollups keep besides their carriers
    # The line of the hit added last and the rollup it went to (None: a hit of its
    # own). A member joins its rollup only as the first hit of its line or right after
    # a hit of the same rollup: members on one glued line then come in runs, each
    # after its carrier or opening the line, so events.resolve_times can tell from
    # the hits alone which of a line's records came last.
    line: int = 0
    went_to: Builder | PreemptionBuilder | None = None
    # Where a copy space's closed rollup of preemption lines reached (its minute, its
    # latest stamp, the stamp's kind): a line of the space stamped there or before in
    # that minute stays a line of its own, and events finds its copies among the
    # rollup's last records exactly (a rollup starting there could not take them off).
    # A scan of a range that starts mid-file (--jobs) begins each space the same way:
    # the range before may end on copies of its first records.
    edges: dict[tuple[object, ...], tuple[str, Instant, str]] = field(default_factory=dict)
    mid_file: bool = False
    began: set[tuple[object, ...]] = field(default_factory=set)

    def _close(self, b: Builder | PreemptionBuilder) -> None:
        self.hits[b.slot] = b.build()
        self.members += b.members()
        if isinstance(b, PreemptionBuilder):
            self.edges[copy_space(b.carrier)] = (b.minute, b.latest_at, b.wrapper)

    def add(self, hit: Hit) -> None:
        when = stamp(hit)
        if hit.kind is Kind.PREEMPTION and self.preemptions:
            plain = hit.repeat != 1 or hit.uptime is not None
            space = copy_space(hit)
            self.add_preemption(hit, hit.fields, when, space, hit.ts_wrapper, plain, hit.line)
            return
        if hit.kind in (Kind.CONFIG, Kind.CAPACITY) and self.opened:
            # (an engine start resets V0 counters: events._count_preemptions)
            for k in [k for k, b in self.opened.items() if b.counted]:
                self._close(self.opened.pop(k))
        _, minute, sec = when
        key = stream_key(hit) if minute is not None and sec is not None else None
        self.add_ref(hit, hit.fields, when, key, hit.line)

    def _arrive(self, line: int, clock: tuple[str, str] | None, minute: str | None) -> bool:
        """A line's hit arrives: the open rollups its clock ends close. Whether it may
        join a rollup: it is its line's first hit, or `went_to` (then set by the caller)
        is the rollup it may join."""
        # May join a rollup: the line's first hit, or one right after a hit of it.
        first = line != self.line
        self.line, self.went_to = line, None
        if minute is None:
            # A stamp that is no time (`14:35:99…`, Feb 29 without a leap year) is no
            # stamp to events: timed by the line before, like an unstamped line.
            clock = None
        if (self.open or self.opened) and (clock is None or clock != self.clock):
            # A member is timed from its carrier, as if the lines between left the
            # clock as the carrier did: true while they stamp the same date (ISO) or
            # month-day (engine). Any other line ends the open rollups it differs from
            # (an unstamped one all of them: it is timed by the line before it, which
            # events.resolve_times then finds among the closed rollups' last lines).
            if self.open:
                self._close_all(self.open, clock)
            if self.opened:
                self._close_all(self.opened, clock)
        self.clock = clock
        return first

    def _close_all(
        self,
        open_: dict[tuple[object, ...], Builder] | dict[tuple[object, ...], PreemptionBuilder],
        clock: tuple[str, str] | None = None,
    ) -> None:
        """Close the open rollups of `open_` (those of another clock than `clock`)."""
        for k in [k for k, b in open_.items() if clock is None or b.clock != clock]:
            self._close(open_.pop(k))

    def add_preemption(
        self,
        ref: Ref,
        fields: Mapping[str, FieldValue],
        when: Stamp,
        key: tuple[object, ...],
        stamp: WrapperStamp | None,
        plain: bool,
        line: int,
        record: CopyKey | None = None,
    ) -> None:
        """add() of a preemption line given as a ref with its hit's fields, stamp(),
        copy_space(), wrapper stamp, whether it must stay a line of its own (a Ray
        repeat, a dmesg uptime) and line (`record`: copy_key of its fields, where the
        caller has it)."""
        after = self.went_to
        clock, minute, sec = when
        first = self._arrive(line, clock, minute)
        if minute is None or sec is None or plain:
            self.hits.append(real(ref))
            return
        instant = _instant(sec)
        wrapper = stamp.kind if stamp is not None else ""
        b = self.opened.get(key)
        if b is not None and b.accepts(fields, wrapper, minute, instant) and (first or after is b):
            b.add(ref, fields, instant, record)
            self.went_to = b
            return
        if b is not None:
            self._close(self.opened.pop(key))
        hit = real(ref)
        if self.mid_file and key not in self.began:
            self.began.add(key)
            self.edges[key] = (minute, instant, wrapper)
        edge = self.edges.get(key)
        # (an engine's line by the second: copies are told by it, and a wrapper's stamp
        # has each copy's own nanosecond)
        at = (instant[0], 0) if hit.engine in WHOLE_SECONDS else instant
        if edge is not None and edge[0] == minute and (edge[2] != wrapper or at <= edge[1]):
            self.hits.append(hit)
            return
        self.went_to = self.opened[key] = PreemptionBuilder(
            len(self.hits), hit, minute, instant, clock
        )
        self.hits.append(hit)

    def add_ref(
        self,
        ref: Ref,
        fields: Mapping[str, FieldValue],
        when: Stamp,
        key: tuple[object, ...] | None,
        line: int,
    ) -> None:
        """add() of a line given as a ref with its hit's fields, stamp(),
        stream_key() (None where stream_key is, or the stamp has no minute) and line."""
        after = self.went_to
        clock, minute, sec = when
        first = self._arrive(line, clock, minute)
        if key is None or minute is None or sec is None:
            self.hits.append(real(ref))
            return
        b = self.open.get(key)
        # (not glued after another record of its line: fuzz seed 8081 input 12465)
        if b is not None and b.accepts(minute, sec) and (first or after is b):
            b.add(ref, fields, sec)
            self.went_to = b
            return
        if b is not None:
            self._close(b)
        hit = real(ref)
        self.went_to = self.open[key] = Builder(len(self.hits), hit, minute, sec, clock)
        self.hits.append(hit)

    def close(self) -> None:
        self._close_all(self.open)
        self._close_all(self.opened)


def map_rollup(r: Rollup[T], f: Callable[[T], U]) -> Rollup[U]:
    return Rollup(r.stats, f(r.last), f(r.peak_first), tuple(f(m) for m in r.preempting))


def member_time(member: Hit, carrier: Hit, carrier_ts: datetime | None) -> datetime | None:
    """A member line's time, from the carrier's resolved one: the same clock minute
    (and so the same year, date and zone) with the member's own seconds."""
    if member is carrier or carrier_ts is None:
        return carrier_ts
    if member.ts_wrapper:
        # ISO/SQL stamps carry their date: parse them (zone as the carrier got it).
        dt = parse_iso(member.ts_wrapper.text)
        if dt is None:
            return carrier_ts
        if member.ts_wrapper.kind == "sql":
            # Zoneless: the carrier's time plus the member's seconds after it. In a
            # named --tz the carrier's is in UTC by now (events._in_utc), and the
            # member's wall clock given the carrier's zone put it hours off (SGLang's
            # stamps with --tz Europe/Berlin: evidence, Waiting's last value, a verdict).
            base = parse_iso(carrier.ts_wrapper.text) if carrier.ts_wrapper else None
            return carrier_ts if base is None else carrier_ts + (dt - base)
        return dt
    engine = member.ts_engine
    if engine is not None and len(engine) == 14 and engine[12:].isdigit():
        # A member's stamp had a minute and seconds when it joined (Builder): _ENGINE's
        # `MM-DD HH:MM:SS` whole, its seconds the last two digits. (stamp_of's cache
        # misses on a month of stamps 10 s apart; its checks cost ~3 us a member.)
        return carrier_ts.replace(second=int(engine[12:]))
    sec = stamp(member)[2]
    return carrier_ts.replace(second=int(sec)) if sec else carrier_ts
