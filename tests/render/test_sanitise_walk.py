"""sanitised() walks a report once, remembering what it has seen; it must give what
the plain recursion gives (kept here as the reference), shared parts included."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from builders import make_event, make_window
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptdiag.model.records import Event, Kind, Window
from preemptdiag.render.sanitise import _CONTROL, clean, sanitised


def reference(obj: Any) -> Any:
    """sanitise._walk before it remembered anything."""
    if type(obj) is str:
        return clean(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            new = reference(value)
            if new is not value:
                changes[f.name] = new
        return dataclasses.replace(obj, **changes) if changes else obj
    if type(obj) in (tuple, list):
        items = [reference(v) for v in obj]
        if all(a is b for a, b in zip(items, obj, strict=True)):
            return obj
        return type(obj)(items)
    if isinstance(obj, Mapping):
        pairs = [(reference(k), reference(v)) for k, v in obj.items()]
        if all(a is k and b is v for (a, b), (k, v) in zip(pairs, obj.items(), strict=True)):
            return obj
        return dict(pairs)
    return obj


def test_no_character_the_cleaner_replaces_is_printable() -> None:
    # clean() skips its search on a printable text: sound only while this holds.
    everything = "".join(map(chr, range(0x110000)))
    hits = [m[0] for m in _CONTROL.finditer(everything)]
    assert len(hits) > 60
    assert not any(c.isprintable() for c in hits)


DIRTY = "WARNING preempted \x1b]0;pwn\x07 \u202eevil \x9b31m"


def _windows_sharing(evidence_text: str) -> list[Window]:
    shared = make_event(Kind.PREEMPTION, {"cumulative": 51, "note\x07": "x\u2066y"})
    shared = dataclasses.replace(shared, text=evidence_text)
    calm = make_event(Kind.STATS, {"kv_usage": 50.0}, minute=1)
    return [
        make_window(0, evidence=(shared, calm)),
        make_window(1, evidence=(shared,), why="why \x1b[31mred"),
        make_window(2, evidence=(calm,)),
    ]


def test_evidence_shared_by_two_windows_is_cleaned_in_both() -> None:
    windows = _windows_sharing(DIRTY)
    got = sanitised(windows)
    assert got == reference(windows)
    for w in got[:2]:
        assert w.evidence[0].text == "WARNING preempted  \ufffdevil "
        assert w.evidence[0].fields == {"cumulative": 51, "note\ufffd": "x\ufffdy"}
    assert got[1].why == "why red"
    # parts with nothing to clean come back as they were
    assert got[2] is windows[2]
    assert got[0].evidence[1] is windows[0].evidence[1]


def test_a_clean_text_equal_to_one_seen_before_is_kept_itself() -> None:
    a = "".join(["rep", "lica"])
    b = "".join(["repl", "ica"])
    assert a == b and a is not b
    ws = [make_window(0, replica=a), make_window(1, replica=b)]
    got = sanitised(ws)
    assert got is ws
    assert got[1].replica is b


@dataclass(frozen=True)
class Box:
    name: Any
    items: Any = ()


_TEXT = st.sampled_from(["ok", "tab\tand\nnewline", "\x1b[2J", "\x07", "\u202e", "é", ""])
_LEAF = st.one_of(_TEXT, st.integers(), st.floats(allow_nan=False), st.none(), st.booleans())
_TREE = st.recursive(
    _LEAF,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.lists(kids, max_size=4).map(tuple),
        st.dictionaries(st.one_of(_TEXT, st.integers()), kids, max_size=4),
        st.builds(Box, kids, kids),
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_TREE, max_size=4))
def test_sanitised_is_the_plain_recursion(parts: list[Any]) -> None:
    # the same parts twice: the second time comes from what the walk remembered
    tree = [parts, tuple(parts), Box(parts, parts)]
    got = sanitised(tree)
    want = reference(tree)
    assert got == want
    assert (got is tree) == (want is tree)


# Windows and their events go a shorter way when nothing in them needs cleaning
# (sanitise._clean_window); it must answer as the walk does, whatever they hold.
_FIELD_VALUE = st.one_of(_TEXT, st.integers(), st.floats(allow_nan=False), st.none(), _TREE)
_EVENT = st.builds(
    lambda text, source, proc, replica, engine, fields, rollup: dataclasses.replace(
        make_event(Kind.STATS, fields, source=source),
        text=text,
        proc=proc,
        replica=replica,
        engine=engine,
        rollup=rollup,
    ),
    _TEXT,
    _TEXT,
    st.one_of(st.none(), _TEXT),
    _TEXT,
    _TEXT,
    st.dictionaries(st.one_of(_TEXT, st.integers()), _FIELD_VALUE, max_size=3),
    st.none(),
)
_WINDOW = st.builds(
    lambda minute, replica, why, evidence: make_window(
        minute, replica=replica, why=why, evidence=evidence
    ),
    st.integers(0, 3),
    _TEXT,
    _TEXT,
    st.one_of(st.lists(_EVENT, max_size=3).map(tuple), st.lists(_EVENT, max_size=2)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_WINDOW, max_size=4))
def test_windows_the_short_way_are_the_plain_recursion(windows: list[Window]) -> None:
    tree = (windows, [w.evidence for w in windows])
    got = sanitised(tree)
    want = reference(tree)
    assert got == want
    for a, b, w in zip(got[0], want[0], windows, strict=True):
        assert (a is w) == (b is w)


def test_the_short_way_knows_every_field_that_can_hold_text() -> None:
    # _clean_window reads replica, why and evidence of a Window, and of an Event its
    # texts, fields and rollup: a new field of another type must be added there.
    def texts(cls: type) -> set[str]:
        return {
            f.name
            for f in dataclasses.fields(cls)
            if not any(
                t in str(f.type)
                for t in ("int", "float", "bool", "datetime", "Class", "Confidence", "Kind")
            )
            or "str" in str(f.type)
            or "Mapping" in str(f.type)
        }

    assert texts(Window) == {"replica", "why", "evidence"}
    assert texts(Event) == {
        "source",
        "sig",
        "fields",
        "text",
        "proc",
        "replica",
        "engine",
        "rollup",
    }


def test_a_clean_window_comes_back_itself_and_a_dirty_one_cleaned() -> None:
    calm = make_event(Kind.STATS, {"kv_usage": 50.0, "kv_device": "GPU"})
    dirty = dataclasses.replace(calm, proc="vllm\x1b[2J")
    ws = [make_window(0, evidence=(calm,)), make_window(1, evidence=(dirty,))]
    got = sanitised(ws)
    assert got[0] is ws[0]
    assert got[1].evidence[0].proc == "vllm"
    assert got[1].evidence[0].fields is calm.fields
