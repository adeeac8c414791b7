"""A long JSON timeline written by two processes: the second half in a forked child
while this one writes the first.

A month of one-minute windows is ~60 MB of JSON, ~0.45 s of one core after the scan,
with the other core idle (the scan's workers are done). The child renders its half
into an unnamed temporary file; this process writes its own half, then the child's
text as it is. The text is the same, byte for byte: the child runs the very code
this process would (tests/render/test_apart.py holds them to each other).

Used only where it is safe and pays: `--jobs` above 1, on Linux (fork shares the
report for free), no other Python thread running (a lock one held at the fork would
never be let go in the child), and enough windows. Anything the child cannot do
(it fails, is killed, the file cannot be made or read back) is done here instead,
so the output never depends on it.
"""

from __future__ import annotations

import codecs
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from preemptdiag.model.errors import DiagError

# Fewer windows than this are written here alone: a fork and a file cost more than
# half their text (~10 us a window) saves.
FORK_MIN_WINDOWS = 8192
_READ = 1 << 20  # bytes of the child's text read back at a time


def can_fork(processes: int) -> bool:
    """Whether a half may go to a forked child (the module docstring's terms)."""
    return (
        processes > 1 and sys.platform == "linux" and hasattr(os, "fork") and not _other_threads()
    )


def _other_threads() -> int:
    """How many Python threads run besides this one."""
    return threading.active_count() - 1


class Apart:
    """Pieces of text (`render`) made in a forked child, read back when asked."""

    def __init__(self, render: Callable[[], Iterator[str]]) -> None:
        import tempfile

        self._file: Any = tempfile.TemporaryFile()  # noqa: SIM115 (close() closes it)
        self._render = render
        self._pid: int | None = None
        sys.stdout.flush()  # (nothing buffered is written twice, by both processes)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child: measured by its output)
            self._child()
        self._pid = pid

    def _child(self) -> None:
        """Render into the file and end, without running this process's exit code
        (atexit hooks, buffered output, the CLI's handlers)."""
        code = 1
        try:
            fd = self._file.fileno()
            for piece in self._render():
                data = piece.encode("utf-8")
                while data:
                    data = data[os.write(fd, data) :]
            code = 0
        except BaseException:  # (Ctrl-C, a full disk: the parent writes the half)
            code = 1
        finally:
            os._exit(code)

    def pieces(self) -> Iterator[str]:
        """The child's text, when it wrote all of it; else render's, made here."""
        if self._ended_well():
            decode = codecs.getincrementaldecoder("utf-8")().decode
            at = 0
            try:
                fd = self._file.fileno()
                while data := os.pread(fd, _READ, at):
                    at += len(data)
                    yield decode(data)
                yield decode(b"", final=True)
                return
            except (OSError, UnicodeDecodeError) as exc:
                if at:  # (text already given out cannot be taken back)
                    raise DiagError(f"cannot read the report's text back: {exc}") from None
        yield from self._render()

    def _ended_well(self) -> bool:
        pid, self._pid = self._pid, None
        if pid is None:
            return False
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 0

    def close(self) -> None:
        """Stop the child if it still runs (this process was interrupted), and let the
        file go."""
        if self._pid is not None:
            import signal

            try:
                os.kill(self._pid, signal.SIGKILL)
                os.waitpid(self._pid, 0)
            except ChildProcessError:
                pass
            self._pid = None
        self._file.close()
