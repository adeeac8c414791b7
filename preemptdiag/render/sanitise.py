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
from collections.abc import Mapping
from typing import Any, TypeVar

import regex  # type: ignore[import-untyped, unused-ignore]

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
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub("\ufffd", _SEQUENCE.sub("", text))


def sanitised(obj: T) -> T:
    """`obj` (a report or any part of it) with every string in it cleaned; parts
    with nothing to clean are returned as they are."""
    return _walk(obj)  # type: ignore[no-any-return]


def _walk(obj: Any) -> Any:
    if type(obj) is str:
        return clean(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            new = _walk(value)
            if new is not value:
                changes[f.name] = new
        return dataclasses.replace(obj, **changes) if changes else obj
    if type(obj) in (tuple, list):
        items = [_walk(v) for v in obj]
        if all(a is b for a, b in zip(items, obj, strict=True)):
            return obj
        return type(obj)(items)
    if isinstance(obj, Mapping):
        pairs = [(_walk(k), _walk(v)) for k, v in obj.items()]
        if all(a is k and b is v for (a, b), (k, v) in zip(pairs, obj.items(), strict=True)):
            return obj
        return dict(pairs)
    return obj
