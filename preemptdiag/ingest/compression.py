"""Compressed inputs (gzip, bzip2, xz, zstd), recognised by their magic bytes and
read as streams: memory stays flat whatever the file's size or compression ratio.

Rotated logs come compressed (logrotate, `docker logs` archives, support bundles);
the name says nothing reliable, the first bytes do. Each format's decompressor is
driven the same way, with its output capped per call: a member of repeated stats
lines can expand 1000:1, and one uncapped call on a 256 KiB read would then hand
back 256 MB.
"""

from __future__ import annotations

import bz2
import io
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from preemptdiag.model.errors import DiagError


class Decompressor(Protocol):
    """What bz2/lzma/zstd decompressors offer (the gzip adapter offers it too)."""

    @property
    def eof(self) -> bool: ...
    @property
    def needs_input(self) -> bool: ...
    @property
    def unused_data(self) -> bytes: ...
    def decompress(self, data: bytes, max_length: int = -1) -> bytes: ...


class _Gzip:
    """zlib's gzip decompressor with the needs_input protocol of the others."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._more = False  # the last call stopped at max_length: call again with b""

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def needs_input(self) -> bool:
        return not self._d.unconsumed_tail and not self._more

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data

    def decompress(self, data: bytes, max_length: int = -1) -> bytes:
        out = self._d.decompress(self._d.unconsumed_tail or data, max(max_length, 0))
        self._more = 0 < max_length <= len(out)
        return out


def _zstd_module() -> Any:
    # The standard library has zstd from 3.14 (when Python was built with it);
    # backports.zstd is the same module, a dependency below 3.14.
    try:
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:
            from backports import zstd  # type: ignore[no-redef,unused-ignore]
        except ImportError:
            raise DiagError(
                "zstd-compressed input, but this Python has no zstd module "
                "(pip install backports.zstd, or decompress it first: zstd -dc FILE | "
                "preemptdiag analyze -)"
            ) from None
    return zstd


def _zstd() -> Decompressor:
    # `zstd --long=31` (and levels --ultra -22) write frames whose window is past
    # the default decoding limit of 128 MiB: allow what the format allows (2 GiB),
    # as `zstd -d --long=31` must be told to. Memory is the window actually used.
    zstd = _zstd_module()
    param = zstd.DecompressionParameter.window_log_max
    d: Decompressor = zstd.ZstdDecompressor(options={param: param.bounds()[1]})
    return d


def _zstd_errors() -> tuple[type[Exception], ...]:
    return (_zstd_module().ZstdError,)


@dataclass(frozen=True, slots=True)
class Codec:
    name: str  # as messages say it
    new: Callable[[], Decompressor]
    # What its decompressor raises on damaged data (zstd's module loads on demand).
    errors: Callable[[], tuple[type[Exception], ...]]


CODECS = {
    "gzip": Codec("gzip", _Gzip, lambda: (zlib.error,)),
    "bzip2": Codec("bzip2", bz2.BZ2Decompressor, lambda: (OSError, EOFError, ValueError)),
    "xz": Codec("xz", lambda: lzma.LZMADecompressor(lzma.FORMAT_XZ), lambda: (lzma.LZMAError,)),
    "zstd": Codec("zstd", _zstd, _zstd_errors),
}


def detect(raw: bytes) -> str | None:
    """The codec name for a file starting with `raw`, None for plain bytes."""
    if raw[:2] == b"\x1f\x8b":
        return "gzip"
    if raw[:6] == b"\xfd7zXZ\x00":
        return "xz"
    if raw[:4] == b"\x28\xb5\x2f\xfd":
        return "zstd"
    # "BZh", a block size digit, then a block's or the end's magic: plain text that
    # happens to start with "BZh" is not taken for bzip2.
    if raw[:3] == b"BZh" and raw[3:4] in b"123456789" and raw[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return "bzip2"
    return None


def archive(head: bytes) -> str | None:
    """ "zip" or "tar" when `head` (decompressed) opens an archive of files, not a log."""
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[257:262] == b"ustar":
        return "tar"
    return None


class DecompressedStream(io.RawIOBase):
    """Streaming decompression that hands out every byte decoded before any damage.

    Members (gzip), streams (bzip2, xz) and frames (zstd) may follow one another, as
    `cat a.gz b.gz` makes them. A file cut short or damaged yields all the data
    before the damage, then a clean end of file, and sets `truncated` (see
    sources.was_truncated) so the scanner can count it. (gzip.GzipFile would lose
    the tail of the last read.)
    """

    _CHUNK = 256 << 10  # compressed bytes read at a time
    _OUT = 1 << 20  # the most one decompress call may produce
    # A call that meets damage raises, and its output is lost with it; so the
    # compressed bytes of the current member are kept (up to this many) to decode it
    # again up to the damage itself (_salvage), as `gzip -dc` writes all it decoded.
    _REPLAY_MAX = 8 << 20
    _PIECE = 4096  # compressed bytes a replay feeds at a time, before going bytewise

    def __init__(self, codec: Codec, raw: BinaryIO) -> None:
        self._codec = codec
        self._errors = codec.errors()
        self._raw = raw
        self._d = codec.new()
        self._buf = b""
        self._pos = 0
        self._done = False
        # compressed bytes fed to self._d (None: too many to keep)
        self._member: bytearray | None = bytearray()
        self._member_out = 0  # bytes self._d has produced
        self.truncated = False
        self.damaged = False  # damage, not just an early end (also sets truncated)
        self.raw_read = 0  # compressed bytes taken from `raw` (progress is counted in them)

    def readable(self) -> bool:
        return True

    def _fill(self) -> None:
        while self._pos >= len(self._buf) and not self._done:
            d = self._d
            if d.eof:
                data = d.unused_data or self._read_raw()
                while data and not data.strip(b"\0"):
                    # Zero padding after a member: xz's stream padding, tape and dd
                    # blocks (GNU gzip: "trailing zero bytes ignored"). Not damage.
                    data = self._read_raw()
                if not data:
                    self._done = True
                    return
                self._d = d = self._codec.new()  # the next member, stream or frame
                self._member, self._member_out = bytearray(), 0
            elif d.needs_input:
                data = self._read_raw()
                if not data:
                    self._done = self.truncated = True
                    return
            else:
                data = b""
            if data and self._member is not None:
                self._member += data
                if len(self._member) > self._REPLAY_MAX:
                    self._member = None
            try:
                self._buf, self._pos = d.decompress(data, self._OUT), 0
            except self._errors:
                self._buf, self._pos = self._salvage(), 0
                self._done = self.truncated = self.damaged = True
                return
            self._member_out += len(self._buf)

    def _salvage(self) -> bytes:
        """What the failing call decoded before the damage: the member decoded again
        from its start, in small pieces and then byte by byte, up to the error;
        the output already handed out is skipped."""
        member = self._member
        if member is None:
            return b""
        n = len(member)
        pieces = [(i, min(i + self._PIECE, n)) for i in range(0, n, self._PIECE)]
        fed, out = self._replay(member, pieces)
        if fed == len(pieces):
            return out
        lo, hi = pieces[fed]
        _, out = self._replay(member, pieces[:fed], [(i, i + 1) for i in range(lo, hi)])
        return out

    def _replay(self, member: bytearray, *spans: list[tuple[int, int]]) -> tuple[int, bytes]:
        """Feed `member`'s spans (in order) to a new decompressor until one fails:
        (spans fed whole, the output past what was handed out already, at most
        _OUT bytes)."""
        d = self._codec.new()
        skip, out = self._member_out, bytearray()
        fed = 0
        try:
            for lo, hi in (span for group in spans for span in group):
                chunk = d.decompress(bytes(member[lo:hi]))
                while not d.needs_input and not d.eof:
                    chunk += d.decompress(b"", self._OUT)
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                out += chunk[: self._OUT - len(out)]
                fed += 1
        except self._errors:
            pass
        return fed, bytes(out)

    def _read_raw(self) -> bytes:
        data = self._raw.read(self._CHUNK)
        self.raw_read += len(data)
        return data

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        self._fill()
        n = min(len(b), len(self._buf) - self._pos)
        with memoryview(self._buf) as view:
            b[:n] = view[self._pos : self._pos + n]
        self._pos += n
        return n
