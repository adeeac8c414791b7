"""Calm minutes -> windows, without a hit, an event or a rollup each.

A month of a server's log is 43,200 stream-minutes of stats lines in which nothing is
preempted, whether requests wait (a server at its cap) or not, and whatever its KV
usage (a pool pinned under steady load). scan/lane.py keeps such a minute as a row of
numbers (records.CalmRows, a frame a block); here each gets its time and replica from
the hit before it in its file (its anchor: the lane makes the first segment of every
clock a hit), and the minutes of one window become that window, as build_windows
aggregates their lines, classified as it is made from its numbers (suspected
preemption, a stall, queueing or healthy: PD107-PD110,
window_rules.calm_judge). Its row is read once, then, and its frame let go: a
frame's windows of one minute (the usual) are a CalmRun, the columns they read, each
window (a CalmWindow) made only when it is read, and its evidence event only when that
is (records.ReadRun, records.ReadWindow). A window of several minutes (SGLang's
decode and prefill streams: most of its windows) is a GroupWindow, made once its
minutes are all read: its numbers held, its evidence event made only when read.
Everything after sees the windows (records.Windows: runs a
class at a time, read a column at a time), and the minutes' lines where it counts
lines (detect_engine).

Exact, or not used: `place` gives None, and analyze scans again without calm minutes,
when a minute has no anchor of its clock before it, when its anchor was not timed from
its own stamp's date, or when a calm minute would come after every hit of its file (a
year-less log is moved back a year by its last stamp: events.resolve_times) or before
every one (lines out of order: its replica's first time is its events' first).
`windows` gives None when a calm window shares its (replica, start) with a window of
events; analyze does the same when the replica's preemption count is a late V1 one
(visibility.Settled reads every stats line's Waiting: analyze.Again), and scans again
with the KV pressure threshold as the minutes' limit where a V0 counter's delta may be
spread onto a minute at it (`pinned`: Again.PINNED). With --since/--until, `noted`
gives the notes what they read of the minutes kept.
tests/timeline/test_calm.py holds the report to the one made without calm minutes,
byte for byte, in every format; bench/fuzz.py and bench/lane_fuzz.py do on damaged
logs.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from functools import lru_cache
from itertools import groupby, islice
from operator import attrgetter, itemgetter, lt
from typing import Any, cast, overload

from preemptdiag.model.records import (
    CALM_COLUMNS,
    CALM_MEANS,
    CalmRows,
    Class,
    Columns,
    Confidence,
    Const,
    Event,
    FieldValue,
    Hit,
    Kind,
    Packed,
    PackedNumbers,
    ReadRun,
    ReadWindow,
    Repeats,
    Window,
    Windows,
    WrapperStamp,
    is_printable,
    micros,
    narrow,
)
from preemptdiag.model.timeparse import parse_iso
from preemptdiag.scan.matcher import MAX_EVIDENCE_CHARS, cut
from preemptdiag.scan.rollup import AGG_FIELDS, number, snap6, stamp
from preemptdiag.timeline.events import read_pass, stamp_event

_KV, _RUNNING, _WAITING, _PROMPT, _GEN, _SWAPPED = (
    AGG_FIELDS.index(k)
    for k in ("kv_usage", "running", "waiting", "prompt_tput", "gen_tput", "swapped")
)
# Where CalmRows.frame's columns are in a row of it (the peak line's fields follow).
_AT = {name: i for i, name in enumerate(CALM_COLUMNS)}
_FIRST_LINE, _FIRST_US, _LAST_LINE, _LAST_US, _LAST_POS, _DAY, _HOUR, _MINUTE, _N = (
    _AT[c]
    for c in (
        "first_line",
        "first_us",
        "last_line",
        "last_us",
        "last_pos",
        "day",
        "hour",
        "minute",
        "n",
    )
)
_SUMS, _COUNTS, _MAXES = (_AT[f"{p}_{AGG_FIELDS[0]}"] for p in ("sum", "cnt", "max"))
_PEAK_KV, _PEAK_RUNNING, _SWAPPED_FIRST, _SWAPPED_LAST = (
    _AT[c] for c in ("peak_kv", "peak_running", "swapped_first", "swapped_last")
)
_WAITING_FIRST, _WAITING_LAST, _WAITING_POS = (
    _AT[c] for c in ("waiting_first", "waiting_last", "waiting_pos")
)
_PEAK_LINE, _PEAK_POS, _PEAK_TEXT, _PEAK_US, _PEAK_PROC = (
    _AT[c] for c in ("peak_line", "peak_pos", "peak_text", "peak_us", "peak_proc")
)
_DAY, _HOUR, _MINUTE = (_AT[c] for c in ("day", "hour", "minute"))
_FIELDS = len(CALM_COLUMNS)


@dataclass(frozen=True, slots=True)
class Placed:
    """The calm minutes of a frame of rows on the timeline: for each row, its replica,
    the time of the stamp that dates it (its anchor: the row's time is that day at
    the row's clock, _at) and window (their values are read when their windows are
    made: a month's rows as Python values were ~60 MB), its lines (`n`, the
    frame's column: it goes once read) and the time of its first line (`firsts`,
    epoch seconds: what --since/--until keep, trimmed); `keep`: which rows of the
    frame these are (all, but where trimmed)."""

    rows: CalmRows
    replicas: Repeats  # (a frame's minutes are one replica's: one run)
    anchors: Repeats  # (by identity: a frame's minutes share an anchor or two)
    wstarts: array[int]  # (epoch seconds: 8 bytes a minute, no int object)
    n: Sequence[int]
    firsts: array[int]
    keep: Sequence[int]

    @property
    def minutes(self) -> int:
        return len(self.replicas)

    @property
    def lines(self) -> int:
        return sum(self.n)


def _fields(r: CalmRows, values: tuple[Any, ...]) -> dict[str, FieldValue]:
    """The peak line's fields (its `values`, in r.fields' order), as the scan's Builder
    gives them (constants first)."""
    out: dict[str, FieldValue] = dict(r.constants)
    out.update(zip(r.fields, values, strict=True))
    return out


def _text(raw: str) -> str:
    """The peak line's text as its hit holds it (cut as the scan cuts evidence)."""
    return cut(raw[: MAX_EVIDENCE_CHARS + 1])


def _peak_hit(
    r: CalmRows,
    line: int,
    values: tuple[Any, ...],
    text: str,
    stamp: str | None,
    proc: str | None,
    pos: int,
) -> Hit:
    """The hit of a calm minute's peak line from its parts (its stamp, None when
    only its event is wanted: the event is timed by its minute, not by the stamp)."""
    wrapper = WrapperStamp("sql", stamp) if r.sglang and stamp is not None else None
    return Hit(
        r.source,
        line,
        r.sig,
        r.kind,
        _fields(r, values),
        text,
        wrapper,
        None if r.sglang else stamp,
        proc,
        1,
        None,
        None,
        None,
        r.engine,
        pos,
    )


def place(
    calm: Sequence[CalmRows],
    hits: Sequence[Hit],
    events: Sequence[Event],
    seconds: int,
    tz: tzinfo = UTC,
) -> list[Placed] | None:
    """The calm minutes of one file on the timeline, a frame at a time (see the module
    docstring); `hits`: the file's hits, `events`: what build_events made of every
    file's, `tz`: the zone of stamps that carry none (--tz). A frame of minutes timed by
    a wrapper's RFC 3339 stamps (CalmRows.zone) is read on that zone's clock, its
    anchors' times too."""
    if not calm:
        return []
    source = calm[0].source
    timed = {(e.line, e.pos, e.sig): e for e in events if e.source == source}
    # Every hit that can move its file's clock (a stamp of any kind); the one just
    # before a calm minute must be a plain stamp of the minute's clock.
    anchors = sorted(
        (h for h in hits if h.ts_engine or h.ts_wrapper), key=lambda h: (h.line, h.pos)
    )
    lines = [h.line for h in anchors]
    stamps = [e.ts for e in timed.values() if e.ts is not None]
    if not stamps:
        return None
    # (a calm minute outside its file's events' span would move its replica's first or
    # last time, read off the events: replicas.replica_facts)
    earliest, latest = min(stamps), max(stamps)
    # A named zone's anchors' events are in UTC (events._in_utc): read on their wall
    # clock, the offset's where it holds all through the file's span (a stamp is then
    # one time whichever pass of an hour it is read as), else the zone's, each minute
    # then timed by its own offset, in the pass of its hour _in_utc reads (_Shifts).
    zone = _one_offset(tz, earliest, latest)
    wall = None if zone is tz else zone or tz
    shifts = None
    if zone is None:
        stamped = ((timed.get((h.line, h.pos, h.sig)), _own_zone(h)) for h in anchors)
        shifts = _Shifts([(e.line, e.pos, e.ts, own) for e, own in stamped if e and e.ts], tz)
    early, late = micros(earliest), micros(latest)
    days: dict[int, int | None] = {}  # (by anchor: _day_at of its time)
    # What the minutes after one anchor read of it: its clock, its event and its time
    # on the wall clock of its stamp, when it can date them (a run of minutes shares
    # its anchor). By the zone of the minutes' wrapper stamps (CalmRows.zone): such a
    # minute is read on its own stamp's clock, its anchor's time on that clock.
    datings: dict[str | None, dict[int, tuple[tuple[str, str], Event, datetime] | None]] = {}
    made: list[tuple[CalmRows, array[int], array[int], array[int]]] = []
    for r in calm:
        kind = "w" if r.sglang or r.zone is not None else "e"
        clock = wall if r.zone is None else _zone_of(r.zone)
        if clock is None and r.zone is not None:
            return None
        dating = datings.setdefault(r.zone, {})
        assert r.frame is not None
        # (each row's anchor: its index, in C, made the Placed's runs once the frame is
        # read; a Repeats.append a row was ~20 ms of a month)
        ks: array[int] = array("q")
        starts: array[int] = array("q")
        firsts: array[int] = array("q")
        cols = r.frame.rows("first_line", "day", "hour", "minute", "first_us")
        # (k: the anchors before the row's line, bisect_left's answer, found by stepping
        # on while the rows' lines go up: a frame's minutes share an anchor or two)
        k, at = -1, -1
        for line, day, hour, minute, us in cols:
            if k < 0 or line < at:
                k = bisect_left(lines, line)
            while k < len(lines) and lines[k] < line:
                k += 1
            at = line
            if not k:
                return None
            if k in dating:
                got = dating[k]
            else:
                got = dating[k] = _dating(anchors[k - 1], timed, clock)
            if got is None:
                return None
            (anchor_kind, anchor_day), _, anchor_ts = got
            if anchor_kind != kind or anchor_day != day:
                return None
            day_at = days.get(k)
            if day_at is None:
                day_at = days[k] = _day_at(anchor_ts)
            if day_at is not None and hour < 24 and minute < 60 and us < _MINUTE_US:
                # (the usual: a fixed offset, its day's midnight and the clock, exactly)
                epoch = day_at + hour * 3600 + minute * 60 + us // _US
                if not early <= epoch * _US <= late:
                    return None
            elif shifts is not None:
                # (its time once _Shifts knows which pass of its hour it is in)
                shifts.add(line, (len(made), len(ks)), anchor_ts, hour, minute, us // _US)
                epoch = 0
            else:
                ts = _at(anchor_ts, hour, minute, us)
                if ts > latest or ts < earliest:
                    return None
                epoch = int(ts.timestamp())  # (windows.window_start)
            ks.append(k << 1)  # (and the pass of its hour: _Shifts)
            starts.append(epoch - epoch % seconds)
            firsts.append(epoch)
        if ks:  # (a frame has rows; none is nothing to place)
            made.append((r, ks, starts, firsts))
    read = shifts.read() if shifts is not None else []
    if read is None:
        return None
    for (f, i), ts, fold in read:
        if not earliest <= ts <= latest:
            return None
        _, ks, starts, firsts = made[f]
        epoch = int(ts.timestamp())
        ks[i] |= fold
        starts[i], firsts[i] = epoch - epoch % seconds, epoch
    # (a named zone's: events give their lines in UTC, evidence shows them so)
    named = wall is not None
    return [
        _placed(replace(r, utc=named and r.zone is None), ks, starts, firsts, datings[r.zone])
        for r, ks, starts, firsts in made
    ]


def _placed(
    r: CalmRows,
    ks: array[int],
    starts: array[int],
    firsts: array[int],
    dating: Mapping[int, tuple[tuple[str, str], Event, datetime] | None],
) -> Placed:
    """The Placed of frame `r`'s rows: `ks`, each row's anchor (its index) and the
    pass of its hour (the low bit, _Shifts: its anchor's time then in that pass)."""
    assert r.frame is not None
    replicas = Repeats()
    dated = Repeats(identity=True)  # (Placed.anchors)
    for key, group in groupby(ks):
        _, e, anchor_ts = cast(tuple[tuple[str, str], Event, datetime], dating[key >> 1])
        n = sum(1 for _ in group)
        replicas.add(e.replica, n)
        dated.add(anchor_ts.replace(fold=1) if key & 1 else anchor_ts, n)
    lines = r.frame.column("n")
    return Placed(r, replicas, dated, starts, lines, firsts, range(len(lines)))


def trimmed(placed: list[Placed], since: datetime | None, until: datetime | None) -> list[Placed]:
    """The calm minutes --since/--until keep (each of a minute's lines is on its side
    of a bound on a minute, which analyze requires: _rollup_exact): `placed`, emptied
    (a frame none of whose minutes are kept goes now)."""
    lo = -(1 << 62) if since is None else math.ceil(micros(since) / _US)
    hi = 1 << 62 if until is None else math.ceil(micros(until) / _US)
    out: list[Placed] = []
    for p in placed:
        keep = [j for j, t in enumerate(p.firsts) if lo <= t < hi]
        if len(keep) == p.minutes:
            out.append(p)
        elif keep:
            out.append(_taken(p, keep))
    placed.clear()
    return out


# What the notes read of a stats line besides its time (commands/notes.py,
# engine_notes): its engine's index, its process (SGLang's DP rank) and how many
# engines it sums up.
_NOTED = ("engine_idx", "engines_aggregated")


def noted(placed: Iterable[Placed]) -> list[Event]:
    """For each replica, a stats event of its calm minutes for each engine they show
    (index, process, engines aggregated), timed by its minute's first line: what the
    notes read of stats lines, where --since/--until keep calm minutes but no event
    of theirs (a range between two blocks' anchors: 'no line carried a timestamp',
    and no data-parallel note)."""
    out: list[Event] = []
    seen: set[tuple[Any, ...]] = set()
    for p in placed:
        r, frame = p.rows, p.rows.frame
        assert frame is not None
        values_of = [
            _listed(frame.column(f"f_{k}"))
            if k in r.fields
            else Const(r.constants.get(k), frame.height)
            for k in _NOTED
        ]
        procs = _listed(frame.column("peak_proc"))
        for j, row in enumerate(p.keep):
            key = (p.replicas[j], procs[row], *(c[row] for c in values_of))
            if key in seen:
                continue
            seen.add(key)
            values = tuple(frame.column(f"f_{k}")[row] for k in r.fields)
            h = _peak_hit(
                r,
                frame.column("peak_line")[row],
                values,
                frame.column("peak_text")[row],
                None,
                procs[row],
                frame.column("peak_pos")[row],
            )
            out.append(stamp_event(h, datetime.fromtimestamp(p.firsts[j], tz=UTC), key[0]))
    return out


def _taken(p: Placed, keep: list[int]) -> Placed:
    """Placed `p` of its minutes `keep` (their indices) alone."""
    replicas, anchors = Repeats(), Repeats(identity=True)
    replicas.extend(p.replicas[j] for j in keep)
    anchors.extend(p.anchors[j] for j in keep)
    rows = p.keep
    return Placed(
        p.rows,
        replicas,
        anchors,
        array("q", (p.wstarts[j] for j in keep)),
        array("q", (p.n[j] for j in keep)),
        array("q", (p.firsts[j] for j in keep)),
        array("q", (rows[j] for j in keep)),
    )


class _Shifts:
    """Where a named zone shifts inside a file's span: which pass of its hour each
    calm minute is in, as events._in_utc would read its first line among the file's
    stamps. _in_utc reads a stamp of an hour the shift skips or repeats as its second
    pass where its first would be more than a minute before the latest stamp above it,
    a calm minute's among them (as its rollup's, the line it would have carried: the
    rollup's lines are timed from it). So the file's stamps and its calm minutes are
    read again here in file order, the stamps' times as events has them; where a
    stamp of such an hour would read otherwise with the calm minutes above it, the
    minutes cannot stand for their lines (`read` gives a None)."""

    def __init__(self, stamps: list[tuple[int, int, datetime, bool]], tz: tzinfo) -> None:
        # (line, pos, time, whether its own zone timed it) of each stamp events timed
        self._stamps = stamps
        self._tz = tz
        self._minutes: list[tuple[int, tuple[int, int], datetime]] = []

    def add(
        self,
        line: int,
        slot: tuple[int, int],
        anchor: datetime,
        hour: int,
        minute: int,
        second: int,
    ) -> None:
        """A calm minute whose first line is `line`, at its anchor's day at the clock
        (`slot`: where place keeps it)."""
        self._minutes.append((line, slot, _wall(anchor, hour, minute, second)))

    def read(self) -> list[tuple[tuple[int, int], datetime, int]] | None:
        """(slot, its first line's time in UTC, the pass of its hour: fold) of each
        minute, in file order; None where a stamp would read otherwise."""
        items = sorted(
            [(line, 0, pos, t, (0, 0), own) for line, pos, t, own in self._stamps]
            + [(line, 1, 0, t, slot, False) for line, slot, t in self._minutes],
            key=itemgetter(0, 1, 2),
        )
        out: list[tuple[tuple[int, int], datetime, int]] = []
        latest: datetime | None = None
        for _, minute, _, t, slot, own in items:
            if minute:
                got = read_pass(t, latest)  # (in UTC: the second pass where it differs)
                out.append((slot, got, int(got != t.astimezone(UTC))))
                t = got
            elif not own:  # (a wrapper's RFC 3339 stamp has its own zone: not --tz's)
                local = t.astimezone(self._tz)
                # (a stamp of a skipped or repeated hour: read with the minutes' first
                # lines above it, as _in_utc would have)
                shifted = latest is not None and _shifting(local)
                if shifted and read_pass(local.replace(fold=0), latest) != t:
                    return None
            latest = t if latest is None or t > latest else latest
        return out


def _own_zone(h: Hit) -> bool:
    """Whether the hit's time is its RFC 3339 wrapper stamp's, in that stamp's zone
    (events._wrapper_ts), not a time of --tz's (events._in_utc reads only those)."""
    w = h.ts_wrapper
    return w is not None and w.kind == "iso" and parse_iso(w.text) is not None


def _wall(anchor: datetime, hour: int, minute: int, second: int) -> datetime:
    """The anchor's day at the clock, on its zone's wall clock, first pass (fold 0)."""
    return anchor.replace(hour=hour, minute=minute, second=second, microsecond=0, fold=0)


def _shifting(ts: datetime) -> bool:
    """Whether wall clock `ts` is in an hour its zone skips or repeats (its two folds
    are two offsets)."""
    return ts.replace(fold=0).utcoffset() != ts.replace(fold=1).utcoffset()


# How far apart _one_offset looks at a named zone's offset: its changes are months
# apart (tzdata holds none closer than days), so two looks an hour apart either side
# of one see it. Past _LOOK_SPAN it does not look (a span of years is a damaged
# stamp's, mostly): each minute is then timed by its own offset, which is exact too.
_LOOK = timedelta(hours=1)
_LOOK_SPAN = timedelta(days=400)


def _one_offset(tz: tzinfo, earliest: datetime, latest: datetime) -> tzinfo | None:
    """`tz` where it is a fixed offset; for a named zone, its one offset from
    `earliest` to `latest` (as a fixed offset), or None where the offset changes
    between them (a shift to or from summer time) or may (_LOOK_SPAN)."""
    if isinstance(tz, timezone):
        return tz
    if latest - earliest > _LOOK_SPAN:
        return None
    first = earliest.astimezone(tz).utcoffset()
    t = earliest
    while True:
        t = min(t + _LOOK, latest)
        if t.astimezone(tz).utcoffset() != first:
            return None
        if t == latest:
            break
    return timezone(first) if first is not None else None


def _at(anchor: datetime, hour: int, minute: int, us: int) -> datetime:
    """The time of a calm minute's line: its anchor's day at its clock, `us`
    microseconds into the minute (in UTC where the anchor is in a named zone,
    _Shifts: times of one such zone compare by their wall clocks, the pass of an hour
    a shift repeats not told)."""
    second, micro = divmod(us, _US)
    t = anchor.replace(hour=hour, minute=minute, second=second, microsecond=micro)
    return t if isinstance(t.tzinfo, timezone) else t.astimezone(UTC)


_US = 1_000_000
_MINUTE_US = 60 * _US


@lru_cache(maxsize=16)
def _zone_of(zone: str) -> tzinfo | None:
    """The zone of a wrapper stamp's zone text (`Z`, `+02:00`) as events has a stamp
    of it (timeparse.parse_iso), None where it is none."""
    ts = parse_iso(f"2001-01-01T00:00:00{zone}")
    return None if ts is None else ts.tzinfo


def _day_at(ts: datetime) -> int | None:
    """The epoch second of the midnight of `ts`'s day in its zone, where the zone is a
    fixed offset (a day's times are then that and their clock's seconds); None for
    any other zone (a day may have a shift in it)."""
    offset = ts.utcoffset()
    if type(ts.tzinfo) is not timezone or offset is None or offset.microseconds:
        return None
    day = micros(ts.replace(hour=0, minute=0, second=0, microsecond=0))
    return day // _US if day >= 0 else None


def lines_of(placed: Iterable[Placed], replicas: set[str]) -> int:
    """The calm minutes' lines of these replicas."""
    return sum(
        n for p in placed for replica, n in zip(p.replicas, p.n, strict=True) if replica in replicas
    )


def replicas_of(placed: Iterable[Placed]) -> set[str]:
    return {replica for p in placed for replica in set(p.replicas)}


def pinned(placed: Iterable[Placed], replicas: set[str], kv_pct: float) -> bool:
    """Whether a calm minute of these replicas reached `kv_pct` KV usage (a V0 counter's
    delta is spread onto such a minute's window: analyze.Again.PINNED)."""
    for p in placed:
        if replicas.isdisjoint(p.replicas):
            continue
        assert p.rows.frame is not None
        kv = _listed(p.rows.frame.data[_MAXES + _KV])
        for i, replica in zip(p.keep, p.replicas, strict=True):
            value = kv[i]
            if replica in replicas and value is not None and value >= kv_pct:
                return True
    return False


def _dating(
    h: Hit, timed: Mapping[tuple[int, int, str], Event], wall: tzinfo | None
) -> tuple[tuple[str, str], Event, datetime] | None:
    """(the clock, the event, its time) of anchor `h`, when it can date a calm minute
    of that clock: a plain stamp (no pod), timed from its own stamp's date; its time
    on the clock of `wall` when given (place: a named zone's one offset, or the zone
    of the minutes' wrapper stamps)."""
    e = timed.get((h.line, h.pos, h.sig))
    clock, minute, _ = stamp(h)
    if h.pod is not None or minute is None or clock is None or e is None or e.ts is None:
        return None
    ts = e.ts if wall is None else e.ts.astimezone(wall)
    return (clock, e, ts) if _same_day(ts, clock) else None


def _same_day(ts: datetime, clock: tuple[str, str]) -> bool:
    """Whether a time resolved from a stamp of `clock` kept that stamp's date."""
    kind, day = clock
    if kind == "e":
        return f"{ts.month:02d}-{ts.day:02d}" == day
    return ts.date().isoformat() == day


# (replica, what detect_engine reads of a line's fields, its engine) -> lines
Weights = dict[tuple[str, tuple[tuple[str, FieldValue], ...], str], int]


def weights(placed: Iterable[Placed]) -> Weights:
    """The calm minutes' lines by replica and by what detect_engine counts a line as:
    all it needs of them once their windows are made."""
    out: Weights = {}
    for p in placed:
        r = p.rows
        reads = _reads(r)
        if len(reads) == 1 and p.replicas.count(p.replicas[0]) == len(p.replicas):
            key = (p.replicas[0], reads[0], r.engine)  # (the usual: one of each a frame)
            out[key] = out.get(key, 0) + p.lines
            continue
        each = [reads[i] for i in p.keep] if len(reads) > 1 else reads * len(p.replicas)
        for replica, read, n in zip(p.replicas, each, p.n, strict=True):
            key = (replica, read, r.engine)
            out[key] = out.get(key, 0) + n
    return out


def _reads(r: CalmRows) -> list[tuple[tuple[str, FieldValue], ...]]:
    """What detect_engine reads of each row's peak line (one, for all, when the fields
    it reads are the signature's constants)."""
    names = [k for k in ("engine", "generation") if k in r.fields or k in r.constants]
    if not any(k in r.fields for k in names):
        return [tuple((k, r.constants[k]) for k in names)]
    assert r.frame is not None
    columns = [
        r.frame.column(f"f_{k}") if k in r.fields else [r.constants[k]] * r.height for k in names
    ]
    return [tuple(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def lines(
    counted: Weights, replica: str | None = None
) -> list[tuple[Mapping[str, FieldValue], str, int]]:
    """(fields, engine, lines) of the calm minutes (of `replica`, given one), for
    detect_engine."""
    return [
        (dict(read), engine, n)
        for (name, read, engine), n in counted.items()
        if replica is None or name == replica
    ]


# What the rules make of a calm window (diagnose.window_rules.calm_judge, bound to a
# run's visibility and thresholds): its class, confidence and why from its replica,
# start, end, stats lines, KV max, Waiting max and share, Running max. (No rule before
# PD107 can take it: nothing preempted or failed.)
Judgement = tuple[Class, Confidence, str]
Judged = Callable[
    [str, datetime, datetime, int, float | None, int | None, float | None, int | None],
    Judgement,
]


def windows(
    placed: list[Placed], others: Sequence[Window], seconds: int, judged: Judged
) -> Sequence[Window] | None:
    """The calm minutes' windows, classified (`judged`), merged into `others`: the
    events' windows (build_windows' order: by replica, then start, undated last);
    None when a calm window would share its replica and start with one of them.
    Empties `placed` once it has the minutes: a frame of rows goes as soon as it
    is read (a month of them is ~24 MiB, and its windows hold what they need)."""
    if not placed:
        return list(others)
    # Each replica's minutes' windows, frame by frame (no tuple a minute: a month's
    # were ~6 MiB at this stage's peak).
    starts: dict[str, array[int]] = {}
    for p in placed:
        if p.replicas.count(p.replicas[0]) == p.minutes:
            starts.setdefault(p.replicas[0], array("q")).extend(p.wstarts)  # (the usual)
        else:
            for replica, wstart in zip(p.replicas, p.wstarts, strict=True):
                starts.setdefault(replica, array("q")).append(wstart)
    # (windows of several minutes, and how many: a minute cut by a block's end, a
    # clock's two streams, SGLang's decode and prefill lines; none where a replica's
    # windows only go up)
    among = {replica: _Among(got) for replica, got in starts.items()}
    several: dict[tuple[str, int], int] = {}
    for replica, got in starts.items():
        if not among[replica].up:
            several.update(((replica, w), n) for w, n in Counter(got).items() if n > 1)
    if any(w.replica in among and _epoch(w.start) in among[w.replica] for w in others):
        return None
    del starts, among
    frames: list[Placed | None] = list(placed)
    placed.clear()
    # Each row is read once, frame by frame: the windows of one minute each become a
    # run of them, made only when read (CalmRun); a window of several is made once its
    # minutes are all in (GroupWindow), its minutes' rows kept until then.
    runs: list[CalmRun] = []
    kept: dict[tuple[str, int], list[_Part]] = {}
    groups: list[Window] = []
    judgements = _Judgements()
    ordered = True  # (made in build_windows' order: by replica, then start)
    last: tuple[str, int] = ("", -1)
    for f, got_ in enumerate(frames):
        assert got_ is not None
        frames[f] = None  # (its frame goes once read)
        r, frame = got_.rows, got_.rows.frame
        assert frame is not None
        # (what a calm window reads of its rows: the columns it keeps, without the
        # rest of the frame)
        bare = replace(r, frame=None)
        if not several and _after(got_, last):
            # (the usual: one replica's minutes going up after the frame before's, a
            # window each: the frame's columns as they are, not a row at a time)
            reps, wstarts = got_.replicas, got_.wstarts
            last = (reps[-1], wstarts[-1])
            alone = _Alone(got_.keep, reps, wstarts, got_.anchors)
            runs.append(CalmRun.made(bare, frame, alone, seconds, judged, judgements))
            continue
        alone = _Alone([], Repeats(), array("q"), Repeats(identity=True))
        columns: tuple[tuple[Sequence[Any], ...], _Texts] | None = None
        opened: list[Sequence[Any]] = []
        for i, replica, anchor, wstart in zip(
            got_.keep, got_.replicas, got_.anchors, got_.wstarts, strict=True
        ):
            key = (replica, wstart)
            if several and key in several:
                if columns is None:
                    c = _kept(bare, frame.data)
                    columns, opened = (c, _texts_of(bare, c)), _opened(bare, frame.data)
                parts = kept.setdefault(key, [])
                parts.append(_Part.of(bare, opened, columns, i, anchor))
                if len(parts) == several[key]:
                    groups.append(_group(key, kept.pop(key), seconds, judged))
                continue
            if ordered:
                ordered = last < (replica, wstart)
                last = (replica, wstart)
            alone.add(i, replica, wstart, anchor)
        if alone.rows:
            runs.append(CalmRun.made(bare, frame, alone, seconds, judged, judgements))
    assert not kept  # (each window's minutes were counted: `several`)
    if groups or not ordered:
        # (windows of several minutes, or a replica's minutes out of order: each window
        # made, all put in order)
        made: list[Window] = [w for run in runs for w in run]
        made += groups
        made.sort(key=_order)
        return _merged(others, made)
    return _merged(others, Windows(runs))


def _rising(values: Sequence[int]) -> bool:
    """Whether each value is above the one before (compared in C: a month's minutes
    took ~7 ms a test a value at a time)."""
    return all(map(lt, values, islice(values, 1, None)))


class _Among:
    """`in` for a list of ints: by bisection where it only goes up (a replica's
    windows, the usual), else by a set of them."""

    def __init__(self, values: Sequence[int]) -> None:
        self.values = values
        self.up = _rising(values)
        self.seen: set[int] | None = None

    def __contains__(self, x: object) -> bool:
        if not isinstance(x, int):
            return False
        if self.up:
            k = bisect_left(self.values, x)
            return k < len(self.values) and self.values[k] == x
        if self.seen is None:
            self.seen = set(self.values)
        return x in self.seen


def _merged(others: Sequence[Window], calm: Sequence[Window]) -> Windows:
    """heapq.merge(others, calm) by _order: each of the few others put before the
    first calm window not before it (calm's runs cut there, not copied). The
    search reads a calm run's keys without making its windows (CalmRun.order_key:
    a window made a probe was ~20 ms of a month's ~100 event windows)."""
    parts: list[Sequence[Window]] = []
    at = 0
    key = _order_keys(calm)
    positions = range(len(calm))
    for w in others:
        k = bisect_left(positions, _order(w), lo=at, key=key)
        parts += (calm[at:k], [w])
        at = k
    parts.append(calm[at:])
    return Windows(parts)


def _order_keys(ws: Sequence[Window]) -> Callable[[int], tuple[str, bool, datetime]]:
    """_order of window i of `ws`, by index."""
    if not isinstance(ws, Windows):
        return lambda i: _order(ws[i])

    def key(i: int) -> tuple[str, bool, datetime]:
        part, j = ws.part_at(i)
        return part.order_key(j) if isinstance(part, CalmRun) else _order(part[j])

    return key


def _order(w: Window) -> tuple[str, bool, datetime]:
    return (w.replica, w.start is None, w.start or _EPOCH)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _epoch(ts: datetime | None) -> int | None:
    return None if ts is None else int(ts.timestamp())


# What a CalmWindow keeps of its minute's row (CalmRows.frame), in this order, then
# the peak line's fields: not the whole row (a month of rows was ~60 MB).
_KEPT = (
    _N,
    _MAXES + _KV,
    _MAXES + _RUNNING,
    _SWAPPED_FIRST,
    _SWAPPED_LAST,
    _MAXES + _SWAPPED,
    _PEAK_KV,
    _PEAK_RUNNING,
    *(_AT[f"mean_{k}"] for k in CALM_MEANS),
    _WAITING_FIRST,
    _WAITING_LAST,
    _MAXES + _WAITING,
    _WAITING_POS,
    _PEAK_LINE,
    _PEAK_POS,
    _PEAK_PROC,
    _PEAK_TEXT,
)
_K_N, _K_KV, _K_RUNNING, _K_SWAPPED_FIRST, _K_SWAPPED_LAST, _K_SWAPPED = range(6)
_K_PEAK_KV, _K_PEAK_RUNNING = 6, 7
_K_KV_MEAN, _K_RUNNING_MEAN, _K_PROMPT, _K_GEN = range(8, 12)  # (CALM_MEANS' order)
_K_WAITING_FIRST, _K_WAITING_LAST, _K_WAITING, _K_WAITING_POS = range(12, 16)
_K_LINE, _K_POS, _K_PROC, _K_TEXT, _K_FIELDS = range(16, 21)


def keeps_of(data: Sequence[Sequence[Any]], fields: int) -> tuple[Sequence[Any], ...]:
    """The columns of a frame (`data`, of a signature with this many fields) the
    CalmWindows of its rows read (_KEPT, then the peak line's fields): shared by them,
    8 bytes a value in an array, where a tuple of its row's values a window was
    ~0.5 KB."""
    return tuple(data[j] for j in (*_KEPT, *range(_FIELDS, _FIELDS + fields)))


def _kept(rows: CalmRows, data: Sequence[Sequence[Any]]) -> tuple[Sequence[Any], ...]:
    """keeps_of() a frame of `rows`, its peak lines' texts cut as the scan cuts
    evidence."""
    columns = keeps_of(data, len(rows.fields))
    raw = data[_PEAK_TEXT]
    longest = raw.longest if isinstance(raw, Packed) else max(map(len, raw), default=0)
    if longest > MAX_EVIDENCE_CHARS:
        # (rare: a line of over 600 characters)
        columns = (*columns[:_K_TEXT], [_text(t) for t in raw], *columns[_K_TEXT + 1 :])
    return columns


def _listed(column: Sequence[Any]) -> Sequence[Any]:
    """A column read a row at a time: a Const as a list, a packed one as its array
    (their [] is a Python call)."""
    if isinstance(column, Const):
        return list(column)
    return column.opened() if isinstance(column, PackedNumbers) else column


def _after(p: Placed, last: tuple[str, int]) -> bool:
    """Whether the frame's minutes are one replica's, each after the one before, the
    first after `last` (the last minute of the frames before): in build_windows'
    order as they are."""
    reps, starts = p.replicas, p.wstarts
    return reps.count(reps[0]) == p.minutes and last < (reps[0], starts[0]) and _rising(starts)


@dataclass(frozen=True, slots=True)
class _Alone:
    """The rows of a frame whose windows are one minute each, with each one's
    replica, start (epoch seconds) and anchor (Placed's: CalmRun.made)."""

    rows: Sequence[int]
    replicas: Repeats
    starts: array[int]
    anchors: Repeats

    def add(self, i: int, replica: str, start: int, anchor: datetime) -> None:
        assert isinstance(self.rows, list)
        self.rows.append(i)
        self.replicas.append(replica)
        self.starts.append(start)
        self.anchors.append(anchor)


class _PeakWindow(ReadWindow):
    """A calm window whose evidence is one calm minute's peak line, read from what
    its window keeps of that minute's frame (keeps_of) when asked: its event, line,
    fields and texts."""

    # Of Window's fields it holds its replica, start, end, class, confidence and why; the
    # rest are read (a subclass's properties) or the same in every calm window (_CALM,
    # class attributes).
    __slots__ = (
        "_c",
        "_i",
        "_m",
        "_rows",
        "_ts",
        "cls",
        "confidence",
        "end",
        "replica",
        "start",
        "why",
    )
    _rows: CalmRows  # (without its frame)
    _c: tuple[Sequence[Any], ...]  # keeps_of(): _KEPT's columns, then the peak line's fields
    _i: int  # its row in them
    _m: _Texts  # _texts_of(_rows, _c): shared by the windows of one frame
    _ts: datetime  # the peak line's time

    def _values(self) -> tuple[Any, ...]:
        """The peak line's fields' values, in its rows' fields' order."""
        i = self._i
        return tuple(column[i] for column in self._c[_K_FIELDS:])

    @property
    def evidence(self) -> tuple[Event, ...]:
        c, i = self._c, self._i
        h = _peak_hit(
            self._rows,
            c[_K_LINE][i],
            self._values(),
            c[_K_TEXT][i],
            None,
            c[_K_PROC][i],
            c[_K_POS][i],
        )
        ts = self._ts.astimezone(UTC) if self._rows.utc else self._ts
        return (stamp_event(h, ts, self.replica),)

    def evidence_line(self) -> tuple[str, int, str, Kind, str, datetime | None]:
        r = self._rows
        c, i = self._c, self._i
        return (r.source, c[_K_LINE][i], r.sig, r.kind, c[_K_TEXT][i], self._ts)

    def evidence_field(self, name: str) -> FieldValue:
        r = self._rows
        if name in r.fields:  # (a field's value, not a constant of the same name)
            return self._c[_K_FIELDS + r.fields.index(name)][self._i]  # type: ignore[no-any-return]
        return r.constants.get(name)

    def texts(self) -> list[str] | None:
        c, i = self._c, self._i
        shared, lists = self._m
        # (a field's column of numbers, an array, holds no str and nothing else)
        values = [c[j][i] for j in lists]
        if not _PLAIN.issuperset(map(type, values)):
            return None
        proc = c[_K_PROC][i]
        return [
            self.replica,
            self.why,
            c[_K_TEXT][i],
            "" if proc is None else proc,
            *shared,
            *(f for f in values if type(f) is str),
        ]


class CalmWindow(_PeakWindow):
    """The window of one calm minute (a replica of one stream: the usual), read from
    what it keeps of the minute's row when asked (records.ReadWindow): the numbers a
    Window of its minute would hold, without a Window, an Event and its fields a minute
    (a month of Windows: ~20 us each, a third of the time after the scan). Its time,
    replica, peak line's time and what the rules make of it (class, confidence, why) are
    held; the peak line's text is read from its frame's column (packed: Packed)."""

    # (_PeakWindow's slots: ~130 bytes a window, where a Window's would make it ~330)
    __slots__ = ()

    @property
    def n_events(self) -> int:
        return int(self._c[_K_N][self._i])

    @property
    def n_stats(self) -> int:
        return int(self._c[_K_N][self._i])

    @property
    def kv_max(self) -> float | None:
        return self._c[_K_KV][self._i]  # type: ignore[no-any-return]

    @property
    def kv_mean(self) -> float | None:
        return self._c[_K_KV_MEAN][self._i]  # type: ignore[no-any-return]

    @property
    def running_max(self) -> int | None:
        running = self._c[_K_RUNNING][self._i]
        return None if running is None else int(running)

    @property
    def running_mean(self) -> float | None:
        return self._c[_K_RUNNING_MEAN][self._i]  # type: ignore[no-any-return]

    @property
    def swapped_first(self) -> int | None:
        return self._c[_K_SWAPPED_FIRST][self._i]  # type: ignore[no-any-return]

    @property
    def swapped_last(self) -> int | None:
        return self._c[_K_SWAPPED_LAST][self._i]  # type: ignore[no-any-return]

    @property
    def swapped_max(self) -> int | None:
        swapped = self._c[_K_SWAPPED][self._i]
        return None if swapped is None else int(swapped)

    @property
    def prompt_tput(self) -> float | None:
        return self._c[_K_PROMPT][self._i]  # type: ignore[no-any-return]

    @property
    def gen_tput(self) -> float | None:
        return self._c[_K_GEN][self._i]  # type: ignore[no-any-return]

    @property
    def waiting_first(self) -> int | None:
        return self._c[_K_WAITING_FIRST][self._i]  # type: ignore[no-any-return]

    @property
    def waiting_last(self) -> int | None:
        return self._c[_K_WAITING_LAST][self._i]  # type: ignore[no-any-return]

    @property
    def waiting_max(self) -> int | None:
        waiting = self._c[_K_WAITING][self._i]
        return None if waiting is None else int(waiting)

    @property
    def waiting_share(self) -> float | None:
        c, i = self._c, self._i
        return _minute_share(c[_K_WAITING_POS][i], c[_K_N][i])

    @property
    def kv_peak_running(self) -> int | None:
        # (as _window's: no peak line when the peak is not equal to itself, a NaN)
        peak_kv = self._c[_K_PEAK_KV][self._i]
        return self._c[_K_PEAK_RUNNING][self._i] if peak_kv == peak_kv else None

    # Read a column at a time (records.ReadWindow.columns): a run of a month's windows
    # is a few runs of rows of frames, read as slices of their kept columns.

    @classmethod
    def columns(cls, ws: Sequence[ReadWindow], names: Sequence[str]) -> list[list[Any]]:
        calm: Sequence[CalmWindow] = ws  # type: ignore[assignment]
        runs = _runs(calm)
        out: list[list[Any]] = []
        for name in names:
            if name in _CALM:
                out.append([_CALM[name]] * len(calm))
            elif name in _READ:
                j, make = _READ[name]
                got = _gather(runs, j)
                out.append(got if make is None else make(got))
            elif name == "waiting_share":
                pos, n = _gather(runs, _K_WAITING_POS), _gather(runs, _K_N)
                out.append(list(map(_minute_share, pos, n)))
            elif name == "kv_peak_running":
                # (as the property's: no peak line when the peak is a NaN)
                kvs, running = _gather(runs, _K_PEAK_KV), _gather(runs, _K_PEAK_RUNNING)
                out.append([r if k == k else None for k, r in zip(kvs, running, strict=True)])
            else:
                out.append(_own(calm, name))
        return out

    @classmethod
    def evidence_lines(cls, ws: Sequence[ReadWindow]) -> list[list[Any]]:
        return [*cls.evidence_untimed(ws), _own(ws, "_ts")]  # type: ignore[arg-type]

    @classmethod
    def evidence_untimed(cls, ws: Sequence[ReadWindow]) -> list[list[Any]]:
        calm: Sequence[CalmWindow] = ws  # type: ignore[assignment]
        runs = _runs(calm)
        per_run: list[list[Any]] = [[], [], []]  # source, sig, kind
        for rows, _, a, b in runs:
            for column, value in zip(per_run, (rows.source, rows.sig, rows.kind), strict=True):
                column += [value] * (b - a)
        source, sig, kind = per_run
        return [source, _gather(runs, _K_LINE), sig, kind, _gather(runs, _K_TEXT)]

    @classmethod
    def evidence_micros(cls, ws: Sequence[ReadWindow]) -> array[int] | None:
        parts = _calm_runs(ws)
        if parts is None:
            return None
        out: array[int] = array("q")
        for part in parts:
            got = part.ts_micros()
            if got is None:
                return None
            out += got
        return out

    @classmethod
    def micros(cls, ws: Sequence[ReadWindow], name: str) -> array[int]:
        parts = _calm_runs(ws)
        if parts is None or name not in ("start", "end"):
            return super().micros(ws, name)
        out: array[int] = array("q")
        for part in parts:
            out += part.micros(name)
        return out

    @classmethod
    def evidence_texts(cls, ws: Sequence[ReadWindow]) -> list[str]:
        return _gather(_runs(ws), _K_TEXT)  # type: ignore[arg-type]

    @classmethod
    def evidence_places(cls, ws: Sequence[ReadWindow]) -> list[list[Any]]:
        calm: Sequence[CalmWindow] = ws  # type: ignore[assignment]
        runs = _runs(calm)
        source: list[str] = []
        kind: list[Kind] = []
        for rows, _, a, b in runs:
            source += [rows.source] * (b - a)
            kind += [rows.kind] * (b - a)
        return [source, _gather(runs, _K_LINE), kind]

    @classmethod
    def evidence_values(cls, ws: Sequence[ReadWindow], name: str) -> list[FieldValue]:
        calm: Sequence[CalmWindow] = ws  # type: ignore[assignment]
        out: list[FieldValue] = []
        for rows, columns, a, b in _runs(calm):
            if name in rows.fields:  # (a field's value, not a constant of the same name)
                out += columns[_K_FIELDS + rows.fields.index(name)][a:b]
            else:
                out += [rows.constants.get(name)] * (b - a)
        return out

    @classmethod
    def printable(cls, ws: Sequence[ReadWindow]) -> bool:
        calm: Sequence[CalmWindow] = ws  # type: ignore[assignment]
        runs = _runs(calm)
        # Each run's frame's shared texts and its str fields' values, then every
        # window's own: its replica, why, line text and process name (texts()).
        texts: list[str] = []
        for rows, columns, a, b in runs:
            shared, lists = _texts_of(rows, columns)
            texts += shared
            for j in lists:
                values = columns[j][a:b]
                if not _PLAIN.issuperset(map(type, values)):
                    return False
                texts += [v for v in values if type(v) is str]
            texts += [p for p in columns[_K_PROC][a:b] if p is not None]
        texts += set(_own(calm, "replica"))
        texts += set(_own(calm, "why"))
        for _, columns, a, b in runs:
            column = columns[_K_TEXT]
            if not (isinstance(column, Packed) and column.printable):  # (known when packed)
                texts += column[a:b]
        return is_printable("".join(texts))


_Run = tuple[CalmRows, tuple[Sequence[Any], ...], int, int]


def _runs(ws: Sequence[CalmWindow]) -> list[_Run]:
    """ws as runs of consecutive rows of one frame: (its rows, their kept columns,
    first row, row after the last). (A month's windows: ~60 frames, each found in C;
    CalmRuns' are known.)"""
    parts = _calm_runs(ws)
    if parts is not None:
        return [span for part in parts for span in part.spans()]
    rows = list(map(_I, ws))
    frames = list(map(_C, ws))
    out: list[_Run] = []
    at = 0
    for _, group in groupby(map(id, frames)):
        n = len(list(group))
        first, a = ws[at], rows[at]
        if rows[at : at + n] == list(range(a, a + n)):
            out.append((first._rows, first._c, a, a + n))  # (the usual: a frame's rows)
        else:
            for w in ws[at : at + n]:
                i = w._i
                if out and out[-1][1] is w._c and out[-1][3] == i:
                    r, c, start, _ = out[-1]
                    out[-1] = (r, c, start, i + 1)
                else:
                    out.append((w._rows, w._c, i, i + 1))
        at += n
    return out


def _calm_runs(ws: Sequence[Window]) -> list[CalmRun] | None:
    """ws as its CalmRuns, when it is one or a Windows of them (records.window_runs'
    run of calm windows), else None (a list of CalmWindows)."""
    if isinstance(ws, CalmRun):
        return [ws]
    if isinstance(ws, Windows):
        parts = ws.parts
        if all(isinstance(p, CalmRun) for p in parts):
            return cast(list[CalmRun], list(parts))
    return None


def _own(ws: Sequence[CalmWindow], name: str) -> list[Any]:
    """[getattr(w, name) for w in ws] of what a calm window holds itself (its time,
    replica, judgement, peak line's time), from CalmRuns without making a window."""
    parts = _calm_runs(ws)
    if parts is None:
        return list(map(attrgetter(name), ws))
    out: list[Any] = []
    for part in parts:
        out += part.own(name)
    return out


class _Judgements:
    """The (class, confidence, why) calm windows were judged, each once, by index
    (`at`): a month's windows say a few hundred. One list of them for every run of a
    call, which a run's marks index (each run copied those seen so far: a quarter's
    ~1 MB), brought up to date once a run is marked (`listed`)."""

    __slots__ = ("_listed", "at")

    def __init__(self) -> None:
        self.at: dict[Judgement, int] = {}
        self._listed: list[Judgement] = []

    def listed(self) -> list[Judgement]:
        """Every pair so far, by index (the dict keeps the order they came in)."""
        self._listed.extend(islice(self.at, len(self._listed), None))
        return self._listed


class CalmRun(ReadRun):
    """A frame's calm windows, a minute each (the usual), one after another in
    build_windows' order: not made until read (records.ReadRun). It holds what they
    do not share, a column each: their rows in the frame, replicas, starts (epoch
    seconds, packed), anchors (a run of windows shares one) and judgements (an index
    into the ones made, packed: _Judgements, shared by a call's runs): a byte or two a
    window where a CalmWindow with its start and peak time was ~220 (a month's: ~9
    MiB), and its columns of numbers are a spilled frame's (records.spilling). A
    window read from it is made as CalmWindow.made made it, equal each time it is
    read. A slice is a CalmRun of the same columns."""

    kind = CalmWindow
    __slots__ = (
        "_anchors",
        "_c",
        "_clock",
        "_hi",
        "_judgements",
        "_lo",
        "_m",
        "_marks",
        "_replicas",
        "_rows",
        "_seconds",
        "_starts",
        "_where",
    )
    _rows: CalmRows  # (without its frame)
    _c: tuple[Sequence[Any], ...]  # keeps_of(): _KEPT's columns, then the peak line's fields
    _m: _Texts
    # hour, minute, the peak line's microseconds into it: the frame's columns (spilled,
    # opened when read: an opened array held a run's life was 3 bytes a window)
    _clock: tuple[Sequence[Any], Sequence[Any], Sequence[Any]]
    _where: Sequence[int]  # each window's row in the frame (a range: the usual)
    _replicas: str | Repeats  # (one replica: the usual)
    _starts: Sequence[int]  # (narrowed, packed: records.PackedNumbers)
    _anchors: Repeats
    _marks: Sequence[int]  # (narrowed, packed)
    _judgements: list[Judgement]
    _seconds: int
    _lo: int
    _hi: int

    @classmethod
    def made(
        cls,
        rows: CalmRows,
        frame: Columns,
        alone: _Alone,
        seconds: int,
        judged: Judged,
        judgements: _Judgements,
    ) -> CalmRun:
        """The windows of rows `alone.rows` of `frame` (the frame of `rows`, which are
        given without it), each of its replica from its start for `seconds`, its peak
        line dated by its anchor (`alone`), classified (`judged`); `judgements`: the
        (confidence, why) pairs seen, by index (a month's windows say a few hundred).
        A frame's at once: its columns read once, not a window at a time."""
        self = object.__new__(cls)
        data = frame.data
        columns = _kept(rows, data)
        n, kv, waiting, pos, running = (
            _listed(data[j])
            for j in (_N, _MAXES + _KV, _MAXES + _WAITING, _WAITING_POS, _MAXES + _RUNNING)
        )
        step = timedelta(seconds=seconds)
        marks: array[int] = array("I")
        mark = marks.append
        seen, at = judgements.at.setdefault, judgements.at
        # (a window's end is the next one's start: one datetime a window)
        last_at, last_end = -1, _EPOCH
        for i, replica, wstart in zip(alone.rows, alone.replicas, alone.starts, strict=True):
            start = last_end if last_at == wstart else datetime.fromtimestamp(wstart, tz=UTC)
            end = start + step
            last_at, last_end = wstart + seconds, end
            w, r = waiting[i], running[i]
            judgement = judged(
                replica,
                start,
                end,
                n[i],
                kv[i],
                None if w is None else int(w),
                _minute_share(pos[i], n[i]),
                None if r is None else int(r),
            )
            mark(seen(judgement, len(at)))
        first, where = alone.rows[0], alone.rows
        contiguous = where[-1] - first == len(where) - 1
        replicas = alone.replicas
        one = replicas.count(replicas[0]) == len(replicas)
        _set = object.__setattr__
        for name, value in (
            ("_rows", rows),
            ("_c", columns),
            ("_m", _texts_of(rows, columns)),
            ("_clock", tuple(data[j] for j in (_HOUR, _MINUTE, _PEAK_US))),
            ("_where", range(first, first + len(where)) if contiguous else where),
            ("_replicas", replicas[0] if one else replicas),
            ("_starts", PackedNumbers.of(narrow(alone.starts))),
            ("_anchors", alone.anchors),
            ("_marks", PackedNumbers.of(narrow(marks))),
            ("_judgements", judgements.listed()),  # (shared: its marks index those so far)
            ("_seconds", seconds),
            ("_lo", 0),
            ("_hi", len(where)),
        ):
            _set(self, name, value)
        return self

    def __len__(self) -> int:
        return self._hi - self._lo

    @overload
    def __getitem__(self, i: int) -> Window: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Window]: ...
    def __getitem__(self, i: int | slice) -> Window | Sequence[Window]:
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step != 1:
                return [self[k] for k in range(lo, hi, step)]
            part = object.__new__(CalmRun)
            for name in CalmRun.__slots__:
                object.__setattr__(part, name, getattr(self, name))
            object.__setattr__(part, "_lo", self._lo + lo)
            object.__setattr__(part, "_hi", self._lo + max(hi, lo))
            return part
        n = len(self)
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError("window index out of range")
        return self._window(self._lo + k)

    def __iter__(self) -> Iterator[Window]:
        return map(self._window, range(self._lo, self._hi))

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return list, (list(self),)

    def _window(self, p: int) -> CalmWindow:
        """Window p of the run's columns, made."""
        i = self._where[p]
        start = datetime.fromtimestamp(self._starts[p], tz=UTC)
        anchor = self._anchors[p]
        hour, minute, us = self._clock
        replicas = self._replicas
        cls, confidence, why = self._judgements[self._marks[p]]
        w = object.__new__(CalmWindow)
        _set = object.__setattr__  # (Window is frozen; slot by slot)
        _set(w, "_rows", self._rows)
        _set(w, "_c", self._c)
        _set(w, "_m", self._m)
        _set(w, "_i", i)
        _set(w, "replica", replicas if isinstance(replicas, str) else replicas[p])
        _set(w, "start", start)
        _set(w, "end", start + timedelta(seconds=self._seconds))
        _set(w, "_ts", _at(anchor, hour[i], minute[i], us[i]))
        _set(w, "cls", cls)
        _set(w, "confidence", confidence)
        _set(w, "why", why)
        return w

    def order_key(self, i: int) -> tuple[str, bool, datetime]:
        """_order of window i, without making it."""
        p = self._lo + i
        replicas = self._replicas
        replica = replicas if isinstance(replicas, str) else replicas[p]
        return replica, False, datetime.fromtimestamp(self._starts[p], tz=UTC)

    def spans(self) -> list[_Run]:
        """The run as runs of consecutive rows of its frame (_runs)."""
        lo, hi, where = self._lo, self._hi, self._where
        if lo == hi:
            return []
        if type(where) is range:
            return [(self._rows, self._c, where[lo], where[hi - 1] + 1)]
        out: list[_Run] = []
        for i in where[lo:hi]:
            if out and out[-1][3] == i:
                r, c, a, _ = out[-1]
                out[-1] = (r, c, a, i + 1)
            else:
                out.append((self._rows, self._c, i, i + 1))
        return out

    def micros(self, name: str) -> array[int]:
        """records.window_micros of its starts or ends, from their epoch seconds."""
        by = self._seconds if name == "end" else 0
        return array("q", [(s + by) * 1_000_000 for s in self._starts[self._lo : self._hi]])

    def ts_micros(self) -> array[int] | None:
        """micros() of each window's peak line's time (_ts), from its anchor's midnight
        and its clock, as calm.place dates a minute; None where an anchor is not in
        a fixed offset (_ts is read then)."""
        hour, minute, peak_us = map(_listed, self._clock)
        days: dict[int, int | None] = {}
        out: array[int] = array("q")
        lo, hi = self._lo, self._hi
        for anchor, i in zip(self._anchors[lo:hi], self._where[lo:hi], strict=True):
            day = days.get(id(anchor), -1)
            if day == -1:
                day = days[id(anchor)] = _day_at(anchor)
            h, m, us = hour[i], minute[i], peak_us[i]
            if day is None or not (h < 24 and m < 60 and us < _MINUTE_US):
                return None
            out.append((day + h * 3600 + m * 60) * _US + us)
        return out

    def own(self, name: str) -> list[Any]:
        """[getattr(w, name) for w in self] of what a calm window holds itself."""
        lo, hi = self._lo, self._hi
        if name == "replica":
            replicas = self._replicas
            return [replicas] * (hi - lo) if isinstance(replicas, str) else replicas[lo:hi]
        if name in ("cls", "confidence", "why"):
            j = ("cls", "confidence", "why").index(name)
            judgements = self._judgements
            return [judgements[m][j] for m in self._marks[lo:hi]]
        if name in ("start", "end"):
            by = self._seconds if name == "end" else 0
            at = datetime.fromtimestamp
            return [at(s + by, tz=UTC) for s in self._starts[lo:hi]]
        if name == "_ts":
            hour, minute, us = map(_listed, self._clock)
            where = self._where
            return [
                _at(a, hour[i], minute[i], us[i])
                for a, i in zip(self._anchors[lo:hi], where[lo:hi], strict=True)
            ]
        return list(map(attrgetter(name), self))


def _gather(runs: list[_Run], j: int) -> list[Any]:
    """Kept column j of each run's rows, one list."""
    out: list[Any] = []
    for _, columns, a, b in runs:
        out += columns[j][a:b]
    return out


def _ints(values: list[Any]) -> list[Any]:
    return list(map(int, values))


def _ints_or_none(values: list[Any]) -> list[Any]:
    return [None if v is None else int(v) for v in values]


_I, _C = attrgetter("_i"), attrgetter("_c")
# What CalmWindow.columns reads of its kept columns (with what its property makes of
# the value); the rest are Window's own slots or class constants.
_READ: dict[str, tuple[int, Callable[[list[Any]], list[Any]] | None]] = {
    "n_events": (_K_N, _ints),
    "n_stats": (_K_N, _ints),
    "kv_max": (_K_KV, None),
    "kv_mean": (_K_KV_MEAN, None),
    "running_max": (_K_RUNNING, _ints_or_none),
    "running_mean": (_K_RUNNING_MEAN, None),
    "swapped_first": (_K_SWAPPED_FIRST, None),
    "swapped_last": (_K_SWAPPED_LAST, None),
    "swapped_max": (_K_SWAPPED, _ints_or_none),
    "waiting_first": (_K_WAITING_FIRST, None),
    "waiting_last": (_K_WAITING_LAST, None),
    "waiting_max": (_K_WAITING, _ints_or_none),
    "prompt_tput": (_K_PROMPT, None),
    "gen_tput": (_K_GEN, None),
}


def _texts_of(r: CalmRows, columns: tuple[Sequence[Any], ...]) -> _Texts:
    """What every CalmWindow of `r`'s rows holds as text, and which of its kept
    `columns` (keeps_of) of the peak line's fields are lists, which may hold text (the
    others are arrays of numbers): the texts of its evidence event are its source,
    signature and engine, and its fields' names and values (the constants and the
    fields, as evidence's)."""
    shared = (
        r.source,
        r.sig,
        r.engine,
        *r.constants,
        *(c for c in r.constants.values() if type(c) is str),
        *r.fields,
    )
    lists = tuple(j for j in range(_K_FIELDS, len(columns)) if _may_hold_text(columns[j]))
    return shared, lists


def _may_hold_text(column: Sequence[Any]) -> bool:
    """Not an array of numbers (packed or not), nor one number or None in every row."""
    if isinstance(column, Const):
        return type(column.value) is str
    return not isinstance(column, array | PackedNumbers)


_Texts = tuple[tuple[str, ...], tuple[int, ...]]


_PLAIN = frozenset((str, int, float, bool, type(None)))  # (what sanitise walks no further)


# The fields every calm window has the same value in: nothing is preempted or fails.
# (Class attributes of CalmWindow and GroupWindow.)
_CALM: dict[str, Any] = {
    "preemptions": 0.0,
    "preemptions_lower_bound": False,
    "max_cumulative": None,
    "alloc_failures": 0,
    "host_ooms": 0,
    "engine_deaths": 0,
    "swap_warnings": 0,
    "preemptions_spread_over": None,
}
for _name, _value in _CALM.items():
    setattr(_PeakWindow, _name, _value)


# (a few pairs make a month's 43,200: each worked out once, ~2 us a window less)
@lru_cache(maxsize=1 << 12)
def _minute_share(pos: int, n: int) -> float | None:
    """_share of one minute (every line of a calm minute says how many wait)."""
    return snap6(snap6(0.0 + pos) / n) if n > 0 else None


# The columns of a frame a window of several reads of each of its minutes (_Part.read).
_READS = (
    _N,
    *(_MAXES + k for k in (_KV, _RUNNING, _WAITING, _SWAPPED)),
    *(_SUMS + k for k in (_KV, _RUNNING, _PROMPT, _GEN)),
    *(_COUNTS + k for k in (_KV, _RUNNING, _PROMPT, _GEN, _WAITING)),
    _WAITING_POS,
    _PEAK_KV,
    _PEAK_RUNNING,
    _SWAPPED_FIRST,
    _SWAPPED_LAST,
    _WAITING_FIRST,
    _WAITING_LAST,
    _FIRST_LINE,
    _FIRST_US,
    _LAST_LINE,
    _LAST_US,
    _LAST_POS,
    _PEAK_LINE,
    _PEAK_POS,
    _PEAK_US,
    _HOUR,
    _MINUTE,
)
_READ_AT = {j: k for k, j in enumerate(_READS)}


@dataclass(frozen=True, slots=True)
class _Part:
    """A calm minute of a window of several, until the window's minutes are all in:
    its rows (without their frame), what its windows keep of its frame (_kept), its
    row, the anchor that dates it, and the values of its row the window reads
    (_READS), then its peak line's KV usage."""

    rows: CalmRows
    kept: tuple[tuple[Sequence[Any], ...], _Texts]
    i: int
    anchor: datetime
    values: tuple[Any, ...]

    @classmethod
    def of(
        cls,
        rows: CalmRows,
        opened: list[Sequence[Any]],
        kept: tuple[tuple[Sequence[Any], ...], _Texts],
        i: int,
        anchor: datetime,
    ) -> _Part:
        """Row i of a frame whose columns `opened` (_opened) are."""
        return cls(rows, kept, i, anchor, tuple(column[i] for column in opened))

    def read(self, j: int) -> Any:
        """The value of its row in column j of its frame (one of _READS)."""
        return self.values[_READ_AT[j]]

    def ts(self, us_at: int) -> datetime:
        """The time of its line whose microseconds into the minute are column
        `us_at`'s."""
        read = self.read
        return _at(self.anchor, read(_HOUR), read(_MINUTE), read(us_at))

    @property
    def kv(self) -> FieldValue:
        """Its peak line's KV usage (its field, or a constant)."""
        return self.values[-1]  # type: ignore[no-any-return]


def _opened(rows: CalmRows, data: Sequence[Sequence[Any]]) -> list[Sequence[Any]]:
    """The columns of a frame its windows of several read (_READS, then the peak
    lines' KV usage), each opened once (a packed column's [] opens it each time)."""
    kv: Sequence[Any] = (
        data[_FIELDS + rows.fields.index("kv_usage")]
        if "kv_usage" in rows.fields
        else [rows.constants.get("kv_usage")] * rows.height
    )
    return [_listed(data[j]) for j in _READS] + [_listed(kv)]


def _group(key: tuple[str, int], parts: list[_Part], seconds: int, judged: Judged) -> GroupWindow:
    """The window of these calm minutes (in the order they came), classified
    (`judged`), as build_windows aggregates their lines: their lines added up, the
    highest of each maximum, each mean over all their lines (summed in this order,
    snapped), the first and last Swapped and Waiting in the order of first and last
    lines, the evidence the peak line of the highest KV, first in log order."""
    replica, wstart = key
    start = datetime.fromtimestamp(wstart, tz=UTC)
    end = start + timedelta(seconds=seconds)
    n = sum(p.read(_N) for p in parts)
    kv_max, running_max, waiting_max, swapped_max = (
        _top([p.read(_MAXES + k) for p in parts]) for k in (_KV, _RUNNING, _WAITING, _SWAPPED)
    )
    means = tuple(_mean_of(parts, k) for k in (_KV, _RUNNING, _PROMPT, _GEN))
    count = sum(p.read(_COUNTS + _WAITING) for p in parts)
    total = 0.0
    for p in parts:
        total += p.read(_WAITING_POS)
    share = snap6(snap6(total) / count) if count > 0 else None
    peaks = [p.read(_PEAK_KV) for p in parts]
    top = max(peaks)
    at_peak = [
        running
        for p, kv in zip(parts, peaks, strict=True)
        if kv == top and (running := p.read(_PEAK_RUNNING)) is not None
    ]
    running = None if running_max is None else int(running_max)
    waiting = None if waiting_max is None else int(waiting_max)
    judgement = judged(replica, start, end, n, kv_max, waiting, share, running)
    firsts = _by_first(parts)
    lasts = _by_last(parts)
    values = (
        n,
        kv_max,
        running,
        *means,
        _first_value(firsts, _SWAPPED_FIRST),
        _first_value(lasts, _SWAPPED_LAST),
        None if swapped_max is None else int(swapped_max),
        _first_value(firsts, _WAITING_FIRST),
        _first_value(lasts, _WAITING_LAST),
        waiting,
        share,
        min(at_peak) if at_peak else None,
    )
    p, ts = _evidence_of(parts)
    return GroupWindow.made(p, ts, values, replica, start, end, judgement)


def _top(values: list[Any]) -> Any:
    """The highest of the values that are there (None when none is)."""
    there = [v for v in values if v is not None]
    return max(there) if there else None


def _mean_of(parts: list[_Part], k: int) -> float | None:
    """windows.snapped_mean over the minutes' sums (added in their order, snapped)."""
    count, total = 0, 0.0
    for p in parts:
        if p.read(_COUNTS + k):
            count += p.read(_COUNTS + k)
            total += p.read(_SUMS + k)
    return snap6(snap6(total) / count) if count else None


def _by_first(parts: list[_Part]) -> list[_Part]:
    """The minutes in the order of their first lines (windows.py's events table: by
    time, file, line)."""
    return sorted(parts, key=lambda p: (p.ts(_FIRST_US), p.rows.source, p.read(_FIRST_LINE)))


def _by_last(parts: list[_Part]) -> list[_Part]:
    """...and from the last of their last lines back (windows._LAST_ORDER)."""
    return sorted(
        parts,
        key=lambda p: (
            p.ts(_LAST_US),
            p.rows.source,
            p.read(_LAST_LINE),
            p.read(_LAST_POS),
            p.rows.sig,
        ),
        reverse=True,
    )


def _first_value(parts: list[_Part], j: int) -> Any:
    """The first value of column j that is there, in this order."""
    return next((v for p in parts if (v := p.read(j)) is not None), None)


def _evidence_of(parts: list[_Part]) -> tuple[_Part, datetime]:
    """The minute whose peak line is the window's evidence, and that line's time: the
    highest KV usage (none, or 0: -1), the first such in log order
    (windows._pick_evidence over the minutes' peak lines)."""
    timed = sorted(
        ((p.ts(_PEAK_US), p) for p in parts),
        key=lambda tp: (
            tp[0],
            tp[1].rows.source,
            tp[1].read(_PEAK_LINE),
            tp[1].read(_PEAK_POS),
            tp[1].rows.sig,
        ),
    )
    ts, p = max(timed, key=lambda tp: number(tp[1].kv) or -1.0)
    return p, ts


class GroupWindow(_PeakWindow):
    """The window of several calm minutes (a clock's decode and prefill streams of
    SGLang, each a frame of its own: the usual; a minute cut by a block's end): its
    numbers, made from its minutes' rows as build_windows makes them of their lines
    (_group), held; its evidence read from its minute's frame as CalmWindow's is.
    ~0.5 KB a window, where a Window and its evidence event were ~1.8."""

    __slots__ = ("_v",)
    # n, KV max, Running max, the means of KV, Running, prompt and generation
    # throughput, Swapped first, last and max, Waiting first, last, max and share,
    # Running at the KV peak
    _v: tuple[Any, ...]

    @classmethod
    def made(
        cls,
        p: _Part,
        ts: datetime,
        values: tuple[Any, ...],
        replica: str,
        start: datetime,
        end: datetime,
        judgement: Judgement,
    ) -> GroupWindow:
        w = object.__new__(cls)
        c, m = p.kept
        for name, value in (
            ("_rows", p.rows),
            ("_c", c),
            ("_m", m),
            ("_i", p.i),
            ("_ts", ts),
            ("_v", values),
            ("replica", replica),
            ("start", start),
            ("end", end),
            ("cls", judgement[0]),
            ("confidence", judgement[1]),
            ("why", judgement[2]),
        ):
            object.__setattr__(w, name, value)  # (Window is frozen; slot by slot)
        return w

    @property
    def n_events(self) -> int:
        return self._v[0]  # type: ignore[no-any-return]

    @property
    def n_stats(self) -> int:
        return self._v[0]  # type: ignore[no-any-return]

    @property
    def kv_max(self) -> float | None:
        return self._v[1]  # type: ignore[no-any-return]

    @property
    def running_max(self) -> int | None:
        return self._v[2]  # type: ignore[no-any-return]

    @property
    def kv_mean(self) -> float | None:
        return self._v[3]  # type: ignore[no-any-return]

    @property
    def running_mean(self) -> float | None:
        return self._v[4]  # type: ignore[no-any-return]

    @property
    def prompt_tput(self) -> float | None:
        return self._v[5]  # type: ignore[no-any-return]

    @property
    def gen_tput(self) -> float | None:
        return self._v[6]  # type: ignore[no-any-return]

    @property
    def swapped_first(self) -> int | None:
        return self._v[7]  # type: ignore[no-any-return]

    @property
    def swapped_last(self) -> int | None:
        return self._v[8]  # type: ignore[no-any-return]

    @property
    def swapped_max(self) -> int | None:
        return self._v[9]  # type: ignore[no-any-return]

    @property
    def waiting_first(self) -> int | None:
        return self._v[10]  # type: ignore[no-any-return]

    @property
    def waiting_last(self) -> int | None:
        return self._v[11]  # type: ignore[no-any-return]

    @property
    def waiting_max(self) -> int | None:
        return self._v[12]  # type: ignore[no-any-return]

    @property
    def waiting_share(self) -> float | None:
        return self._v[13]  # type: ignore[no-any-return]

    @property
    def kv_peak_running(self) -> int | None:
        return self._v[14]  # type: ignore[no-any-return]
