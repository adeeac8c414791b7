"""records.Columns: the calm minutes a --jobs worker sends, as plain Python columns
(read without polars, so the parent never imports it), and lane.plain_columns, which
makes them from the lane's polars frame."""

from __future__ import annotations

import math
import pickle
import weakref
from array import array
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptdiag.model import records
from preemptdiag.model.records import CALM_COLUMNS, Columns, Const, Packed, PackedNumbers, column_of
from preemptdiag.scan import lane, rust_regex
from preemptdiag.scan.lane import plain_columns
from preemptdiag.scan.signatures import load as load_signatures


def _table() -> Columns:
    return Columns(
        ("line", "kv", "text"),
        (array("q", [10, 11, 12]), array("d", [1.5, -0.0, 3.0]), ["a", "b", "a"]),
    )


def test_its_rows_columns_and_height() -> None:
    t = _table()
    assert t.height == 3
    assert list(t.rows()) == [(10, 1.5, "a"), (11, -0.0, "b"), (12, 3.0, "a")]
    assert list(t.rows("text", "line")) == [("a", 10), ("b", 11), ("a", 12)]
    assert t.column("kv") is t.data[1]
    with pytest.raises(ValueError):
        t.column("nope")
    assert Columns((), ()).height == 0


def test_shifted_adds_to_the_named_columns_only_and_keeps_them_arrays() -> None:
    t = _table()
    moved = t.shifted(("line",), 1000)
    assert list(moved.column("line")) == [1010, 1011, 1012]
    # (narrowed: records.narrow, the fewest bytes that hold them)
    assert isinstance(moved.column("line"), array) and moved.column("line").typecode == "h"
    assert moved.column("kv") is t.column("kv") and moved.column("text") is t.column("text")
    assert list(t.column("line")) == [10, 11, 12]  # (the table itself is left as it was)
    listed = Columns(("line",), ([1, 2],)).shifted(("line",), 5)
    assert listed.column("line") == [6, 7]


def test_it_pickles_as_arrays_and_can_be_watched_going() -> None:
    t = _table()
    back = pickle.loads(pickle.dumps(t))
    assert back == t and isinstance(back.column("kv"), array)
    ref = weakref.ref(back)
    del back
    assert ref() is None


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same type; NaN is NaN, and -0.0 is not 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    return bool(a == b)


@pytest.mark.parametrize(
    ("series", "kind"),
    [
        (pl.Series([1.5, -0.0, float("nan"), float("inf")], dtype=pl.Float64), "d"),
        (pl.Series([1, -2, 2**62], dtype=pl.Int64), "q"),
        # (ints in the fewest bytes that hold them: records.narrow)
        (pl.Series([3, 4, 5], dtype=pl.Int32), "b"),
        (pl.Series([3, -400, 5], dtype=pl.Int32), "h"),
        (pl.Series([3, 4, 70_000], dtype=pl.UInt32), "i"),
        (pl.Series([2**64 - 1, 1, 2], dtype=pl.UInt64), list),  # (past int64)
        (pl.Series([1.0, None, 2.0], dtype=pl.Float64), list),  # (a gap: None, not NaN)
        (pl.Series([1, None, 2], dtype=pl.Int64), list),
        (pl.Series([None, None, None], dtype=pl.Float64), list),
        (pl.Series([True, False, True], dtype=pl.Boolean), list),
        (pl.Series(["GPU", "GPU", "CPU", "GPU"], dtype=pl.Utf8), list),
        (pl.Series(["a line", "another", "a third"], dtype=pl.Utf8), list),
        (pl.Series([1.0, 2.0], dtype=pl.Float32), list),
    ],
)
def test_plain_columns_gives_what_to_list_gives(series: pl.Series, kind: Any) -> None:
    got = plain_columns(pl.DataFrame({"c": series})).column("c")
    if kind is list:
        assert type(got) is list
    else:
        assert isinstance(got, array) and got.typecode == kind
    want = series.to_list()
    assert len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want, strict=True))


def test_plain_columns_makes_equal_strings_of_a_column_one_object() -> None:
    frame = pl.DataFrame(
        {
            "device": ["GPU", "GPU", "CPU", "GPU"],
            "text": ["line one", "line two", "line three", "line one"],
        }
    )
    t = plain_columns(frame)
    assert t.names == ("device", "text")
    device = t.column("device")
    assert device == ["GPU", "GPU", "CPU", "GPU"]
    assert device[0] is device[1] is device[3]
    assert t.column("text") == frame.get_column("text").to_list()


@pytest.mark.parametrize(
    ("values", "code", "kind"),
    [
        ([0.0] * 8, "d", Const),
        ([None] * 9, None, Const),
        (["GPU"] * 8, None, Const),
        ([7] * 8, "q", Const),
        ([0.0] * 7 + [-0.0], "d", "d"),  # (one value only with one sign)
        ([-0.0] * 8, "d", Const),
        ([1] * 7 + [1.0], None, list),  # (1 == 1.0, but not one type)
        ([1] * 7 + [True], None, list),
        ([float("nan")] * 8, "d", "d"),  # (NaN is no value equal to itself)
        ([0.0] * 7, "d", "d"),  # (under 8 rows: an array)
        ([1.0, None] * 4, "d", list),
        ([1, 2] * 4, "q", "b"),
        ([1, 2**40] * 4, "q", "q"),
        (["a", "b"] * 4, None, list),
    ],
)
def test_column_of_keeps_one_value_once(values: list[Any], code: str | None, kind: Any) -> None:
    got = column_of(values, code)
    if kind is Const:
        assert isinstance(got, Const) and got.length == len(values)
    elif kind is list:
        assert type(got) is list
    else:
        assert isinstance(got, array) and got.typecode == kind
    assert len(got) == len(values)
    assert all(_same(a, b) for a, b in zip(got, values, strict=True))
    assert all(_same(got[i], values[i]) for i in range(-len(values), len(values)))


def test_const_is_a_sequence_of_its_value() -> None:
    c = Const(None, 5)
    assert list(c) == [None] * 5 and len(c) == 5
    assert c[4] is None and c[-5] is None
    with pytest.raises(IndexError):
        c[5]
    with pytest.raises(IndexError):
        c[-6]
    assert c[1:4] == Const(None, 3) and list(c[::2]) == [None] * 3
    assert c.count(None) == 5 and c.index(None) == 0 and None in c
    assert pickle.loads(pickle.dumps(c)) == c
    # shifted() adds to a Const of line numbers as to any column
    t = Columns(("line", "n"), (Const(10, 3), Const(6, 3)))
    assert list(t.shifted(["line"], 5).column("line")) == [15, 15, 15]
    assert t.shifted(["line"], 5).column("n") == Const(6, 3)


def test_plain_columns_keeps_a_column_of_one_value_once() -> None:
    frame = pl.DataFrame({"none": [None] * 10, "gpu": ["GPU"] * 10, "n": list(range(10))})
    t = plain_columns(frame)
    assert t.column("none") == Const(None, 10) and t.column("gpu") == Const("GPU", 10)
    assert isinstance(t.column("n"), array)
    # ~20 bytes pickled for a column of one value, not one a row
    assert len(pickle.dumps(Const(None, 100_000))) < 100


# records.Packed: the calm minutes' peak lines, kept compressed.

_LINES = st.lists(
    st.one_of(
        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
        st.sampled_from(["", "tab\there", "del\x7f", "\x1b[31mred", "é", "a\rb", "a\nb"]),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_LINES)
def test_packed_is_a_sequence_of_its_texts(texts: list[str]) -> None:
    packed = Packed.of(texts)
    assert packed is not None
    for got in (packed, pickle.loads(pickle.dumps(packed))):
        assert len(got) == len(texts)
        assert list(got) == texts
        assert got[:] == list(got) == texts and got[1:3] == texts[1:3]
        assert got[::2] == texts[::2] and got[3:1] == texts[3:1] == []
        assert got[-3:] == texts[-3:] and got[:-2] == texts[:-2]
        with pytest.raises(IndexError):
            got[len(texts)]
        assert [got[i] for i in range(-len(texts), len(texts))] == texts + texts
        assert got.longest == max(map(len, texts), default=0)
        # (the sanitiser's test of every text, known without opening them)
        assert got.printable is all(t.isprintable() for t in texts)
        assert got == packed
    other = Packed.of([*texts, "x"])
    assert other is not None and other != packed
    with pytest.raises(TypeError):
        hash(packed)


def test_packed_opens_the_last_read_once() -> None:
    a, b = Packed.of(["a", "b"]), Packed.of(["c"])
    assert a is not None and b is not None
    assert a._text()[0] is a._text()[0]  # (one column read after another keeps it open)
    first = a._text()[0]
    assert b[0] == "c"
    assert a._text()[0] is not first and a._text()[0] == first  # (opened again)


@pytest.mark.parametrize("texts", [["\ud800"], ["ok", "lone \udc80 surrogate"]])
def test_texts_with_a_lone_surrogate_are_not_packed(texts: list[str]) -> None:
    assert Packed.of(texts) is None


def test_a_frames_peak_lines_are_packed_when_its_calm_rows_are_made() -> None:
    sig = next(s for s in load_signatures() if s.id == "vllm.v1.stats")
    at = CALM_COLUMNS.index("peak_text")

    def frame(n: int) -> Columns:
        texts = [f"Engine 000: Avg prompt throughput: {i}.0 tokens/s" for i in range(n)]
        return Columns(
            CALM_COLUMNS, tuple(texts if j == at else Const(0, n) for j in range(len(CALM_COLUMNS)))
        )

    made = frame(lane.PACK_MIN)
    got = lane.calm_rows("a.log", sig, False, made).frame
    assert got is not None
    assert isinstance(got.data[at], Packed) and list(got.data[at]) == made.data[at]
    assert all(got.data[j] is made.data[j] for j in range(len(CALM_COLUMNS)) if j != at)
    # (a few are kept as they are)
    few = frame(lane.PACK_MIN - 1)
    got = lane.calm_rows("a.log", sig, False, few).frame
    assert got is not None and got.data[at] is few.data[at]


_NUMBERS = st.one_of(
    st.tuples(st.just("b"), st.lists(st.integers(-128, 127), max_size=200)),
    st.tuples(st.just("i"), st.lists(st.integers(-(2**31), 2**31 - 1), max_size=200)),
    st.tuples(st.just("q"), st.lists(st.sampled_from([0, 1, 2**40, -7]), max_size=200)),
    st.tuples(
        st.just("d"),
        st.lists(st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, 70.1]), max_size=200),
    ),
)


@settings(max_examples=200, deadline=None)
@given(_NUMBERS)
def test_packed_numbers_are_the_array_they_were(drawn: tuple[str, list[Any]]) -> None:
    code, values = drawn
    column = array(code, values)
    got = PackedNumbers.of(column)
    # (kept as the array where packing saves under a fifth)
    assert got is column or (
        isinstance(got, PackedNumbers) and len(got._blob) * 5 <= len(column.tobytes()) * 4
    )
    for read in (got, pickle.loads(pickle.dumps(got))):
        assert len(read) == len(values) and read.typecode == code
        assert all(_same(a, b) for a, b in zip(read, values, strict=True))
        assert all(_same(read[i], values[i]) for i in range(-len(values), len(values)))
        assert list(read[2:9]) == values[2:9] and list(read[::3]) == values[::3]
        assert read.count(values[0] if values else 0) == values.count(values[0] if values else 0)


def test_packed_numbers_are_read_right_past_the_columns_kept_open() -> None:
    columns = [array("q", [k] * 64 + list(range(64))) for k in range(300)]
    packed = [PackedNumbers.of(c) for c in columns]
    assert all(isinstance(p, PackedNumbers) for p in packed)
    for _ in range(2):  # (each opened, then opened again once the others pushed it out)
        assert all(
            p[0] == k and list(p) == list(c)
            for k, (p, c) in enumerate(zip(packed, columns, strict=True))
        )
    assert packed[0] == PackedNumbers.of(array("q", columns[0])) and packed[0] != packed[1]


def test_shifted_keeps_a_packed_column_packed_and_right() -> None:
    lines = array("q", range(10, 1010))
    packed = PackedNumbers.of(lines)
    assert isinstance(packed, PackedNumbers)
    moved = Columns(("line",), (packed,)).shifted(("line",), 1 << 40).column("line")
    assert isinstance(moved, PackedNumbers) and list(moved) == [v + (1 << 40) for v in lines]


def test_a_frames_numbers_are_packed_when_its_calm_rows_are_made() -> None:
    sig = next(s for s in load_signatures() if s.id == "vllm.v1.stats")
    n = lane.PACK_MIN
    numbers = array("d", [float(i % 3) for i in range(n)])
    data = tuple(numbers if name == "sum_kv_usage" else Const(0, n) for name in CALM_COLUMNS)
    got = lane.calm_rows("a.log", sig, False, Columns(CALM_COLUMNS, data)).frame
    assert got is not None
    column = got.column("sum_kv_usage")
    assert isinstance(column, PackedNumbers) and list(column) == list(numbers)
    few = tuple(c[: n - 1] for c in data)
    kept = lane.calm_rows("a.log", sig, False, Columns(CALM_COLUMNS, few)).frame
    assert kept is not None and isinstance(kept.column("sum_kv_usage"), array)


def test_columns_packed_while_a_run_spills_keep_their_bytes_in_its_file() -> None:
    texts = [f"(APIServer pid=1) INFO line {i} with some text" for i in range(400)]
    numbers = array("q", [i // 7 for i in range(4000)])
    with records.spilling():
        packed, packed_numbers = Packed.of(texts), PackedNumbers.of(numbers)
        small = PackedNumbers.of(array("q", [0] * 200))  # (under SPILL_MIN packed)
        store = records._SPILL
    assert packed is not None and isinstance(packed_numbers, PackedNumbers)
    assert isinstance(small, PackedNumbers) and isinstance(small._blob, bytes)
    assert records._SPILL is None  # (only while the run spills)
    for column in (packed, packed_numbers):
        assert isinstance(column._blob, records._Spilled) and column._blob.store is store
    assert packed._ends is None  # (where each text ends is in the file too)
    # Read back after the run: the columns hold the file open while they live.
    assert list(packed) == texts and packed[7] == texts[7] and len(packed) == 400
    assert list(packed_numbers) == list(numbers) and packed_numbers[3999] == numbers[3999]
    # Pickled (a --jobs worker's result) as their bytes, loaded in memory outside a run.
    for column in (packed, packed_numbers):
        loaded = pickle.loads(pickle.dumps(column))
        assert isinstance(loaded._blob, bytes) and loaded == column
    # ...and into the run's file inside one (the parent loads a worker's result so).
    with records.spilling():
        loaded_n = pickle.loads(pickle.dumps(packed_numbers))
    assert isinstance(loaded_n._blob, records._Spilled) and list(loaded_n) == list(numbers)
    gone = weakref.ref(store)
    del packed, packed_numbers, column, store
    records._NUMBERS.clear()  # (the columns opened last are kept open: let them go)
    records._OPEN = None
    assert gone() is None  # (the file closes with the last column spilled to it)


def test_a_run_that_cannot_spill_keeps_its_columns_in_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full(*_: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records.os, "pwrite", full)
    numbers = array("q", [i // 7 for i in range(4000)])
    with records.spilling():
        first, second = PackedNumbers.of(numbers), PackedNumbers.of(numbers)
    for got in (first, second):
        assert isinstance(got, PackedNumbers) and isinstance(got._blob, bytes)
        assert list(got) == list(numbers)


def test_a_jobs_worker_never_writes_to_its_parents_spill_file() -> None:
    import signal

    from preemptdiag.scan import parallel

    before, forked = signal.getsignal(signal.SIGINT), rust_regex._FORKED_WITH_POLARS
    try:
        with records.spilling():
            parallel._worker_init()  # (what a forked worker runs first)
            assert records._SPILL is None
            column = PackedNumbers.of(array("q", [i // 7 for i in range(4000)]))
            assert isinstance(column, PackedNumbers) and isinstance(column._blob, bytes)
    finally:
        signal.signal(signal.SIGINT, before)
        rust_regex._FORKED_WITH_POLARS = forked


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "extend", "add"]),
            st.lists(st.sampled_from(["a", "b", "", "a"]), max_size=6),
        ),
        max_size=8,
    ),
    st.integers(-20, 20),
    st.integers(-20, 20),
)
def test_repeats_are_the_list_they_stand_for(
    steps: list[tuple[str, list[str]]], a: int, b: int
) -> None:
    got, want = records.Repeats(), list[str]()
    for how, values in steps:
        if how == "append":
            for v in values:
                got.append(v)
        elif how == "extend":
            got.extend(values)
        else:  # (each value as many times as the values drawn: 0 to 6)
            for v in values:
                got.add(v, len(values))
            values = [v for v in values for _ in values]
        want += values
    got.add("z", 0)  # (no times: nothing added, no empty run)
    assert len(got) == len(want) and list(got) == want and got == want
    assert [got[i] for i in range(-len(want), len(want))] == want + want
    assert got[a:b] == want[a:b] and got[::2] == want[::2] and got[a:] == want[a:]
    assert all(list(got.iterate(k)) == want[k:] for k in range(len(want) + 1))
    assert all(got.count(v) == want.count(v) for v in ("a", "b", "", "z"))
    # Held a run at a time: as many runs as the values change.
    runs = list(got.runs())
    assert len(runs) == sum(1 for i, v in enumerate(want) if not i or want[i - 1] != v)
    assert [v for v, lo, hi in runs for _ in range(lo, hi)] == want
    with pytest.raises(IndexError):
        got[len(want)]


def test_repeats_by_identity_keep_equal_times_of_other_zones_apart() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    utc = datetime(2026, 6, 3, 10, tzinfo=UTC)
    paris = utc.astimezone(timezone(timedelta(hours=2)))
    got = records.Repeats([utc, utc, paris], identity=True)
    assert utc == paris and [v.tzinfo for v in got] == [UTC, UTC, paris.tzinfo]
    assert len(list(got.runs())) == 2
    assert len(list(records.Repeats([utc, paris]).runs())) == 1  # (by ==: one run)
