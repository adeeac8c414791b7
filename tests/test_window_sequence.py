"""records.Windows, window_micros and narrow: what lets a month's calm windows be a
report's windows without a window object (or a datetime, or 8 bytes an int) each.

Windows is a sequence of runs read as one: held here to the list of its windows it
stands for (indexing, slices, equality, pickling, runs of one class). micros is held
to datetime arithmetic, narrow to the values it was given. (test_calm_window.py holds
a calm run's windows to the ones made without calm minutes.)
"""

from __future__ import annotations

import pickle
from array import array
from datetime import UTC, datetime, timedelta, timezone

import pytest
from builders import make_window
from hypothesis import given
from hypothesis import strategies as st

from preemptdiag.model.records import (
    NO_TIME,
    Window,
    Windows,
    from_micros,
    micros,
    narrow,
    window_micros,
    window_runs,
)


def _parts(sizes: list[int]) -> tuple[list[Window], list[list[Window]]]:
    """Windows of minutes 0.., cut into parts of these sizes (empty ones among them)."""
    flat = [make_window(i, replica=f"r{i % 3}") for i in range(sum(sizes))]
    parts, at = [], 0
    for n in sizes:
        parts.append(flat[at : at + n])
        at += n
    return flat, parts


_SIZES = st.lists(st.integers(0, 6), max_size=6)


@given(_SIZES, st.data())
def test_it_reads_as_the_list_of_its_parts_windows(sizes: list[int], data: st.DataObject) -> None:
    flat, parts = _parts(sizes)
    ws = Windows(parts)
    assert len(ws) == len(flat) and list(ws) == flat
    for i in range(-len(flat), len(flat)):
        assert ws[i] is flat[i]
    for k in range(len(flat)):  # (the part that holds window k, and where)
        part, j = ws.part_at(k)
        assert part in ws.parts and part[j] is flat[k]
    for i in (len(flat), -len(flat) - 1):
        with pytest.raises(IndexError):
            ws[i]
    bound = st.none() | st.integers(-len(flat) - 2, len(flat) + 2)
    cut = slice(
        data.draw(bound), data.draw(bound), data.draw(st.none() | st.sampled_from([1, 2, -1]))
    )
    assert list(ws[cut]) == flat[cut]
    assert isinstance(ws[cut], Windows)
    # (a Windows of a Windows is its parts, not a part of one)
    assert list(Windows([ws, ws])) == flat + flat


@given(_SIZES)
def test_it_equals_any_sequence_of_equal_windows(sizes: list[int]) -> None:
    flat, parts = _parts(sizes)
    ws = Windows(parts)
    assert ws == flat and ws == tuple(flat) and tuple(flat) == ws and ws == Windows([flat])
    assert ws != "text" and ws != [*flat, make_window(99)]
    if flat:
        other = [*flat[:-1], make_window(99)]
        assert ws != other and hash(ws) == hash(tuple(flat))


@given(_SIZES)
def test_it_pickles_as_a_tuple_of_its_windows(sizes: list[int]) -> None:
    flat, parts = _parts(sizes)
    back = pickle.loads(pickle.dumps(Windows(parts)))
    assert type(back) is tuple and back == tuple(flat)


def test_made_windows_run_by_class_as_a_list_groups_them() -> None:
    class Other(Window):
        __slots__ = ()

    flat, _ = _parts([2, 0, 3])
    mixed = [
        *flat[:2],
        Other(**{f: getattr(flat[2], f) for f in Window.__dataclass_fields__}),
        *flat[3:],
    ]
    got = [(kind, list(run)) for kind, run in window_runs(Windows([mixed[:3], mixed[3:]]))]
    assert got == [(Window, mixed[:2]), (Other, mixed[2:3]), (Window, mixed[3:])]
    assert [(k, list(r)) for k, r in window_runs(mixed)] == got


_ZONES = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)
_TIMES = st.datetimes(datetime(1900, 1, 1), datetime(2200, 1, 1))


@given(_TIMES, _TIMES, _ZONES, _ZONES)
def test_micros_orders_and_subtracts_as_the_times_do(
    a: datetime, b: datetime, za: timezone, zb: timezone
) -> None:
    x, y = a.replace(tzinfo=za), b.replace(tzinfo=zb)
    assert micros(x) - micros(y) == (x - y) // timedelta(microseconds=1)
    assert (micros(x) < micros(y)) is (x < y)
    # (a naive time is read as UTC, as the renderers read it)
    assert micros(a) == micros(a.replace(tzinfo=UTC))
    assert micros(None) == NO_TIME < micros(datetime(1, 1, 1, tzinfo=UTC))
    # (and back: the same instant, in UTC)
    assert from_micros(micros(x)) == x and from_micros(micros(x)).tzinfo is UTC


def test_window_micros_is_each_windows_time_or_no_time() -> None:
    ws = [make_window(0), make_window(1, start=None, end=None), make_window(2)]
    assert list(window_micros(Windows([ws[:1], ws[1:]]), "start")) == [
        micros(ws[0].start),
        NO_TIME,
        micros(ws[2].start),
    ]
    assert list(window_micros(ws, "end")) == [micros(w.end) for w in ws]


@given(st.lists(st.integers(-(2**63), 2**63 - 1)))
def test_narrow_keeps_every_value_in_the_fewest_bytes(values: list[int]) -> None:
    got = narrow(array("q", values))
    assert list(got) == values
    sizes = {"b": 1, "h": 2, "i": 4, "q": 8}
    assert got.itemsize == sizes[got.typecode] and (
        got.typecode == "b"
        or not values
        or all(
            not all(_fits(v, smaller) for v in values)
            for smaller, n in sizes.items()
            if n < got.itemsize
        )
    )


def _fits(v: int, code: str) -> bool:
    bits = array(code).itemsize * 8
    return -(2 ** (bits - 1)) <= v < 2 ** (bits - 1)
