"""render_json's window encoder gives json.dumps(indent=2)'s bytes, faster."""

from __future__ import annotations

import json
import textwrap
from enum import IntEnum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptdiag.render.json_format import dumps_indented


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
