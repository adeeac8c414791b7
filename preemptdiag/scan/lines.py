"""Normalise one physical line: peel wrappers, strip ANSI, find its timestamps.

Runs only on candidate lines (those the prefilter picked), so clarity beats speed
here; the hot loop never calls it for the bulk of a log.
"""

from __future__ import annotations

import bisect
import json
import sys
from dataclasses import dataclass

import regex

# Real escapes and the syslog-mangled "#033[" form (corpus 018).
_ANSI = regex.compile(r"(?:\x1b|#033)\[[0-9;?]*[A-Za-z]")

# Outer wrappers, tried in order at the start of the line. Each yields a timestamp
# that carries a date (and often a zone), which vLLM's own "MM-DD HH:MM:SS" lacks.
_RFC3339 = regex.compile(
    r"(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
    r"(?:\s+(?:stdout|stderr)\s+[FP])?\s+"
)
_K8S_PREFIX = regex.compile(r"\[(?P<pod>pod/[^\]\s]+)\]\s+")
_BRACKET_FULL = regex.compile(
    r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)(?P<rank>(?: [A-Z_]+\d+)*)\]\s?"
)
_BRACKET_TIME = regex.compile(r"\[(?P<ts>\d\d:\d\d:\d\d)(?P<rank>(?: [A-Z_]+\d+)*)\]\s")
_PIPE_FULL = regex.compile(r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\s+\|\s+")
_DMESG_T = regex.compile(r"\[(?P<ts>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]\s?")
_DMESG_UPTIME = regex.compile(r"\[\s*(?P<up>\d+\.\d+)\]\s?")
_SYSLOG = regex.compile(
    r"(?P<ts>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)\s+(?P<host>\S+)\s+(?P<prog>[^\s:\[]+)(?:\[\d+\])?:\s"
)
_QUOTE = regex.compile(r"(?:>\s?)+")

ENGINE_TS = regex.compile(
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) (?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)"
)
_PROC = regex.compile(r"\((?P<name>[^()\n]{1,80}?) pid=(?P<pid>\d+)(?:, ip=(?P<ip>[\d.:a-f]+))?\)")
# (at most 18 digits: a count past 64 bits is no count Ray prints, and times a
# preemption count it was past any float: fuzz seed 9091 input 733)
_REPEATED = regex.compile(r"\[repeated (?P<n>\d{1,18})x across cluster\]")
_SGLANG_RANK = regex.compile(r"(?:DP\d+ )?(?:PP\d+ )?TP\d+")


@dataclass(frozen=True, slots=True)
class Line:
    text: str  # normalised text the signatures search
    ts_wrapper: str | None  # dated timestamp from a wrapper, as text
    ts_kind: str | None  # how to parse ts_wrapper: iso, sql, dmesg_t, syslog, clock, uptime
    pod: str | None  # kubectl --prefix pod
    rank: str | None  # SGLang "TP3" style rank
    uptime: float | None = None  # dmesg seconds-since-boot seen next to a dated stamp
    crs: tuple[int, ...] = ()  # where normalise turned a \r into a space in `text`


def _peel_json(s: str) -> tuple[str, str | None]:
    """Docker json-file records: {"log": "...\\n", "stream": ..., "time": ...}."""
    try:
        obj = json.loads(s)
    except ValueError:
        return s, None
    if not isinstance(obj, dict) or not isinstance(obj.get("log"), str):
        return s, None
    t = obj.get("time")
    return obj["log"].rstrip("\r\n"), t if isinstance(t, str) else None


def normalise(raw: str) -> Line:
    s = raw.rstrip("\r\n")
    if s.startswith("(") and "\x1b" not in s and "#033[" not in s and "\r" not in s:
        # A process tag in front (vLLM's `(APIServer pid=1) INFO ...`): no wrapper
        # below opens with "(", so the line is its own text (a stats line every 10 s).
        return Line(text=s, ts_wrapper=None, ts_kind=None, pod=None, rank=None)
    if "\x1b" in s or "#033[" in s:
        s = _ANSI.sub("", s)
    ts: str | None = None
    kind: str | None = None
    pod: str | None = None
    rank: str | None = None
    uptime: float | None = None
    if s.startswith('{"'):
        s, ts = _peel_json(s)
        kind = "iso" if ts else None
        if "\x1b" in s:
            s = _ANSI.sub("", s)
    m = _K8S_PREFIX.match(s)
    if m:
        pod, s = m.group("pod"), s[m.end() :]
    if ts is None:
        for rx, k in (
            (_RFC3339, "iso"),
            (_BRACKET_FULL, "sql"),
            (_PIPE_FULL, "sql"),
            (_DMESG_T, "dmesg_t"),
            (_SYSLOG, "syslog"),
            (_BRACKET_TIME, "clock"),
            (_DMESG_UPTIME, "uptime"),
        ):
            m = rx.match(s)
            if m:
                ts = m.group("ts") if "ts" in m.re.groupindex else m.group("up")
                kind = k
                if "rank" in m.re.groupindex and m.group("rank"):
                    rank = sys.intern(m.group("rank").strip())  # (one object a rank)
                s = s[m.end() :]
                # journald/syslog may wrap a dmesg uptime: keep the dated one.
                if k in ("iso", "syslog"):
                    m2 = _DMESG_UPTIME.match(s)
                    if m2:
                        uptime = float(m2.group("up"))
                        s = s[m2.end() :]
                break
    if kind in ("iso", "syslog") and rank is None and s.startswith("["):
        # SGLang's own stamp and rank under a wrapper's (`kubectl logs --timestamps`,
        # journald): its rank names the process, as in a bare line, so ranks stay
        # streams and a DP rank's retractions its own; the wrapper's stamp, which has
        # the date and zone, times the line.
        m = _BRACKET_FULL.match(s)
        if m:
            if m.group("rank"):
                rank = sys.intern(m.group("rank").strip())
            s = s[m.end() :]
    if s.startswith(">"):
        m = _QUOTE.match(s)
        if m:
            s = s[m.end() :]
    crs: tuple[int, ...] = ()
    if "\r" in s:
        # vLLM's multi-line records end each piece in \r; tqdm redraws with \r.
        crs = tuple(i for i, c in enumerate(s) if c == "\r")
        s = s.replace("\r", " ")
    return Line(text=s, ts_wrapper=ts, ts_kind=kind, pod=pod, rank=rank, uptime=uptime, crs=crs)


def engine_ts_before(text: str, pos: int) -> str | None:
    """The last vLLM "MM-DD HH:MM:SS" timestamp at or before pos (glued records)."""
    return Marks(text).engine_ts_before(pos)


class Marks:
    """Where one line's engine stamps, record starts and process tags are, each found
    once and looked up by position. Records glued on one line (a thousand of them,
    pasted without newlines) would otherwise be searched from the line's start again
    for every match: quadratic in the line's length. A match ends at or before the
    position asked for, as when the search stops there."""

    __slots__ = ("_found", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._found: dict[str, tuple[list[int], list[regex.Match[str]]]] = {}

    def _all(
        self, name: str, pattern: regex.Pattern[str]
    ) -> tuple[list[int], list[regex.Match[str]]]:
        found = self._found.get(name)
        if found is None:
            # (a literal every match holds, absent: SGLang's lines have no level
            # word or process tag, and a search costs several times this test)
            need = _NEEDS[name]
            t = self.text
            ms = list(pattern.finditer(t)) if any(lit in t for lit in need) else []
            found = self._found[name] = ([m.end() for m in ms], ms)
        return found

    def _last(self, name: str, pattern: regex.Pattern[str], bound: int) -> regex.Match[str] | None:
        ends, ms = self._all(name, pattern)
        i = bisect.bisect_right(ends, bound) - 1
        return ms[i] if i >= 0 else None

    def engine_ts_before(self, pos: int) -> str | None:
        bound = pos + 1 if pos < len(self.text) else len(self.text)
        last = self._last("ts", ENGINE_TS, bound)
        return f"{last.group('md')} {last.group('hms')}" if last else None

    def record_text(self, start: int, end: int, limit: int | None = None) -> str:
        """The one record holding text[start:end] (see record_text); its first `limit`
        characters only, when given (a line of glued records with no record marks is
        one record: copying all of it for each match would be quadratic)."""
        last = self._last("record", _RECORD_START, start + 1)
        lo = last.start() if last else 0
        _, ms = self._all("record", _RECORD_START)
        i = bisect.bisect_left(ms, end, key=lambda m: m.start())  # the first at or after end
        hi = ms[i].start() if i < len(ms) else len(self.text)
        return self.text[lo : hi if limit is None else min(hi, lo + limit)]

    def proc_before(self, pos: int) -> str | None:
        last = self._last("proc", _PROC, max(pos, 0))
        if last is None:
            return None
        name = last.group("name")
        ip = last.group("ip")
        return f"{name}@{ip}" if ip else name


# What a match of each of Marks' patterns holds one of (a level word: ENGINE_TS and
# _RECORD_START end in one; " pid=": _PROC).
_LEVEL_WORDS = ("INFO", "WARN", "ERROR", "DEBUG", "CRITICAL")
_NEEDS = {"ts": _LEVEL_WORDS, "record": _LEVEL_WORDS, "proc": (" pid=",)}

_RECORD_START = regex.compile(
    r"(?:\([^()\n]{1,80}? pid=\d+(?:, ip=[\d.:a-f]+)?\) )*"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"
)


# After any `(tag) ` prefixes (Ray's `(raylet)`): a level word, a bracket, a brace,
# a date, or a process tag such as `(APIServer pid=7)`. A piece of a wrapped message
# such as `(0.0 GiB KV cache is needed, ...` opens nothing.
_RECORD_OPENER = regex.compile(
    r"(?:\([^()\n]{1,80}\) )*(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|\[|\{|\d{4}"
    r"|\([^()\n]{1,80}? pid=\d+)"
)


def starts_record(line: str) -> bool:
    """Whether a physical line opens a record of its own (so it continues nothing):
    a level word, a bracket, a process tag or a date/time in front."""
    s = line.lstrip()
    if s.startswith(">"):
        s = s.lstrip("> ")
    if s.startswith(("\x1b", "#033[")):
        s = _ANSI.sub("", s)
    return _RECORD_OPENER.match(s) is not None


def record_text(text: str, start: int, end: int) -> str:
    """The one record holding text[start:end]: drops tqdm bars glued in front and
    further records glued behind (pastes without newlines)."""
    return Marks(text).record_text(start, end)


def proc_before(text: str, pos: int) -> str | None:
    return Marks(text).proc_before(pos)


def repeat_count(text: str) -> int:
    m = _REPEATED.search(text)
    return int(m.group("n")) if m else 1


def sglang_rank(rank: str | None) -> str | None:
    if rank and _SGLANG_RANK.fullmatch(rank):
        return rank
    return None
