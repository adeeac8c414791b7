"""render_json's window encoder gives json.dumps(indent=2)'s bytes, faster."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from datetime import timedelta, timezone
from enum import IntEnum
from typing import Any

import pytest
from builders import T0, make_event, make_window
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptdiag.model.records import Class, Event, Kind, Window
from preemptdiag.render.json_format import dumps_indented, window_dict, window_json


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
