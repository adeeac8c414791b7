"""What polars' Rust regex can run, and Rust patterns made from `regex` ones.

The bulk and lane paths (bulk.py, lane.py) run signature patterns in polars where
Rust's regex engine reads them as `regex` does. It has no look-around or
back-references; these say when a pattern runs there as it is, and make patterns
that stand in for one that does not: its ASCII spelling (faster, same matches on
ASCII text), and a superset without its look-arounds whose "no match" proves the
original's. tests/test_lane.py holds each to its definition.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache

import regex

# What Rust's regex lacks (look-around, back-references, atomic groups, possessive
# quantifiers, conditionals), seen in the pattern's text: refused without asking
# polars, whose string kernels cost memory to page in (a false alarm only keeps a
# pattern on the regex path).
_NOT_RUST = regex.compile(r"\(\?<?[=!]|\(\?>|\(\?P=|\\[1-9]|[*+?}]\+|\(\?\(")
# A counted repetition of 1,000 or more: Rust's regex unrolls it, and a config line's
# `[^\n]{0,4000}?` compiled to 10-23 MiB that polars then cached for the run (a third
# of a month's scan memory, measured); such a pattern stays on the `regex` path.
_HUGE_REPEAT = regex.compile(r"\{(?:[0-9]*,)?[0-9]{4,}\}")


@cache
def rust_ok(pattern: str) -> bool:
    """Whether polars' Rust regex compiles `pattern` (and it cannot match nothing)."""
    if _NOT_RUST.search(pattern) or _HUGE_REPEAT.search(pattern):
        return False
    if regex.search(pattern, "") is not None:
        return False
    if not usable():
        return False  # (a forked worker: see usable)
    import polars as pl

    try:
        pl.Series([""], dtype=pl.Utf8).str.count_matches(pattern)
    except Exception:  # polars raises ComputeError for what Rust's regex rejects
        return False
    return True


def usable() -> bool:
    """polars is there, and safe to use in this process: a worker forked after the
    parent started polars' thread pool may deadlock in it, so it does not. (Asked
    without importing it: a run that never needs polars never pays its ~55 MiB.)"""
    return _installed() and not _FORKED_WITH_POLARS


def loaded() -> bool:
    """polars is imported in this process already: its pages are paid for."""
    return "polars" in sys.modules


@cache
def _installed() -> bool:
    return "polars" in sys.modules or importlib.util.find_spec("polars") is not None


# Set in a --jobs worker whose parent had imported polars before forking it.
_FORKED_WITH_POLARS = False


def mark_forked() -> None:
    global _FORKED_WITH_POLARS
    _FORKED_WITH_POLARS = "polars" in sys.modules


@cache
def superset(pattern: str) -> str | None:
    """`pattern` without its look-arounds, when Rust's regex takes that: it matches
    wherever `pattern` does (a look-around only removes matches), so no match of it
    proves none of `pattern`. None when there is no such pattern."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "[":
            j = _class_end(pattern, i)
            out.append(pattern[i:j])
            i = j
            continue
        if pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
            i = _group_end(pattern, i)
            continue
        out.append(c)
        i += 1
    stripped = "".join(out)
    return stripped if stripped and rust_ok(stripped) else None


@cache
def ascii_only(pattern: str) -> str | None:
    """`pattern` with its Unicode classes spelt as their ASCII members (`\\d` as
    `[0-9]`, `\\b` as ASCII's): the same matches on ASCII text, and Rust's automata
    run it several times faster. None for a construct not handled here."""
    out: list[str] = []
    i, n, depth = 0, len(pattern), 0
    outside = {
        "d": "[0-9]",
        "w": "[0-9A-Za-z_]",
        "s": "[\\t\\n\\x0B\\f\\r ]",
        "D": "[^0-9]",
        "W": "[^0-9A-Za-z_]",
        "S": "[^\\t\\n\\x0B\\f\\r ]",
        "b": "(?-u:\\b)",
        "B": "(?-u:\\B)",
    }
    inside = {"d": "0-9", "w": "0-9A-Za-z_", "s": "\\t\\n\\x0B\\f\\r "}
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            e = pattern[i + 1]
            table = inside if depth else outside
            if e in table:
                out.append(table[e])
            elif e in "DWSBbpPX":
                return None
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "[" and not depth:
            depth = 1
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":
                out.append("\\]")
                i += 1
            continue
        if c == "[" and depth:
            return None  # nested class: not handled
        if c == "]" and depth:
            depth = 0
        out.append(c)
        i += 1
    return "".join(out)


def anchored(pattern: str) -> bool:
    """Whether `pattern` holds `^` or `\\A` outside a class (the match would read
    differently cut from its line)."""
    p = regex.sub(r"\\.|\[(?:\\.|[^\]])*\]", "", pattern)
    return "^" in p or "\\A" in pattern


@cache
def zero_test(pattern: str) -> str | None:
    """A Rust pattern that finds something in every line `pattern` matches (so none
    found proves none of `pattern`), without its capture names; None if there is none.
    A leading look-behind for a literal becomes "not preceded by that literal"."""
    body, before = pattern, ""
    m = regex.match(r"\(\?<!((?:[^\\()\[\].*+?{}|^$]|\\[^\w])+)\)", pattern)
    if m:
        lit = regex.sub(r"\\(.)", r"\1", m.group(1))
        body, before = pattern[m.end() :], _not_after(lit)
    spelt = ascii_only(regex.sub(r"\(\?P?<(?![=!])\w+>", "(?:", body))
    sup = None if spelt is None else superset(spelt)
    if sup is None or not rust_ok(before + sup):
        return None
    return before + sup


def _not_after(lit: str) -> str:
    """A prefix that matches exactly where `lit` does not end right before."""
    k = len(lit)
    alts = [f"^.{{0,{k - 1}}}"]
    for j, ch in enumerate(lit):
        esc = "\\" + ch if ch in "\\]^[-&~" else ch
        alts.append(f".{{{j}}}[^{esc}].{{{k - 1 - j}}}")
    return "(?:" + "|".join(alts) + ")"


def _class_end(p: str, i: int) -> int:
    j = i + 1
    if j < len(p) and p[j] == "^":
        j += 1
    if j < len(p) and p[j] == "]":
        j += 1
    while j < len(p) and p[j] != "]":
        j += 2 if p[j] == "\\" else 1
    return j + 1


def _group_end(p: str, i: int) -> int:
    depth, j = 0, i
    while j < len(p):
        c = p[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            j = _class_end(p, j)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return j
