"""Where a log line quotes request text: a prompt, a completion, a request body.

Engines and clients log what users sent: vLLM's `Received request …: prompt: '…'`,
SGLang's `Receive: obj=GenerateReqInput(text='…')` and `Finish: … out={'text': …}`,
TGI's JSON `"inputs"`, LangChain's `Prompt after formatting:`, an OpenAI error's
`message="…"`. User text can quote any signal line ("KV cache pool is full…"), so
the same definition serves two stages: the scanner treats a match inside request
text as a decoy, never evidence (scan/matcher.py), and the redactor replaces the
text in every echoed line (render/redact.py). One list, so a shape the redactor
knows can never count as evidence, and the other way round.

A span runs from the key to where the quoted text ends: a real warning glued after
the closing quote is evidence again. A quote left open at the end of the line (a
truncated repr, a multi-line prompt) runs to the end of the line and on to the lines
below that open no record of their own, up to the closing quote; so does the text
below a key that ends its line (`Prompt after formatting:`). Unquoted text after a
key (`Prompt: …`) ends with its line, unless a narrow terminal wrapped that line.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import ahocorasick_rs
import regex  # type: ignore[import-untyped, unused-ignore]

# A quoted Python repr / JSON string on one line, closed or cut off (then it runs to
# the end of the line). A \r is no line end inside a line: the scanner reads it as a
# space (tqdm redraws, vLLM's multi-line records), so request text runs on past it.
# Escapes are consumed in pairs so `\'` does not close a single-quoted repr; a value
# that starts with a redaction marker is not text. The body is written unrolled
# (plain characters as one class run, then escape + run, possessive): the same
# strings as `(?:[^'\\\n]|\\[^\n])*+`, 3x faster on a prompt of a few KB, because
# the regex engine runs a class repetition without trying an alternation per
# character (a prompt line of the request-logging bench: 365 -> 120 us;
# tests/test_request_text.py holds the two forms to the same matches).
SQ = r"'(?!\[REDACTED:)[^'\\\n]*+(?:\\[^\n][^'\\\n]*+)*+(?:'|\\?(?=\n|\Z))"
DQ = r'"(?!\[REDACTED:)[^"\\\n]*+(?:\\[^\n][^"\\\n]*+)*+(?:"|\\?(?=\n|\Z))'
SQ_CLOSED = r"'[^'\\\n]*+(?:\\[^\n][^'\\\n]*+)*+'"
DQ_CLOSED = r'"[^"\\\n]*+(?:\\[^\n][^"\\\n]*+)*+"'


@dataclass(frozen=True, slots=True)
class Shape:
    """One way request text is logged. `pattern` names its groups `<name>_k` (the
    key, kept by the redactor) and `<name>_v` (the text); `triggers` are literals
    the pattern cannot match without (a cheap test before the regex runs)."""

    name: str
    pattern: str
    triggers: tuple[str, ...]


_BODY_KEYS = ("prompt", "messages", "content", "input", "inputs", "text")
_REQTEXT_KEYS = ("prompt", "prompt_text", "text", "inputs", "message")

SHAPES: tuple[Shape, ...] = (
    # vLLM request log: `prompt: %r` (the repr picks " when the text holds a '), and
    # the offline examples' `Prompt: %r, Generated text: %r`.
    Shape(
        "prompt",
        rf"(?P<prompt_k>\b(?:prompt|Prompt|PROMPT|Generated text):[ ])(?P<prompt_v>{SQ}|{DQ})",
        ("prompt: ", "Prompt: ", "PROMPT: ", "Generated text: "),
    ),
    Shape(
        "ids",
        r"(?P<ids_k>\bprompt_token_ids:[ ]?)"
        r"(?P<ids_v>\[(?!REDACTED:)[^\]\n]*+(?:\]|(?=\n|\Z)))",
        ("prompt_token_ids:",),
    ),
    # JSON bodies and Python dict reprs: "prompt"/"messages"/"content"/"input(s)"/"text"
    # (TGI's `{"inputs": …}`, SGLang's `out={'text': …}`).
    Shape(
        "body",
        # the key's quote must open a key (line start, space, `{`, `,`, `[`, `(`),
        # not close a value just redacted
        r"(?P<body_k>(?<![^\s{,\[(])[\"'](?:" + "|".join(_BODY_KEYS) + r")[\"']\s*+:\s*+)"
        rf"(?P<body_v>{SQ}|{DQ}"
        # a whole array, nested arrays and strings included (recursion) ...
        r"|(?P<body_arr>\[(?!REDACTED:)(?:[^\[\]\"'\n]++"
        rf"|{DQ_CLOSED}|{SQ_CLOSED}|(?&body_arr))*+\])"
        # ... or, when it does not close on this line, the rest of the line
        r"|\[(?!REDACTED:)[^\n]*+)",
        tuple(f"{k}{q}" for k in _BODY_KEYS for q in "\"'"),
    ),
    # Other reprs: prompt='…', text="…", prompt:'…', llm.generate(prompt="…"),
    # GenerateReqInput(text='…'), Request(prompt_text='…'), an OpenAI error's message="…".
    Shape(
        "reqtext",
        r"(?P<reqtext_k>(?<![A-Za-z0-9_])(?:" + "|".join(_REQTEXT_KEYS) + r")(?:=|:(?! )))"
        rf"(?P<reqtext_v>{SQ}|{DQ})",
        tuple(f"{k}{s}" for k in _REQTEXT_KEYS for s in ("=", ":'", ':"')),
    ),
    # Unquoted: `Prompt: …` and LangChain's `Prompt after formatting:` print the text
    # raw, to the end of the line and on below.
    Shape(
        "rawprompt",
        # (LangChain's phrase is distinctive enough to be found glued to a word)
        r"(?P<rawprompt_k>(?:(?<![A-Za-z0-9_])(?:[Pp]rompt|PROMPT)|Prompt after formatting):[ ]*+)"
        r"(?P<rawprompt_v>(?![\"'\[ ])(?!\[REDACTED:)[^\n]*+|(?=\n|\Z))",
        ("prompt:", "Prompt:", "PROMPT:", "after formatting:"),
    ),
)
NAMES = tuple(s.name for s in SHAPES)
TRIGGERS = tuple(dict.fromkeys(t for s in SHAPES for t in s.triggers))
TRIGGER_BYTES = tuple(t.encode() for t in TRIGGERS)
# Which triggers a text holds. Every candidate line of every log is asked (the
# scanner's raw-bytes decoy test, then each request-text search), and 36 `in` tests
# cost ~4 us a line, and ~30 us on a prompt of a few KB (each absent trigger scans it
# whole). One Aho-Corasick pass (ahocorasick-rs, the prefilter's fallback) lists them
# all, overlapping (`prompt:` inside `prompt: ` counts for both shapes), in ~0.5 us.
# A listing is as long as the text is dense in triggers (a 1 MiB line of `prompt: `
# repeated: 0.3 s and 34 MiB), so texts over _LISTED_AT_MOST take the searches that
# stop at the first (13 ms for that line, as before).
_FIND_TRIGGERS = ahocorasick_rs.AhoCorasick(list(TRIGGERS))
_FIND_TRIGGER_BYTES = ahocorasick_rs.BytesAhoCorasick(list(TRIGGER_BYTES))
_SHAPES_OF = tuple(frozenset(k for k, s in enumerate(SHAPES) if t in s.triggers) for t in TRIGGERS)
_ANY_TRIGGER_BYTES = re.compile(b"|".join(map(re.escape, TRIGGER_BYTES)))
_LONGEST_TRIGGER = max(map(len, TRIGGER_BYTES))
_LISTED_AT_MOST = 16 << 10  # characters (bytes): at most ~2,000 matches listed


@dataclass(frozen=True, slots=True)
class Span:
    """Request text from `start` (its key) to `end`; `open` is what keeps it going past
    the line: the quote still open, "raw" for unquoted text, None when closed."""

    start: int
    end: int
    open: str | None
    shape: str = ""


@cache
def _combined(names: tuple[str, ...]) -> regex.Pattern[str]:
    by_name = {s.name: s.pattern for s in SHAPES}
    return regex.compile("|".join(f"(?P<{n}>{by_name[n]})" for n in names), regex.VERSION1)


def triggered(text: str) -> tuple[str, ...]:
    """The shapes whose triggers are in `text`, in SHAPES order."""
    if len(text) > _LISTED_AT_MOST:
        return tuple(s.name for s in SHAPES if any(t in text for t in s.triggers))
    found = _FIND_TRIGGERS.find_matches_as_indexes(text, overlapping=True)
    if not found:
        return ()
    shapes = frozenset().union(*(_SHAPES_OF[i] for i, _, _ in found))
    return tuple(s.name for k, s in enumerate(SHAPES) if k in shapes)


def trigger_starts_in(buf: bytes | bytearray, start: int, last: int) -> bool:
    """Whether a trigger starts in buf[start:last + 1] (it may run on past `last`)."""
    if last < start:
        return False
    end = last + _LONGEST_TRIGGER
    if end - start > _LISTED_AT_MOST:
        # The leftmost trigger: if it starts after `last`, none starts before.
        m = _ANY_TRIGGER_BYTES.search(buf, start, end)
        return m is not None and m.start() <= last
    found = _FIND_TRIGGER_BYTES.find_matches_as_indexes(
        memoryview(buf)[start:end], overlapping=True
    )
    return any(at <= last - start for _, at, _ in found)


def combined(names: tuple[str, ...]) -> regex.Pattern[str]:
    """One pattern of the named shapes, each its own named group; compiled once."""
    return _combined(names)


def is_closed(value: str) -> bool:
    """Whether a quoted value ends with its own quote (not an escaped one)."""
    if len(value) < 2 or value[-1] != value[0]:
        return False
    body = value[1:-1]
    return (len(body) - len(body.rstrip("\\"))) % 2 == 0


def spans(text: str) -> list[Span]:
    """The request text in one line, left to right.

    A \r in a raw line joins what it separates: a line a terminal wrapped whose
    newlines became \r (mixed line ends) holds its key cut in two (`mes\rsage='…`),
    and the key must be found whole (fuzz seed 8081 input 9045)."""
    if "\r" not in text:
        return _spans(text)
    kept = [i for i, c in enumerate(text) if c != "\r"]
    kept.append(len(text))
    return [
        Span(kept[sp.start], kept[sp.end], sp.open, sp.shape)
        for sp in _spans(text.replace("\r", ""))
    ]


def _spans(text: str) -> list[Span]:
    names = triggered(text)
    if not names:
        return []
    out: list[Span] = []
    for m in combined(names).finditer(text):
        name = next(n for n in names if m.group(n) is not None)
        value = m[f"{name}_v"]
        if name == "rawprompt":
            # Text on the key's line ends with it; a key alone (LangChain's
            # `Prompt after formatting:`) has its text on the lines below.
            still: str | None = None if value else "raw"
        elif value[:1] in "\"'" and not is_closed(value):
            still = value[0]
        elif value[:1] == "[" and not value.endswith("]"):
            still = "raw"  # a body cut mid-array: its end is not on this line
        else:
            still = None
        out.append(Span(m.start(), m.end(), still, name))
    return out


def inside(pos: int, found: Sequence[Span]) -> bool:
    """Whether `pos` is in one of `found` (sorted by start, not overlapping, as
    `spans` gives them): a bisection, as a line of glued records has thousands."""
    i = bisect.bisect_right(found, pos, key=lambda s: s.start) - 1
    return i >= 0 and pos < found[i].end


def closing_quote(text: str, quote: str) -> int:
    """Where a quote left open on a line above closes in `text` (-1: not here)."""
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == quote:
            return i
        i += 1
    return -1
