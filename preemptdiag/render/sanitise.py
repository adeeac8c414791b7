"""Keep terminal control out of reports.

Every string a report shows can come from a log: evidence lines, a process name the
kernel printed (16 characters any local user picks), a replica or pod name, a
signature's field. Printed raw, an escape sequence in one sets the terminal title,
plants an OSC 8 link, writes the clipboard (OSC 52) or hides the lines around it,
and a markdown ticket carries it on. So every string of a report is cleaned once,
before any renderer sees it: escape sequences (CSI, OSC, DCS and the other string
controls, 7- and 8-bit) are dropped, other control characters and bidi overrides
become U+FFFD. Tabs and newlines stay (the tool's own text uses them). Since the
report is cleaned, not the output, all four formats show the same text.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import regex  # type: ignore[import-untyped, unused-ignore]

from preemptdiag.model.records import Event, ReadWindow, Window, Windows, is_printable

T = TypeVar("T")

_SEQUENCE = regex.compile(
    r"\x1b\[[0-?]*+[ -/]*+[@-~]?"  # CSI ... final byte
    # OSC, DCS, SOS, PM, APC: the body goes with a terminator; without one only the
    # introducer (the rest is plain text once the ESC is gone)
    r"|\x1b[\]PX^_](?:[^\x07\x1b\x9c]*+(?:\x07|\x1b\\|\x9c))?"
    r"|\x1b[ -/]*+[0-~]?"  # two- and three-character escapes
    r"|\x9b[0-?]*+[ -/]*+[@-~]?"  # 8-bit CSI
    r"|[\x90\x98\x9d\x9e\x9f](?:[^\x07\x1b\x9c]*+(?:\x07|\x1b\\|\x9c))?"  # 8-bit strings
)
_CONTROL = regex.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean(text: str) -> str:
    """`text` without escape sequences; other control characters as U+FFFD."""
    # isprintable() is false for every character _CONTROL matches (test_sanitise
    # checks all of Unicode), so a printable text needs no search: 0.5 us, not 3.
    if text.isprintable() or _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub("\ufffd", _SEQUENCE.sub("", text))


def sanitised(obj: T) -> T:
    """`obj` (a report or any part of it) with every string in it cleaned; parts
    with nothing to clean are returned as they are."""
    return _Walk().walk(obj)  # type: ignore[no-any-return]


# What a value of a type is to the walk. Decided once per type and run: a month of
# windows holds a million values, and is_dataclass/isinstance(Mapping) per value
# were most of the time.
_ATOM, _STR, _DATACLASS, _SEQ, _MAP, _WINDOWS = range(6)


def _kind_of(t: type) -> int:
    if t is str:
        return _STR
    # dataclasses.is_dataclass(obj) and not isinstance(obj, type), for obj of type t
    if hasattr(t, "__dataclass_fields__") and not issubclass(t, type):
        return _DATACLASS
    if t in (tuple, list):
        return _SEQ
    if issubclass(t, Windows):
        return _WINDOWS
    if issubclass(t, Mapping):
        return _MAP
    return _ATOM


Plan = tuple[Callable[[tuple[Any, ...]], tuple[Any, ...]], tuple[int, ...], tuple[int, ...]]


class _Walk:
    """One sanitised() call, as fast as a report of a month of windows needs.

    Per value it is the old recursion (strings cleaned; dataclasses, tuples, lists
    and mappings walked; anything else kept), with what it learns remembered for
    the rest of the call: what each type is; the distinct texts seen, clean or with
    their cleaned form; for each combination of value types in a row of values (a
    dataclass's fields, a tuple, a mapping's keys or values) which positions hold
    strings and which hold parts to walk (a Window's ints, floats and datetimes are
    not looked at one by one, and its strings are checked against the clean ones in
    one set operation); and the result for each dataclass instance or container, by
    id (the object kept alive so its id is not reused), so evidence shared by
    windows and the verdict is walked once."""

    def __init__(self) -> None:
        self.kinds: dict[type, int] = {}
        self.fields: dict[type, tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]] = {}
        self.plans: dict[tuple[type, ...], Plan] = {}
        self.clean: set[str] = set()  # texts seen that are clean
        self.cleaned: dict[str, str] = {}  # texts seen that are not, cleaned
        self.done: dict[int, tuple[Any, Any]] = {}

    def kind(self, t: type) -> int:
        kind = self.kinds.get(t)
        if kind is None:
            kind = self.kinds[t] = _kind_of(t)
        return kind

    def walk(self, obj: Any) -> Any:
        kind = self.kind(type(obj))
        if kind == _ATOM:
            return obj
        if kind == _STR:
            return self.text(obj)
        seen = self.done.get(id(obj))
        if seen is not None:
            return seen[1]
        if kind == _DATACLASS:
            if type(obj) is Window:
                new = obj if self._clean_window(obj) else self._dataclass(obj)
            elif isinstance(obj, ReadWindow) and _printable(obj.texts()):
                new = obj  # (its texts at once, without making its evidence event)
            else:
                new = self._dataclass(obj)
        elif kind == _SEQ:
            new = self._seq(obj)
        elif kind == _WINDOWS:
            new = self._windows(obj)
        else:
            new = self._map(obj)
        self.done[id(obj)] = (obj, new)
        return new

    def text(self, obj: str) -> str:
        # A clean text comes back itself, not an equal one seen before: a part whose
        # strings are all clean is returned as it is.
        if obj in self.clean:
            return obj
        got = self.cleaned.get(obj)
        if got is None:
            got = clean(obj)
            if got is obj:
                self.clean.add(obj)
                return obj
            self.cleaned[obj] = got
        return got

    def _clean(self, obj: str) -> bool:
        return type(obj) is str and (obj in self.clean or self.text(obj) is obj)

    def _clean_window(self, w: Window) -> bool:
        """Whether the walk would leave w as it is, found without it: a month of
        windows is 43,200 of them, and the walk took ~12 us each (the same answer:
        a Window's other fields are numbers, times and enums, test_sanitise_walk
        checks; anything this does not know goes the walk's way)."""
        return (
            self._clean(w.replica)
            and self._clean(w.why)
            and type(w.evidence) is tuple
            and all(self._clean_event(e) for e in w.evidence)
        )

    def _clean_event(self, e: Event) -> bool:
        if type(e) is not Event or e.rollup is not None or type(e.fields) is not dict:
            return False
        clean = self._clean
        if not (
            clean(e.source)
            and clean(e.sig)
            and clean(e.text)
            and (e.proc is None or clean(e.proc))
            and clean(e.replica)
            and clean(e.engine)
        ):
            return False
        for k, v in e.fields.items():
            t = type(v)
            if type(k) is not str or not clean(k) or (t is str and not clean(v)):
                return False
            if t is not str and t not in _NUMBERS:
                return False
        return True

    def _plan(self, row: tuple[Any, ...]) -> Plan:
        """For the types of `row`'s values: a getter of its strings, their positions,
        and the positions of the other parts to walk."""
        shape = tuple(map(type, row))
        plan = self.plans.get(shape)
        if plan is None:
            kinds = [self.kind(t) for t in shape]
            texts = tuple(i for i, k in enumerate(kinds) if k == _STR)
            parts = tuple(i for i, k in enumerate(kinds) if k not in (_ATOM, _STR))
            get: Callable[[tuple[Any, ...]], tuple[Any, ...]]
            if len(texts) == 1:
                get = partial(_one, texts[0])
            else:
                get = operator.itemgetter(*texts) if texts else _none
            plan = self.plans[shape] = (get, texts, parts)
        return plan

    def _row(self, row: tuple[Any, ...]) -> dict[int, Any]:
        """Position -> new value, for the values of `row` the walk changes."""
        get, texts, parts = self._plan(row)
        changes = {}
        if texts and not self.clean.issuperset(get(row)):
            for i in texts:
                new = self.text(row[i])
                if new is not row[i]:
                    changes[i] = new
        for i in parts:
            new = self.walk(row[i])
            if new is not row[i]:
                changes[i] = new
        return changes

    def _dataclass(self, obj: Any) -> Any:
        t = type(obj)
        got = self.fields.get(t)
        if got is None:
            names = tuple(f.name for f in dataclasses.fields(obj))
            getter: Callable[[Any], tuple[Any, ...]]
            if len(names) == 1:
                getter = partial(_one_attr, operator.attrgetter(names[0]))
            else:
                getter = operator.attrgetter(*names) if names else _none
            got = self.fields[t] = (names, getter)
        names, values = got
        changes = self._row(values(obj))
        if not changes:
            return obj
        return dataclasses.replace(obj, **{names[i]: v for i, v in changes.items()})

    def _seq(self, obj: tuple[Any, ...] | list[Any]) -> Any:
        row = obj if type(obj) is tuple else tuple(obj)
        changes = self._long(row) if len(row) >= _MANY else self._row(row)
        if not changes:
            return obj
        items = list(obj)
        for i, v in changes.items():
            items[i] = v
        return type(obj)(items)

    def _long(self, items: tuple[Any, ...]) -> dict[int, Any]:
        """_row of a long sequence (a month's windows): each run of ReadWindows of one
        class whose texts are all printable (ReadWindow.printable, the run at once)
        is left as it is; every other item is walked."""
        changes = {}
        at = 0
        for kind, run in itertools.groupby(items, type):
            group = list(run)
            if not (issubclass(kind, ReadWindow) and kind.printable(group)):
                for i, item in enumerate(group, at):
                    new = self.walk(item)
                    if new is not item:
                        changes[i] = new
            at += len(group)
        return changes

    def _windows(self, obj: Windows) -> Windows:
        """A report's windows, a run at a time (Windows.runs): a run of ReadWindows
        whose texts are all printable is left as it is, without making its windows;
        every other window is walked."""
        parts: list[Sequence[Any]] = []
        changed = False
        for kind, run in obj.runs():
            if issubclass(kind, ReadWindow) and kind.printable(run):  # type: ignore[arg-type]
                parts.append(run)
                continue
            items = list(run)
            new = [self.walk(w) for w in items]
            changed = changed or any(a is not b for a, b in zip(new, items, strict=True))
            parts.append(new)
        return Windows(parts) if changed else obj

    def _map(self, obj: Mapping[Any, Any]) -> Any:
        if (self.clean.issuperset(obj) or not self._row(tuple(obj))) and not self._row(
            tuple(obj.values())
        ):
            return obj
        return dict([(self.walk(k), self.walk(v)) for k, v in obj.items()])


_NUMBERS = frozenset((int, float, bool, type(None)))
_MANY = 64  # (a sequence this long is looked at for runs of ReadWindows first)


def _printable(texts: list[str] | None) -> bool:
    """Whether every text is clean, found in one call: a joined text is printable
    only if each is, and isprintable() is false for every character clean() changes
    (a text with one goes the walk's way)."""
    return texts is not None and is_printable("".join(texts))


def _one(i: int, row: tuple[Any, ...]) -> tuple[Any, ...]:
    return (row[i],)


def _one_attr(get: Callable[[Any], Any], obj: Any) -> tuple[Any, ...]:
    return (get(obj),)


def _none(_: Any) -> tuple[Any, ...]:
    return ()
