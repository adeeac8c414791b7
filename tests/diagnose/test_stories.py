"""stories.queueing_why: the queue's peak over every queueing window of the replica,
read a chunk of windows at a time (a month of them is never made at once)."""

from __future__ import annotations

import random

import pytest
from builders import make_window

import preemptdiag.diagnose.stories as stories
from preemptdiag.model.records import Class, Window


def _naive(windows: list[Window], replica: str, fallback: str) -> str:
    mine = [w for w in windows if w.replica == replica]
    q = [w for w in mine if w.cls is Class.QUEUEING]
    waiting = [w.waiting_max for w in q if w.waiting_max is not None]
    if not waiting:
        return fallback
    kv = [w.kv_max for w in q if w.kv_max is not None]
    parts = [f"requests waiting in {len(q)} of {len(mine)} window(s), up to {max(waiting)}"]
    if kv:
        parts.append(f"KV max {max(kv):.1f}%")
    return ", ".join(parts) + ", " + q[-1].why.rsplit(", ", 1)[-1]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_peak_and_counts_across_chunks_are_those_of_every_window(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stories, "_CHUNK", 7)  # (many chunks of a few windows)
    rng = random.Random(seed)
    windows = [
        make_window(
            i,
            replica=rng.choice(["a", "b"]),
            cls=rng.choice([Class.QUEUEING, Class.QUEUEING, Class.HEALTHY]),
            waiting_max=rng.choice([None, 0, 3, 17, 40]),
            kv_max=rng.choice([None, 12.5, 70.0, 88.1]),
            why=f"x waiting, KV max y, tail {i}",
        )
        for i in range(60)
    ]
    for replica in ("a", "b", "c"):
        got = stories.queueing_why(windows, replica, "fallback")
        assert got == _naive(windows, replica, "fallback")
    assert stories.queueing_why(windows, "c", "fallback") == "fallback"


def test_the_tail_is_the_last_queueing_windows_own() -> None:
    windows = [
        make_window(
            0, replica="a", cls=Class.QUEUEING, waiting_max=8, kv_max=63.1, why="8, k, one"
        ),
        make_window(
            1, replica="a", cls=Class.QUEUEING, waiting_max=38, kv_max=82.3, why="38, k, two"
        ),
        make_window(
            2, replica="a", cls=Class.HEALTHY, waiting_max=0, kv_max=90.0, why="h, k, three"
        ),
    ]
    assert stories.queueing_why(windows, "a", "fallback") == (
        "requests waiting in 2 of 3 window(s), up to 38, KV max 82.3%, two"
    )
