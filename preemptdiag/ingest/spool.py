"""stdin copied to a temporary file, so a piped log can be read twice.

`kubectl logs pod | preemptdiag analyze -` is the common way a log arrives. A pipe is
read once, so analyze could not do for it what it does for a file: scan again where
what the scan summed cannot stand for its lines (calm minutes, rollups of preemption
lines, a late V1 count), or cut it for --jobs. It kept every stats line of a piped
month as an event instead: ~300 MiB and 8.7 s where the same file took 51 MiB and
3.5 s, and counts the report could only call "may be off".

So the raw bytes (still compressed, if they are) go to a file in the temporary folder
(TMPDIR) first, in 1 MiB pieces, and the log is read from there like any file; it is
removed when the run ends, a SIGTERM included (a log may hold prompts and secrets:
the file is its owner's alone meanwhile). Where no such file can be made, stdin is
streamed once, as before. Where writing stops part way (the disk fills), the part
written is read back, then the rest of the pipe: the same bytes, streamed once.
"""

from __future__ import annotations

import io
import os
import select
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Generator, Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import BinaryIO

from preemptdiag.ingest.sources import Source

_PIECE = 1 << 20


@contextmanager
def spooled(src: Source) -> Iterator[Source]:
    """`src` read from a copy of itself on disk when it is stdin (see the module
    docstring); the copy is removed on leaving."""
    if src.path is not None:
        yield src
        return
    pipe = sys.stdin.buffer
    try:
        fd, name = tempfile.mkstemp(prefix="preemptdiag-stdin-", suffix=".log")
    except OSError:
        yield src  # (no temporary folder to write in: streamed once)
        return
    path = Path(name)
    # (`timeout`, a job's deadline and k8s stop a run with SIGTERM, whose default
    # skips every `finally`: here it ends the run as an exception, so the copy goes)
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _terminated) if main else None
    try:
        yield _copied(src, pipe, fd, path)
    finally:
        with suppress(OSError):
            path.unlink()
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _copied(src: Source, pipe: BinaryIO, fd: int, path: Path) -> Source:
    """The Source read from `path` once stdin is all in it, or, when a write fails,
    the stream of what it holds, then what was not written, then the rest of stdin."""
    size = 0
    # (closed on the way out: stdin as it was, blocking)
    with os.fdopen(fd, "wb", buffering=0) as out, closing(_pieces(pipe)) as pieces:
        piece = memoryview(src.stdin_head)
        while piece:
            try:
                while piece:
                    n = out.write(piece) or 0
                    size += n
                    piece = piece[n:]
            except OSError:
                return replace(src, stdin_head=bytes(piece), stdin_part=path)
            piece = memoryview(next(pieces, b""))
    return replace(src, path=path, size=size, stdin_head=b"")


# How long a wait for a pipe's next bytes may hold off a SIGTERM: one that arrives
# just before a blocking read(2) runs its handler only once the read returns, which on
# an idle pipe (`kubectl logs -f`) is never.
_POLL_S = 0.5


def _pieces(pipe: BinaryIO) -> Generator[bytes, None, None]:
    """stdin's bytes, up to _PIECE at a time. From a pipe or socket, read without
    blocking and waited for in select() a _POLL_S at most, so a signal's handler runs
    within that (stdin made blocking again after); anything else, as it comes."""
    try:
        fd = pipe.fileno()
        polled = stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode)
    except (OSError, ValueError, io.UnsupportedOperation):
        polled = False
    if not polled:
        yield from iter(partial(pipe.read, _PIECE), b"")
        return
    blocking = os.get_blocking(fd)
    os.set_blocking(fd, False)
    try:
        while True:
            data = pipe.read(_PIECE)  # (None: nothing yet; b"": its end)
            if data is None:
                select.select([fd], [], [], _POLL_S)
            elif data:
                yield data
            else:
                return
    finally:
        os.set_blocking(fd, blocking)
