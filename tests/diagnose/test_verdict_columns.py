"""rules.verdict reads its windows a column at a time (rules._Read): the episode, the
first allocation failure and host kill, the healthy story and its cap are what the
window-at-a-time reading made of them (kept here as the reference)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta

from builders import T0, make_window
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptdiag.diagnose import rules
from preemptdiag.diagnose.stories import StatsSeen
from preemptdiag.model.records import Class, Window

_SECONDS = 60


def _episode_one_at_a_time(windows: Sequence[Window], seconds: int) -> list[Window]:
    """rules._episode as it was, a window and property at a time."""
    best = min(rules._rank(w) for w in windows)
    ordered = sorted(windows, key=lambda w: (w.start is None, w.start or 0, w.replica))
    first = next(w for w in ordered if rules._rank(w) == best)
    same = [w for w in windows if w.replica == first.replica]
    k = next(i for i, w in enumerate(same) if w is first)
    run = [first]
    for w in same[k + 1 :]:
        if w.cls is first.cls and rules._consecutive(run[-1], w, seconds):
            run.append(w)
        else:
            break
    return run


def _first_ts_one_at_a_time(windows: Sequence[Window], cls: Class) -> Window | None:
    c = [w for w in windows if w.cls is cls and w.start is not None]
    return min(c, key=lambda w: w.start) if c else None  # type: ignore[arg-type,return-value]


_WINDOW = st.builds(
    lambda minute, replica, cls, host_ooms, n, undated: make_window(
        minute,
        replica=replica,
        cls=cls,
        host_ooms=host_ooms,
        n_stats=n,
        **({"start": None, "end": None} if undated else {}),
    ),
    st.integers(0, 12),
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(list(Class)),
    st.integers(0, 1),
    st.integers(0, 3),
    st.sampled_from([False, False, False, False, True]),  # (undated: now and then)
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_WINDOW, min_size=1, max_size=14))
def test_the_episode_is_the_one_read_a_window_at_a_time(windows: list[Window]) -> None:
    # (in build_windows' order: by replica, then start, undated last)
    windows.sort(key=lambda w: (w.replica, w.start is None, w.start or T0))
    read = rules._Read.of(windows)
    got = rules._episode(windows, _SECONDS, read)
    want = _episode_one_at_a_time(windows, _SECONDS)
    assert [id(w) for w in got] == [id(w) for w in want]
    for cls in Class:
        assert rules._first_ts(windows, read, cls) is _first_ts_one_at_a_time(windows, cls)


def test_a_gap_ends_the_run_and_another_replicas_window_is_passed_over() -> None:
    ws = [
        make_window(0, replica="a", cls=Class.QUEUEING),
        make_window(1, replica="a", cls=Class.QUEUEING),
        make_window(1, replica="b", cls=Class.QUEUEING),
        make_window(2, replica="a", cls=Class.QUEUEING),
        make_window(4, replica="a", cls=Class.QUEUEING),
        make_window(5, replica="a", cls=Class.QUEUEING),
    ]
    run = rules._episode(ws, _SECONDS, rules._Read.of(ws))
    assert [(w.replica, w.start) for w in run] == [
        ("a", T0 + timedelta(minutes=m)) for m in (0, 1, 2)
    ]
    ws[1] = make_window(1, replica="a", cls=Class.HEALTHY)
    run = rules._episode(ws, _SECONDS, rules._Read.of(ws))
    assert [(w.replica, w.start) for w in run] == [("a", T0)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 40), max_size=8),
    st.lists(st.lists(st.integers(0, 40), max_size=10), max_size=4),
    st.lists(st.integers(-1, 41), max_size=10),
)
def test_the_lines_taken_are_a_set_of_them(
    added: list[int], runs: list[list[int]], asked: list[int]
) -> None:
    # (the verdict's evidence: a run of calm windows' lines, which only go up, taken
    # without a set of them, and any other line one at a time)
    taken, model = rules._Taken(), set(added)
    for at in added:
        taken.add(at)
    for lines in runs:
        up = sorted(set(lines))
        assert taken.isdisjoint(up) is model.isdisjoint(up)
        if up and model.isdisjoint(up):
            taken.runs.append(up)
            model |= set(up)
    assert [at in taken for at in asked] == [at in model for at in asked]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.none() | st.sampled_from([0.0, -0.0, 12.5, 99.9, math.nan]) | st.floats(0, 100),
            st.none() | st.integers(0, 50),
        ),
        max_size=30,
    ),
    st.integers(1, 7),
)
def test_a_healthy_verdicts_counts_read_in_chunks_are_the_whole_columns(
    rows: list[tuple[int, float | None, int | None]], chunk: int
) -> None:
    # (stories.healthy_why's numbers, as the lists of every window gave them: max()
    # in order, a NaN among them included)
    seen = StatsSeen()
    for at in range(0, len(rows), chunk):
        part = rows[at : at + chunk]
        seen.add(at, [r[0] for r in part], [r[1] for r in part], [r[2] for r in part])
    stats = [i for i, r in enumerate(rows) if r[0]]
    kv = [v for i in stats if (v := rows[i][1]) is not None]
    waiting = [v for i in stats if (v := rows[i][2]) is not None]
    assert (seen.windows, seen.lines, seen.last) == (
        len(stats),
        sum(rows[i][0] for i in stats),
        stats[-1] if stats else -1,
    )
    assert repr(seen.kv) == repr(max(kv) if kv else None)
    assert seen.waiting == (max(waiting) if waiting else None)
