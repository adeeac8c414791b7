"""One open of a log file, read by position, for the whole run.

logrotate works while we read: `create` renames the file and makes a new one at
the path, `copytruncate` copies it and cuts it to zero. A reader that opens the path
again (each --jobs worker did, per byte range) then reads a mix of two files, or a
fragment, with no note. So a file is opened once; its descriptor and its size at
that moment are the snapshot every reader uses. Forked workers inherit the
descriptor and read with `pread` (no shared file offset between processes), never
past the size, so `--jobs 2` reads exactly the bytes `--jobs 1` reads. A rename
leaves the descriptor on the old file, which is read whole; a file cut shorter
while it is read cannot be read whole any more, and the run says so (`check`).
"""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass

from preemptdiag.model.errors import DiagError

_PREADV = hasattr(os, "preadv")


@dataclass(frozen=True, slots=True)
class Snapshot:
    fd: int
    size: int  # bytes at open: what every reader reads, growth after it ignored
    name: str

    def close(self) -> None:
        os.close(self.fd)


def take(path: os.PathLike[str] | str, name: str) -> Snapshot:
    """Open `path` once; OSErrors become the one-line errors open_binary gives."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise read_error(name, exc) from None
    st = os.fstat(fd)
    # A FIFO or device has no size to hold readers to: read it as a stream.
    size = st.st_size if stat.S_ISREG(st.st_mode) else -1
    return Snapshot(fd, size, name)


def read_error(name: str, exc: OSError) -> DiagError:
    """The one-line error for a file that fails to open or read."""
    if isinstance(exc, FileNotFoundError):
        # Sniffed a moment ago: rotated or deleted since (logrotate runs while we read).
        return DiagError(f"{name}: no such file (removed while being read)")
    if isinstance(exc, PermissionError):
        return DiagError(f"{name}: permission denied")
    return DiagError(f"{name}: cannot read ({exc.strerror or exc})")


def check(snap: Snapshot) -> None:
    """Refuse a file cut shorter than its snapshot since it was opened (copytruncate
    while we read): what was read is a fragment, and a verdict on it is not the
    log's. A file that grew is fine: the snapshot's bytes were all there."""
    if snap.size < 0:
        return
    now = os.fstat(snap.fd).st_size
    if now < snap.size:
        raise DiagError(
            f"{snap.name}: cut from {snap.size:,} to {now:,} bytes while being read "
            "(log rotation by copytruncate?); analyze the rotated copy, or rerun"
        )


class PositionalReader(io.RawIOBase):
    """The snapshot's bytes, read with pread from this reader's own position."""

    def __init__(self, snap: Snapshot) -> None:
        super().__init__()
        self.snap = snap
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self.snap.size >= 0

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.snap.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.snap.size < 0:
            got = os.readv(self.snap.fd, [b])
            self.pos += got
            return got
        want = min(len(b), self.snap.size - self.pos)
        if want <= 0:
            return 0
        with memoryview(b) as view, view[:want] as dest:
            if _PREADV:
                got = os.preadv(self.snap.fd, [dest], self.pos)
            else:  # macOS before 11: pread and copy
                data = os.pread(self.snap.fd, want, self.pos)
                got = len(data)
                dest[:got] = data
        self.pos += got
        return got
