"""The lane's commonest blocks, in Python's `re`: plain vLLM stats lines (V1's or V0's)
and plain SGLang batch lines, without polars.

A month of a vLLM server's log is a V1 stats line every 10 s per engine, and little
else; a dense SGLang log is two batch lines a second (decode, and prefill now and
then). The polars lane (lane.py) reads any mix of stats lines, heads and odd lines,
at ~50 ms a 1 MiB block in ~44 queries, and importing polars costs a --jobs worker
~55 MiB of its pages (70 MiB with its regexes' caches). A block whose candidate lines
are plain stats lines, with a few odd ones among them (start-up lines, a KV cache
line), needs none of that: one `re.finditer` of the head and the signatures'
patterns (_Shape) takes every line's groups (~2-3 us a line), each signature's lines
become columns (_Block), each stream-minute's aggregates are added up as Builder adds
them (rollup.py) a column at a time, the signatures' segments are walked in line
order (lane.walk), and the odd lines are matched as line by line. SGLang's
retraction lines are read with its batch lines, as columns too, and given to the
sink one by one in their place (lane.feed_preemption: a hit is made only for a line
a rollup keeps): a thrashing server prints one a second from each of eight ranks,
~700,000 lines a day, most of its log, which as odd lines cost ~35 us each. A
block of anything else is the polars lane's to judge (`take` returns None, having
recorded nothing), or the line-by-line scan's where the polars lane would refuse it
too (0).

Exactness: this takes a block only where its plain lines would be plain to the
polars lane too (its docstring says why a plain line's hits are the line-by-line
scan's; a V0 line's reasons are a V1 line's: normalise leaves it as it is, its stamp
and no process name are the head's) and its odd lines odd to it, and gives what the
line-by-line scan gives:

- Each line is a head followed by a plain match, or any other line. The head may come
  after a wrapper's RFC 3339 stamp (_WRAP: `kubectl logs --timestamps`, `docker logs
  -t`, a CRI log file), which normalise takes off, and SGLang's bracket after it
  (lines.normalise), or the line may be the `log` of a record of Docker's json-file
  log that JSON escapes nothing in (_JSON_PRE, _JSON_POST: normalise's json.loads
  gives the line, and the record's `time` as its stamp). The stamp is then the hit's
  wrapper stamp and times the line (rollup.stamp_of's minute holds its zone, its
  seconds the fraction; one zone a block). The polars lane reads no such line; once
  the stamp is off, its argument holds for them as for bare lines. vLLM's: its head
  at INFO (bulk._HEAD's groups, or V0's `INFO MM-DD HH:MM:SS metrics.py:396] ` with no
  process name) and one match of the V1 or V0 stats pattern that runs to the line's
  end (one signature a block: a mix goes line by line). (V0's lines are the polars
  lane's to refuse: it reads bulk._HEAD only.) SGLang's: its head as normalise takes
  it off (lane._SG_HEAD) and a whole record of the decode or the prefill signature's
  plain shape, where its pattern matches once with the same fields
  (tests/test_signatures.py); or of the retraction signature's plain shape
  (SGLANG_PREEMPTION_SIGS), which is its pattern whole: each optional part opens with
  a literal of its own and every number is read greedily, so the pattern's one match
  is the record. A retraction line is no stats line: its hit is given to the sink in
  its place, as an odd line's is, and like one it may not move the clock (_clocks).
  The other lines that hold a literal of any signature (one scan of them, hyperscan's
  where it is installed) are the odd lines: at most MAX_ODD, matched as line by line
  before anything is recorded, their hits in their place (lane.walk). An odd line
  among the block's last lines waits for the next block, as line by line: the lines
  above it are taken, the line-by-line scan takes the rest (passes.scan_fast).
- vLLM's pattern's first match is the one right after the head, and the only one:
  every match holds `Avg prompt throughput: `, which each plain line holds once
  (counted); a match starting in the head would have to hold its `] ` in what
  precedes that literal, which is `Engine N: `, `N Engines Aggregated: ` or nothing
  (V1), or nothing (V0's starts with it). (Which is why only these signatures go this
  way: PLAIN_SIGS.)
- What follows vLLM's head holds no record start (a level word and a space: only the
  head's `INFO ` in each line, counted); an SGLang line holds no level word and no
  process tag, so its record is what follows its head, unnamed. No plain line holds
  a stop literal of the lane (request text, Ray's repeat mark, V0's tag, rsyslog's
  escape). Every other signature the plain lines are candidates of (the literals they
  hold) is shown to match none of them: a literal its pattern requires is in no
  record, or (a pattern after a literal look-behind, `(?<!L)R`) every R follows an L,
  or, for a pattern _requires cannot read (SGLang's decode pattern, whose literal a
  prefill line holds), its search of each record finds nothing.
- Every value converts (bulk._converted, the converters themselves), every stamp is
  a real time (rollup.stamp_of).

tests/test_lane.py holds every block to the line-by-line scan with this on and off;
tests/test_lane_plain.py holds its calm minutes to the polars lane's, and each of its
shortcuts (_requires, _convert, prefilter.Literals, _sum, _means) to its long way.
"""

from __future__ import annotations

import re
import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from functools import cache, partial, reduce
from importlib import import_module
from itertools import pairwise
from operator import add, itemgetter
from typing import Any, overload
from weakref import WeakKeyDictionary

from preemptdiag.model.records import (
    CALM_COLUMNS,
    CALM_MEANS,
    CalmRows,
    Columns,
    Kind,
    WrapperStamp,
    column_of,
)
from preemptdiag.scan import lane
from preemptdiag.scan.bulk import _BAD, _converted
from preemptdiag.scan.lines import _LEVEL_WORDS, sglang_rank
from preemptdiag.scan.matcher import Matcher, ScanResult
from preemptdiag.scan.prefilter import Literals
from preemptdiag.scan.rollup import (
    AGG_FIELDS,
    KV,
    RUNNING,
    STREAM_FIELDS,
    WAITING,
    _instant,
    snap6,
    stamp,
    stamp_of,
    stats_preemptions,
)
from preemptdiag.scan.rust_regex import anchored, ascii_only
from preemptdiag.scan.signatures import (
    _INT_LIMIT,
    FLOAT_LIMIT,
    PERCENT_LIMIT,
    PLAIN_PRE,
    Signature,
)

# re's own parser (sre_parse): what literal text a pattern requires (_requires)
_parser: Any = import_module("re._parser")
ENABLED = True  # tests turn it off to hold the polars lane to the line-by-line scan
# The signatures read this way, by head: vLLM's (whose match cannot start in the head:
# the docstring's argument; one a block, as any mix of V1 and V0 goes as line by line
# does: tests/test_lane.py, bench/lane_fuzz.py) and SGLang's (its decode and prefill
# batch lines, which share its blocks, each a whole record of its plain shape).
PLAIN_SIGS = ("vllm.v1.stats", "vllm.v0.stats")
SGLANG_SIGS = ("sglang.stats.decode", "sglang.stats.prefill")
# SGLang's retraction lines, read beside its batch lines (a thrashing server's: one a
# second from each of eight ranks is most of its log) and given to the sink one by one
# in their place, as its hits would be (RollupSink.add_preemption: a minute's are one
# rollup), with no hit made unless a rollup keeps the line.
SGLANG_PREEMPTION_SIGS = ("sglang.retract",)
# (sglang, wrapper, ids): the lines bare, with the stamp `kubectl logs --timestamps` or
# `docker logs -t` puts in front of each (`stamp`: _WRAP), or each a record of Docker's
# json-file log (`json`: _JSON_PRE, _JSON_POST), whose stamp times them.
_GROUPS = tuple(
    (sglang, wrap, ids)
    for wrap in ("", "stamp", "json")
    for sglang, ids in (
        (False, ("vllm.v1.stats",)),
        (False, ("vllm.v0.stats",)),
        (True, (*SGLANG_SIGS, *SGLANG_PREEMPTION_SIGS)),
    )
)
# bulk._HEAD at INFO (a stats line's level), with the line captured whole, its process
# and the `[` before the file optional: V0's is `INFO MM-DD HH:MM:SS metrics.py:396] `.
_HEAD = (
    r"(?:\((?P<lane_proc>[^()\n]{1,80}?) pid=\d+\) )?INFO "
    r"(?P<lane_ts>\d\d-\d\d \d\d:\d\d:\d\d) \[?[\w.]+:\d+\] "
)
# The wrapper stamp of a vLLM line as lines.normalise takes it off (its _RFC3339): the
# RFC 3339 stamp of `kubectl logs --timestamps` and `docker logs -t` (UTC, `Z`, with
# nanoseconds) or of a CRI log file (`stdout F` after it), here with a `T`, seconds and
# a zone of `Z` or `+HH:MM` (rollup.stamp_of's minute then holds the zone: one a block,
# _Block.of). Any other goes the other ways.
_STAMP = (
    r"(?P<lane_wrap>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
    r"(?:[.,][0-9]+)?(?:Z|[+-][0-9]{2}:[0-9]{2}))"
)
_WRAP = rf"(?P<lane_pre>{_STAMP}(?: +(?:stdout|stderr) +[FP])? +)"
# A record of Docker's json-file log (/var/lib/docker/containers/*/*-json.log) as
# lines.normalise reads it (json.loads: the line is its `log` less its newline, the
# stamp its `time`), in the order and the keys Docker writes; a line that JSON
# escapes anything in (a `\` or `"`) is no plain line (_Block.of).
_JSON_PRE = r'(?P<lane_pre>\{"log":")'
_JSON_POST = rf'(?P<lane_post>\\n","stream":"(?:stdout|stderr)","time":"{_STAMP}"\}})'
# The text around a line each way (_Shape): before it, after it.
_AROUND = {"": ("", ""), "stamp": (_WRAP, ""), "json": (_JSON_PRE, _JSON_POST)}
# SGLang's head as lines.normalise takes it off (lane._SG_HEAD: no fraction in the
# stamp, one space after it), its rank in lane_proc.
_SG_HEAD = (
    r"\[(?P<lane_ts>[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2})"
    r"(?P<lane_proc>(?: [A-Z_]+[0-9]+)*)\] "
)
# Odd candidate lines a block may hold and still go this lane's way. Each is matched
# as line by line, as it would be without the lane: a thrashing SGLang server's
# retraction every few seconds is ~300 a block among its batch lines, which the lane
# still reads as columns. (lane.MAX_ODD is the polars lane's.)
MAX_ODD = 1024
# Level words after which a record could start (lines._RECORD_START), but `INFO `.
_LEVELS = ("DEBUG ", "WARN", "ERROR ", "CRITICAL ")
# What an SGLang line may not hold for normalise to leave its record as the text
# after the head, alone and unnamed (lane._plan's test): a level word (an engine stamp,
# a record start), a process tag.
_SG_STOPS = (*_LEVEL_WORDS, " pid=")
_GROUP = re.compile(r"\(\?P<(\w+)>")


def _renamed(j: int, m: re.Match[str]) -> str:
    return f"(?P<s{j}_{m[1]}>"


class _Shape:
    """The line pattern of one head's signatures: a plain line of one of them (its
    groups; `lane_m{j}` says which), or any other line whole. vLLM's: the head right
    before the signature's one match, which runs to the line's end. SGLang's: the head
    before a whole record of one signature's plain shape (signatures.py: `pattern`
    matches it once there, with the same fields), its groups named `s{j}_` each."""

    def __init__(
        self,
        sigs: tuple[Signature, ...],
        bodies: tuple[str, ...],
        sglang: bool,
        wrap: str = "",
    ) -> None:
        self.sigs, self.sglang, self.wrap = sigs, sglang, wrap
        pre, post = _AROUND[wrap]
        if sglang:
            alts = "|".join(
                f"(?P<lane_m{j}>{_GROUP.sub(partial(_renamed, j), body)})"
                for j, body in enumerate(bodies)
            )
            line = rf"{pre}(?P<lane_line>{_SG_HEAD}(?P<lane_rec>{alts})){post}$"
        else:
            (body,) = bodies
            # (what follows the match: empty on a plain line; in a JSON record, the
            # text up to the record's end)
            tail = r"(?P<lane_tail>[^\n]*?)" if post else r"(?P<lane_tail>[^\n]*)"
            line = rf"{pre}(?P<lane_line>{_HEAD}(?P<lane_m0>{body})){tail}{post}"
            if post:
                line += "$"
        self.regex = re.compile(rf"^(?:{line}|(?P<lane_other>[^\n]*))", re.M)
        at = {name: k - 1 for name, k in self.regex.groupindex.items()}
        self.line, self.other, self.proc, self.ts = (
            at[f"lane_{k}"] for k in ("line", "other", "proc", "ts")
        )
        self.tail = at.get("lane_tail")
        # (a wrapped line's wrapper stamp; the text before and after the line)
        self.stamp, self.around = (
            at.get("lane_wrap"),
            [at[k] for k in ("lane_pre", "lane_post") if k in at],
        )
        self.rec = at.get("lane_rec", self.line)  # (the record: vLLM's is the line)
        self.m = [at[f"lane_m{j}"] for j in range(len(sigs))]
        name = "s{j}_{f}" if sglang else "{f}"
        # field -> its group, None where the shape has no place for it (then None, as
        # `pattern` leaves it)
        self.fields = [
            {f: at.get(name.format(j=j, f=f)) for f in sig.fields} for j, sig in enumerate(sigs)
        ]
        self.pre = [at.get(f"s{j}_{PLAIN_PRE}") for j in range(len(sigs))]
        # (the stats signatures': a block is worth the lane, and its first plain line
        # found, by its stats lines)
        self.literals = tuple(sig.prefilter[0] for sig in sigs if sig.kind is Kind.STATS)
        # (where the hour is in a stamp; how much of a minute names its clock)
        self.at, self.clock = (11, 10) if sglang or wrap else (6, 5)


# By the signatures' ids (a Signature holds dicts: no hash); the signatures are kept
# beside it, so their ids are not reused.
_SHAPES: dict[tuple[object, ...], tuple[tuple[Signature, ...], _Shape | None]] = {}


def _shape(sigs: tuple[Signature, ...], sglang: bool, wrap: str) -> _Shape | None:
    key = (*map(id, sigs), wrap)
    got = _SHAPES.get(key)
    if got is None:
        got = _SHAPES[key] = (sigs, _made(sigs, sglang, wrap))
    return got[1]


def _made(sigs: tuple[Signature, ...], sglang: bool, wrap: str) -> _Shape | None:
    # (its ASCII spelling: the same matches on ASCII text, and `re` reads it as
    # `regex` does; not rust_ok, which would import polars)
    bodies = []
    for sig in sigs:
        body = ascii_only(sig.plain if sglang else sig.pattern)
        if (
            body is None
            or (sglang and not _plain_ok(sig, body))
            or (not sglang and anchored(sig.pattern))
            or len(sig.prefilter) != 1
            or not lane.fields_readable(sig)
        ):
            return None
        bodies.append(body)
    try:
        return _Shape(sigs, tuple(bodies), sglang, wrap)
    except re.error:
        return None


def _plain_ok(sig: Signature, body: str) -> bool:
    """Whether sig's plain shape can be one alternative among others: its own groups
    (no back reference), a match within a line, no anchor of its own."""
    return bool(sig.plain) and not any(s in body for s in ("(?P=", "\\n", "^", "$", "\\A", "\\Z"))


_PLAIN: WeakKeyDictionary[Matcher, tuple[_Shape, ...]] = WeakKeyDictionary()


def _shapes(matcher: Matcher) -> tuple[_Shape, ...]:
    got = _PLAIN.get(matcher)
    if got is None:
        by_id = {s.id: s for s in matcher.sigs if s.builtin}
        made = (
            _shape(tuple(by_id[i] for i in ids if i in by_id), sglang, wrap)
            for sglang, wrap, ids in _GROUPS
            if any(i in by_id for i in ids)
        )
        got = _PLAIN[matcher] = tuple(s for s in made if s is not None)
    return got


# A block is worth this lane with at least this many lines holding a plain
# signature's literal, and one in WORTH_SHARE of its lines: fewer cost less one at a
# time than a finditer over the whole block (a GiB of request logging, a stats line
# among hundreds of request lines: none tried). Its first WORTH_SAMPLE bytes are
# counted first: counting a whole block's newlines and literal is ~0.75 ms, 0.8 s of
# CPU over a GiB of request logging (measured), and its head says no in ~30 us. A
# head with WORTH_LINES such lines at that share says yes for the block.
WORTH_LINES, WORTH_SHARE, WORTH_SAMPLE = 64, 8, 64 << 10


def worth(matcher: Matcher, block: bytearray, size: int) -> bool:
    """Whether block[:size] is dense enough with plain lines to try (bytes counted)."""
    if not ENABLED:
        return False
    head = min(size, WORTH_SAMPLE)
    for shape in _shapes(matcher):
        for text in shape.literals:
            literal = text.encode()
            sampled = block.count(literal, 0, head)
            # (a few in 64 KiB: no need to count its lines)
            if sampled < 4 or sampled * WORTH_SHARE < block.count(b"\n", 0, head):
                continue
            if sampled >= WORTH_LINES:
                return True  # (its head is dense enough: the rest not counted, ~1 ms a MiB)
            n = block.count(literal, 0, size)
            if n >= WORTH_LINES and n * WORTH_SHARE >= block.count(b"\n", 0, size):
                return True
    return False


def take(
    matcher: Matcher,
    source: str,
    text: str,
    first_line: int,
    result: ScanResult,
    odd: lane.Odd,
    tail: int,
) -> int | None:
    """Match and roll up the block's text (ASCII, whole lines) as the line-by-line
    scan would, if its candidate lines are plain stats lines, plain retraction lines
    (given to the sink in their place) and a few odd ones (matched as line by line:
    `odd`, as lane.try_block has it): how much of the text
    it took (whole lines from its start). All of it, or the lines above the first odd
    line among its last ones (from `tail` on: such a line waits for the next block, as
    line by line, which takes it and the lines after it). 0, with nothing recorded,
    when the polars lane would not take the block either (a candidate line too long
    or with a stop literal); None when it is the polars lane's to judge."""
    if not ENABLED:
        return None
    got = _lines(matcher, text)
    if got is None:
        return None
    shape, sets, odd_lines = got
    late = [start for _, start, _ in odd_lines if start >= tail]
    if late:
        # (a thrashing SGLang server's retraction every few seconds is among a block's
        # last lines in ~40 % of its blocks: they went line by line)
        cut = min(late)
        return (take(matcher, source, text[:cut], first_line, result, odd, cut) or 0) if cut else 0
    if any(len(t) > lane.MAX_LINE or _holds_stop(t) for _, _, t in odd_lines):
        return 0
    blocks: list[_Block] = []
    preempting: list[_Block] = []
    for j, rows, index in sets:
        block = _Block.of(shape, j, rows, index, first_line)
        whole = text if index is None and not shape.wrap else None
        if block is None or not _alone(matcher, block, whole):
            return None
        if block.rows.sig.kind is Kind.PREEMPTION:
            block.lines = []
            preempting.append(block)
            continue
        block.tag, block.lines = len(blocks), []  # (lane.walk's set; the lines read)
        blocks.append(block)
    if not blocks:
        return None  # (retractions alone: no rollup of stats lines to keep them among)
    sink = result.sink
    assert sink is not None
    allowed = _clocks(blocks, sink.clock)
    if not _one_clock(blocks, preempting) and not all(
        lane._clock(b.rows, i) in allowed(k)
        for b in preempting
        for i, k in enumerate(b.index or ())
    ):
        return 0  # (a retraction would move the clock: odd to the polars lane, refused)
    others = _odd_hits(matcher, odd_lines, odd, first_line, allowed)
    if isinstance(others, bool):
        return None if others else 0
    _roll(source, blocks, others, result, _fed(preempting))
    return len(text)


# One signature's plain lines: which of the shape's, their groups, and their line
# indexes in the block (None when every line is one).
Set = tuple[int, list[tuple[str | None, ...]], list[int] | None]


def _lines(
    matcher: Matcher, text: str
) -> tuple[_Shape, list[Set], list[tuple[int, int, str]]] | None:
    """(the shape, the plain lines of each of its signatures that has some, the other
    candidate lines (line index, where it starts, its text)), or None when the block
    does not qualify: no plain line, too many other candidate lines."""
    shape = _first(matcher, text)
    if shape is None:
        return None
    got = [m.groups() for m in shape.regex.finditer(text)]
    lines = text.count("\n") + (not text.endswith("\n"))
    if len(got) == lines + 1:
        got.pop()  # the empty match after the last newline
    if len(got) != lines:
        return None
    line, other, tail = shape.line, shape.other, shape.tail
    # (a column read by itemgetter in C: ~3 ms of a 1 MiB block as generators; an
    # other line's tail is None, a plain line's text never empty)
    if tail is not None and any(map(itemgetter(tail), got)):
        return None  # (something after the match: the polars lane's to judge)
    if len(shape.m) == 1 and all(map(itemgetter(line), got)):
        return shape, [(0, got, None)], []
    plain = [k for k, g in enumerate(got) if g[line] is not None]
    if not plain:
        return None
    sets: list[Set] = []
    for j, m in enumerate(shape.m):
        index = plain if len(shape.m) == 1 else [k for k in plain if got[k][m] is not None]
        if index:
            sets.append((j, [got[k] for k in index], index))
    if len(plain) == len(got):
        return shape, sets, []
    rest: list[str] = [g[other] for g in got if g[line] is None]
    found = Literals.of(matcher.literals).found("\n".join(rest).encode("ascii"))
    if not found:
        return shape, sets, []
    # The candidate lines among the others (a literal in them: the prefilter's test)
    # and where each starts (ASCII: a character is a byte).
    cands = [
        k for k, g in enumerate(got) if g[line] is None and any(lit in g[other] for lit in found)
    ]
    if len(cands) > MAX_ODD:
        return None
    starts = [0]
    around = shape.around
    for g in got:
        size = len(g[other]) if g[line] is None else len(g[line]) + sum(len(g[k]) for k in around)
        starts.append(starts[-1] + 1 + size)
    return shape, sets, [(k, starts[k], got[k][other]) for k in cands]


def _holds_stop(text: str) -> bool:
    return any(lit in text for lit in lane._STOP)


def _odd_hits(
    matcher: Matcher,
    odd_lines: list[tuple[int, int, str]],
    odd: lane.Odd,
    first_line: int,
    allowed: Callable[[int], set[tuple[str, str] | None]],
) -> dict[int, ScanResult] | bool:
    """lane._odd_lines: the odd candidate lines matched as line by line (by line
    index). False when the block must go line by line: one in the block's tail (take
    leaves those to line by line), one a wrapped record's rejoin reached from, a hit
    whose clock is not `allowed` there or that has no stamp (the polars lane finds the
    same of the same lines: a line with no stats hit is odd to it too). True when one
    gives a stats hit (the polars lane may read it as a plain line of another
    signature)."""
    if not odd_lines:
        return {}
    out = lane.match_odd(
        matcher,
        odd,
        ((k, start, start + len(line), first_line + k) for k, start, line in odd_lines),
    )
    if isinstance(out, bool):
        return out
    for k, got in out.items():
        clocks = allowed(k)
        for h in got.hits:
            when = stamp(h)
            if when[0] is None or when[1] is None or when[0] not in clocks:
                return False
    return out


def _one_clock(blocks: list[_Block], preempting: list[_Block]) -> bool:
    """Whether every plain line of the block, stats and retraction, has one clock (the
    common case: then each retraction has the clock of the stats line above it, or of
    the first one, which _clocks allows)."""
    width = blocks[0].shape.clock
    return len({m[:width] for b in (*blocks, *preempting) for m in set(b.minutes)}) == 1


def _clocks(
    blocks: list[_Block], clock: tuple[str, str] | None
) -> Callable[[int], set[tuple[str, str] | None]]:
    """The clocks a hit of another line (an odd line's, a retraction's) may have at a
    line index of the block: the one the sink has there, the last plain stats line's
    above it. Above the first plain line, the sink's before the block or the first
    plain line's: the sink closes the open rollups of another clock on that hit as it
    would line by line, and the block's first edges find its clock set. (lane.py
    allows only the sink's: a log's start-up lines, above its first stats line, sent
    its first block line by line.)"""
    first = min(blocks, key=lambda b: b.place(0))
    opening = {clock, lane._clock(first.rows, 0)}

    def allowed(k: int) -> set[tuple[str, str] | None]:
        above: list[tuple[int, _Block, int]] = []
        for b in blocks:
            assert b.index is not None  # (other lines: not every line is this one's)
            i = bisect_left(b.index, k) - 1
            if i >= 0:
                above.append((b.index[i], b, i))
        if not above:
            return opening
        _, b, i = max(above, key=lambda a: a[0])
        return {lane._clock(b.rows, i)}

    return allowed


def _first(matcher: Matcher, text: str) -> _Shape | None:
    """The shape of the block's first line holding a literal of one of its signatures
    and fitting it."""
    best, at = None, len(text)
    for shape in _shapes(matcher):
        for literal in shape.literals:
            p = text.find(literal, 0, at)
            if p == -1:
                continue
            start = text.rfind("\n", 0, p) + 1
            m = shape.regex.match(text, start)
            if m is not None and m.group("lane_line") is not None:
                best, at = shape, p
    return best


class _Block:
    """One signature's plain lines of a block as columns (lane._Rows), and what the
    rollups read."""

    __slots__ = (
        "floats",
        "index",
        "lines",
        "lower",
        "minutes",
        "npre",
        "rows",
        "secs",
        "shape",
        "streams",
        "tag",
        "zone",
    )

    def __init__(
        self,
        shape: _Shape,
        tag: int,
        rows: lane._Rows,
        lines: list[str],
        index: list[int] | None,
        minutes: list[str],
        secs: list[str],
    ) -> None:
        self.shape, self.tag = shape, tag
        self.rows = rows
        self.lines = lines  # (the whole lines: what the prefilter reads)
        self.index = index  # where each line is in the block (None: every line is one)
        self.minutes = minutes
        self.secs = secs
        self.streams: list[tuple[object, ...]] | None = None  # None: one stream
        # AGG_FIELDS' values as floats (rollup.number), None for a field not there
        self.floats: list[list[float | None] | None] = []
        self.npre: list[int] | None = None  # None: no line carries a count
        self.lower: list[bool] | None = None
        self.zone: str | None = None  # its wrapper stamps' zone (CalmRows.zone)

    def place(self, i: int) -> int:
        """Where line i is among the block's lines."""
        return i if self.index is None else self.index[i]

    @classmethod
    def of(
        cls,
        shape: _Shape,
        j: int,
        groups: list[tuple[str | None, ...]],
        index: list[int] | None,
        first_line: int,
    ) -> _Block | None:
        """The columns of the shape's j-th signature's lines, None when a value does not
        convert or a stamp is no time. Empties `groups`, and lets each field's texts
        go once converted: a 1 MiB block's groups are ~5 MB of str objects, most of its
        peak memory."""
        sig = shape.sigs[j]
        n = len(groups)
        cols: list[Sequence[Any]] = list(zip(*groups, strict=True))
        groups.clear()
        typed: dict[str, list[Any]] = {}
        holes: set[str] = set()  # (the fields that may hold a None: the others hold none)
        for name, typ in sig.fields.items():
            at = shape.fields[j][name]
            if at is None:
                typed[name] = [None] * n
                holes.add(name)
                continue
            raw = cols[at]
            cols[at] = ()  # (its texts go with `raw`)
            if typ == "str":
                typed[name] = list(raw)
                holes.add(name)
                continue
            distinct = set(raw)
            if None in distinct:
                holes.add(name)
            if len(distinct) * 2 > len(raw) and None not in distinct:
                # (most values differ, throughputs: each converted, not each distinct)
                each = _convert_each(raw, typ)
                if each is not None:
                    typed[name] = each
                    continue
            conv = _convert([v for v in distinct if v is not None], typ)
            if conv is None:
                return None
            conv[None] = None
            typed[name] = list(map(conv.__getitem__, raw))
        ts: list[str] = list(cols[shape.ts])  # (a plain line's stamp: never None)
        zone: str | None = None
        if shape.wrap == "json" and any("\\" in t or '"' in t for t in cols[shape.line]):
            return None  # (JSON escaped something: the record's text is not the line's)
        if shape.stamp is not None:
            # (timed by the wrapper's stamp: rollup.stamp_of's minute, its zone after
            # it, and seconds, `,` read as `.`)
            stamps: list[str] = list(cols[shape.stamp])
            zone = _zone(stamps)
            if zone is None:
                return None
            minutes = [t[:16] + zone for t in stamps]
            secs = [t[17 : -len(zone)] for t in stamps]
            if any("," in t for t in secs):
                secs = [t.replace(",", ".") for t in secs]
            if not _real_wrapped(minutes, secs, zone):
                return None
        else:
            cut = shape.at + 5  # `MM-DD HH:MM` / `YYYY-MM-DD HH:MM`
            minutes = [t[:cut] for t in ts]
            secs = [t[cut + 1 :] for t in ts]
            if not _real(minutes, secs, shape.sglang):
                return None
        lines: list[str] = list(cols[shape.line])
        texts: list[str] = lines if shape.rec == shape.line else list(cols[shape.rec])
        pre = shape.pre[j]
        if pre is not None:  # (SGLang's)
            start: Sequence[int] = _lengths(cols[pre])
            proc = _ranks(cols[shape.proc])
        else:
            start = _Starts(texts, cols[shape.m[j]])
            proc = _one_each(list(cols[shape.proc]))
        lineno = (
            list(range(first_line, first_line + n))
            if index is None
            else [first_line + k for k in index]
        )
        rows = lane._Rows(
            sig=sig,
            lineno=lineno,
            texts=texts,
            start=start,
            proc=proc,
            ts=[None] * n if shape.sglang else ts,  # type: ignore[arg-type]
            wrapper=stamps if zone is not None else ts if shape.sglang else None,
            typed=typed,
            wrapper_kind="iso" if zone is not None else "sql",
        )
        block = cls(shape, j, rows, lines, index, minutes, secs)
        block.zone = zone
        if sig.kind is Kind.STATS:  # (a retraction's lines are not aggregated)
            block._derive(holes)
        return block

    def _derive(self, holes: set[str]) -> None:
        """Stream keys, the aggregated fields as floats, preemption counts. `holes`:
        the fields that may hold a None (counted; ~1 ms a 1 MiB block for all)."""
        r = self.rows
        n = len(r.lineno)
        parts: list[Sequence[object]] = [r.proc]
        for name in r.sig.fields:
            col = r.typed[name]
            nulls = col.count(None) if name in holes else 0
            if 0 < nulls < n:  # (constant in the block otherwise)
                parts.append([v is None for v in col])
        parts += [r.typed[k] for k in STREAM_FIELDS if k in r.sig.fields]
        if any(len(set(p)) > 1 for p in parts):
            self.streams = list(zip(*parts, strict=True))
        for k in AGG_FIELDS:
            values = r.typed.get(k)
            nulls = n if values is None else values.count(None) if k in holes else 0
            if values is None or nulls == n:
                self.floats.append(None)
            elif nulls == 0:
                # (a float field's values are floats; an int field's are made floats)
                exact = r.sig.fields[k] in ("float", "percent", "fraction_percent")
                self.floats.append(values if exact else list(map(float, values)))
            else:
                self.floats.append([None if v is None else float(v) for v in values])
        counts = [r.typed[k] for k in lane._PREEMPT_FIELDS if k in r.typed]
        if any(col.count(None) < n for col in counts):
            pairs = [_preemptions(r, i) for i in range(n)]
            self.npre = [p for p, _ in pairs]
            self.lower = [low for _, low in pairs]


# Digits and points only (with the NULs that join them): a number the converters
# read as float() or int() does, no comma or sign to take off first.
_DIGITS = re.compile(r"[0-9.\x00]*")
_FAST = {"float": (float, FLOAT_LIMIT), "percent": (float, PERCENT_LIMIT)}
_FAST_INT = {"int": _INT_LIMIT, "int_commas": _INT_LIMIT}


class _Starts(Sequence[int]):
    """Where each line's match starts (after its head), worked out when asked: the
    hits and calm minutes ask for a few lines of a block. It keeps the matches'
    lengths, not the matches (~0.9 MB of a 1 MiB block's peak)."""

    __slots__ = ("_lines", "_matched")

    def __init__(self, lines: list[str], matched: Sequence[str]) -> None:
        self._lines = lines
        self._matched = array("i", map(len, matched))  # (each match's length)

    def __len__(self) -> int:
        return len(self._lines)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...
    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice):
            return [len(a) - b for a, b in zip(self._lines[i], self._matched[i], strict=True)]
        return len(self._lines[i]) - self._matched[i]

    def at(self, rows: list[int]) -> list[int]:
        """[self[i] for i in rows], without a method call a row."""
        lines, matched = self._lines, self._matched
        return [len(lines[i]) - matched[i] for i in rows]


def _convert_each(raw: Sequence[str], typ: str) -> list[Any] | None:
    """Digit strings converted in their order as CONVERTERS[typ] converts them (float()
    or int() at once: the converters' own checks are their ranges, checked on the
    maximum); None where the converter's long way is needed."""
    if not raw or not _DIGITS.fullmatch("\x00".join(raw)):
        return None
    try:
        if typ in _FAST:
            make, limit = _FAST[typ]
            values: list[Any] = list(map(make, raw))
            top = max(values)
            return values if top <= limit and (typ == "percent" or top < limit) else None
        if typ in _FAST_INT:
            values = list(map(int, raw))
            return values if max(values) < _FAST_INT[typ] else None
    except ValueError:
        pass  # (`1.2.3`: the converter says so)
    return None


def _convert(raw: list[str], typ: str) -> dict[Any, Any] | None:
    """Each distinct value converted as CONVERTERS[typ] converts it; None when one does
    not convert. (Digit strings, nearly all of them: _convert_each.)"""
    values = _convert_each(raw, typ)
    if values is not None:
        return dict(zip(raw, values, strict=True))
    conv = _converted(raw, typ)
    if any(v is _BAD for v in conv.values()):
        return None
    return dict(conv)


def _real(minutes: list[str], secs: list[str], sglang: bool) -> bool:
    """Whether every minute (`MM-DD HH:MM`, SGLang's `YYYY-MM-DD HH:MM`) and seconds
    is a real time (rollup.stamp_of): each hour's day and hour, then minutes and
    seconds up to 59."""
    at = 11 if sglang else 6
    distinct = set(minutes)
    for hour in {m[: at + 2] for m in distinct}:
        wrapper = WrapperStamp("sql", f"{hour}:00:00") if sglang else None
        if stamp_of(wrapper, None if sglang else f"{hour}:00:00")[1] is None:
            return False
    return max(secs) <= "59" and max(m[at + 3 :] for m in distinct) <= "59"


def _zone(stamps: list[str]) -> str | None:
    """The zone every wrapper stamp (_WRAP's) ends in, None where they have two."""
    zone = "Z" if stamps[0].endswith("Z") else stamps[0][-6:]
    return zone if all(t.endswith(zone) for t in stamps) else None


def _real_wrapped(minutes: list[str], secs: list[str], zone: str) -> bool:
    """_real of wrapper stamps (`YYYY-MM-DDTHH:MM` and their zone, `SS.fff`): each
    hour's a real time in that zone (rollup.stamp_of: timeparse.parse_iso), then
    minutes and seconds up to 59."""
    for hour in {m[:13] for m in minutes}:
        if stamp_of(WrapperStamp("iso", f"{hour}:00:00{zone}"), None)[1] is None:
            return False
    return max(t[:2] for t in secs) <= "59" and max(m[14:16] for m in set(minutes)) <= "59"


def _one_each(values: list[str | None]) -> list[str | None]:
    """lane._shared: equal values one object (a block's lines nearly always have one
    process name: that in C, ~0.7 ms a block less)."""
    if values.count(values[0]) == len(values):
        return [values[0]] * len(values)
    return lane._shared(values)


def _ranks(ranks: Sequence[str]) -> list[str | None]:
    """SGLang's process names: lines.sglang_rank of each head's ranks, as normalise
    and new_hit read them."""
    names = {r: sglang_rank(r.strip() or None) for r in set(ranks)}
    return _one_each(list(map(names.__getitem__, ranks)))


def _lengths(pre: Sequence[str]) -> Sequence[int]:
    """Where each record's match starts: after the text its plain shape puts before
    it (`Decode batch, `)."""
    sizes = {p: len(p) for p in set(pre)}
    if len(set(sizes.values())) == 1:
        return [next(iter(sizes.values()))] * len(pre)
    return list(map(sizes.__getitem__, pre))


def _preemptions(r: lane._Rows, i: int) -> tuple[int, bool]:
    """rollup.stats_preemptions of line i."""
    return stats_preemptions({k: r.typed[k][i] for k in lane._PREEMPT_FIELDS if k in r.typed})


def _alone(matcher: Matcher, block: _Block, whole: str | None) -> bool:
    """Whether the block's plain lines (`whole`: the block's text, when they are all of
    it) are candidates of their signature alone, or of others that match none of
    them, with nothing in them that sends a line another way."""
    shape, r = block.shape, block.rows
    sig, lines = r.sig, block.lines
    if max(map(len, lines)) > lane.MAX_LINE:
        return False
    n = len(lines)
    text = "\n".join(lines) if whole is None else whole
    if not shape.sglang and (text.count("INFO ") != n or text.count(shape.literals[0]) != n):
        return False
    data = text.encode("ascii")
    present = [lit for lit in matcher.literals if lit in lines[0]]
    rest = [lit for lit in matcher.literals if lit not in present]
    stops = (*lane._STOP, *(_SG_STOPS if shape.sglang else _LEVELS))
    # One scan for what must not be there (a stop literal, a level word) and the
    # other literals (a line holding one is a candidate of more signatures), one for
    # what those signatures' patterns require. (Two databases: hyperscan compiled the
    # ~145 literals of both in one with a ~19 MiB peak, against ~4 MiB for the two.)
    found = Literals.of((*stops, *rest)).found(data)
    if any(lit in found for lit in stops):
        return False
    # (a `Preemptions: N` on some lines, say: their signatures are shown too)
    cands = matcher.candidates(" \n ".join(present + [lit for lit in rest if lit in found]))
    if sig not in cands or not all(s.builtin for s in cands):
        return False
    others = [(s, _requires(s.pattern)) for s in cands if s is not sig]
    # The signatures' patterns run on the records (SGLang's: what follows the head).
    records = text if shape.rec == shape.line else "\n".join(r.texts)
    needs = [need for _, need in others if need is not None]
    if needs:
        # (those in the first record are in them: hyperscan looks for the others only,
        # ~1.2 ms of a 1 MiB block less where a few short ones are on every line)
        required = _required(needs)
        found = {lit for lit in required if lit in r.texts[0]}
        rare = Literals.of(tuple(lit for lit in required if lit not in found))
        found |= rare.found(data if records is text else records.encode("ascii"))
        if not all(_matches_none(need, found, records) for need in needs):
            return False
    # A pattern _requires cannot read (SGLang's decode pattern, whose literal each
    # prefill line holds) runs on each record, as the line-by-line scan runs it.
    unread = [s.regex for s, need in others if need is None]
    return not any(p.search(t) for p in unread for t in r.texts)


Need = tuple[tuple[str, ...], tuple[str, str] | None]


def _required(needs: list[Need]) -> tuple[str, ...]:
    return tuple(sorted({lit for need in needs for lit in need[0]}))


def _matches_none(need: Need, found: set[str], text: str) -> bool:
    """Whether a pattern that requires `need` (_requires) matches none of the lines of
    `text` (shown, not tried): a literal it requires is not in it (`found`: those that
    are), or it starts with a literal look-behind `(?<!L)` before a literal R, and every
    R in `text` follows an L."""
    literals, behind = need
    if any(lit not in found for lit in literals):
        return True
    if behind is not None:
        # (R overlaps no other R: each LR holds its own R, so equal counts mean every
        # R follows an L; an R near a line's start has a newline, no L, before it)
        before, after = behind
        return text.count(after) == text.count(before + after)
    return False


@cache
def _requires(pattern: str) -> tuple[tuple[str, ...], tuple[str, str] | None] | None:
    """(runs of literal text every match of `pattern` holds, longest first; (L, R)
    where it starts `(?<!L)R` with literal L and R), None when it cannot be read."""
    try:
        parsed = _parser.parse(pattern)
    except (re.error, RecursionError):
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None
    runs: list[str] = []
    current: list[str] = []

    def flush() -> None:
        if current:
            runs.append("".join(current))
            current.clear()

    def walk(items: Any) -> bool:
        for op, av in items:
            if op is _parser.LITERAL:
                current.append(chr(av))
            elif op is _parser.SUBPATTERN:
                if av[1] & re.IGNORECASE:
                    return False
                if not walk(av[3]):
                    return False
            elif op in (_parser.MAX_REPEAT, _parser.MIN_REPEAT) and av[0] >= 1:
                flush()
                if not walk(av[2]):
                    return False
                flush()
            else:
                flush()
        return True

    if not walk(parsed):
        return None
    flush()
    if not runs:
        return None  # (no literal every match holds, an alternation's: nothing to show)
    behind = None
    items = list(parsed)
    if len(items) >= 2 and items[0][0] is _parser.ASSERT_NOT and items[0][1][0] == -1:
        before = _literal_text(items[0][1][1])
        after = _leading_literal(items[1:])
        if before and after and "\n" not in before + after and _border_free(after):
            behind = (before, after)
    return tuple(sorted(set(runs), key=lambda r: (-len(r), r))), behind


def _literal_text(items: Any) -> str | None:
    out = []
    for op, av in items:
        if op is not _parser.LITERAL:
            return None
        out.append(chr(av))
    return "".join(out)


def _border_free(s: str) -> bool:
    """No proper prefix of s is also its suffix: two of its occurrences never overlap."""
    return all(s[:k] != s[-k:] for k in range(1, len(s)))


def _leading_literal(items: Any) -> str:
    out = []
    for op, av in items:
        if op is not _parser.LITERAL:
            break
        out.append(chr(av))
    return "".join(out)


# --- the rollups ---------------------------------------------------------------------

Seg = tuple[int, int, list[int], int, bool, object, int]
# Builder adds a field's values one at a time; sum() does that for floats up to 3.11
# and adds with compensation from 3.12 (then: reduce, ~3x slower).
_sum: Callable[[list[float]], float] = (
    partial(sum, start=0.0) if sys.version_info < (3, 12) else partial(reduce, add, initial=0.0)
)


def _roll(
    source: str,
    blocks: list[_Block],
    others: dict[int, ScanResult],
    result: ScanResult,
    fed: list[lane.Fed],
) -> None:
    """lane._roll of the block's lines (one _Block a stats signature): segments (one
    stream, one clock minute, stamps not going back, no change of clock between), the
    edges through the sink, the inner ones aggregated as Builder aggregates, as calm
    minutes where they are, the odd lines' hits (`others`, by line index) and the
    retraction lines (`fed`) in their place."""
    sink = result.sink
    assert sink is not None
    runs = _runs(blocks)
    made = [_segments(b, None if runs is None else runs[j]) for j, b in enumerate(blocks)]
    last_run = max(last for _, last in made)
    per = [_edges(b, segs, last_run) for b, (segs, _) in zip(blocks, made, strict=True)]
    # (in order of their first lines: the segment is named by where that is)
    segs = per[0] if len(per) == 1 else sorted((s for p in per for s in p), key=lambda s: s[0])
    kv_limit = result.calm_kv
    inner: list[list[Seg]] = []
    aggs: list[_Aggs] = []
    quiet: set[int] = set()
    for b, mine in zip(blocks, per, strict=True):
        inner.append([s for s in mine if not s[4]])
        aggs.append(_Aggs(b, [s[2] for s in inner[-1]]))
        if kv_limit is not None and "cumulative" not in b.rows.sig.fields:
            quiet.update(inner[-1][j][0] for j in aggs[-1].quiet(b, kv_limit))
    calm: set[int] = set()
    if quiet:
        calm = lane.calm_of(
            quiet,
            ((s[0], blocks[s[6]].minutes[s[2][0]], s[3], s[4]) for s in segs),
            others,
            {f[1] for f in fed},
            result.calm_window,
        )
    if calm:
        # one CalmRows a signature, in order of their first calm minutes
        chosen = [[j for j, s in enumerate(mine) if s[0] in calm] for mine in inner]
        order = sorted((inner[k][c[0]][0], k) for k, c in enumerate(chosen) if c)
        for _, k in order:
            result.calm.append(_calm_rows(source, blocks[k], aggs[k], chosen[k]))
    rolled = {
        s[0]: agg.one(j)
        for mine, agg in zip(inner, aggs, strict=True)
        for j, s in enumerate(mine)
        if s[0] not in calm
    }
    lane.walk(source, [b.rows for b in blocks], segs, rolled, calm, others, sink, result, fed)


def _fed(blocks: list[_Block]) -> list[lane.Fed]:
    """The retraction lines of the block, in order: (line index, minute, rows, row)."""
    fed = [(k, b.minutes[i], b.rows, i) for b in blocks for i, k in enumerate(b.index or ())]
    if len(blocks) > 1:
        fed.sort(key=itemgetter(0))
    return fed


def _runs(blocks: list[_Block]) -> list[list[int]] | None:
    """Each line's clock run (how many changes of clock above it) in the block's line
    order, per signature, where its signatures' lines share a block and it has more
    than one clock (SGLang's decode and prefill lines across midnight); None where
    each reckons its own (one signature, or one clock: each line's run is 0)."""
    if len(blocks) == 1:
        return None
    width = blocks[0].shape.clock
    if len({m[:width] for b in blocks for m in set(b.minutes)}) == 1:
        return None
    clock_at: dict[int, str] = {}
    for b in blocks:
        assert b.index is not None
        clock_at.update(zip(b.index, (m[:width] for m in b.minutes), strict=True))
    run_at: dict[int, int] = {}
    run, now = 0, None
    for place in sorted(clock_at):
        clock = clock_at[place]
        if now is not None and clock != now:
            run += 1
        now, run_at[place] = clock, run
    return [[run_at[k] for k in b.index or ()] for b in blocks]


def _segments(block: _Block, runs: list[int] | None) -> tuple[list[list[Any]], int]:
    """The block's segments in order of their first lines (members, clock run,
    stream), and its last clock run. `runs`: each line's clock run in the whole
    block's order (_runs), None where the block reckons them from its own minutes."""
    minutes, secs = block.minutes, block.secs
    width = block.shape.clock
    n = len(minutes)
    if block.streams is None and runs is None:
        # One stream: a segment ends where the minute changes or the seconds go back.
        cuts = [
            i
            for i, a, b, x, y in zip(
                range(1, n), minutes, minutes[1:], secs, secs[1:], strict=False
            )
            if a != b or x > y
        ]
        bounds = [0, *cuts, n]
        out: list[list[Any]] = []
        run, clock = 0, minutes[0][:width]
        for a, b in pairwise(bounds):
            if minutes[a][:width] != clock:
                clock = minutes[a][:width]
                run += 1
            out.append([list(range(a, b)), run, None])
        return out, run
    streams: Sequence[object] = block.streams or [None] * n
    open_: dict[object, list[Any]] = {}  # stream -> [minute, sec, run, members]
    segs: list[list[Any]] = []
    run, minute_now, clock = 0, minutes[0], minutes[0][:width]
    for i, (minute, sec, stream) in enumerate(zip(minutes, secs, streams, strict=True)):
        if runs is not None:
            run = runs[i]
        elif minute != minute_now:
            minute_now = minute
            if minute[:width] != clock:
                clock = minute[:width]
                run += 1
        o = open_.get(stream)
        if o is not None and o[0] == minute and o[1] <= sec and o[2] == run:
            o[1] = sec
            o[3].append(i)
            continue
        members = [i]
        open_[stream] = [minute, sec, run, members]
        segs.append([members, run, stream])
    return segs, run


def _edges(block: _Block, segs: list[list[Any]], last_run: int) -> list[Seg]:
    """The segments as lane.walk takes them: (seg: where its first line is among the
    block's lines, which names it; that again; members, clock run, edge, stream,
    which signature). The edges are the first segment of each stream in the block's
    first clock and the last of each in its last one: they go through the sink."""
    first_of: dict[object, int] = {}
    last_of: dict[object, int] = {}
    for k, s in enumerate(segs):
        first_of.setdefault(s[2], k)
        last_of[s[2]] = k
    edges = {
        k
        for k in {*first_of.values(), *last_of.values()}
        if (segs[k][1] == 0 and first_of[segs[k][2]] == k)
        or (segs[k][1] == last_run and last_of[segs[k][2]] == k)
    }
    tag = block.tag
    out: list[Seg] = []
    for k, (members, run, stream) in enumerate(segs):
        place = block.place(members[0])
        out.append((place, place, members, run, k in edges, (tag, stream), tag))
    return out


class _Aggs:
    """What Builder accumulates over each inner segment's lines (rollup.Builder.add),
    a column at a time: per AGG_FIELDS field its sums, counts and maxima, and the
    segments' line counts, preemptions, lines with Waiting > 0, evidence line, peak
    KV and fewest running at it."""

    def __init__(self, block: _Block, members: list[list[int]]) -> None:
        self.members = members
        self.n = n = [len(m) for m in members]
        contiguous = all(m[-1] - m[0] + 1 == len(m) for m in members)

        def parts(col: Sequence[Any]) -> list[Any]:
            if contiguous:
                return [col[m[0] : m[-1] + 1] for m in members]
            return [[col[i] for i in m] for m in members]

        none: list[Any] = [None] * len(members)
        self.sums: list[list[float]] = []
        self.counts: list[list[int]] = []
        self.maxes: list[list[float | None]] = []
        values: list[list[Any] | None] = []
        for col in block.floats:
            if col is None:
                self.sums.append([0.0] * len(members))
                self.counts.append([0] * len(members))
                self.maxes.append(none)
                values.append(None)
                continue
            groups = parts(col)
            # (a field is there on every line of a stream or on none)
            there = [g[0] is not None for g in groups]
            self.sums.append([_sum(g) if t else 0.0 for g, t in zip(groups, there, strict=True)])
            self.counts.append([k if t else 0 for k, t in zip(n, there, strict=True)])
            self.maxes.append([max(g) if t else None for g, t in zip(groups, there, strict=True)])
            values.append(groups)
        self.npre = none if block.npre is None else parts(block.npre)
        self.pre = [0] * len(members) if block.npre is None else list(map(sum, self.npre))
        self.lower = (
            [False] * len(members) if block.lower is None else list(map(any, parts(block.lower)))
        )
        waits = values[WAITING]
        self.waiting_pos = [
            0 if w is None or w[0] is None or mx is None or mx <= 0 else sum(v > 0 for v in w)
            for w, mx in zip(waits or none, self.maxes[WAITING], strict=True)
        ]
        kv = block.floats[KV]
        # Builder's evidence pick: the first line with the highest (KV or -1,
        # preemptions); its peak KV (-1 on a line without one) and the fewest running
        # on a line at it.
        if kv is None:
            picks = filled = parts([-1.0] * len(block.minutes))
        else:
            # (a KV of 0 picks as -1, as a missing one; the column itself where it has
            # neither)
            whole = None not in kv
            filled = parts(kv if whole else [-1.0 if v is None else v for v in kv])
            picks = filled if whole and 0.0 not in kv else parts([v or -1.0 for v in kv])
        self.peak_at = [
            g.index(max(g)) if not pre else _first_max(list(zip(g, p, strict=True)))
            for g, pre, p in zip(picks, self.pre, self.npre, strict=True)
        ]
        self.peak_kv = list(map(max, filled))
        runs = values[RUNNING]
        self.peak_running = [
            None if r is None or r[0] is None else _fewest(r, f, pk)
            for r, f, pk in zip(runs or none, filled, self.peak_kv, strict=True)
        ]

    def quiet(self, block: _Block, kv_limit: float) -> list[int]:
        """lane._calm_segments' test: no line preempted or carries a preemption count
        (a stream's lines all do or none), every line says how many wait, KV under the
        limit (analyze.CALM_KV). The segments' positions."""
        counted = block.rows.typed.get("preemptions")
        out = []
        for j, (m, k) in enumerate(zip(self.members, self.n, strict=True)):
            kv = self.maxes[KV][j]
            if (
                self.pre[j] == 0
                and not self.lower[j]
                and (counted is None or counted[m[0]] is None)
                and self.counts[WAITING][j] == k
                and not (kv is not None and kv >= kv_limit)
            ):
                out.append(j)
        return out

    def one(self, j: int) -> lane._Agg:
        m = self.members[j]
        pre = self.npre[j]
        return lane._Agg(
            rows=tuple(m),
            n=self.n[j],
            preemptions=self.pre[j],
            lower=self.lower[j],
            sums=tuple(s[j] for s in self.sums),
            counts=tuple(c[j] for c in self.counts),
            maxes=tuple(x[j] for x in self.maxes),
            waiting_pos=self.waiting_pos[j],
            peak_row=m[self.peak_at[j]],
            peak_kv=self.peak_kv[j],
            peak_running=self.peak_running[j],
            preempting=()
            if pre is None
            else tuple(i for i, p in zip(m, pre, strict=True) if p > 0)[:2],
        )


def _first_max(keys: list[Any]) -> int:
    return keys.index(max(keys))


def _fewest(runs: list[float], filled: list[float], peak: float) -> int:
    if filled.count(peak) == 1:
        return int(runs[filled.index(peak)])
    return min(int(r) for r, f in zip(runs, filled, strict=True) if f == peak)


def _calm_rows(source: str, block: _Block, agg: _Aggs, chosen: list[int]) -> CalmRows:
    """lane._calm_set's rows of the chosen inner segments, from Python lists."""
    r = block.rows
    sig = r.sig
    members = [agg.members[j] for j in chosen]
    first = [m[0] for m in members]
    last = [m[-1] for m in members]
    peak = [agg.members[j][agg.peak_at[j]] for j in chosen]
    ts: list[str] = r.ts if r.wrapper is None else r.wrapper  # type: ignore[assignment]
    at = block.shape.at  # (where the hour is in a stamp)

    def take(values: Sequence[Any], which: list[int]) -> list[Any]:
        return [values[i] for i in which]

    every = len(chosen) == len(agg.members)  # (the usual: every inner segment, in order)

    def pick(values: list[Any]) -> list[Any]:
        return values if every else [values[j] for j in chosen]

    stamp_first = take(ts, first)
    swapped, waiting = r.typed.get("swapped"), r.typed.get("waiting")
    cols: dict[str, tuple[str, list[Any]]] = {
        "first_line": ("q", take(r.lineno, first)),
        "first_us": ("q", _micros(take(block.secs, first))),
        "last_line": ("q", take(r.lineno, last)),
        "last_us": ("q", _micros(take(block.secs, last))),
        "last_pos": ("q", _starts_at(r.start, last)),
        "day": ("s", [t[: at - 1] for t in stamp_first]),
        "hour": ("q", [int(t[at : at + 2]) for t in stamp_first]),
        "minute": ("q", [int(t[at + 3 : at + 5]) for t in stamp_first]),
        "n": ("q", pick(agg.n)),
        "peak_kv": ("d", pick(agg.peak_kv)),
        "peak_running": ("q", pick(agg.peak_running)),
        "swapped_first": ("", [None] * len(chosen) if swapped is None else take(swapped, first)),
        "swapped_last": ("", [None] * len(chosen) if swapped is None else take(swapped, last)),
        "waiting_first": ("", [None] * len(chosen) if waiting is None else take(waiting, first)),
        "waiting_last": ("", [None] * len(chosen) if waiting is None else take(waiting, last)),
        "waiting_pos": ("q", pick(agg.waiting_pos)),
        "peak_line": ("q", take(r.lineno, peak)),
        "peak_pos": ("q", _starts_at(r.start, peak)),
        "peak_text": ("s", take(r.texts, peak)),
        "peak_us": ("q", _micros(take(block.secs, peak))),
        "peak_proc": ("s", take(r.proc, peak)),
    }
    for k, name in enumerate(AGG_FIELDS):
        sums, counts = pick(agg.sums[k]), pick(agg.counts[k])
        cols[f"sum_{name}"] = ("d", sums)
        cols[f"cnt_{name}"] = ("q", counts)
        cols[f"max_{name}"] = ("d", pick(agg.maxes[k]))
        if name in CALM_MEANS:
            cols[f"mean_{name}"] = ("d", _means(sums, counts))
    names = (*CALM_COLUMNS, *(f"f_{n}" for n in sig.fields))
    data = [_column(*cols[c]) for c in CALM_COLUMNS]
    data += [_column(_KIND.get(sig.fields[n], ""), take(r.typed[n], peak)) for n in sig.fields]
    frame = Columns(names, tuple(data))
    return lane.calm_rows(source, sig, block.shape.sglang, frame, block.zone)


_US = 1_000_000


def _micros(secs: list[str]) -> list[int]:
    """Each line's microseconds into its minute from its seconds as Builder has them
    (_Block.secs: `SS`, a wrapper stamp's `SS.fffffffff`), as rollup._instant reads
    them (whole seconds, the usual, without it)."""
    if all(len(t) == 2 for t in secs):
        return [int(t) * _US for t in secs]
    return [s * _US + us for s, us in map(_instant, secs)]


_KIND = {
    "int": "q",
    "int_commas": "q",
    "float": "d",
    "percent": "d",
    "fraction_percent": "d",
    "str": "s",
}


def _starts_at(starts: Sequence[int], rows: list[int]) -> list[int]:
    """Where the match of each of `rows` starts (a block's _Starts, or any sequence)."""
    return starts.at(rows) if isinstance(starts, _Starts) else [starts[i] for i in rows]


def _means(sums: list[float], counts: list[int]) -> list[float | None]:
    """windows.snapped_mean of each minute's sum and count, as lane._calm_set: snap6
    of snap6(sum) over the count. (Sums of digit strings are finite and not negative,
    where snap6 is its rounding alone; any other goes through snap6 itself.)"""
    # (not negative and a finite total: every sum finite, none a NaN, which the total
    # would be)
    if sums and min(sums) >= 0.0 and sum(sums) < 1e300:
        r = round  # (a local: ~20 % of the comprehension's time less)
        return [
            r(r(s * 1e6) / 1e6 / c * 1e6) / 1e6 if c else None
            for s, c in zip(sums, counts, strict=True)
        ]
    return [snap6(snap6(s + 0.0) / c) if c else None for s, c in zip(sums, counts, strict=True)]


def _column(code: str, values: list[Any]) -> Sequence[Any]:
    """A column as lane.plain_columns keeps it (records.column_of): `d` floats, `q`
    ints, `s` strings."""
    return column_of(values, code if code in ("d", "q") else None)
