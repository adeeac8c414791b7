"""Helpers every format shares, so the formats differ only in layout.

Class descriptions and severities, number and time formatting, sparklines, the
timeline rows (with elision of long timelines) and the evidence lines live here; a
renderer only decides how to lay them out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from preemptdiag.model.records import (
    NO_TIME,
    Class,
    Event,
    ReplicaFacts,
    Report,
    Verdict,
    Window,
    Windows,
    window_columns,
    window_micros,
)

if TYPE_CHECKING:
    from preemptdiag.render.episodes import Episode, TimelineMode

NO_EVIDENCE = "no vLLM evidence found"
FILTERED_OUT = "no event in the --since/--until range"


def no_evidence(v: Verdict) -> str:
    """The banner of a report without evidence: nothing matched, or the time filter
    removed everything that did (a different mistake, and it must not read as green)."""
    return FILTERED_OUT if v.filtered_out else NO_EVIDENCE


SUSPECTED = "suspected, not proven"
EMPTY = "–"  # an empty cell: visible, and never mistaken for zero
EVIDENCE_MAX_LINES = 8
EVIDENCE_MAX_CHARS = 200

SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_MISSING = "·"

CLASS_DESCRIPTIONS: Mapping[Class, str] = {
    Class.HEALTHY: "Nothing wrong seen: KV usage below pressure, no preemption.",
    Class.QUEUEING: "Admission queue non-empty without preemption: load waits at the door.",
    Class.BENIGN_PREEMPTION: "Occasional KV-cache preemption; the engine recovers.",
    Class.THRASH_LOOP: "Sustained KV-cache preemption feeding itself (preempt, re-prefill, preempt).",
    Class.ALLOCATION_FAILURE: "GPU memory allocation failed (CUDA/HIP OOM or KV cache sizing).",
    Class.HOST_PRESSURE: "System RAM / cgroup / container memory pressure, not the GPU.",
    Class.INSUFFICIENT_EVIDENCE: "Too little evidence in the log to decide.",
}

# SARIF levels double as the severity colour buckets of the terminal.
CLASS_LEVELS: Mapping[Class, str] = {
    Class.THRASH_LOOP: "error",
    Class.ALLOCATION_FAILURE: "error",
    Class.HOST_PRESSURE: "error",
    Class.INSUFFICIENT_EVIDENCE: "warning",
    Class.BENIGN_PREEMPTION: "warning",
    Class.QUEUEING: "note",
    Class.HEALTHY: "note",
}

CLASS_COLOURS: Mapping[Class, str] = {
    Class.THRASH_LOOP: "red",
    Class.ALLOCATION_FAILURE: "red",
    Class.HOST_PRESSURE: "red",
    Class.INSUFFICIENT_EVIDENCE: "yellow",
    Class.BENIGN_PREEMPTION: "yellow",
    Class.QUEUEING: "cyan",
    Class.HEALTHY: "green",
}


# ---------------------------------------------------------------- numbers and time


def utc(dt: datetime) -> datetime:
    """Records promise aware datetimes; a naive one is read as UTC rather than local time."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def iso(dt: datetime | None) -> str | None:
    if dt is None:
        return None
    # (a record's times are UTC already: astimezone, ~1 us, three times a window)
    return dt.isoformat() if dt.tzinfo is UTC else utc(dt).isoformat()


def finite(x: float | None) -> float | None:
    """NaN/inf are not data (and not valid JSON); treat them as missing."""
    return None if x is None or not math.isfinite(x) else x


def fmt_num(x: int | float | None, digits: int = 1) -> str:
    x = finite(x) if isinstance(x, float) else x
    if x is None:
        return EMPTY
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def fmt_int(n: int) -> str:
    return f"{n:,}"


def round_count(x: float) -> int:
    """Preemptions may be fractional (a V0 counter delta spread over windows); show whole
    preemptions, rounding halves up so 0.5 does not vanish as banker's rounding would."""
    return math.floor(x + 0.5) if math.isfinite(x) else 0


def fmt_preemptions(w: Window) -> str:
    """`+`: a lower bound; `~`: a share of a counter's delta spread over windows."""
    spread = "~" if w.preemptions_spread_over and w.preemptions else ""
    return f"{spread}{round_count(w.preemptions)}{'+' if w.preemptions_lower_bound else ''}"


def fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    unit = "KiB"
    for bigger in ("MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{size:.1f} {unit} ({fmt_int(n)} bytes)"


def fmt_seconds(s: int) -> str:
    return f"{s} s"


def fmt_value(v: Any) -> str:
    """Threshold values: ints stay ints, floats lose trailing zeros."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def fmt_mapping(m: Mapping[str, Any], *, sort: bool = True) -> str:
    items = sorted(m.items()) if sort else list(m.items())
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in items) if items else "none"


def time_span(v: Verdict) -> str:
    if v.start is None:
        return "no timestamps"
    start = utc(v.start).isoformat()
    if v.end is None:
        return start
    return f"{start} → {utc(v.end).isoformat()}"


def engine_label(report: Report) -> str:
    e = report.engine
    parts = [e.engine]
    if e.generation:
        parts.append(e.generation)
    if e.version:
        parts.append(e.version)
    return " ".join(parts)


def cause_line(v: Verdict) -> str | None:
    if v.cause is None and v.consequence is None:
        return None
    return f"cause: {v.cause or EMPTY} → consequence: {v.consequence or EMPTY}"


def lever_change(report: Report) -> str:
    """The one-line change: `knob: current → proposed`, or "no change"."""
    lv = report.lever
    if lv.knob is None:
        return "no change"
    current = lv.current if lv.current is not None else "not shown in the log"
    proposed = lv.proposed if lv.proposed is not None else EMPTY
    return f"{lv.knob}: {current} → {proposed}"


# ---------------------------------------------------------------- evidence


def clean_text(text: str) -> str:
    """Control characters (a stray ESC, CR) must not reach a terminal or a Markdown block."""
    return "".join(
        " " if ch == "\t" else ("\ufffd" if ord(ch) < 32 or ord(ch) == 127 else ch) for ch in text
    )


# Parts of a long evidence line that prove nothing, dropped first: the logger's
# `[file.py:123] `, cache hit rates.
_FILLER = (
    re.compile(r"\[[\w./-]{1,60}:\d{1,6}\] "),
    re.compile(r", (?:External )?[Pp]refix cache hit rate: [\d.]+%"),
    re.compile(r", MM cache hit rate: [\d.]+%"),
)


# Where the proof starts on the lines evidence shows: the fields of a stats line, the
# error of a failure line, the victim of a kill. The earliest one present is kept in
# view when a line must be shortened.
_PROOF = (
    "Running: ",
    "#running-req",
    "Sequence group ",
    "is preempted",
    "Retract",
    "OutOfMemoryError",
    "out of memory",
    "Out of memory",
    "Killed process",
    "ValueError: ",
    "RuntimeError: ",
    "EngineDeadError",
    "OOMKilled",
    "Exit Code",
)


_KEY_TAILS = ("total_num_cumulative_preemption=", "total_cumulative_preemption_cnt=")


def truncate(text: str, limit: int = EVIDENCE_MAX_CHARS) -> str:
    """Fit a line to `limit` without hiding its proof: drop filler (the logger's
    `[file.py:123] `, cache hit rates), then keep the head (its stamp) and, from where
    the proof starts (Running/Preemptions/KV usage, the error, the killed process), as
    much as fits. Cuts fall on spaces, so no token is split."""
    if len(text) <= limit:
        return text
    for rx in _FILLER:
        text = rx.sub("", text)
        if len(text) <= limit:
            return text
    at = min((i for i in (text.find(p) for p in _PROOF) if i != -1), default=-1)
    if at == -1:
        return _head(text, limit - 1) + "…"
    proof = text[at:]
    room = limit - len(proof) - 3  # what the head may take beside the whole proof
    if room >= 20:
        if room >= at:
            return text  # unreachable after the length check; kept for clarity
        return f"{_head(text[:at], room)} … {proof}"
    head = _head(text[:at], min(at, limit // 5))
    # A counter at the very end (V0's cumulative preemptions) is the proof's point.
    key = max(text.rfind(k) for k in _KEY_TAILS)
    if key > at:
        end = text[key:]
        room = limit - len(head) - len(end) - 6
        if room >= 20:
            return f"{head} … {_head(proof, room)} … {end}"
    rest = _head(proof, limit - len(head) - 5)
    return f"{head} … {rest} …"


def _head(text: str, n: int) -> str:
    """The first `n` characters, cut back to a space when one is near (a long token,
    already redacted, is cut where it must be rather than dropped whole)."""
    cut = text[:n]
    space = cut.rfind(" ")
    return cut[:space] if len(text) > n and space > n // 2 else cut


def location(e: Event) -> str:
    return f"{e.source}:{e.line}"


@dataclass(frozen=True, slots=True)
class EvidenceLine:
    location: str  # file:line
    text: str  # cleaned and truncated


# A clock time in the head of a line: the line still carries its own stamp.
_STAMPED = re.compile(r"\d{2}:\d{2}:\d{2}")


def stamped(e: Event) -> str:
    """The line's text with its time in front when the scan peeled the stamp off
    (SGLang's `[2025-11-02 10:00:08 TP0]`, journald/ISO and dmesg wrappers): evidence
    without a time cannot be laid beside the timeline. The time is shown in the
    line's own offset, as the log wrote it; the rank, when known, as SGLang does."""
    if e.ts is None or _STAMPED.search(e.text[:48]):
        return e.text
    rank = f" {e.proc}" if e.proc and e.proc.startswith(("TP", "DP", "PP", "EP")) else ""
    return f"[{e.ts:%Y-%m-%d %H:%M:%S}{rank}] {e.text.lstrip()}"


def evidence_lines(v: Verdict) -> tuple[list[EvidenceLine], int]:
    """The evidence to display, and how many further events were left out."""
    shown = [
        EvidenceLine(location(e), truncate(clean_text(stamped(e))))
        for e in v.evidence[:EVIDENCE_MAX_LINES]
    ]
    return shown, max(0, len(v.evidence) - EVIDENCE_MAX_LINES)


# ---------------------------------------------------------------- sparklines


def _bucket(values: Sequence[float | None], max_len: int) -> list[float | None]:
    """Shrink to max_len points keeping each bucket's peak, so a spike never disappears."""
    if len(values) <= max_len:
        return list(values)
    out: list[float | None] = []
    for i in range(max_len):
        lo = i * len(values) // max_len
        hi = (i + 1) * len(values) // max_len
        present = [v for v in values[lo:hi] if v is not None]
        out.append(max(present) if present else None)
    return out


def sparkline(
    values: Sequence[float | None], *, top: float | None = None, max_len: int | None = None
) -> str:
    """One block per value scaled to 0..top (default: the largest value).

    Zero maps to the lowest block and any positive value to at least the second, so a
    single preemption among hundreds still shows.
    """
    vals = [finite(v) for v in values]
    if max_len is not None and max_len > 0:
        vals = _bucket(vals, max_len)
    present = [v for v in vals if v is not None]
    peak = top if top is not None else (max(present) if present else 0.0)
    out = []
    for v in vals:
        if v is None:
            out.append(SPARK_MISSING)
        elif v <= 0 or peak <= 0:
            out.append(SPARK_BLOCKS[0])
        else:
            idx = 1 + round(min(v / peak, 1.0) * (len(SPARK_BLOCKS) - 2))
            out.append(SPARK_BLOCKS[idx])
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Spark:
    label: str
    line: str
    peak: str  # the value the top block stands for, so the line can be read
    per_block: float = 1.0  # windows a block stands for (each block shows their peak)

    @property
    def legend(self) -> str:
        if self.per_block <= 1:
            return f"top = {self.peak}"
        return f"top = {self.peak}, a block = peak of ≈{self.per_block:,.0f} windows"


SPARK_MAX = 100  # blocks in a markdown sparkline (a month is 43,200 windows)


def sparklines(report: Report, max_len: int | None = SPARK_MAX) -> list[Spark]:
    """KV max % and preemptions per window, one pair per replica when there are several;
    at most `max_len` blocks, each then the peak of a share of the windows."""
    out: list[Spark] = []
    names = replicas(report.windows)
    multi = len(names) > 1
    for rep in names:
        ws = of_replica(report.windows, rep)
        suffix = f" [{rep}]" if multi else ""
        per = len(ws) / max_len if max_len and len(ws) > max_len else 1.0
        kv, counts, lower = window_columns(ws, ("kv_max", "preemptions", "preemptions_lower_bound"))
        pre = [float(round_count(n)) for n in counts]
        out.append(
            Spark(f"KV max %{suffix}", sparkline(kv, top=100.0, max_len=max_len), "100", per)
        )
        peak = max(pre, default=0.0)
        out.append(
            Spark(
                f"preemptions{suffix}",
                sparkline(pre, max_len=max_len),
                str(int(peak)) + ("+" if any(lower) else ""),
                per,
            )
        )
    return out


# ---------------------------------------------------------------- timeline


def replicas(windows: Sequence[Window]) -> list[str]:
    return list(dict.fromkeys(window_columns(windows, ("replica",))[0]))


def of_replica(windows: Sequence[Window], replica: str) -> Sequence[Window]:
    """The windows of one replica, in order: a slice where they are consecutive (the
    usual: windows go by replica), which a month's calm windows give without making
    them (records.Windows)."""
    names = window_columns(windows, ("replica",))[0]
    n = names.count(replica)
    first = names.index(replica) if n else 0
    if names[first : first + n].count(replica) == n:
        return windows[first : first + n]
    return [w for w, name in zip(windows, names, strict=True) if name == replica]


def verdict_replica_first(report: Report) -> Report:
    """The report with the verdict's replica's windows ahead of the others' (each
    replica's in their order): a reader's report leads with the replica the verdict
    names, where name order put a healthy `a-0` above the thrashing `b-1`. JSON keeps
    name order, which is stable between runs."""
    rep = report.verdict.replica
    names = replicas(report.windows)
    if len(names) < 2 or names[0] == rep or rep not in names:
        return report
    ws = report.windows
    column = window_columns(ws, ("replica",))[0]
    first, n = column.index(rep), column.count(rep)
    if column[first : first + n].count(rep) == n:
        # (its windows are consecutive, the usual: the sequence cut, not copied)
        return replace(
            report, windows=Windows([ws[first : first + n], ws[:first], ws[first + n :]])
        )
    return replace(report, windows=tuple(sorted(ws, key=lambda w: w.replica != rep)))


def shared_date(windows: Sequence[Window]) -> str | None:
    """The one UTC date of all timestamped windows, shown once in the header."""
    dates = _utc_dates(windows)
    return dates.pop().isoformat() if len(dates) == 1 else None


_DAY_US = 86_400_000_000
_EPOCH_DAY = date(1970, 1, 1)


def _utc_dates(windows: Sequence[Window]) -> set[date]:
    """The UTC dates the windows start on (utc(w.start).date(), from their starts'
    microseconds: a month's calm windows without a datetime each)."""
    days = {us // _DAY_US for us in window_micros(windows, "start") if us != NO_TIME}
    return {_EPOCH_DAY + timedelta(days=d) for d in days}


def select_windows(report: Report, mode: TimelineMode | None = None) -> list[Window | int]:
    """The windows to show, in order, with an int standing for a run of omitted windows.

    In episodes mode (the default) a long replica shows in full only its focus episode
    (the verdict's) and its neighbours; the rest is in the episode rows. An omitted run
    never spans two replicas."""
    from preemptdiag.render.episodes import TimelineMode, shown_mask

    mode = mode or TimelineMode.EPISODES
    out: list[Window | int] = []
    for rep in replicas(report.windows):
        ws = of_replica(report.windows, rep)
        out += kept_runs(ws, shown_mask(ws, report.verdict, report.window_seconds, mode))
    return out


T = TypeVar("T")


def kept_runs(items: Sequence[T], keep: Sequence[bool]) -> list[T | int]:
    """The kept items in order, each run of left-out ones replaced by its length."""
    out: list[T | int] = []
    gap = 0
    assert len(items) == len(keep)
    # (by index: only the kept items are read, a month's calm windows made)
    for i, k in enumerate(keep):
        if k:
            if gap:
                out.append(gap)
                gap = 0
            out.append(items[i])
        else:
            gap += 1
    if gap:
        out.append(gap)
    return out


def omitted_label(n: int, *, compact: bool = False) -> str:
    """It sits in the class column, so in the terminal it is kept about as narrow as a
    class name: a wider one would squeeze every other column at 80."""
    if compact:
        return f"… {fmt_int(n)} omitted …"
    return f"… {n} window{'s' if n != 1 else ''} omitted …"


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    header: str
    short: str  # terminal header, two lines at most: ten full headers do not fit 100 columns
    numeric: bool


@dataclass(frozen=True, slots=True)
class Row:
    cells: tuple[str, ...]
    cls: Class | None  # None for an "omitted" row
    omitted: int = 0


@dataclass(frozen=True, slots=True)
class Timeline:
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    date: str | None  # shared UTC date, when all windows have one
    omitted: int  # windows left out in total
    windows: tuple[Window, ...]  # the windows behind the rows, in order

    @property
    def class_index(self) -> int:
        return [c.key for c in self.columns].index("class")


def start_cell(w: Window, date: str | None, short: str | None = None) -> str:
    """The clock under a shared date; else the date too, in `short` form when given
    (the terminal's: a year and seconds the table does not need)."""
    if w.start is None:
        return EMPTY
    t = utc(w.start)
    if date is not None:
        return t.strftime("%H:%M:%S")
    return t.strftime(short or "%Y-%m-%d %H:%M:%S")


def short_stamp(windows: Sequence[Window], seconds: int) -> str | None:
    """A shorter date-and-time format for a table over several days: without the year
    when all windows share one, without seconds for whole-minute windows."""
    years = {d.year for d in _utc_dates(windows)}
    clock = "%H:%M" if seconds % 60 == 0 else "%H:%M:%S"
    return f"%m-%d {clock}" if len(years) == 1 else f"%Y-%m-%d {clock}"


def _waiting_cell(w: Window) -> str:
    if w.waiting_first is not None and w.waiting_last is not None:
        return f"{w.waiting_first}→{w.waiting_last}"
    return fmt_num(w.waiting_max)


def _lead_columns(when: Column, multi: bool) -> list[Column]:
    """The time column, the replica (when there are several) and the class."""
    replica = [Column("replica", "replica", "replica", False)] if multi else []
    return [when, *replica, Column("class", "class", "class", False)]


def timeline(
    report: Report, mode: TimelineMode | None = None, *, compact: bool = False
) -> Timeline:
    """The timeline rows; `compact` (the terminal) writes multi-day stamps short."""
    ws = report.windows
    date = shared_date(ws)
    short = short_stamp(ws, report.window_seconds) if compact else None
    multi = len(replicas(ws)) > 1
    swapped = any(s is not None for s in window_columns(ws, ("swapped_max",))[0])
    cols = [*_lead_columns(Column("start", "start (UTC)", "start", False), multi)]
    cols += [
        Column("preemptions", "preemptions", "preempt", True),
        Column("kv_max", "KV max %", "KV\nmax %", True),
        Column("running_max", "running max", "run\nmax", True),
        Column("waiting", "waiting", "waiting", True),
    ]
    if swapped:
        cols.append(Column("swapped_max", "swapped max", "swap\nmax", True))
    cols += [
        Column("prompt_tput", "prompt tok/s", "prompt\ntok/s", True),
        Column("gen_tput", "gen tok/s", "gen\ntok/s", True),
    ]

    def cells(w: Window) -> tuple[str, ...]:
        values = {
            "start": start_cell(w, date, short),
            "replica": w.replica or EMPTY,
            "class": str(w.cls),
            "preemptions": fmt_preemptions(w),
            "kv_max": fmt_num(w.kv_max),
            "running_max": fmt_num(w.running_max),
            "waiting": _waiting_cell(w),
            "swapped_max": fmt_num(w.swapped_max),
            "prompt_tput": fmt_num(w.prompt_tput),
            "gen_tput": fmt_num(w.gen_tput),
        }
        return tuple(values[c.key] for c in cols)

    rows: list[Row] = []
    shown: list[Window] = []
    omitted = 0
    for item in select_windows(report, mode):
        if isinstance(item, int):
            omitted += item
            # The label sits in the class column: the widest text column in every layout.
            rows.append(
                Row(
                    tuple(
                        omitted_label(item, compact=compact) if c.key == "class" else ""
                        for c in cols
                    ),
                    None,
                    item,
                )
            )
        else:
            rows.append(Row(cells(item), item.cls))
            shown.append(item)
    return Timeline(tuple(cols), tuple(rows), date, omitted, tuple(shown))


_FACT_NAMES = ("max_num_seqs", "max_running_requests", "max_model_len", "kv_tokens")


def replica_line(r: ReplicaFacts, *, short: bool = False, named: bool = True) -> str:
    """One replica in a line: its name (`named`), engine and version, span, how it was
    dated, and the facts the levers size from (each with the line that shows it;
    `short`: a line of the replica's own file as `line N`, its path said once
    already, as a page-long terminal report has room for)."""
    e = r.engine
    engine = " ".join(x for x in (e.engine, e.generation, e.version) if x)
    if r.start is None or r.end is None:
        span = "no timestamps"
    elif r.start.date() == r.end.date():
        span = f"{r.start:%Y-%m-%d %H:%M}–{r.end:%H:%M}"
    else:  # a span past midnight names both days, or "00:00–00:00" reads as one minute
        span = f"{r.start:%Y-%m-%d %H:%M} → {r.end:%Y-%m-%d %H:%M}"
    facts = ", ".join(
        f"{f.name}={f.value} [{_cited(f.source, r.replica if short else None)}]"
        for f in r.facts
        if f.name in _FACT_NAMES and f.source
    )
    dated = "; ".join(r.dated_by) or "not dated"
    head = f"{r.replica}: {engine}" if named else engine
    return f"{head}, {span} (dated by {dated})" + (f"; {facts}" if facts else "")


def _cited(source: str, own: str | None) -> str:
    """A fact's `file:line`, or `line N` where the file is `own`."""
    path, _, line = source.rpartition(":")
    return f"line {line}" if own is not None and path == own and line.isdigit() else source


# ---------------------------------------------------------------- episodes


def span_cell(
    start: datetime | None,
    end: datetime | None,
    date: str | None,
    seconds: int,
    *,
    compact: bool = False,
) -> str:
    """`from → to` of a run: clock times under a shared date, else the date once and
    only as much of the end as differs (seconds only for windows that are not minutes;
    `compact`: no year either, when both ends share it)."""
    if start is None or end is None:
        return EMPTY
    a, b = utc(start), utc(end)
    clock = "%H:%M" if seconds % 60 == 0 else "%H:%M:%S"
    if compact and date is None and a.year == b.year:
        return f"{a.strftime(f'%m-%d {clock}')} → {b.strftime(clock if b.date() == a.date() else f'%m-%d {clock}')}"
    if date is not None:  # the header gives the date; an end past midnight names its day
        return (
            f"{a:%H:%M:%S} → {b:%H:%M:%S}"
            if b.date() == a.date()
            else f"{a:%H:%M:%S} → {b:%m-%d %H:%M:%S}"
        )
    if b.date() == a.date():
        tail = clock
    elif b.year == a.year:
        tail = f"%m-%d {clock}"
    else:
        tail = f"%Y-%m-%d {clock}"
    return f"{a.strftime(f'%Y-%m-%d {clock}')} → {b.strftime(tail)}"


def fmt_episode_preemptions(e: Episode) -> str:
    spread = "~" if e.preemptions_estimated else ""
    return f"{spread}{round_count(e.preemptions)}{'+' if e.preemptions_lower_bound else ''}"


def fmt_confidence(e: Episode) -> str:
    """The confidence most windows have, and how many have another: `high (2 low)`."""
    (top, _), *rest = e.confidence
    return str(top) + (f" ({', '.join(f'{n} {c}' for c, n in rest)})" if rest else "")


VERDICT_MARK = " ◀ verdict"
VERDICT_MARK_SHORT = " ◀"  # the terminal's, explained in the table's title


@dataclass(frozen=True, slots=True)
class EpisodeTable:
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]  # Row.cls is None for a row of omitted episodes
    windows: int  # windows the episodes cover
    episodes: int  # episodes in all (shown and omitted)
    silent: bool  # some run's span has windows without a log line

    @property
    def class_index(self) -> int:
        return [c.key for c in self.columns].index("class")


def episode_table(
    report: Report, mode: TimelineMode | None = None, *, compact: bool = False
) -> EpisodeTable | None:
    """One row per run of same-class windows, for the replicas whose timeline is
    collapsed; None when every window is shown in full (nothing to summarise).
    `compact` (the terminal, 80 columns and up): short stamps and verdict mark."""
    from preemptdiag.render.episodes import TimelineMode, collapsed, episode_rows, episodes

    mode = mode or TimelineMode.EPISODES
    date = shared_date(report.windows)
    names = replicas(report.windows)
    cols = _lead_columns(
        Column("span", "from → to (UTC)", "from → to (UTC)", False), len(names) > 1
    )
    cols += [
        Column("windows", "windows", "windows", True),
        Column("preemptions", "preemptions", "preempt", True),
        Column("kv_max", "KV max %", "KV max", True),
        Column("waiting_max", "waiting max", "wait max", True),
        Column("confidence", "confidence", "conf.", False),
    ]
    mark = VERDICT_MARK_SHORT if compact else VERDICT_MARK
    rows: list[Row] = []
    n_windows = n_episodes = 0
    any_silent = False
    for rep in names:
        ws = of_replica(report.windows, rep)
        if not collapsed(ws, mode):
            continue
        eps = episodes(ws, report.verdict, report.window_seconds)
        n_windows += len(ws)
        n_episodes += len(eps)
        for item in episode_rows(eps):
            if isinstance(item, int):
                label = f"… {item} episode{'s' if item != 1 else ''} omitted …"
                rows.append(Row(tuple(label if c.key == "class" else "" for c in cols), None, item))
                continue
            silent = f" (+{fmt_int(item.silent)} silent)" if item.silent else ""
            any_silent = any_silent or bool(item.silent)
            values = {
                "span": span_cell(
                    item.start, item.end, date, report.window_seconds, compact=compact
                ),
                "replica": rep or EMPTY,
                "class": str(item.cls) + (mark if item.verdict else ""),
                "windows": fmt_int(item.n) + silent,
                "preemptions": fmt_episode_preemptions(item),
                "kv_max": fmt_num(item.kv_max),
                "waiting_max": fmt_num(item.waiting_max),
                "confidence": fmt_confidence(item),
            }
            rows.append(Row(tuple(values[c.key] for c in cols), item.cls))
    if not rows:
        return None
    return EpisodeTable(tuple(cols), tuple(rows), n_windows, n_episodes, any_silent)


def episode_title(table: EpisodeTable, *, compact: bool = False) -> str:
    # "3 runs of one class" read as if every run had the same class.
    runs = "run of one class" if table.episodes == 1 else "runs, one class each"
    text = f"{fmt_int(table.windows)} windows in {fmt_int(table.episodes)} {runs}"
    return text + (f" ({VERDICT_MARK_SHORT.strip()} the verdict's)" if compact else "")


SILENT_LEGEND = "silent: windows in a run's span without a log line"
