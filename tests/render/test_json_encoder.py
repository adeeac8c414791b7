"""render_json's window encoder gives json.dumps(indent=2)'s bytes, faster."""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
from array import array
from datetime import UTC, datetime, timedelta, timezone
from enum import IntEnum
from typing import Any

import pytest
from builders import T0, make_event, make_window
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptdiag.model.records import Class, Event, Kind, ReadWindow, Window, micros
from preemptdiag.render import common
from preemptdiag.render.json_format import (
    _iso_column,
    _iso_micros,
    _texts,
    dumps_indented,
    window_dict,
    window_json,
    windows_json,
)


def want(value: Any, indent: str) -> str:
    """What render_json wrote before: json.dumps, then textwrap.indent (the first line
    is prefixed by the caller)."""
    return textwrap.indent(json.dumps(value, indent=2, allow_nan=False), indent)[len(indent) :]


class Level(IntEnum):
    LOW = 1


_KEY = st.one_of(st.text(max_size=6), st.sampled_from(["{", "}", "{0}", 'a"b', "é\x07"]))
_LEAF = st.one_of(
    st.text(max_size=8),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none(),
    st.booleans(),
    st.just(Level.LOW),
    st.just(-0.0),
)
_TREE = st.recursive(
    _LEAF,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.lists(kids, max_size=3).map(tuple),
        st.dictionaries(_KEY, kids, max_size=4),
        st.dictionaries(st.one_of(st.integers(), st.none(), st.booleans()), kids, max_size=3),
    ),
    max_leaves=25,
)


@settings(max_examples=500, deadline=None)
@given(_TREE, st.sampled_from(["", "  ", "    "]))
def test_the_same_bytes_as_json_dumps(value: Any, indent: str) -> None:
    assert dumps_indented(value, indent) == want(value, indent)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_float_still_fails(bad: float) -> None:
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        dumps_indented({"kv_max": [1, bad]}, "    ")


def test_a_type_json_cannot_encode_still_fails() -> None:
    with pytest.raises(TypeError):
        dumps_indented({"when": object()}, "    ")


# A window with one evidence event, the usual, is one str.format of its scalars
# (window_json); any window must come out as the dict encoded by the walk.
_TEXT = st.one_of(st.text(max_size=6), st.sampled_from(["{", "}", "{0}", 'a"b', "é\x07"]))
_FLOAT = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False), st.just(-0.0))
_NUMBER = st.one_of(st.none(), st.integers())


@st.composite
def _windows(draw: st.DrawFn) -> Window:
    def event(minute: int) -> Event:
        e = make_event(Kind.STATS, {}, minute=minute, source=draw(_TEXT), sig=draw(_TEXT))
        return dataclasses.replace(e, text=draw(_TEXT), ts=draw(st.sampled_from([e.ts, None])))

    start = draw(st.sampled_from([T0, None, T0.astimezone(timezone(timedelta(hours=5)))]))
    return make_window(
        0,
        replica=draw(_TEXT),
        start=start,
        end=None if start is None else start + timedelta(minutes=1),
        why=draw(_TEXT),
        cls=draw(st.sampled_from(list(Class))),
        preemptions=draw(st.floats(allow_nan=True, allow_infinity=True)),
        preemptions_lower_bound=draw(st.booleans()),
        preemptions_spread_over=draw(_NUMBER),
        kv_max=draw(st.one_of(_FLOAT, st.just(float("nan")), st.just(float("inf")))),
        kv_mean=draw(_FLOAT),
        running_max=draw(_NUMBER),
        swapped_first=draw(_NUMBER),
        prompt_tput=draw(_FLOAT),
        n_stats=draw(st.integers(0, 10**12)),
        kv_peak_running=draw(st.one_of(_NUMBER, st.just(Level.LOW))),
        evidence=tuple(event(i) for i in range(draw(st.integers(0, 3)))),
    )


@settings(max_examples=400, deadline=None)
@given(_windows(), st.sampled_from(["", "    "]))
def test_a_window_is_its_dict_encoded(w: Window, indent: str) -> None:
    assert window_json(w, indent) == dumps_indented(window_dict(w), indent)
    assert json.loads(window_json(w, indent)) == json.loads(json.dumps(window_dict(w)))


# A run of ReadWindows (a month's calm minutes) is written a column at a time
# (windows_json): each must come out as window_json writes it alone.
class _Read(ReadWindow):
    """A ReadWindow holding a Window's values, its one event's line read from it."""

    __slots__ = tuple(f.name for f in dataclasses.fields(Window))

    def evidence_line(self) -> tuple[str, int, str, Kind, str, datetime | None]:
        (e,) = self.evidence
        return (e.source, e.line, e.sig, e.kind, e.text, e.ts)


def _read(w: Window) -> Window:
    if len(w.evidence) != 1:
        return w
    out = object.__new__(_Read)
    for f in dataclasses.fields(Window):
        object.__setattr__(out, f.name, getattr(w, f.name))
    return out


@st.composite
def _runs(draw: st.DrawFn) -> list[Window]:
    """Windows drawn again and again from a few (so a field is often one value in all
    of a run, as a calm class's constants are), most of them ReadWindows."""
    pool = draw(st.lists(_windows(), min_size=1, max_size=4))
    picks = draw(st.lists(st.tuples(st.integers(0, len(pool) - 1), st.integers(0, 4)), max_size=12))
    return [pool[i] if plain == 0 else _read(pool[i]) for i, plain in picks]


@settings(max_examples=400, deadline=None)
@given(_runs(), st.sampled_from(["", "    "]))
def test_a_run_of_read_windows_is_each_written_alone(ws: list[Window], indent: str) -> None:
    try:
        alone = [window_json(w, indent) for w in ws]
    except (ValueError, TypeError) as e:  # (a NaN window_json will not write)
        with pytest.raises(type(e), match=re.escape(str(e))):
            windows_json(ws, indent)
        return
    assert windows_json(ws, indent) == alone


def test_a_zero_of_either_sign_in_a_run_is_not_one_value() -> None:
    ws = [
        _read(make_window(i, kv_max=kv, evidence=(make_event(Kind.STATS, {}, i),)))
        for i, kv in enumerate([0.0, -0.0, 0.0, 0.0])
    ]
    assert all(isinstance(w, ReadWindow) for w in ws)
    assert windows_json(ws, "    ") == [window_json(w, "    ") for w in ws]
    assert '"kv_max": -0.0' in windows_json(ws)[1]


def test_a_time_in_a_run_is_its_instant_in_utc_whatever_its_zone() -> None:
    """An end that is the next window's start is written once; the same instant in
    another zone is the same text."""
    east = T0.astimezone(timezone(timedelta(hours=5)))
    ws = [
        _read(make_window(i, start=start, evidence=(make_event(Kind.STATS, {}, i),)))
        for i, start in enumerate([east, T0, T0 + timedelta(minutes=1)])
    ]
    assert windows_json(ws, "    ") == [window_json(w, "    ") for w in ws]
    assert json.loads(windows_json(ws)[0])["start"] == T0.isoformat()


def test_a_value_that_is_not_a_plain_scalar_sends_the_run_a_window_at_a_time() -> None:
    ws = [
        _read(make_window(i, kv_peak_running=Level.LOW, evidence=(make_event(Kind.STATS, {}, i),)))
        for i in range(3)
    ]
    assert windows_json(ws) == [window_json(w) for w in ws]
    assert json.loads(windows_json(ws)[0])["kv_peak_running"] == 1


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=12),
            st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12),
            st.sampled_from(['a"b', "a\\b", "tab\there", "del\x7f", "\u00e9t\u00e9", ""]),
        ),
        min_size=1,
        max_size=9,
    )
)
def test_a_column_of_texts_is_each_text_quoted(col: list[str]) -> None:
    # (a column of plain texts is given as it is, its quotes left to the caller; any
    # other text quoted the encoder's way)
    got = _texts(col)
    assert got is not None
    quoted = [f'"{v}"' for v in got] if got is col else list(got)
    assert quoted == [json.dumps(v) for v in col]
    assert quoted == [json.encoder.encode_basestring_ascii(v) for v in col]
    assert (got is col) == all(json.dumps(v) == f'"{v}"' for v in col) or len(set(col)) == 1


_TIMES = st.one_of(
    st.none(),
    st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from(
            [None, UTC, timezone(timedelta(0)), timezone(timedelta(hours=5, minutes=30))]
        ),
    ),
    # (whole seconds, the usual: a log's stamps and a window's bounds)
    st.datetimes(
        min_value=datetime(1969, 12, 1),
        max_value=datetime(2100, 1, 1),
        timezones=st.just(UTC),
    ).map(lambda t: t.replace(microsecond=0)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_TIMES, min_size=1, max_size=8), st.booleans())
def test_a_column_of_times_is_each_time_as_iso_writes_it(
    col: list[datetime | None], again: bool
) -> None:
    seen: dict[int, str] = {}
    if again:  # (the hours seen are kept from column to column)
        _iso_column(col[::-1], seen)
    assert _iso_column(col, seen) == [common.iso(t) for t in col]


def test_a_microsecond_past_a_second_centuries_away_is_written_whole() -> None:
    # (hypothesis, in a clean clone's test run: 2515's timestamp() has no room for
    # one microsecond, and the column was written as the whole second)
    for t in (
        datetime(2515, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        datetime(2026, 6, 3, 0, 0, 0, 1, tzinfo=UTC),
    ):
        assert _iso_column([t], {}) == [common.iso(t)] == [t.isoformat()]


@settings(max_examples=400, deadline=None)
@given(st.lists(_TIMES, min_size=1, max_size=8))
def test_times_from_their_microseconds_are_written_as_iso_writes_them(
    col: list[datetime | None],
) -> None:
    # (a calm run's times come as microseconds, records.window_micros: written when
    # each is a whole second or none, else left to the datetimes' way)
    got = _iso_micros(array("q", map(micros, col)), {})
    whole = all(t is None or t.microsecond == 0 for t in col)
    assert got == ([common.iso(t) for t in col] if whole else None)
    assert _iso_micros(None, {}) is None
