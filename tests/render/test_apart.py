"""render/apart.py: a long JSON timeline's second half made by a forked child while
this process writes the first; the text is the one process's, byte for byte, and
anything the child cannot do is done here."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import preemptdiag.render.apart as apart
import preemptdiag.render.json_format as jf
from preemptdiag.commands.analyze import run_analysis
from preemptdiag.commands.options import build_options
from preemptdiag.model.records import Report
from preemptdiag.render import Format, render_chunks

SAMPLE = Path(__file__).parents[2] / "samples" / "v1_thrash_loop.log"


def _report() -> Report:
    opts = build_options(
        [str(SAMPLE)], None, None, None, 2026, None, None, None, None, 1, False, False, None
    )
    return run_analysis(opts).report


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Any timeline goes apart, in batches of two windows; the children made."""
    made: list[int] = []
    monkeypatch.setattr(apart, "FORK_MIN_WINDOWS", 1)
    monkeypatch.setattr(jf, "FORK_MIN_WINDOWS", 1)
    monkeypatch.setattr(jf, "_BATCH", 2)
    fork = os.fork

    def counted() -> int:
        pid = fork()
        if pid:
            made.append(pid)
        return pid

    monkeypatch.setattr(apart.os, "fork", counted)
    # (threads another test left running are not this test's: those it starts are)
    before = set(threading.enumerate())
    monkeypatch.setattr(apart, "_other_threads", lambda: len(set(threading.enumerate()) - before))
    return made


def test_two_processes_write_the_text_one_writes(forks: list[int]) -> None:
    report = _report()
    assert len(report.windows) >= 6
    one = "".join(render_chunks(report, Format.JSON, processes=1))
    assert not forks
    two = "".join(render_chunks(report, Format.JSON, processes=2))
    assert len(forks) == 1 and two == one


def test_a_child_that_fails_leaves_its_half_to_this_process(
    forks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    report = _report()
    one = "".join(render_chunks(report, Format.JSON, processes=1))

    def fails(self: apart.Apart) -> None:
        os._exit(1)

    monkeypatch.setattr(apart.Apart, "_child", fails)
    assert "".join(render_chunks(report, Format.JSON, processes=2)) == one
    assert len(forks) == 1


def test_no_fork_with_another_thread_running_or_one_process(forks: list[int]) -> None:
    assert apart.can_fork(2)
    assert not apart.can_fork(1)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        # (a lock that thread held at the fork would never be let go in the child)
        assert not apart.can_fork(2)
        "".join(render_chunks(_report(), Format.JSON, processes=2))
        assert not forks
    finally:
        stop.set()
        other.join()


def test_the_childs_text_is_read_back_whole_across_its_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (3 bytes a read: a two-byte character is cut in two by nearly every read)
    monkeypatch.setattr(apart, "_READ", 3)
    pieces = ["a", "é" * 50, "b\n", "€ and 🙂"]
    child = apart.Apart(lambda: iter(pieces))
    try:
        assert "".join(child.pieces()) == "".join(pieces)
    finally:
        child.close()


def test_closing_stops_a_child_still_writing() -> None:
    # (Ctrl-C in this process while the child writes: it must not outlive the run)
    def slow() -> Iterator[str]:
        time.sleep(60)
        yield "never"

    child = apart.Apart(slow)
    pid = child._pid
    assert pid is not None
    t0 = time.monotonic()
    child.close()
    assert time.monotonic() - t0 < 5
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # (reaped: no such child any more)
