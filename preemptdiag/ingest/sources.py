"""Open inputs: files, `-` for stdin, compressed ones (compression.py); refuse what is
not a text log, clearly."""

from __future__ import annotations

import io
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, cast

from preemptdiag.ingest.compression import CODECS, DecompressedStream, archive, detect
from preemptdiag.ingest.snapshot import PositionalReader, Snapshot, read_error
from preemptdiag.model.errors import DiagError

SNIFF_BYTES = 64 * 1024
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\r\x0c\x1b\x08") + b"\x7f"


@dataclass(frozen=True, slots=True)
class Source:
    name: str  # as the user typed it; used in evidence file:line
    path: Path | None  # None for stdin
    codec: str | None  # compression.CODECS key, None for plain text
    mtime: datetime | None
    head: bytes  # first bytes (decompressed), for sniffing the format
    size: int | None  # on-disk size, for progress and job splitting
    cr_only: bool = False  # old-Mac line ends: every \r is a line break
    # stdin only: the raw (maybe compressed) bytes read for sniffing, which the
    # scan reads again before the rest of the stream. stdin is streamed, never
    # held whole, so a piped 10 GB log costs no more memory than a file.
    stdin_head: bytes = b""
    # stdin only: where copying it to a file stopped part way (spool.py), that file,
    # read before stdin_head and the rest of the stream.
    stdin_part: Path | None = None


class _Prepend(io.RawIOBase):
    """`head`, then whatever `rest` still has: stdin after its sniffed head (and after
    `part`, the file a copy of it stopped in, when there is one: spool.py)."""

    def __init__(self, head: bytes, rest: BinaryIO, part: BinaryIO | None = None) -> None:
        self._part = part
        self._head = head
        self._inner = rest

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._part is not None:
            data = self._part.read(len(b))
            if data:
                b[: len(data)] = data
                return len(data)
            self._part = None
        if self._head:
            n = min(len(b), len(self._head))
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._inner.read(len(b))
        b[: len(data)] = data
        return len(data)


def _sniff_text(name: str, head: bytes) -> None:
    if not head:
        return
    # Text logs hold almost no control bytes; binary formats are full of them. A few
    # stray ones (interleaved garbage in a paste) must not reject a real log.
    # NUL runs are what a node that crashed mid-write leaves in a log (the very incident
    # this tool is for): they are padding, not binary content, and the scan skips them.
    text = head.replace(b"\x00", b"")
    control = len(text) - len(text.translate(None, _CONTROL))
    if control * 20 > len(text):
        raise DiagError(f"{name}: looks like a binary file, not a text log")


def _cr_only(head: bytes) -> bool:
    return b"\n" not in head and head.count(b"\r") > 1


def open_source(name: str) -> Source:
    if name == "-":
        return _open_stdin()
    path = Path(name)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DiagError(f"{name}: no such file") from None
    except PermissionError:
        raise DiagError(f"{name}: permission denied") from None
    except OSError as exc:
        raise DiagError(f"{name}: cannot open ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise DiagError(f"{name}: is a directory (pass the log files inside it)")
    if not os.access(path, os.R_OK):
        raise DiagError(f"{name}: permission denied")
    try:
        with path.open("rb") as f:
            codec = detect(f.read(10))
            f.seek(0)
            head = _read_head(name, codec, f)
    except OSError as exc:
        raise DiagError(f"{name}: cannot read ({exc.strerror})") from None
    _sniff_text(name, head)
    return Source(
        name=name,
        path=path,
        codec=codec,
        mtime=datetime.fromtimestamp(st.st_mtime, tz=UTC),
        head=head.replace(b"\r", b"\n") if _cr_only(head) else head,
        size=st.st_size,
        cr_only=_cr_only(head),
    )


def _open_stdin() -> Source:
    stdin = _Recording(sys.stdin.buffer)
    codec = detect(stdin.peek(10))
    # Compressed: decompress as much as the sniffed head needs (a bzip2 block is up
    # to 900 kB); every byte taken from stdin is kept to be read again by the scan.
    head = _read_head("<stdin>", codec, cast(BinaryIO, stdin))
    raw = stdin.taken()
    _sniff_text("<stdin>", head)
    cr_only = _cr_only(head)
    return Source(
        name="<stdin>",
        path=None,
        codec=codec,
        mtime=None,
        head=head.replace(b"\r", b"\n") if cr_only else head,
        size=None,
        cr_only=cr_only,
        stdin_head=raw,
    )


class _Recording:
    """stdin, remembering every byte read from it (the sniffed head)."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self._taken: list[bytes] = []
        self._pending = b""  # peeked, not yet read

    def peek(self, n: int) -> bytes:
        self._pending = self._inner.read(n)
        self._taken.append(self._pending)
        return self._pending

    def read(self, n: int = -1) -> bytes:
        pending, self._pending = self._pending, b""
        want = -1 if n < 0 else n - len(pending)
        more = self._inner.read(want) if want else b""
        self._taken.append(more)
        return pending + more

    def taken(self) -> bytes:
        return b"".join(self._taken)


def _read_head(name: str, codec: str | None, f: BinaryIO) -> bytes:
    """The first SNIFF_BYTES of the (decompressed) content; archives are refused."""
    if codec is None:
        head = f.read(SNIFF_BYTES)
    else:
        try:
            stream = DecompressedStream(CODECS[codec], f)
        except DiagError as exc:  # no module for this format
            raise DiagError(f"{name}: {exc.message}") from None
        head = io.BufferedReader(stream, buffer_size=SNIFF_BYTES).read(SNIFF_BYTES)
        if not head and stream.truncated:
            raise DiagError(f"{name}: corrupt or truncated {codec} data at the start")
    kind = archive(head)
    if kind is not None:
        raise DiagError(
            f"{name}: a {kind} archive, not a log: extract it and pass the log files inside"
        )
    return head


def _layers(f: object) -> Iterator[object]:
    """`f` and the readers under it (buffering, line-end translation, decompression)."""
    while f is not None:
        yield f
        f = getattr(f, "raw", None) or getattr(f, "_inner", None)


def was_truncated(f: object) -> bool:
    """True when the reader behind `f` (through buffering layers) hit a cut-short or
    damaged compressed stream."""
    return any(getattr(layer, "truncated", False) for layer in _layers(f))


def was_damaged(f: object) -> bool:
    """True when that stream met damage (a bad block, a CRC mismatch), not an end."""
    return any(getattr(layer, "damaged", False) for layer in _layers(f))


def compressed_bytes(f: object) -> Callable[[], int] | None:
    """For a compressed input, how many of its on-disk bytes were read so far (what
    a progress bar over the file's size must count); None for plain input."""
    for layer in _layers(f):
        if isinstance(layer, DecompressedStream):
            stream = layer
            return lambda: stream.raw_read
    return None


_LONE_CR = re.compile(rb"\r(?!\n)")


class _CRToLF(io.RawIOBase):
    """Length-preserving translation of a lone \r to \n, so byte offsets stay valid.
    A \r\n stays one line end: a log that starts with old-Mac line ends and goes on
    with CRLF ones (a file appended to from another machine) is numbered as
    universal newlines number it, not with a blank line after every CRLF line."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self._carry = b""  # a byte read ahead to judge a \r at a chunk's end

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._carry + self._inner.read(max(len(b) - len(self._carry), 0))
        self._carry = b""
        if data.endswith(b"\r"):
            self._carry = self._inner.read(1)
            end = b"\r" if self._carry == b"\n" else b"\n"
            data = _LONE_CR.sub(b"\n", data[:-1]) + end
        else:
            data = _LONE_CR.sub(b"\n", data)
        n = len(data)
        b[:n] = data
        return n


def _layered(src: Source, raw: BinaryIO | io.RawIOBase) -> BinaryIO:
    """Decompression and line-end translation over the raw bytes, as `src` needs."""
    reader = cast(BinaryIO, raw)
    if src.codec is not None:
        stream = DecompressedStream(CODECS[src.codec], reader)
        reader = cast(BinaryIO, io.BufferedReader(stream, buffer_size=1 << 20))
    elif not isinstance(raw, io.FileIO | PositionalReader):  # those take readinto whole
        reader = cast(BinaryIO, io.BufferedReader(cast(io.RawIOBase, raw), buffer_size=1 << 20))
    return cast(BinaryIO, io.BufferedReader(_CRToLF(reader))) if src.cr_only else reader


@contextmanager
def open_binary(src: Source, snap: Snapshot | None = None) -> Iterator[BinaryIO]:
    """The bytes of `src`, decompressed; from `snap` (snapshot.py) when given, so
    every reader of the run reads the one file it opened, whatever rotation does."""
    if src.path is None:
        if src.stdin_part is None:
            yield _layered(src, _Prepend(src.stdin_head, sys.stdin.buffer))
            return
        try:
            with src.stdin_part.open("rb") as part:
                yield _layered(src, _Prepend(src.stdin_head, sys.stdin.buffer, part))
        except OSError as exc:
            raise read_error(src.name, exc) from None
        return
    if snap is not None:
        try:
            yield _layered(src, PositionalReader(snap))
        except OSError as exc:
            raise read_error(src.name, exc) from None
        return
    try:
        if src.codec is not None:
            with src.path.open("rb") as raw:
                yield _layered(src, raw)
        else:
            with src.path.open("rb", buffering=0) as f:
                yield _layered(src, f)
    except OSError as exc:
        raise read_error(src.name, exc) from None
