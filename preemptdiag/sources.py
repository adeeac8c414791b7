"""Open inputs: files, `-` for stdin, .gz; refuse what is not a text log, clearly."""

from __future__ import annotations

import gzip
import io
import os
import stat
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, cast

from preemptdiag.errors import DiagError

SNIFF_BYTES = 64 * 1024
GZIP_MAGIC = b"\x1f\x8b"
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\r\x0c\x1b\x08") + b"\x7f"


@dataclass(frozen=True, slots=True)
class Source:
    name: str  # as the user typed it; used in evidence file:line
    path: Path | None  # None for stdin
    gz: bool
    mtime: datetime | None
    head: bytes  # first bytes (decompressed), for sniffing the format
    size: int | None  # on-disk size, for progress and job splitting
    cr_only: bool = False  # old-Mac line ends: every \r is a line break
    # stdin only: the raw (maybe compressed) bytes read for sniffing, which the
    # scan reads again before the rest of the stream. stdin is streamed, never
    # held whole, so a piped 10 GB log costs no more memory than a file.
    stdin_head: bytes = b""


class _Prepend(io.RawIOBase):
    """`head`, then whatever `rest` still has: stdin after its sniffed head."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self._head = head
        self._inner = rest

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
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
    control = len(head) - len(head.translate(None, _CONTROL))
    if control * 20 > len(head):
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
            magic = f.read(2)
    except OSError as exc:
        raise DiagError(f"{name}: cannot read ({exc.strerror})") from None
    gz = magic == GZIP_MAGIC
    head = _read_head(name, path, gz)
    _sniff_text(name, head)
    return Source(
        name=name,
        path=path,
        gz=gz,
        mtime=datetime.fromtimestamp(st.st_mtime, tz=UTC),
        head=head.replace(b"\r", b"\n") if _cr_only(head) else head,
        size=st.st_size,
        cr_only=_cr_only(head),
    )


def _open_stdin() -> Source:
    raw = sys.stdin.buffer.read(SNIFF_BYTES)
    gz = raw[:2] == GZIP_MAGIC
    head = raw
    if gz:
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, SNIFF_BYTES)
        except zlib.error:
            raise DiagError("<stdin>: corrupt or truncated gzip data at the start") from None
    _sniff_text("<stdin>", head)
    cr_only = _cr_only(head)
    return Source(
        name="<stdin>",
        path=None,
        gz=gz,
        mtime=None,
        head=head.replace(b"\r", b"\n") if cr_only else head,
        size=None,
        cr_only=cr_only,
        stdin_head=raw,
    )


def _read_head(name: str, path: Path, gz: bool) -> bytes:
    try:
        if gz:
            with gzip.open(path, "rb") as g:
                try:
                    return g.read(SNIFF_BYTES)
                except (EOFError, zlib.error, gzip.BadGzipFile, OSError):
                    raise DiagError(
                        f"{name}: corrupt or truncated gzip data at the start"
                    ) from None
        with path.open("rb") as f:
            return f.read(SNIFF_BYTES)
    except OSError as exc:
        raise DiagError(f"{name}: cannot read ({exc.strerror})") from None


def was_truncated(f: object) -> bool:
    """True when the reader behind `f` (through buffering layers) hit a cut-short .gz."""
    while f is not None:
        if getattr(f, "truncated", False):
            return True
        f = getattr(f, "raw", None) or getattr(f, "_inner", None)
    return False


class _GzipStream(io.RawIOBase):
    """Streaming gunzip that hands out every byte decompressed before any damage.

    gzip.GzipFile loses the tail of the last read when the file is cut short; this
    returns all the data, then a clean end of file, and sets `truncated` (see
    was_truncated) so the scanner can count it. Memory stays flat.
    """

    _CHUNK = 256 << 10

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._buf = b""
        self._done = False
        self.truncated = False

    def readable(self) -> bool:
        return True

    def _fill(self) -> None:
        while not self._buf and not self._done:
            data = self._d.unused_data if self._d.eof else self._raw.read(self._CHUNK)
            if self._d.eof:
                if not data:
                    data = self._raw.read(self._CHUNK)
                if not data:
                    self._done = True
                    return
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # next gzip member
            elif not data:
                self._done = self.truncated = True
                return
            try:
                self._buf = self._d.decompress(data)
            except zlib.error:
                self._done = self.truncated = True
                return

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        self._fill()
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class _CRToLF(io.RawIOBase):
    """Length-preserving \r -> \n translation, so byte offsets stay valid."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._inner.read(len(b)).replace(b"\r", b"\n")
        n = len(data)
        b[:n] = data
        return n


def _layered(src: Source, raw: BinaryIO | io.RawIOBase) -> BinaryIO:
    """Decompression and line-end translation over the raw bytes, as `src` needs."""
    reader = cast(BinaryIO, raw)
    if src.gz:
        reader = cast(BinaryIO, io.BufferedReader(_GzipStream(reader), buffer_size=1 << 20))
    elif not isinstance(raw, io.FileIO):
        reader = cast(BinaryIO, io.BufferedReader(cast(io.RawIOBase, raw), buffer_size=1 << 20))
    return cast(BinaryIO, io.BufferedReader(_CRToLF(reader))) if src.cr_only else reader


@contextmanager
def open_binary(src: Source) -> Iterator[BinaryIO]:
    if src.path is None:
        yield _layered(src, _Prepend(src.stdin_head, sys.stdin.buffer))
        return
    try:
        if src.gz:
            with src.path.open("rb") as raw:
                yield _layered(src, raw)
        else:
            with src.path.open("rb", buffering=0) as f:
                yield _layered(src, f)
    except PermissionError:
        raise DiagError(f"{src.name}: permission denied") from None
