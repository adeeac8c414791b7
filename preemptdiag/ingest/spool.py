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

import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from preemptdiag.ingest.sources import Source

_PIECE = 1 << 20


@contextmanager
def spooled(src: Source, stdin: BinaryIO | None = None) -> Iterator[Source]:
    """`src` read from a copy of itself on disk when it is stdin (see the module
    docstring); the copy is removed on leaving."""
    if src.path is not None:
        yield src
        return
    pipe = sys.stdin.buffer if stdin is None else stdin
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
    with os.fdopen(fd, "wb", buffering=0) as out:
        piece = memoryview(src.stdin_head)
        while piece:
            try:
                while piece:
                    n = out.write(piece) or 0
                    size += n
                    piece = piece[n:]
            except OSError:
                return replace(src, stdin_head=bytes(piece), stdin_part=path)
            piece = memoryview(pipe.read(_PIECE))
    return replace(src, path=path, size=size, stdin_head=b"")
