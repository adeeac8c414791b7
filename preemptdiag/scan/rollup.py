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
from functools import lru_cache
from typing import Protocol, TypeVar

from preemptdiag.model.records import (
    CALM_AGG_FIELDS,
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
        if parse_iso(text) is None:
            return clock, None, None
        return clock, m["minute"] + (m["zone"] or ""), m["sec"]
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
    """Appends hits to `hits`, merging stats lines into per-stream rollups."""

    hits: list[Hit]
    open: dict[tuple[object, ...], Builder] = field(default_factory=dict)  # by stream_key
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
    went_to: Builder | None = None

    def _close(self, b: Builder) -> None:
        self.hits[b.slot] = b.build()
        self.members += b.members()

    def add(self, hit: Hit) -> None:
        clock, minute, sec = stamp(hit)
        key = stream_key(hit) if minute is not None and sec is not None else None
        self.add_ref(hit, hit.fields, (clock, minute, sec), key, hit.line)

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
        # May join a rollup: the line's first hit, or one right after a hit of it.
        first, after = line != self.line, self.went_to
        self.line, self.went_to = line, None
        clock, minute, sec = when
        if minute is None:
            # A stamp that is no time (`14:35:99…`, Feb 29 without a leap year) is no
            # stamp to events: timed by the line before, like an unstamped line.
            clock = None
        if self.open and (clock is None or clock != self.clock):
            # A member is timed from its carrier, as if the lines between left the
            # clock as the carrier did: true while they stamp the same date (ISO) or
            # month-day (engine). Any other line ends the open rollups it differs from
            # (an unstamped one all of them: it is timed by the line before it, which
            # events.resolve_times then finds among the closed rollups' last lines).
            for k in [k for k, b in self.open.items() if clock is None or b.clock != clock]:
                self._close(self.open.pop(k))
        self.clock = clock
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
        for b in self.open.values():
            self._close(b)
        self.open.clear()


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
            dt = dt.replace(tzinfo=carrier_ts.tzinfo)
        return dt
    engine = member.ts_engine
    if engine is not None and len(engine) == 14 and engine[12:].isdigit():
        # A member's stamp had a minute and seconds when it joined (Builder): _ENGINE's
        # `MM-DD HH:MM:SS` whole, its seconds the last two digits. (stamp_of's cache
        # misses on a month of stamps 10 s apart; its checks cost ~3 us a member.)
        return carrier_ts.replace(second=int(engine[12:]))
    sec = stamp(member)[2]
    return carrier_ts.replace(second=int(sec)) if sec else carrier_ts
