"""Load, validate and apply line signatures (signatures/*.toml, schema in its README)."""

from __future__ import annotations

import re as _re
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import regex

from preemptdiag.model.errors import DiagError
from preemptdiag.model.records import FieldValue, Kind
from preemptdiag.scan.lines import normalise

if TYPE_CHECKING:
    from regex._main import Match

# Per-pattern time limit for user signatures: a slow pattern must not hang a 3 a.m. run.
USER_REGEX_TIMEOUT_S = 0.25  # one user pattern on one line
USER_REGEX_BUDGET_S = 10.0  # all user patterns together, per run (reset_user_budget)
_USER_REGEX_SPENT = [0.0]


class RegexTimeout(Exception):
    """A user signature's pattern ran out of time on a line (or the run's budget)."""

    def __init__(self, sig_id: str) -> None:
        super().__init__(sig_id)
        self.sig_id = sig_id


def reset_user_budget() -> None:
    """A new run: user patterns get the whole USER_REGEX_BUDGET_S again."""
    _USER_REGEX_SPENT[0] = 0.0


_SIZE_UNITS = {
    "bytes": 1,
    "b": 1,
    "kib": 1024,
    "kb": 1000,
    "mib": 1024**2,
    "mb": 1000**2,
    "gib": 1024**3,
    "gb": 1000**3,
    "tib": 1024**4,
}


# Counts, sizes and token numbers a real engine prints fit in 64 bits; a longer
# number is a damaged or hostile line, refused here (and counted by the scan) rather
# than carried into the windows' int64 columns.
_INT_LIMIT = 1 << 63


def _to_int(s: str) -> int:
    v = int(s.replace(",", "").replace("_", ""))
    if not -_INT_LIMIT < v < _INT_LIMIT:
        raise ValueError(f"number out of range: {s[:40]!r}")
    return v


def _to_size(s: str) -> int:
    m = _re.fullmatch(r"\s*(-?[\d.,]+)\s*([A-Za-z]+)?\s*", s)
    if not m:
        raise ValueError(f"not a size: {s!r}")
    unit = (m.group(2) or "bytes").lower()
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown size unit in {s!r}")
    v = round(float(m.group(1).replace(",", "")) * _SIZE_UNITS[unit])
    if not -_INT_LIMIT < v < _INT_LIMIT:
        raise ValueError(f"size out of range: {s[:40]!r}")
    return v


# Throughputs, GiB and ratios past this (or not finite: a 400-digit number reads as
# inf) are damage too; so is a share past ten times the whole (KV usage, pressure).
# Sums of such values lose their low digits, so windows would depend on the order
# lines are added in (rollups, --jobs).
FLOAT_LIMIT = 1e15
PERCENT_LIMIT = 1000.0


def _to_float(s: str) -> float:
    v = float(s.replace(",", ""))
    if not abs(v) < FLOAT_LIMIT:  # also NaN
        raise ValueError(f"number out of range: {s[:40]!r}")
    return v


def _to_percent(s: str) -> float:
    v = float(s.rstrip("%"))
    if not abs(v) <= PERCENT_LIMIT:
        raise ValueError(f"percentage out of range: {s[:40]!r}")
    return v


def _to_fraction_percent(s: str) -> float:
    return round(_to_percent(str(float(s) * 100.0)), 4)


CONVERTERS: dict[str, Callable[[str], FieldValue]] = {
    "str": str,
    "int": _to_int,
    "int_commas": _to_int,
    "float": _to_float,
    "percent": _to_percent,
    "fraction_percent": _to_fraction_percent,
    "size": _to_size,
}

# The groups of a signature's `plain` shape that hold the text before the match and
# the match itself.
PLAIN_PRE, PLAIN_MATCH = "plain_pre_", "plain_match_"

# Nested unbounded quantifiers such as (a+)+ or (.*)* backtrack catastrophically.
_GROUP_NAME = _re.compile(r"\(\?P<([A-Za-z_]\w*)>")
_NESTED_QUANTIFIER = _re.compile(r"\((?:[^()\\]|\\.)*[+*](?:\?)?\)[+*{]")


@dataclass(frozen=True, slots=True)
class Example:
    line: str
    fields: Mapping[str, FieldValue]


@dataclass(frozen=True, slots=True)
class Signature:
    id: str
    family: str
    engine: str
    kind: Kind
    versions: str
    description: str
    prefilter: tuple[str, ...]
    pattern: str
    fields: Mapping[str, str]
    constants: Mapping[str, FieldValue]
    overlaps: tuple[str, ...]
    priority: int
    matches: tuple[Example, ...]
    no_matches: tuple[str, ...]
    path: str
    builtin: bool
    # A candidate line holding one of these literals that no signature matched is
    # counted as unparsed (ScanStats.skipped): literals that alone mean "this is that
    # line", so a format the engine changed shows up at once instead of vanishing.
    unparsed_if: tuple[str, ...] = ()
    # The whole normalised text of the line's most common shape, in Rust regex syntax
    # (bulk.py runs it in polars where `pattern` has look-arounds): the text before
    # the match in PLAIN_PRE, the match in PLAIN_MATCH, and the fields it sees. Where
    # it matches a whole text, `pattern` matches there once, on that span, with the
    # same fields (the others: None); tests/test_signatures.py holds it to that.
    plain: str = ""

    def extract(self, m: Match[str]) -> dict[str, FieldValue]:
        """Typed fields of one match; a group that did not take part is None."""
        out: dict[str, FieldValue] = dict(self.constants)
        for name, typ in self.fields.items():
            raw = m.group(name)
            out[name] = None if raw is None else CONVERTERS[typ](raw)
        return out

    @property
    def regex(self) -> regex.Pattern[str]:
        return _compiled(self.pattern)

    def finditer(self, text: str) -> Iterable[Match[str]]:
        """Matches in `text`. A user pattern runs under a time bound per line and per
        run (USER_REGEX_*): past either it raises RegexTimeout, which the scan counts
        as a skipped line, so a pattern that backtracks cannot make a run unbounded."""
        if self.builtin:
            return self.regex.finditer(text)
        left = USER_REGEX_BUDGET_S - _USER_REGEX_SPENT[0]
        if left <= 0:
            raise RegexTimeout(self.id)
        t0 = time.perf_counter()
        try:
            return list(self.regex.finditer(text, timeout=min(USER_REGEX_TIMEOUT_S, left)))
        except TimeoutError:
            raise RegexTimeout(self.id) from None
        finally:
            _USER_REGEX_SPENT[0] += time.perf_counter() - t0

    def prefilter_hit(self, text: str) -> bool:
        return any(lit in text for lit in self.prefilter)


@cache
def _compiled(pattern: str) -> regex.Pattern[str]:
    # Built-in patterns compile on first use: a small log touches a handful of the
    # ~100 signatures, and compiling all of them would double the start-up time.
    return regex.compile(pattern)


def builtin_dir() -> Path:
    """The shipped signatures: inside the wheel, or the source tree's signatures/."""
    package = Path(__file__).resolve().parent.parent  # preemptdiag/
    packaged = package / "_signatures"
    if packaged.is_dir():
        return packaged
    return package.parent / "signatures"


def _fail(path: Path, sid: str | None, what: str) -> DiagError:
    where = f"{path}" + (f": signature {sid!r}" if sid else "")
    return DiagError(f"invalid signature file {where}: {what}")


def _compile(path: Path, raw: Mapping[str, Any], builtin: bool) -> Signature:
    sid = raw.get("id")
    if not isinstance(sid, str) or not sid:
        raise _fail(path, None, "a [[signature]] has no 'id'")
    for key in ("family", "engine", "kind", "pattern", "prefilter"):
        if key not in raw:
            raise _fail(path, sid, f"missing '{key}'")
    try:
        kind = Kind(raw["kind"])
    except ValueError:
        known = ", ".join(k.value for k in Kind)
        raise _fail(path, sid, f"unknown kind {raw['kind']!r} (known: {known})") from None
    prefilter = raw["prefilter"]
    if (
        not isinstance(prefilter, list)
        or not prefilter
        or not all(isinstance(p, str) and p for p in prefilter)
    ):
        raise _fail(path, sid, "'prefilter' must be a non-empty list of non-empty strings")
    pattern = raw["pattern"]
    if not isinstance(pattern, str) or not pattern:
        raise _fail(path, sid, "'pattern' must be a non-empty string")
    if _NESTED_QUANTIFIER.search(pattern) or (not builtin and _repeats_a_choice(pattern)):
        raise _fail(
            path, sid, "pattern has a nested unbounded quantifier (catastrophic backtracking)"
        )
    for key, want in (("fields", dict), ("set", dict), ("match", list), ("no_match", list)):
        if key in raw and not isinstance(raw[key], want):
            shape = "a table" if want is dict else "a list of tables ([[signature.KEY]])"
            raise _fail(path, sid, f"'{key}' must be {shape.replace('KEY', key)}")
    for key in ("overlaps",):
        if key in raw and not (
            isinstance(raw[key], list) and all(isinstance(x, str) for x in raw[key])
        ):
            raise _fail(path, sid, f"'{key}' must be a list of signature ids")
    if "priority" in raw and (
        not isinstance(raw["priority"], int) or isinstance(raw["priority"], bool)
    ):
        raise _fail(path, sid, "'priority' must be a whole number")
    for key in ("family", "engine", "versions", "description"):
        if key in raw and not isinstance(raw[key], str):
            raise _fail(path, sid, f"'{key}' must be a string")
    for ex in [*raw.get("match", []), *raw.get("no_match", [])]:
        if not isinstance(ex, dict) or not isinstance(ex.get("line"), str):
            raise _fail(
                path, sid, "every [[signature.match]] / [[signature.no_match]] needs a 'line'"
            )
        if not isinstance(ex.get("fields", {}), dict):
            raise _fail(path, sid, "an example's 'fields' must be a table")
    fields = dict(raw.get("fields", {}))
    for name, typ in fields.items():
        if typ not in CONVERTERS:
            raise _fail(path, sid, f"field {name!r} has unknown type {typ!r}")
    groups = _group_names(path, sid, pattern, builtin)
    if groups != set(fields):
        missing = sorted(groups - set(fields))
        extra = sorted(set(fields) - groups)
        raise _fail(
            path, sid, f"named groups and [fields] differ (untyped: {missing}, no group: {extra})"
        )
    matches = tuple(
        Example(line=str(e["line"]), fields=dict(e.get("fields", {}))) for e in raw.get("match", [])
    )
    if not matches:
        raise _fail(path, sid, "needs at least one [[signature.match]] example")
    no_matches = tuple(str(e["line"]) for e in raw.get("no_match", []))
    unparsed_if = raw.get("unparsed_if", [])
    if not isinstance(unparsed_if, list) or not all(isinstance(u, str) and u for u in unparsed_if):
        raise _fail(path, sid, "'unparsed_if' must be a list of non-empty strings")
    if any(not any(lit in u for lit in prefilter) for u in unparsed_if):
        raise _fail(path, sid, "every 'unparsed_if' literal must contain a prefilter literal")
    plain = raw.get("plain", "")
    if not isinstance(plain, str):
        raise _fail(path, sid, "'plain' must be a string")
    if plain:
        named = _group_names(path, sid, plain, builtin)
        if not {PLAIN_PRE, PLAIN_MATCH} <= named or not named - {PLAIN_PRE, PLAIN_MATCH} <= set(
            fields
        ):
            raise _fail(
                path,
                sid,
                f"'plain' needs groups {PLAIN_PRE!r} and {PLAIN_MATCH!r}, and only fields besides",
            )
    return Signature(
        id=sid,
        family=str(raw["family"]),
        engine=str(raw["engine"]),
        kind=kind,
        versions=str(raw.get("versions", "")),
        description=str(raw.get("description", "")).strip(),
        prefilter=tuple(prefilter),
        pattern=pattern,
        fields=fields,
        constants=dict(raw.get("set", {})),
        overlaps=tuple(raw.get("overlaps", [])),
        priority=int(raw.get("priority", 0)),
        matches=matches,
        no_matches=no_matches,
        path=str(path),
        builtin=builtin,
        unparsed_if=tuple(unparsed_if),
        plain=plain,
    )


def _repeats_a_choice(pattern: str) -> bool:
    r"""Whether a group that repeats (`*`, `+`, `{n,}`, `{n,m}` with m > 1) holds a
    quantifier or an alternation, at any depth: `((a+))+b`, `(?:a|aa)+$`,
    `(\w+\s?)+$`, `(?:a{1,30}){1,30}b`. Such a group can split one run of text in
    exponentially many ways, and a line that almost matches tries them all. Stricter
    than needed (`(?:\d+\.)+` is safe), which a user signature can afford: write
    the repetition out, or bound it."""
    # Per open group: a quantifier or `|` inside it so far, and whether it is a
    # look-around (zero-width: what it tries is not repeated by a quantifier outside).
    stack: list[list[bool]] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # a class: its contents are characters, not syntax
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            continue
        if c == "(":
            stack.append([False, pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i)])
        elif c == ")" and stack:
            inner, look = stack.pop()
            rep = _QUANT.match(pattern, i + 1)
            if rep is not None and inner and not look and _repeats(rep.group()):
                return True
            if stack and not look and (inner or rep is not None):
                stack[-1][0] = True
        elif (
            (c == "|" and stack)
            or (c in "*+{" and stack and _QUANT.match(pattern, i) is not None)
            or (c == "?" and stack and pattern[i - 1] not in "(*+?}")  # not `(?:`, lazy
        ):
            stack[-1][0] = True
        i += 1
    return False


_QUANT = _re.compile(r"[*+?]|\{\d*(?:,\d*)?\}")


def _repeats(q: str) -> bool:
    if q in "*+":
        return True
    if q == "?":
        return False
    lo, _, hi = q.strip("{}").partition(",")
    return ("," in q and (hi == "" or int(hi) > 1)) or ("," not in q and int(lo or 0) > 1)


def _group_names(path: Path, sid: str, pattern: str, builtin: bool) -> set[str]:
    # Built-in patterns are compiled (and their groups checked) by the test suite;
    # at run time they compile on first use. A user's pattern compiles now, so a
    # typo is reported before any log is read.
    if builtin:
        return set(_GROUP_NAME.findall(pattern))
    try:
        return set(_compiled(pattern).groupindex)
    except regex.error as exc:
        raise _fail(path, sid, f"pattern does not compile: {exc}") from None


def load_file(path: Path, builtin: bool = False) -> list[Signature]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DiagError(f"cannot read signature file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise _fail(path, None, f"not valid TOML ({exc})") from None
    raw_sigs = data.get("signature", [])
    if not isinstance(raw_sigs, list):
        raise _fail(path, None, "expected [[signature]] tables")
    return [_compile(path, raw, builtin) for raw in raw_sigs]


def load_dir(directory: Path, builtin: bool = False) -> list[Signature]:
    if not directory.is_dir():
        raise DiagError(f"signatures directory not found: {directory}")
    files = sorted(directory.glob("*.toml"))
    if not files and not builtin:
        raise DiagError(f"no *.toml signature files in {directory}")
    out: list[Signature] = []
    for f in files:
        out.extend(load_file(f, builtin))
    return out


@cache
def _builtin() -> tuple[Signature, ...]:
    return tuple(load_dir(builtin_dir(), builtin=True))


def load(user_dir: Path | None = None) -> tuple[Signature, ...]:
    """Built-in signatures, then the user's (a user id replaces the built-in one)."""
    sigs: dict[str, Signature] = {}
    for s in _builtin():
        if s.id in sigs:
            raise _fail(Path(s.path), s.id, f"duplicate id (also in {sigs[s.id].path})")
        sigs[s.id] = s
    if user_dir is not None:
        seen: set[str] = set()
        for s in load_dir(user_dir):
            if s.id in seen:
                raise _fail(Path(s.path), s.id, "duplicate id")
            seen.add(s.id)
            sigs[s.id] = s
    return tuple(sigs.values())


def found_in(sig: Signature, text: str) -> list[Match[str]] | None:
    """`sig`'s matches in `text`; None when its pattern ran out of time there."""
    try:
        return list(sig.finditer(text))
    except RegexTimeout:
        return None


def check_examples(sig: Signature) -> list[str]:
    """Problems with a signature's embedded examples (empty when all pass)."""
    problems: list[str] = []
    for ex in sig.matches:
        if not sig.prefilter_hit(ex.line):
            problems.append(f"match example contains no prefilter literal: {ex.line[:80]!r}")
            continue
        found = found_in(sig, ex.line)
        if found is None:
            problems.append(f"pattern timed out on example: {ex.line[:80]!r}")
            continue
        if not found:
            problems.append(f"match example does not match: {ex.line[:80]!r}")
            continue
        got = sig.extract(found[0])
        for k, want in ex.fields.items():
            if k not in got:
                problems.append(f"example expects unknown field {k!r}")
            elif got[k] != want:
                problems.append(
                    f"field {k!r}: expected {want!r}, got {got[k]!r} in {ex.line[:60]!r}"
                )
    for line in sig.no_matches:
        if found_in(sig, line) != []:
            problems.append(f"no_match example matches: {line[:80]!r}")
    if sig.plain:
        problems += _plain_problems(sig)
    return problems


def _plain_problems(sig: Signature) -> list[str]:
    """Where sig's plain shape does not stand for its pattern on its examples: a
    whole normalised text it fits must hold one match, on its PLAIN_MATCH span, with
    the fields it reads; it must fit a match example and no no_match one."""
    shape = _compiled(sig.plain)
    problems: list[str] = []
    fits = 0
    for ex in sig.matches:
        text = normalise(ex.line).text
        m = shape.fullmatch(text)
        if m is None:
            continue
        fits += 1
        found = found_in(sig, text)
        if not found or len(found) != 1 or found[0].span() != m.span(PLAIN_MATCH):
            problems.append(
                f"plain shape fits an example the pattern does not match once on its span: "
                f"{ex.line[:80]!r}"
            )
        elif sig.extract(found[0]) != plain_fields(sig, m):
            problems.append(f"plain shape reads other fields than the pattern: {ex.line[:80]!r}")
    if not fits:
        problems.append("plain shape fits none of the match examples")
    for line in sig.no_matches:
        if shape.fullmatch(normalise(line).text):
            problems.append(f"plain shape fits a no_match example: {line[:80]!r}")
    return problems


def plain_fields(sig: Signature, m: Match[str]) -> dict[str, FieldValue]:
    """The fields a match of sig's plain shape reads (the others: None)."""
    out: dict[str, FieldValue] = dict(sig.constants)
    for name, typ in sig.fields.items():
        raw = m.group(name) if name in m.re.groupindex else None
        out[name] = None if raw is None else CONVERTERS[typ](raw)
    return out


def overlaps(sigs: Iterable[Signature]) -> list[tuple[str, str, str]]:
    """(sig, other, example) where other's pattern also matches sig's example undeclared."""
    sigs = list(sigs)
    out: list[tuple[str, str, str]] = []
    for s in sigs:
        for ex in s.matches:
            for o in sigs:
                if o.id == s.id or o.id in s.overlaps or s.id in o.overlaps:
                    continue
                if o.prefilter_hit(ex.line) and found_in(o, ex.line):
                    out.append((s.id, o.id, ex.line))
    return out


def validate(sigs: Iterable[Signature]) -> None:
    """Raise DiagError naming the first signature whose examples fail."""
    for s in sigs:
        problems = check_examples(s)
        if problems:
            raise _fail(Path(s.path), s.id, problems[0])
