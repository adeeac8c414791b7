"""ingest.spool: stdin copied to a temporary file so it can be read twice, and streamed
once where no copy can be made or the copy stops part way."""

from __future__ import annotations

import gzip
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from builders import Pipe

import preemptdiag.ingest.spool as spool
from preemptdiag.ingest.sources import Source, open_binary, open_source

LOG = b"".join(b"INFO 03-04 10:00:%02d line %d\n" % (i % 60, i) for i in range(200_000))


def _stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> Pipe:
    pipe = Pipe(data, chunk=65536)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(pipe)))
    return pipe


def _folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _read(src: Source) -> bytes:
    with open_binary(src) as f:
        return f.read()


@pytest.mark.parametrize("compress", [False, True])
def test_stdin_is_read_from_its_copy_which_goes_when_the_run_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, compress: bool
) -> None:
    raw = gzip.compress(LOG) if compress else LOG
    pipe = _stdin(monkeypatch, raw)
    folder = _folder(monkeypatch, tmp_path)
    piped = open_source("-")
    with spool.spooled(piped) as src:
        (copy,) = folder.iterdir()
        # The raw bytes, still compressed; the name, codec and the missing file time
        # (year-less stamps are dated by when stdin was read) stay stdin's.
        assert src.path == copy and copy.read_bytes() == raw and src.size == len(raw)
        assert (src.name, src.codec, src.mtime) == ("<stdin>", piped.codec, None)
        assert src.head == piped.head and src.stdin_head == b""
        assert os.stat(copy).st_mode & 0o777 == 0o600  # (a log may hold secrets)
        assert pipe.served == len(raw)
        assert _read(src) == LOG
        assert _read(src) == LOG  # (twice: that is what it is for)
    assert list(folder.iterdir()) == []


def test_the_copy_goes_when_the_run_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _stdin(monkeypatch, LOG)
    folder = _folder(monkeypatch, tmp_path)
    with pytest.raises(RuntimeError), spool.spooled(open_source("-")):
        assert len(list(folder.iterdir())) == 1
        raise RuntimeError("the scan failed")
    assert list(folder.iterdir()) == []


def test_a_file_is_not_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(LOG)
    folder = _folder(monkeypatch, tmp_path)
    src = open_source(str(log))
    with spool.spooled(src) as got:
        assert got is src and list(folder.iterdir()) == []


def test_without_a_temporary_folder_stdin_is_streamed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: Any, **__: Any) -> tuple[int, str]:
        raise PermissionError(13, "Permission denied")

    pipe = _stdin(monkeypatch, LOG)
    monkeypatch.setattr(spool.tempfile, "mkstemp", refuse)
    piped = open_source("-")
    with spool.spooled(piped) as src:
        assert src is piped and src.path is None
        assert _read(src) == LOG and pipe.served == len(LOG)


class _Full(io.RawIOBase):
    """A file on a disk that fills after `room` bytes: a short write, then ENOSPC."""

    def __init__(self, fd: int, room: int) -> None:
        self._f = io.FileIO(fd, "wb")
        self._room = room

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if not self._room:
            raise OSError(28, "No space left on device")
        n = self._f.write(bytes(b[: self._room])) or 0
        self._room -= n
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


@pytest.mark.parametrize("room", [0, 1000, 3 << 20])
def test_a_copy_that_stops_part_way_is_read_then_the_rest_of_stdin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, room: int
) -> None:
    # The disk fills: what was written, what was not, then the pipe: every byte once,
    # in order; the part is removed when the run ends.
    data = LOG * 2  # (past 3 MiB: the copy stops in a later piece)
    assert len(data) > room + (1 << 20)
    pipe = _stdin(monkeypatch, data)
    folder = _folder(monkeypatch, tmp_path)
    monkeypatch.setattr(spool.os, "fdopen", lambda fd, *_, **__: _Full(fd, room))
    with spool.spooled(open_source("-")) as src:
        (part,) = folder.iterdir()
        assert src.path is None and src.stdin_part == part and part.stat().st_size == room
        assert pipe.served < len(data)
        assert _read(src) == data
    assert list(folder.iterdir()) == []


def test_a_sigterm_mid_run_removes_the_copy(tmp_path: Path) -> None:
    # (`timeout` and k8s stop a run with SIGTERM: the log, prompts and all, must not
    # stay behind in the temporary folder)
    folder = tmp_path / "tmp"
    folder.mkdir()
    env = {**os.environ, "TMPDIR": str(folder)}
    run = subprocess.Popen(
        [sys.executable, "-m", "preemptdiag", "analyze", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert run.stdin is not None
    run.stdin.write(LOG[:100_000])  # (and the pipe left open: the copy waits for more)
    run.stdin.flush()
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size for p in folder.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    (copy,) = folder.iterdir()
    assert copy.name.startswith("preemptdiag-stdin-")
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 128 + signal.SIGTERM
    run.stdin.close()
    assert list(folder.iterdir()) == []


def test_a_pipe_is_read_whole_without_blocking_and_left_blocking() -> None:
    # (spool._pieces: from a pipe, each wait a select() of _POLL_S at most, so a
    # SIGTERM that comes just before it is handled; the pipe as it was after)
    r, w = os.pipe()

    def feed() -> None:
        for k in range(0, len(LOG), 300_000):
            os.write(w, LOG[k : k + 300_000])
            time.sleep(0.05)
        os.close(w)

    writer = threading.Thread(target=feed)
    writer.start()
    with open(r, "rb") as pipe:
        assert os.get_blocking(r)
        assert b"".join(spool._pieces(pipe)) == LOG
        assert os.get_blocking(r)
    writer.join()
