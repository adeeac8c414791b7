"""JSON format: the versioned, machine-readable report (docs/json-schema.md).

Bump SCHEMA_VERSION when a field is removed, renamed or changes meaning; adding a
field is compatible. The exit code is deliberately absent: the CLI owns it.
"""

from __future__ import annotations

import functools
import itertools
import json
import operator
import string
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from enum import Enum
from typing import Any

from preemptdiag.model.records import (
    NO_TIME,
    Event,
    Kind,
    Lever,
    ReadWindow,
    ReplicaFacts,
    Report,
    ScanStats,
    Verdict,
    Window,
    is_printable,
    window_runs,
)
from preemptdiag.render import common
from preemptdiag.render.apart import FORK_MIN_WINDOWS, Apart, can_fork
from preemptdiag.render.episodes import Episode, TimelineMode, episodes

SCHEMA = "preemptdiag/report"
SCHEMA_VERSION = 1

JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]


def jsonable(value: Any) -> JSONValue:
    """Thresholds and event fields are open-ended; make them valid JSON (no NaN)."""
    if value is None or isinstance(value, bool | int | str):
        return value.value if isinstance(value, Enum) else value
    if isinstance(value, float):
        return common.finite(value)
    if isinstance(value, datetime):
        return common.iso(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Enum):
        return jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, Sequence | set | frozenset):
        return [jsonable(v) for v in value]
    return str(value)


_EVENT_KEYS = ("file", "line", "signature", "kind", "text", "ts")


def _event_values(e: Event) -> tuple[JSONValue, ...]:
    # (in _EVENT_KEYS' order: event_dict and the windows' template share it)
    return _line_values(e.source, e.line, e.sig, e.kind, e.text, e.ts)


def _line_values(
    source: str, line: int, sig: str, kind: Kind, text: str, ts: datetime | None
) -> tuple[JSONValue, ...]:
    return (source, line, sig, str(kind), text, common.iso(ts))


def event_dict(e: Event) -> dict[str, JSONValue]:
    return dict(zip(_EVENT_KEYS, _event_values(e), strict=True))


def verdict_dict(v: Verdict) -> dict[str, JSONValue]:
    return {
        "class": str(v.cls),
        "confidence": str(v.confidence),
        "start": common.iso(v.start),
        "end": common.iso(v.end),
        "replica": v.replica,
        "why": v.why,
        "evidence_found": v.evidence_found,
        "filtered_out": v.filtered_out,
        "suspected": v.suspected,
        "capture_next": v.capture_next,
        "cause": v.cause,
        "consequence": v.consequence,
        "evidence": [event_dict(e) for e in v.evidence],
    }


def lever_dict(lv: Lever) -> dict[str, JSONValue]:
    return {
        "knob": lv.knob,
        "current": lv.current,
        "proposed": lv.proposed,
        "arithmetic": list(lv.arithmetic),
        "verify": lv.verify,
        "apply": lv.apply or None,
        "rollback": lv.rollback or None,
        "do_not": lv.do_not,
        "rationale": lv.rationale,
        "engine": lv.engine,
    }


_WINDOW_KEYS = (
    "replica",
    "start",
    "end",
    "class",
    "confidence",
    "why",
    "preemptions",
    "preemptions_lower_bound",
    "preemptions_spread_over",
    "max_cumulative",
    "kv_max",
    "kv_mean",
    "kv_peak_running",
    "running_max",
    "running_mean",
    "waiting_first",
    "waiting_last",
    "waiting_max",
    "swapped_first",
    "swapped_last",
    "swapped_max",
    "prompt_tput",
    "gen_tput",
    "n_events",
    "n_stats",
    "alloc_failures",
    "host_ooms",
    "engine_deaths",
    "swap_warnings",
)  # then "evidence"


# The Window attribute of each of _WINDOW_KEYS, and what its JSON value is made
# from it with (None: the value itself); a numbers' field goes through `finite`.
_WINDOW_ATTRS = ("replica", "start", "end", "cls", "confidence", "why", *_WINDOW_KEYS[6:])
_WINDOW_MAKE: tuple[Callable[[Any], JSONValue] | None, ...] = tuple(
    common.iso
    if a in ("start", "end")
    else str
    if a in ("cls", "confidence")
    else common.finite
    if a in ("preemptions", "kv_max", "kv_mean", "running_mean", "prompt_tput", "gen_tput")
    else None
    for a in _WINDOW_ATTRS
)
_window_attrs: Callable[[Window], tuple[Any, ...]] = operator.attrgetter(*_WINDOW_ATTRS)


# (the positions whose value is made, and how: a third of them)
_MADE = tuple((i, make) for i, make in enumerate(_WINDOW_MAKE) if make is not None)


def _window_values(w: Window) -> list[JSONValue]:
    # (in _WINDOW_KEYS' order: window_dict and the windows' template share it)
    values = list(_window_attrs(w))
    for i, make in _MADE:
        values[i] = make(values[i])
    return values


def window_dict(w: Window) -> dict[str, JSONValue]:
    out = dict(zip(_WINDOW_KEYS, _window_values(w), strict=True))
    out["evidence"] = [event_dict(e) for e in w.evidence]
    return out


def _sorted_counts(m: Mapping[str, int]) -> dict[str, JSONValue]:
    # Counters fill in log order; sorting keeps two runs over the same input diffable.
    return {k: m[k] for k in sorted(m)}


def scan_dict(s: ScanStats) -> dict[str, JSONValue]:
    return {
        "files": list(s.files),
        "lines_read": s.lines_read,
        "bytes_read": s.bytes_read,
        "recognised": _sorted_counts(s.recognised),
        "skipped": _sorted_counts(s.skipped),
    }


def replica_dict(r: ReplicaFacts) -> dict[str, JSONValue]:
    e = r.engine
    return {
        "replica": r.replica,
        "engine": {"engine": e.engine, "generation": e.generation, "version": e.version},
        "start": r.start.isoformat() if r.start else None,
        "end": r.end.isoformat() if r.end else None,
        "dated_by": list(r.dated_by),
        "facts": [
            {"name": f.name, "value": f.value, "source": f.source, "how": f.how or None}
            for f in r.facts
        ],
    }


def episode_dict(e: Episode) -> dict[str, JSONValue]:
    return {
        "replica": e.replica,
        "start": common.iso(e.start),
        "end": common.iso(e.end),
        "class": str(e.cls),
        "windows": e.n,
        "silent_windows": e.silent,
        "preemptions": common.finite(e.preemptions),
        "preemptions_lower_bound": e.preemptions_lower_bound,
        "preemptions_estimated": e.preemptions_estimated,
        "kv_max": common.finite(e.kv_max),
        "waiting_max": e.waiting_max,
        "running_max": e.running_max,
        "confidence": {str(c): n for c, n in e.confidence},
        "verdict": e.verdict,
    }


def _episodes(report: Report) -> Iterator[dict[str, JSONValue]]:
    for rep in common.replicas(report.windows):
        ws = common.of_replica(report.windows, rep)
        yield from map(episode_dict, episodes(ws, report.verdict, report.window_seconds))


def shown_windows(report: Report, timeline: TimelineMode) -> Sequence[Window]:
    if timeline is TimelineMode.FULL:
        return report.windows  # (a month's calm windows made as they are written)
    return [w for w in common.select_windows(report, timeline) if not isinstance(w, int)]


def report_dict(
    report: Report,
    with_windows: bool = True,
    timeline: TimelineMode = TimelineMode.FULL,
    with_episodes: bool = True,
) -> dict[str, JSONValue]:
    e = report.engine
    shown = shown_windows(report, timeline) if with_windows else []
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "tool_version": report.tool_version,
        "verdict": verdict_dict(report.verdict),
        "lever": lever_dict(report.lever),
        "windows": [window_dict(w) for w in shown],
        "engine": {"engine": e.engine, "generation": e.generation, "version": e.version},
        "scan": scan_dict(report.stats),
        # Thresholds keep their defined order (it groups related knobs).
        "thresholds": {str(k): jsonable(v) for k, v in report.thresholds.items()},
        "window_seconds": report.window_seconds,
        "notes": list(report.notes),
        "replicas": [replica_dict(r) for r in report.replicas],
        "timeline": str(timeline),
        "episodes": list(_episodes(report)) if with_episodes else [],
    }


_WINDOWS_SLOT = "\x00windows\x00"
_EPISODES_SLOT = "\x00episodes\x00"


def render_json(report: Report, *, timeline: TimelineMode = TimelineMode.FULL) -> str:
    """report_dict as indented JSON (json_chunks, joined)."""
    return "".join(json_chunks(report, timeline=timeline))


def json_chunks(
    report: Report, *, timeline: TimelineMode = TimelineMode.FULL, processes: int = 1
) -> Iterator[str]:
    """render_json's text in pieces, a window at a time: written as they come, a
    month of one-minute windows (60 MB of JSON) is never held whole, nor twice (its
    pieces and their join); so are the episodes, an episode at a time (a quarter of a
    pool pinned at the pressure threshold is ~12,000: as dicts and one text, split,
    ~25 MiB). The rest is encoded whole first; the windows' numbers passed `finite`
    when they were made. With `processes` above 1, a long timeline's second half is
    made by a forked child meanwhile (render/apart.py)."""
    timeline = TimelineMode(timeline)
    shown = shown_windows(report, timeline)

    def part(lo: int, hi: int) -> Iterator[str]:
        for at in range(lo, hi, _BATCH):
            yield (",\n    " if at else "") + ",\n    ".join(
                windows_json(shown[at : min(at + _BATCH, hi)], "    ")
            )

    # (at a batch's start: both halves are the batches one process writes) The child
    # starts before the head is made: a month's episodes are ~50 ms of it.
    mid = len(shown) // 2 // _BATCH * _BATCH
    other = _apart(functools.partial(part, mid, len(shown)), len(shown), processes)
    try:
        doc = {
            **report_dict(report, with_windows=False, timeline=timeline, with_episodes=False),
            "windows": _WINDOWS_SLOT,
            "episodes": _EPISODES_SLOT,
        }
        # allow_nan=False: a NaN that slipped past `finite` must fail loudly, not emit
        # bad JSON.
        text = json.dumps(doc, indent=2, allow_nan=False)
        head, rest = text.split(json.dumps(_WINDOWS_SLOT))
        middle, tail = rest.split(json.dumps(_EPISODES_SLOT))
        if not shown:
            yield f"{head}[]{middle}"
        else:
            yield head + "[\n    "
            if other is None:
                yield from part(0, len(shown))
            else:
                yield from part(0, mid)
                yield from other.pieces()
            yield "\n  ]" + middle
        yield from _listed_json(_episodes(report), "  ")
        yield tail + "\n"
    finally:
        if other is not None:
            other.close()


def _apart(render: Callable[[], Iterator[str]], n: int, processes: int) -> Apart | None:
    """A forked child making `render`'s text, where that pays and is safe."""
    if n < FORK_MIN_WINDOWS or not can_fork(processes):
        return None
    try:
        return Apart(render)
    except OSError:  # (no temporary file, no fork: this process writes it all)
        return None


_BATCH = 512  # windows written as one piece


def _listed_json(items: Iterable[JSONValue], indent: str) -> Iterator[str]:
    """json.dumps(list(items), indent=2) as the value of a key `indent` deep, an item
    at a time (an item's text is its own dumps, each line after its first indented
    one level further in)."""
    inner = "\n" + indent + "  "
    sep = "[" + inner
    for item in items:
        yield sep + json.dumps(item, indent=2, allow_nan=False).replace("\n", inner)
        sep = "," + inner
    yield "[]" if sep.startswith("[") else "\n" + indent + "]"


def windows_json(ws: Sequence[Window], indent: str = "") -> list[str]:
    """[window_json(w, indent) for w in ws], the same texts (test_json_format checks);
    a run of ReadWindows of one class made a column at a time (_read_windows_json)."""
    out: list[str] = []
    for kind, group in window_runs(ws):
        made = (
            _read_windows_json(kind, group, indent)  # type: ignore[arg-type]
            if len(group) > 1 and issubclass(kind, ReadWindow)
            else None
        )
        out += made if made is not None else [window_json(w, indent) for w in group]
    return out


def _read_windows_json(
    read: type[ReadWindow], ws: Sequence[ReadWindow], indent: str
) -> list[str] | None:
    """window_json of each of `ws` (ReadWindows of one class, a month's calm minutes:
    ~3x faster): their values taken a field at a time, each field's texts made by
    one function over the column, a field with one text in every window written into
    the template's pieces; None when a value is not a plain scalar (window_json
    then, a window at a time)."""
    times: dict[int, str] = {}  # (_iso_column's hours)
    # (a window's start and end, and its line's time, written from their microseconds
    # where the class has them without a datetime each: a calm run's)
    stamps = {name: _iso_micros(read.micros(ws, name), times) for name in _TIMES}
    others = [a for a in _WINDOW_ATTRS if a not in _TIMES or stamps[a] is None]
    read_columns = dict(zip(others, read.columns(ws, others), strict=True))
    made: list[Sequence[Any]] = [
        read_columns[name]
        if make is None
        else stamps[name] or _iso_column(read_columns[name], times)
        if make is common.iso
        else _finite_column(read_columns[name])
        if make is common.finite
        else list(map(make, read_columns[name]))
        for name, make in zip(_WINDOW_ATTRS, _WINDOW_MAKE, strict=True)
    ]
    # (_line_values' columns: the kind as str, the time as iso)
    file, line, sig, kind, text = read.evidence_untimed(ws)
    ts = _iso_micros(read.evidence_micros(ws), times)
    if ts is None:
        ts = _iso_column(read.evidence_lines(ws)[5], times)
    made += [file, line, sig, [str(k) for k in kind], text, ts]
    pieces = list(_one_event_pieces(indent))
    glue = [pieces[0]]  # the template's text before each varying field, and after
    varying: list[Sequence[str]] = []
    for col, after in zip(made, pieces[1:], strict=True):
        texts = _texts(col)
        if texts is None:
            return None
        if texts.count(texts[0]) == len(texts):
            glue[-1] += (f'"{texts[0]}"' if texts is col else texts[0]) + after
        elif texts is col:
            # (texts that need no escape: their quotes go into the pieces around them)
            varying.append(texts)
            glue[-1] += '"'
            glue.append('"' + after)
        else:
            varying.append(texts)
            glue.append(after)
    if not varying:
        return [glue[0]] * len(ws)
    columns: list[Iterable[str]] = [itertools.repeat(glue[0], len(ws))]
    for texts, after in zip(varying, glue[1:], strict=True):
        columns += [texts, itertools.repeat(after, len(ws))]
    return list(map("".join, zip(*columns, strict=True)))


def _texts(col: Sequence[Any]) -> Sequence[str] | None:
    """The JSON text of each value of a column (_SCALARS'); None when one is not a
    plain scalar; the column itself when it is of texts that need no escape: each
    one's JSON text is itself in quotes (which the caller puts around it)."""
    kinds = set(map(type, col))
    if len(kinds) == 1 and col.count(col[0]) == len(col) and _one_zero(col):
        # (one value in every window, a class constant: written once)
        scalar = _SCALARS.get(kinds.pop())
        return None if scalar is None else [scalar(col[0])] * len(col)
    if kinds == {float} and _finite_sum(col):
        return list(map(float.__repr__, col))  # (_float's checks, for the column at once)
    if kinds == {str} and _plain_texts(col):
        return col  # (what _quoted makes of each is it in quotes)
    if len(kinds) == 1:
        scalar = _SCALARS.get(kinds.pop())
        return None if scalar is None else list(map(scalar, col))
    if not _SCALAR_TYPES.issuperset(kinds):
        return None
    get = _SCALARS.__getitem__
    return [get(type(v))(v) for v in col]


def _plain_texts(col: Sequence[str]) -> bool:
    """Whether _quoted would only put quotes around each text: every character from
    space to tilde (records.is_printable of ASCII), none a quote or a backslash (JSON
    escapes the rest), found for the column at once."""
    joined = "".join(col)
    return joined.isascii() and is_printable(joined) and '"' not in joined and "\\" not in joined


def _one_zero(col: Sequence[Any]) -> bool:
    """Whether a column of one value (by ==) is one text: not floats that are zeros,
    unless all of one sign (-0.0 == 0.0, but prints otherwise)."""
    first = col[0]
    if type(first) is not float or first != 0.0:
        return True
    return array("d", col).tobytes() == array("d", (first,)).tobytes() * len(col)


def _iso_column(col: Sequence[datetime | None], seen: dict[int, str]) -> list[str | None]:
    """common.iso of each. Aware times of whole seconds (a log's stamps, a window's
    bounds, the usual) are written from their epoch second: an hour's text (kept in
    `seen`, by hour since the epoch) and a second's in the hour (_clock), ~2x faster
    than isoformat."""
    try:
        stamps = list(map(_TIMESTAMP, col))
    except TypeError:  # (None: an undated window)
        return list(map(common.iso, col))
    seconds = list(map(int, stamps))
    # (a naive time is UTC to common.iso, local time to timestamp(); a float holds a
    # time's microseconds only up to a few centuries from the epoch: in 2515, one
    # microsecond past a second was that second's timestamp, and was written as it)
    if seconds != stamps or None in map(_TZINFO, col) or any(map(_MICROSECOND, col)):
        return list(map(common.iso, col))
    return _iso_seconds(seconds, seen)


def _iso_seconds(seconds: Iterable[int | None], seen: dict[int, str]) -> list[str | None]:
    """common.iso of each epoch second (None: None)."""
    clock = _clock()
    out: list[str | None] = []
    for second in seconds:
        if second is None:
            out.append(None)
            continue
        hour, at = divmod(second, 3600)
        text = seen.get(hour)
        if text is None:
            text = seen[hour] = datetime.fromtimestamp(hour * 3600, UTC).isoformat()[:14]
        out.append(text + clock[at])
    return out


def _iso_micros(micros: Sequence[int] | None, seen: dict[int, str]) -> list[str | None] | None:
    """_iso_column of the times these microseconds are (records.window_micros; NO_TIME
    none): None unless each is a whole second or none (the caller then reads the
    datetimes)."""
    if micros is None:
        return None
    seconds: list[int | None] = []
    for us in micros:
        second, part = divmod(us, 1_000_000)
        if us != NO_TIME and part:
            return None
        seconds.append(None if us == NO_TIME else second)
    return _iso_seconds(seconds, seen)


_TIMES = ("start", "end")
_TZINFO = operator.attrgetter("tzinfo")
_MICROSECOND = operator.attrgetter("microsecond")
_TIMESTAMP: Callable[[datetime | None], float] = datetime.timestamp  # type: ignore[assignment]


@functools.cache
def _clock() -> list[str]:
    """The text after an hour's of each second in it, as UTC's isoformat ends."""
    return [f"{m:02d}:{s:02d}+00:00" for m in range(60) for s in range(60)]


def _finite_column(col: Sequence[Any]) -> Sequence[Any]:
    """common.finite of each: the column itself when its numbers are all finite."""
    return col if _finite_sum(col) else list(map(common.finite, col))


def _finite_sum(col: Sequence[Any]) -> bool:
    """Whether the column holds numbers only and their sum is finite, which it is not
    when one is a NaN or an infinity (or, rarely, the sum overflows: a false no)."""
    try:
        total = sum(col)
    except (TypeError, OverflowError):  # (a None among them; an int past any float)
        return False
    return bool(total - total == 0)


_quoted: Callable[[str], str] = json.encoder.encode_basestring_ascii
_INF = float("inf")


def _float(v: float) -> str:
    if v != v or v == _INF or v == -_INF:
        raise ValueError(f"Out of range float values are not JSON compliant: {v!r}")
    return float.__repr__(v)


# The scalars, by exact type (a subclass, say an IntEnum, goes to json.dumps).
# "null".format(None) is "null": format ignores an argument it has no field for.
_SCALARS: dict[type, Callable[[Any], str]] = {
    str: _quoted,
    int: int.__repr__,
    float: _float,
    bool: ("false", "true").__getitem__,
    type(None): "null".format,
}
_SCALAR_TYPES = frozenset(_SCALARS)


def dumps_indented(value: Any, indent: str = "") -> str:
    """json.dumps(value, indent=2, allow_nan=False), every line after the first
    prefixed by `indent`: the same bytes (test_json_format checks), ~5x faster.

    With `indent` set, json.dumps runs the pure-Python encoder (the C one does only
    compact output), a generator per container and value: a month of windows took
    seconds. This handles the types windows hold (dicts with str keys, lists, tuples,
    str, int, float, bool, None) and hands anything else to json.dumps."""
    t = type(value)
    scalar = _SCALARS.get(t)
    if scalar is not None:
        return scalar(value)
    inner = indent + "  "
    get = _SCALARS.get
    if t is dict:
        template = _template(tuple(value), indent)
        if template is not None:
            return template.format(
                *[
                    scalar(v) if (scalar := get(type(v))) else dumps_indented(v, inner)
                    for v in value.values()
                ]
            )
    elif t is list or t is tuple:
        if not value:
            return "[]"
        parts = [scalar(v) if (scalar := get(type(v))) else dumps_indented(v, inner) for v in value]
        return "[\n" + inner + (",\n" + inner).join(parts) + "\n" + indent + "]"
    return json.dumps(value, indent=2, allow_nan=False).replace("\n", "\n" + indent)


def window_json(w: Window, indent: str = "") -> str:
    """dumps_indented(window_dict(w), indent), the same bytes (test_json_format
    checks): a window with one evidence line, the usual, is one str.format of its
    scalars into _one_event's template (a month of windows: ~3x faster than dict and
    walk)."""
    if isinstance(w, ReadWindow) or len(w.evidence) == 1:
        get = _SCALARS.get
        # (a ReadWindow's evidence line read without making its event)
        line = (
            _line_values(*w.evidence_line())
            if isinstance(w, ReadWindow)
            else _event_values(w.evidence[0])
        )
        values = (*_window_values(w), *line)
        texts = [scalar(v) for v in values if (scalar := get(type(v))) is not None]
        if len(texts) == len(values):
            return _filled(_one_event_pieces(indent), texts)
    return dumps_indented(window_dict(w), indent)


@functools.lru_cache(maxsize=8)
def _one_event_pieces(indent: str) -> tuple[str, ...]:
    """_one_event's template as the texts between its fields (one more than them):
    joined with the fields' texts between them it is the template's str.format, ~2x
    faster (format parses its 1.4 KB template each time)."""
    pieces = [""]
    for literal, name, _, _ in string.Formatter().parse(_one_event(indent)):
        pieces[-1] += literal
        if name is not None:
            pieces.append("")
    return tuple(pieces)


def _filled(pieces: tuple[str, ...], texts: list[str]) -> str:
    return pieces[0] + "".join(itertools.chain.from_iterable(zip(texts, pieces[1:], strict=True)))


@functools.lru_cache(maxsize=8)
def _one_event(indent: str) -> str:
    """The template of a window with one evidence event at this indent: the
    window's dict template with the event's dict template in its evidence list."""
    outer = _template((*_WINDOW_KEYS, "evidence"), indent)
    inner = indent + "  "
    event = _template(_EVENT_KEYS, inner + "  ")
    assert outer is not None and event is not None and outer.endswith("{}\n" + indent + "}}")
    head = outer[: -len("{}\n" + indent + "}}")]
    return head + "[\n" + inner + "  " + event + "\n" + inner + "]\n" + indent + "}}"


@functools.lru_cache(maxsize=256)
def _template(keys: tuple[object, ...], indent: str) -> str | None:
    """A str.format template of a dict with these keys at this indent (the values
    are its fields); None when a key is not a str (json.dumps converts those)."""
    if not all(type(k) is str for k in keys):
        return None
    if not keys:
        return "{{}}"
    inner = indent + "  "
    items = [_quoted(k).replace("{", "{{").replace("}", "}}") + ": {}" for k in keys]  # type: ignore[arg-type]
    return "{{\n" + inner + (",\n" + inner).join(items) + "\n" + indent + "}}"
