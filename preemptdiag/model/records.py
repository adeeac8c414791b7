"""Typed records that flow one way through the pipeline.

sources -> scan (Hit) -> events (Event) -> windows (Window) -> rules (Verdict)
-> advice (Lever) -> render (Report).
"""

from __future__ import annotations

import math
import os
import threading
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import FrozenInstanceError, dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import cache, partial
from itertools import accumulate, chain, groupby, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from preemptdiag.model.evolve import positional
from preemptdiag.model.fastinit import fast_init

FieldValue = int | float | str | None
T = TypeVar("T")


class Kind(StrEnum):
    """What an event means, independent of which line format carried it."""

    PREEMPTION = "preemption"  # one KV preemption/retraction signal
    STATS = "stats"  # periodic engine stats (vLLM stats line, SGLang batch line)
    CAPACITY = "capacity"  # start-up KV capacity (blocks, tokens, concurrency)
    CONFIG = "config"  # engine version / config / args
    ALLOC_FAILURE = "alloc_failure"  # GPU allocation failed (CUDA OOM, KV sizing)
    ENGINE_DEAD = "engine_dead"  # engine died (cause may be elsewhere)
    HOST_OOM = "host_oom"  # kernel / cgroup / container memory kill
    SWAP_WARNING = "swap_warning"  # host RAM swap-space sizing warning
    CONTEXT = "context"  # other recognised lines that only add context


class Class(StrEnum):
    """Window / incident classes (design.md section 3)."""

    HEALTHY = "healthy"
    QUEUEING = "queueing"
    BENIGN_PREEMPTION = "benign_preemption"
    THRASH_LOOP = "thrash_loop"
    ALLOCATION_FAILURE = "allocation_failure"
    HOST_PRESSURE = "host_pressure"
    INSUFFICIENT_EVIDENCE = "insufficient_evidence"


class Confidence(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


# What tells one printed record from another at one stamp (events._dedupe_ranks):
# its fields, as (name, str(value)) in name order.
CopyKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class RollupStats:
    """Aggregates over all `n` lines of a rollup, the carrier included; `sums`,
    `counts` and `maxes` follow rollup.AGG_FIELDS."""

    n: int
    preemptions: int  # as events.py counts stats lines, summed
    lower: bool
    sums: tuple[float, ...]
    counts: tuple[int, ...]
    maxes: tuple[float | None, ...]
    waiting_pos: int  # lines with Waiting > 0
    peak_kv: float  # highest KV usage (-1: none)
    peak_running: int | None  # fewest running requests on a line at peak_kv
    # A rollup of preemption lines (rollup.PreemptionBuilder) only. `preemptions` is
    # then what its members after the carrier count (the carrier's own count depends
    # on the lines before it: events._count_preemptions); the records of its first and
    # of its last stamp (copies of them printed by other ranks count once:
    # events._dedupe_ranks); a V0 counter's value after its last line, and its highest.
    first_copies: frozenset[CopyKey] = frozenset()
    last_copies: frozenset[CopyKey] = frozenset()
    cumulative: int | None = None
    highest: int | None = None


@dataclass(frozen=True, slots=True)
class Rollup(Generic[T]):
    """Further lines merged into the hit or event that carries this (rollup.py): stats
    lines, or preemption lines (`preempting`: the first members after the carrier;
    `peak_first`: the member latest in time, as a rank's copy may come after a later
    line); their aggregates, and the member lines evidence and ordering can need."""

    stats: RollupStats
    last: T
    peak_first: T  # first line with the highest (KV usage, preemptions)
    preempting: tuple[T, ...]  # the first two lines that preempted


@dataclass(frozen=True, slots=True)
class WrapperStamp:
    """A timestamp a wrapper put in front of the engine's line, with how to read it.

    kind: iso (RFC 3339, has a zone), sql (`YYYY-MM-DD HH:MM:SS`, no zone), dmesg_t
    (`dmesg -T`), syslog (`Aug 19 18:34:30`, no year), clock (`HH:MM:SS` alone), uptime
    (dmesg seconds since boot)."""

    kind: str
    text: str

    @property
    def dated(self) -> bool:
        """Carries its own date and year."""
        return self.kind in ("iso", "sql", "dmesg_t")


@dataclass(frozen=True, slots=True)
class Hit:
    """One signature match on one physical line (or a rejoined wrapped line)."""

    source: str  # display name of the input
    line: int  # 1-based physical line number of the match start
    sig: str  # signature id
    kind: Kind
    fields: Mapping[str, FieldValue]
    text: str  # the normalised line (ANSI and wrappers stripped), for evidence
    ts_wrapper: WrapperStamp | None  # wrapper timestamp (kubectl/docker/journald/...)
    ts_engine: str | None  # engine timestamp text (e.g. "06-16 21:24:15")
    proc: str | None  # process / rank prefix, e.g. "VllmWorkerProcess", "TP3"
    repeat: int = 1  # Ray "[repeated Nx across cluster]" multiplier
    pod: str | None = None  # kubectl --prefix "pod/<name>/<container>"
    uptime: float | None = None  # dmesg uptime printed beside a dated stamp (boot time)
    rollup: Rollup[Hit] | None = None  # later stats lines of the same stream and minute
    # Who printed it, from the signature: vllm, sglang, any (either engine), or the
    # system around it (system, k8s, docker, ray).
    engine: str = ""
    # Where the match starts in its line's text: records glued on one line (a lost
    # newline) share the line number and often the stamp; this orders them the same
    # way whatever order the hits come in (rollups list a member at its carrier's).
    pos: int = 0


# The columns of CalmRows.frame, in this order (then `f_<field>` for each of the
# signature's fields, the peak line's values): what the scan keeps of a calm minute
# (a stream's clock minute of stats lines in which every line says how many wait and
# nothing is preempted, at any KV usage but where analyze asks for a limit).
# sum_/cnt_/max_ go through AGG_FIELDS (scan/rollup.py) in its order.
CALM_AGG_FIELDS = ("kv_usage", "running", "waiting", "swapped", "prompt_tput", "gen_tput")
CALM_MEANS = ("kv_usage", "running", "prompt_tput", "gen_tput")
CALM_COLUMNS = (
    "first_line",
    "first_us",  # (a line's microseconds into its minute: a wrapper's stamp has them)
    "last_line",
    "last_us",
    "last_pos",
    "day",  # the clock's day as its stamps print it: `MM-DD` (vLLM), `YYYY-MM-DD`
    "hour",
    "minute",
    "n",
    *(f"sum_{k}" for k in CALM_AGG_FIELDS),
    *(f"cnt_{k}" for k in CALM_AGG_FIELDS),
    *(f"max_{k}" for k in CALM_AGG_FIELDS),
    # a window's mean of the minute's lines (windows.snapped_mean of its sum and count)
    *(f"mean_{k}" for k in CALM_MEANS),
    "peak_kv",
    "peak_running",
    "swapped_first",
    "swapped_last",
    "waiting_first",  # the minute's first and last line's Waiting
    "waiting_last",
    "waiting_pos",  # its lines with Waiting > 0
    "peak_line",
    "peak_pos",
    "peak_text",
    "peak_us",
    "peak_proc",
)


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Columns:
    """A table as plain Python columns: a column of numbers with no gap an `array`
    (8 bytes a value), any other a list; its values are what polars' `to_list` gives.
    What a --jobs worker sends of its calm minutes (timeline/calm.py): read without
    polars, the parent never imports it (~30 MiB and ~0.2 s of a month's run)."""

    names: tuple[str, ...]
    data: tuple[Sequence[Any], ...]  # one per name, each `height` long

    @property
    def height(self) -> int:
        return len(self.data[0]) if self.data else 0

    def column(self, name: str) -> Sequence[Any]:
        return self.data[self.names.index(name)]

    def rows(self, *names: str) -> Iterator[tuple[Any, ...]]:
        """Its rows (of the columns `names`, in that order; all, without)."""
        data = [self.column(n) for n in names] if names else self.data
        return zip(*data, strict=True)

    def shifted(self, names: Sequence[str], offset: int) -> Columns:
        """The table with `offset` added to the columns `names` (numbers, no gap)."""
        return Columns(
            self.names,
            tuple(
                _added(d, offset) if n in names else d
                for n, d in zip(self.names, self.data, strict=True)
            ),
        )


def _added(column: Sequence[int], offset: int) -> Sequence[int]:
    values = [v + offset for v in column]
    if isinstance(column, PackedNumbers):
        return PackedNumbers.of(narrow(array("q", values)))
    return narrow(array("q", values)) if isinstance(column, array) else values


def narrow(column: array[int]) -> array[int]:
    """An array of ints in the fewest bytes a value that hold them all (1, 2 or 4;
    else 8): the same values read back. (A month of calm minutes' clock, count and
    line columns in 8 bytes a value were ~2 MiB more of the scan's result.) Each try
    stops at the first value that does not fit."""
    for code in "bhi":
        with suppress(OverflowError):
            return array(code, column)
    return column


@dataclass(frozen=True, slots=True)
class Const(Sequence[Any]):
    """A column of one value `length` times: a field no line of the block has, a
    count every minute shares, the process name. A month of calm minutes had 25 such
    of its 52 columns, ~9 MiB held and pickled a value at a time (8 bytes a row)."""

    value: Any
    length: int

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> Const: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return Const(self.value, len(range(*i.indices(self.length))))
        if not -self.length <= i < self.length:
            raise IndexError("Const index out of range")
        return self.value

    def __iter__(self) -> Iterator[Any]:
        return repeat(self.value, self.length)


class Repeats(Sequence[Any]):
    """A column whose values come in runs, held a run at a time: its value and where
    it ends. A frame's minutes share their replica and an anchor or two, and a
    month's windows are a class or two: as lists they were 8 bytes a window each,
    growing with the log's span. Appended a value, or a sequence, at a time; a value
    joins the run before it when it is that run's value (`==`), or, made with
    `identity`, that very object (times that are equal but not alike: another zone)."""

    __slots__ = ("_ends", "_identity", "_values")

    def __init__(self, values: Iterable[Any] = (), *, identity: bool = False) -> None:
        self._values: list[Any] = []
        self._ends: list[int] = []
        self._identity = identity
        self.extend(values)

    def append(self, value: Any) -> None:
        self.add(value, 1)

    def add(self, value: Any, n: int) -> None:
        """`value`, `n` times."""
        values = self._values
        if values and (values[-1] is value or (not self._identity and values[-1] == value)):
            self._ends[-1] += n
        elif n:
            values.append(value)
            self._ends.append(len(self) + n)

    def extend(self, values: Iterable[Any]) -> None:
        if self._identity:
            for v in values:
                self.add(v, 1)
            return
        for value, group in groupby(values):
            self.add(value, sum(1 for _ in group))

    def runs(self, start: int = 0) -> Iterator[tuple[Any, int, int]]:
        """(value, first index, end) of each run from index `start` on."""
        ends = self._ends
        k = bisect_right(ends, start)
        begin = max(start, ends[k - 1] if k else 0)
        for value, end in zip(self._values[k:], ends[k:], strict=True):
            yield value, begin, end
            begin = end

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        n = len(self)
        if isinstance(i, slice):
            a, b, step = i.indices(n)
            if step != 1:
                return list(self)[i]
            out: list[Any] = []
            for value, lo, hi in self.runs(a):
                if lo >= b:
                    break
                out += [value] * (min(hi, b) - lo)
            return out
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("Repeats index out of range")
        return self._values[bisect_right(self._ends, i)]

    def __iter__(self) -> Iterator[Any]:
        return self.iterate()

    def iterate(self, start: int = 0) -> Iterator[Any]:
        """Its values from index `start` on."""
        return chain.from_iterable(repeat(v, hi - lo) for v, lo, hi in self.runs(start))

    def count(self, value: Any) -> int:
        return sum(hi - lo for v, lo, hi in self.runs() if v == value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class _Spill:
    """A run's packed columns out of memory: their bytes in one unnamed temporary
    file, each read back (os.pread) when its column is opened. A month's calm
    minutes held ~3.5 MB of packed bytes in the report and a quarter's ~10, growing
    with the log's span; written here, the report holds ~100 bytes a column, and
    the pages are the kernel's to keep or drop (file pages are no process's RSS).

    Made by `spilling()`, for one run, in the process that writes its report; a
    column holds its store, so the file lives while any column spilled to it does and
    closes when the last goes. Where the file cannot be made (no writable temporary
    directory) or read at an offset (no os.pread), columns keep their bytes."""

    __slots__ = ("__weakref__", "_broken", "_end", "_file", "_lock", "_tempfile")

    def __init__(self) -> None:
        # (imported here, in the thread that starts the run: a --jobs result is loaded,
        # and its columns spilled, in the executor's thread, and an import there could
        # wait on one the main thread holds when Ctrl-C stops it)
        import tempfile

        self._tempfile = tempfile
        self._file: Any = None  # (made at the first put: small runs never need one)
        self._end = 0
        self._lock = threading.Lock()  # (a --jobs result is loaded in a thread)
        self._broken = not hasattr(os, "pread")

    def put(self, *parts: bytes) -> _Spilled | None:
        """Where `parts` were written, end to end; None when they could not be."""
        size = sum(map(len, parts))
        with self._lock:
            if self._broken:
                return None
            try:
                if self._file is None:
                    # (closed when the store goes: the last column spilled to it)
                    self._file = self._tempfile.TemporaryFile()
                at = self._end
                os.pwrite(self._file.fileno(), b"".join(parts), at)
            except OSError:
                self._broken = True  # (a full disk: the rest stay in memory)
                return None
            self._end += size
        return _Spilled(self, at, tuple(map(len, parts)))

    def get(self, at: int, size: int) -> bytes:
        got = os.pread(self._file.fileno(), size, at)
        if len(got) != size:
            raise OSError(f"spilled column cut short: {len(got)} of {size} bytes")
        return got


@dataclass(frozen=True, slots=True)
class _Spilled:
    """Bytes a _Spill holds: where they start, and the sizes of their parts."""

    store: _Spill
    at: int
    sizes: tuple[int, ...]

    def parts(self) -> list[bytes]:
        data = self.store.get(self.at, sum(self.sizes))
        return [data[a - n : a] for a, n in zip(accumulate(self.sizes), self.sizes, strict=True)]


_SPILL: _Spill | None = None  # (the run's, while spilling())
# Fewer bytes than this stay in memory: a column's handle (~100 bytes) would outweigh
# them, and each would be a read.
SPILL_MIN = 512


@contextmanager
def spilling() -> Iterator[None]:
    """Columns packed meanwhile in this process (and loaded from a --jobs worker's
    result) keep their bytes in a temporary file (_Spill), not in memory."""
    global _SPILL
    before, _SPILL = _SPILL, _Spill()
    try:
        yield
    finally:
        _SPILL = before


def spill_off() -> None:
    """No spilling in this process: a forked --jobs worker, whose columns are sent
    to the parent (it spills them as it loads them) and must not write to the
    parent's file."""
    global _SPILL
    _SPILL = None


def _spilled(*parts: bytes) -> _Spilled | None:
    store = _SPILL
    if store is None or sum(map(len, parts)) < SPILL_MIN:
        return None
    return store.put(*parts)


class Packed(Sequence[str]):
    """A column of texts kept compressed: the calm minutes' peak lines, which a
    report reads twice (the redactor, the JSON writer) and a window at a time seldom
    (a month's are ~10 MB as str objects, ~1 MB so, and pickled from a --jobs worker
    so). Its texts are one zstd frame of them end to end (level 1: a month's in
    ~15 ms, opened in ~10; zlib where no zstd module is) and where each ends (4
    bytes a text). The last column read keeps its text open (_OPEN), so a pass over
    the columns in order, or a window's text after its neighbour's, opens each once."""

    __slots__ = ("_blob", "_ends", "_n", "longest", "printable")

    def __init__(self, blob: bytes, ends: array[int], longest: int, printable: bool) -> None:
        self._n = len(ends)
        self.longest = longest  # the longest text's length
        self.printable = printable  # every text is: is_printable (the sanitiser's test)
        # (spilled while a run spills: its ends and its blob, None here)
        spilled = _spilled(ends.tobytes(), blob)
        self._blob: bytes | _Spilled = blob if spilled is None else spilled
        self._ends: array[int] | None = ends if spilled is None else None

    @classmethod
    def of(cls, texts: Sequence[str]) -> Packed | None:
        """`texts` packed; None when one cannot be UTF-8 (a lone surrogate)."""
        joined = "".join(texts)
        try:
            data = joined.encode()
        except UnicodeEncodeError:
            return None
        lengths = list(map(len, texts))
        # (is_printable of every text: of them end to end)
        if data.isascii():  # (deleted in C, as is_printable)
            printable = not data.translate(None, _PRINTABLE_ASCII)
        else:
            printable = joined.isprintable()
        return cls(
            _codec()[0](data), array("I", accumulate(lengths)), max(lengths, default=0), printable
        )

    def __reduce__(self) -> tuple[type, tuple[bytes, array[int], int, bool]]:
        return Packed, (*self._parts(), self.longest, self.printable)

    def _parts(self) -> tuple[bytes, array[int]]:
        """Its blob and ends, read back when spilled."""
        if not isinstance(self._blob, _Spilled):
            assert self._ends is not None
            return self._blob, self._ends
        raw, blob = self._blob.parts()
        ends = array("I")
        ends.frombytes(raw)
        return blob, ends

    def __len__(self) -> int:
        return self._n

    def _text(self) -> tuple[str, array[int]]:
        """The texts end to end, and where each ends."""
        global _OPEN
        if _OPEN is not None and _OPEN[0] is self:
            return _OPEN[1], _OPEN[2]
        blob, ends = self._parts()
        out = _codec()[1](blob).decode()
        _OPEN = (self, out, ends)
        return out, ends

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        text, ends = self._text()
        if isinstance(i, slice):
            a, b, step = i.indices(len(ends))
            if step != 1:
                return self[:][i]
            if a >= b:
                return []
            starts = ends[a - 1 : b - 1] if a else [0, *ends[: b - 1]]
            return [text[s:e] for s, e in zip(starts, ends[a:b], strict=True)]
        if i < 0:
            i += len(ends)
        if not 0 <= i < len(ends):
            raise IndexError("Packed index out of range")
        return text[ends[i - 1] if i else 0 : ends[i]]

    def __iter__(self) -> Iterator[str]:
        return iter(self[:])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Packed):
            return self[:] == other[:]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class PackedNumbers(Sequence[Any]):
    """A column of numbers (an array) kept compressed: a calm minute's numbers, which
    a month holds ~6 MiB of as arrays (~2.2 MiB so), through the scan (and from a
    --jobs worker) and in the report's windows, and reads a column at a time. One
    zstd frame of its bytes (level 1), opened when read: the columns opened last stay
    open (_NUMBERS, a few frames' worth), so a window's values, read a column each,
    open each of its frame's columns once, and a pass over a column once a frame."""

    __slots__ = ("_blob", "_n", "typecode")

    def __init__(self, blob: bytes, typecode: str, n: int) -> None:
        self._blob: bytes | _Spilled = _spilled(blob) or blob  # (spilled while a run spills)
        self.typecode = typecode
        self._n = n

    @classmethod
    def of(cls, column: array[Any]) -> PackedNumbers | array[Any]:
        """`column` packed; itself when packing saves under a fifth of it."""
        data = column.tobytes()
        blob = _codec()[0](data)
        if len(blob) * 5 > len(data) * 4:
            return column
        return cls(blob, column.typecode, len(column))

    def __reduce__(self) -> tuple[type, tuple[bytes, str, int]]:
        return PackedNumbers, (self._bytes(), self.typecode, self._n)

    def _bytes(self) -> bytes:
        blob = self._blob
        return blob.parts()[0] if isinstance(blob, _Spilled) else blob

    def __len__(self) -> int:
        return self._n

    def opened(self) -> array[Any]:
        """The column as its array."""
        key = id(self)
        got = _NUMBERS.get(key)
        if got is not None and got[0] is self:
            return got[1]
        out = array(self.typecode)
        out.frombytes(_codec()[1](self._bytes()))
        if len(_NUMBERS) >= _NUMBERS_OPEN:
            del _NUMBERS[next(iter(_NUMBERS))]  # (the one opened first)
        _NUMBERS[key] = (self, out)
        return out

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> array[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        return self.opened()[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.opened())

    def count(self, value: Any) -> int:
        return self.opened().count(value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedNumbers):
            return self.opened() == other.opened()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


# The PackedNumbers opened last, by id, each with its array (the column keeps its id
# while it is held here): a frame has ~30 columns.
_NUMBERS: dict[int, tuple[PackedNumbers, array[Any]]] = {}
_NUMBERS_OPEN = 96


@cache
def _codec() -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    """(pack, unpack), imported when first used. The standard library has zstd from
    3.14; backports.zstd is the same module, a dependency below 3.14
    (ingest/compression.py reads .zst logs with it)."""
    try:
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:
            from backports import zstd  # type: ignore[no-redef,unused-ignore]
        except ImportError:
            return partial(zlib.compress, level=1), zlib.decompress
    own = threading.local()  # (a compressor is used by one thread at a time)

    def pack(data: bytes) -> bytes:
        """zstd.compress(data, level=1) with this thread's compressor: a new one each
        call was ~40 us, half of packing a calm block's ~60 small columns."""
        got = getattr(own, "compressor", None)
        if got is None:
            got = own.compressor = zstd.ZstdCompressor(level=1)
        return cast(bytes, got.compress(data, zstd.ZstdCompressor.FLUSH_FRAME))

    return pack, zstd.decompress


_OPEN: tuple[Packed, str, array[int]] | None = None  # (Packed._text: the last one read)


def column_of(values: Sequence[Any], typecode: str | None) -> Sequence[Any]:
    """`values` as a Columns column keeps them: one value in every row (8 rows or
    more) a Const; floats (`d`) or ints (`q`) with no gap an array; strings that
    repeat one object each; anything else the list. (One value: of one type, and a
    zero of one sign: -0.0 among 0.0s prints otherwise.)"""
    n = len(values)
    col = values
    if typecode is not None:
        with suppress(TypeError):  # (a gap: None)
            col = array(typecode, values)
            if typecode == "q":
                col = narrow(col)
    if n >= 8:
        first = col[0]
        if (
            col.count(first) == n
            and (isinstance(col, array) or len(set(map(type, col))) == 1)
            and (type(first) is not float or first != 0 or _one_sign(col))
        ):
            return Const(first, n)
    if col is not values:
        return col
    if n and type(values[0]) is str and len(set(values)) * 2 <= n:
        shared: dict[Any, Any] = {}
        return [shared.setdefault(v, v) for v in values]
    return values


def _one_sign(zeros: Sequence[float]) -> bool:
    if isinstance(zeros, array) and zeros.typecode == "d":
        # (a zero's sign is in its bytes: compared in C, not a value at a time)
        return zeros.tobytes() == zeros[:1].tobytes() * len(zeros)
    return len({math.copysign(1.0, v) for v in zeros}) == 1


@dataclass(frozen=True, slots=True)
class CalmRows:
    """The calm minutes of one block's lines of one stats signature, as columns
    (CALM_COLUMNS, then the peak line's fields), one row a minute, in line order. As
    objects a minute, a month of them was ~2 KB a minute and a fifth of the scan's
    time; as rows, each becomes its window (timeline/calm.py) without a hit or an
    object a minute."""

    source: str
    sig: str  # the signature: its id, kind, engine, constants and fields
    kind: Kind
    engine: str
    constants: Mapping[str, FieldValue]
    fields: tuple[str, ...]
    sglang: bool  # stamped by SGLang's wrapper stamp, not vLLM's engine stamp
    frame: Columns | None  # (None in what a calm window keeps of it)
    # The zone of the RFC 3339 stamp a wrapper put on each line (`kubectl logs
    # --timestamps`: `Z`), which times the minutes; None where they are the engine's.
    zone: str | None = None
    # Its lines' times read on a named --tz's clock (calm.place), which events give in
    # UTC (events._in_utc): its evidence shows them so, as the line's event would.
    utc: bool = False

    @property
    def height(self) -> int:
        assert self.frame is not None
        return self.frame.height


@dataclass(frozen=True, slots=True)
class Event:
    """A hit with a resolved timestamp and its derived counts."""

    source: str
    line: int
    sig: str
    kind: Kind
    ts: datetime | None  # timezone-aware (UTC when the zone is unknown)
    fields: Mapping[str, FieldValue]
    text: str
    proc: str | None = None
    replica: str = ""  # which engine instance this belongs to (source or pod)
    preemptions: int = 0  # preemptions attributed to this event (deltas)
    lower_bound: bool = False  # the count is a lower bound (sampled warning)
    repeat: int = 1
    rollup: Rollup[Event] | None = None  # later stats lines of the same stream and minute
    engine: str = ""  # as on the Hit; "prometheus" for a /metrics scrape
    pos: int = 0  # as on the Hit

    @property
    def lines(self) -> int:
        """How many log lines this event stands for."""
        return self.rollup.stats.n if self.rollup else 1


@dataclass(frozen=True, slots=True)
class Window:
    """Aggregated features of one time window of one replica."""

    replica: str
    start: datetime | None
    end: datetime | None
    n_events: int
    n_stats: int
    preemptions: float  # V0 counter deltas may be spread over several windows
    preemptions_lower_bound: bool
    max_cumulative: int | None  # highest V0 cumulative counter seen
    kv_max: float | None  # percent 0-100
    kv_mean: float | None
    running_max: int | None
    running_mean: float | None
    waiting_first: int | None
    waiting_last: int | None
    waiting_max: int | None
    swapped_first: int | None
    swapped_last: int | None
    swapped_max: int | None
    prompt_tput: float | None
    gen_tput: float | None
    alloc_failures: int
    host_ooms: int
    engine_deaths: int
    swap_warnings: int
    evidence: tuple[Event, ...]  # the decisive events of this window
    cls: Class = Class.HEALTHY
    confidence: Confidence = Confidence.LOW
    why: str = ""
    kv_peak_running: int | None = None  # fewest Running on a stats line at the highest KV
    waiting_share: float | None = None  # fraction of stats lines with Waiting > 0
    # Set when `preemptions` is a share of a sampled counter's delta (V0 warnings, two
    # scrapes) spread over this many windows: an estimate, not a measurement.
    preemptions_spread_over: int | None = None


if TYPE_CHECKING:
    _ReadBase = Window
else:
    _ReadBase = object


class ReadWindow(_ReadBase):
    """A Window whose values are read from what it was made of when asked, not
    held: timeline/calm.py's calm windows, as Windows a month of them was ~2 KB and
    ~20 us each. It has one evidence event, made each time `evidence` is read;
    `texts` and `evidence_line` let the sanitiser, the redactor and the JSON writer
    read it without making that event. A copy (dataclasses.replace, pickling) is a
    plain Window with its values.

    It is a Window to the type checker and to `dataclasses` (its fields are
    Window's), not at run time: a subclass of a slotted class holds every slot of
    it, and a calm window would hold Window's 32 (~210 bytes, a month ~9 MiB) where
    it uses five. A subclass gives each field as a slot, a property or a class
    attribute; it compares, hashes and prints as a Window of its values would, and
    is as frozen."""

    __slots__ = ()
    __dataclass_fields__ = Window.__dataclass_fields__
    __dataclass_params__ = Window.__dataclass_params__  # type: ignore[attr-defined]
    __eq__ = Window.__eq__
    __hash__ = Window.__hash__
    __repr__ = Window.__repr__

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __new__(*args: Any, **kwargs: Any) -> Window:  # type: ignore[misc]
        # dataclasses.replace calls an instance's class with every field; one of
        # them is `cls` (so the class comes as the first of args, unnamed).
        return Window(*args[1:], **kwargs)

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        assert _window_values is not None
        return Window, _window_values(self)

    def texts(self) -> list[str] | None:
        """Every string the window holds, its evidence event's included (its fields'
        names and str values); None when a field holds what is not a str or a number."""
        raise NotImplementedError

    def evidence_line(self) -> tuple[str, int, str, Kind, str, datetime | None]:
        """(source, line, sig, kind, text, ts) of its one evidence event."""
        raise NotImplementedError

    def evidence_field(self, name: str) -> FieldValue:
        """The value of field `name` of its one evidence event (None if it has none)."""
        raise NotImplementedError

    # A run of windows read a column at a time: what the JSON writer, the sanitiser,
    # the redactor and the verdict read of a month's windows, without an attribute
    # lookup a window and field (a subclass reads its own columns; these are the
    # long way, the answer they must give).

    @classmethod
    def columns(cls, ws: Sequence[ReadWindow], names: Sequence[str]) -> list[list[Any]]:
        """[[getattr(w, name) for w in ws] for name in names] (ws all of this class)."""
        return _attribute_columns(ws, names)

    @classmethod
    def evidence_lines(cls, ws: Sequence[ReadWindow]) -> list[list[Any]]:
        """The columns of [w.evidence_line() for w in ws]: source, line, sig, kind,
        text, ts (ws all of this class)."""
        lines = [w.evidence_line() for w in ws]
        return (
            [list(column) for column in zip(*lines, strict=True)]
            if lines
            else [[] for _ in range(6)]
        )

    @classmethod
    def evidence_untimed(cls, ws: Sequence[ReadWindow]) -> list[list[Any]]:
        """evidence_lines but the time: source, line, sig, kind, text."""
        return cls.evidence_lines(ws)[:5]

    @classmethod
    def evidence_micros(cls, ws: Sequence[ReadWindow]) -> array[int] | None:
        """The evidence lines' times as micros(); None where the class has them only
        as datetimes (evidence_lines' last column, then)."""
        return None

    @classmethod
    def evidence_texts(cls, ws: Sequence[ReadWindow]) -> list[str]:
        """The text column of evidence_lines (what the redactor reads)."""
        return cls.evidence_lines(ws)[4]

    @classmethod
    def evidence_places(cls, ws: Sequence[ReadWindow]) -> list[list[Any]]:
        """The source, line and kind columns of evidence_lines (without reading the
        texts: a calm window's are packed, records.Packed)."""
        source, line, _, kind, _, _ = cls.evidence_lines(ws)
        return [source, line, kind]

    @classmethod
    def evidence_values(cls, ws: Sequence[ReadWindow], name: str) -> list[FieldValue]:
        """[w.evidence_field(name) for w in ws] (ws all of this class)."""
        return [w.evidence_field(name) for w in ws]

    @classmethod
    def micros(cls, ws: Sequence[ReadWindow], name: str) -> array[int]:
        """window_micros of ws (all of this class)."""
        return array("q", map(micros, _attribute_columns(ws, (name,))[0]))

    @classmethod
    def printable(cls, ws: Sequence[ReadWindow]) -> bool:
        """Whether every text of every window of ws (texts()) is printable, so that
        sanitising leaves them as they are (ws all of this class)."""
        texts = [w.texts() for w in ws]
        return None not in texts and is_printable("".join(t for w in texts if w for t in w))


class ReadRun(Sequence[Window]):
    """Windows of one ReadWindow class (`kind`) not made until one is asked for: a
    frame's calm windows (calm.CalmRun), held as the columns they are read from (~20
    bytes a window where a CalmWindow and its times were ~220). Indexing makes the
    window (an equal one each time, not the same object); its class's column readers
    (ReadWindow.columns and the rest) read a run without making one."""

    __slots__ = ()
    kind: type[ReadWindow]


class Windows(Sequence[Window]):
    """A report's windows: runs of made Windows and ReadRuns one after another, read
    as one sequence (a window made from its run as it is read). `runs()` gives them
    a class at a time, so a stage that reads a run's columns (window_runs) never
    makes a month's windows at once. Equal to any sequence of equal windows; pickled
    as a tuple of them."""

    __slots__ = ("_ends", "_parts")

    def __init__(self, parts: Iterable[Sequence[Window]] = ()) -> None:
        flat: list[Sequence[Window]] = []
        for part in parts:
            if isinstance(part, Windows):
                flat += part._parts
            elif len(part):
                flat.append(part)
        self._parts: tuple[Sequence[Window], ...] = tuple(flat)
        self._ends = list(accumulate(map(len, flat)))

    @property
    def parts(self) -> tuple[Sequence[Window], ...]:
        return self._parts

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @overload
    def __getitem__(self, i: int) -> Window: ...
    @overload
    def __getitem__(self, i: slice) -> Windows: ...
    def __getitem__(self, i: int | slice) -> Window | Windows:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return Windows([[self[k] for k in range(start, stop, step)]])
            return Windows(self._between(start, stop))
        n = len(self)
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError("window index out of range")
        part, j = self.part_at(k)
        return part[j]

    def part_at(self, k: int) -> tuple[Sequence[Window], int]:
        """The part that holds window k (0 <= k < len), and its index there."""
        p = bisect_right(self._ends, k)
        return self._parts[p], k - (self._ends[p - 1] if p else 0)

    def _between(self, start: int, stop: int) -> Iterator[Sequence[Window]]:
        at = 0
        for part, end in zip(self._parts, self._ends, strict=True):
            if end > start and at < stop:
                lo, hi = max(start - at, 0), min(stop, end) - at
                yield part if (lo, hi) == (0, len(part)) else part[lo:hi]
            at = end

    def __iter__(self) -> Iterator[Window]:
        return chain.from_iterable(self._parts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Windows({list(self)!r})"

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return tuple, (tuple(self),)

    def runs(self) -> Iterator[tuple[type[Window], Sequence[Window]]]:
        """The windows as runs of one class, in order: consecutive ReadRuns of one
        class as one run (a Windows of them), made windows grouped by class."""
        for kind, group in groupby(self._parts, _part_kind):
            parts = list(group)
            if kind is not None:
                yield kind, parts[0] if len(parts) == 1 else Windows(parts)
            else:
                for made, run in groupby(chain.from_iterable(parts), type):
                    yield made, list(run)


def _part_kind(part: Sequence[Window]) -> type[ReadWindow] | None:
    return part.kind if isinstance(part, ReadRun) else None


def window_runs(ws: Sequence[Window]) -> Iterator[tuple[type[Window], Sequence[Window]]]:
    """ws as runs of windows of one class, in order (Windows.runs; a list grouped by
    class)."""
    if isinstance(ws, Windows):
        yield from ws.runs()
    elif isinstance(ws, ReadRun):
        yield ws.kind, ws
    else:
        for kind, run in groupby(ws, type):
            yield kind, list(run)


def window_columns(ws: Sequence[Window], names: Sequence[str]) -> list[list[Any]]:
    """[[getattr(w, name) for w in ws] for name in names]; a run of ReadWindows of one
    class read a column at a time (ReadWindow.columns)."""
    parts: list[list[list[Any]]] = []
    for kind, group in window_runs(ws):
        parts.append(
            kind.columns(cast(Sequence[ReadWindow], group), names)
            if issubclass(kind, ReadWindow)
            else _attribute_columns(group, names)
        )
    if len(parts) <= 1:
        return parts[0] if parts else [[] for _ in names]
    # Each column is its runs' parts put around the longest one in place (a month's
    # calm windows between a few others: no second copy of 43,200 values).
    out: list[list[Any]] = []
    for j in range(len(names)):
        got = [p[j] for p in parts]
        k = max(range(len(got)), key=lambda i: len(got[i]))
        column = got[k]
        column[:0] = chain.from_iterable(got[:k])
        column += chain.from_iterable(got[k + 1 :])
        out.append(column)
    return out


NO_TIME = -(2**63)  # (window_micros' value for a window without that time)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros(ts: datetime | None) -> int:
    """A time as integer microseconds since the epoch (a naive one read as UTC, as
    the renderers read it); NO_TIME for None."""
    if ts is None:
        return NO_TIME
    return ((ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts) - _EPOCH) // _MICROSECOND


def from_micros(us: int) -> datetime:
    """The UTC time of micros() (not NO_TIME)."""
    return _EPOCH + timedelta(microseconds=us)


def window_micros(ws: Sequence[Window], name: str) -> array[int]:
    """Each window's `name` ("start" or "end") as micros(): 8 bytes a window in an
    array, where a month's calm windows' datetimes were ~2.4 MiB a column, and
    ordered and subtracted as the datetimes are, exactly."""
    out: array[int] = array("q")
    for kind, run in window_runs(ws):
        if issubclass(kind, ReadWindow):
            out += kind.micros(cast(Sequence[ReadWindow], run), name)
        else:
            out += array("q", map(micros, _attribute_columns(run, (name,))[0]))
    return out


def _attribute_columns(ws: Sequence[Any], names: Sequence[str]) -> list[list[Any]]:
    return [list(map(attrgetter(name), ws)) for name in names]


_PRINTABLE_ASCII = bytes(range(0x20, 0x7F))


def is_printable(text: str) -> bool:
    """text.isprintable(); an ASCII text (a month of stats lines, ~10 MB) ~3x faster:
    its printable characters are the bytes from space to tilde, deleted in C."""
    if text.isascii():
        return not text.encode("ascii").translate(None, _PRINTABLE_ASCII)
    return text.isprintable()


# (every field of Window is a positional __init__ parameter)
_window_values = positional(Window)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The incident verdict: the earliest most severe episode."""

    cls: Class
    confidence: Confidence
    start: datetime | None
    end: datetime | None
    replica: str
    why: str
    evidence: tuple[Event, ...]
    evidence_found: bool = True
    filtered_out: bool = False  # lines matched, but --since/--until left no window
    cause: str | None = None  # when host and GPU evidence both exist
    consequence: str | None = None
    suspected: bool = False  # insufficient evidence but pressure suspected
    capture_next: str | None = None  # the one thing to capture next


@dataclass(frozen=True, slots=True)
class Lever:
    """The ONE change to make next."""

    knob: str | None  # e.g. "--max-num-seqs"; None means "no change"
    current: str | None
    proposed: str | None
    arithmetic: tuple[str, ...]
    verify: str
    do_not: str
    rationale: str
    engine: str = "vllm"
    apply: str = ""  # where the change goes (the launch command, the container spec)
    rollback: str = ""  # the previous value, and the signal that means going back


# Signature engines that describe the node or the pod, not the serving engine.
SYSTEM_ENGINES = frozenset({"system", "k8s", "docker", "ray"})


@dataclass(frozen=True, slots=True)
class EngineInfo:
    engine: str  # "vllm", "sglang" or "unknown"
    generation: str | None  # "v0", "v1" or None
    version: str | None


@dataclass(frozen=True, slots=True)
class ScanStats:
    """What was read, recognised and skipped (the report footer)."""

    files: tuple[str, ...]
    lines_read: int
    bytes_read: int
    recognised: Mapping[str, int]  # per signature family
    skipped: Mapping[str, int]  # reason -> count (invalid utf-8, oversize, unparsed ts)


@dataclass(frozen=True, slots=True)
class Fact:
    """One configuration or capacity value of a replica, with the line that shows it."""

    name: str  # e.g. "max_num_seqs", "kv_tokens"
    value: str
    source: str  # file:line
    how: str = ""  # how a derived value was worked out (e.g. "# GPU blocks x block size")


@dataclass(frozen=True, slots=True)
class ReplicaFacts:
    """What one engine instance is, independent of --since/--until."""

    replica: str
    engine: EngineInfo
    start: datetime | None
    end: datetime | None
    dated_by: tuple[str, ...]  # how its sources' clocks were dated
    facts: tuple[Fact, ...]


@dataclass(frozen=True, slots=True)
class Report:
    """Everything a renderer needs; renderers are pure functions of this."""

    verdict: Verdict
    lever: Lever
    windows: Sequence[Window]  # (a tuple, or Windows: a month's calm windows lazily)
    engine: EngineInfo
    stats: ScanStats
    thresholds: Mapping[str, Any]
    window_seconds: int
    notes: tuple[str, ...] = field(default=())
    tool_version: str = ""
    replicas: tuple[ReplicaFacts, ...] = field(default=())


# --- compare: one change, before and after -----------------------------------------


class Change(StrEnum):
    IMPROVED = "improved"
    REGRESSED = "regressed"
    MOVED_TO_QUEUEING = "moved_to_queueing"
    NOT_FIXED = "not_fixed"  # fewer preemptions, but the after side still fails
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True, slots=True)
class Side:
    files: tuple[str, ...]
    verdict: str
    minutes: float | None
    preemptions: float
    preemptions_per_min: float | None
    kv_mean: float | None
    kv_max: float | None
    waiting_mean: float | None
    waiting_max: int | None
    prompt_tput: float | None
    gen_tput: float | None
    completed: float | None
    knobs: dict[str, str]
    suspected: bool = False  # the log cannot show preemptions (V1 without scrapes)

    @property
    def completed_per_min(self) -> float | None:
        if self.completed is None or not self.minutes:
            return None
        return self.completed / self.minutes


@dataclass(frozen=True, slots=True)
class Comparison:
    before: Side
    after: Side
    changed_knobs: dict[str, tuple[str | None, str | None]]
    change: Change
    why: str


def _by_constructor(cls: type) -> None:
    """Pickle instances of `cls` as its constructor and its field values. The
    default for a frozen slots dataclass (a state dict set back one field at a time
    with object.__setattr__) made shipping a month's hits from a --jobs worker
    cost more than the worker saved: 1.6 s to load 43,000 rollups, now ~0.4 s."""
    values = positional(cls)
    assert values is not None, cls  # every field a positional __init__ parameter

    def reduce(self: Any) -> tuple[type, tuple[Any, ...]]:
        return cls, values(self)

    cls.__reduce__ = reduce  # type: ignore[assignment, method-assign]


for _cls in (RollupStats, Rollup, WrapperStamp, Hit):
    _by_constructor(_cls)

# The classes a month of stats lines makes one (or several) of a minute (fastinit.py).
for _fast in (RollupStats, Rollup, WrapperStamp, Hit, Event, Window):
    fast_init(_fast)
