"""calm_judge: what the rules make of a calm window (timeline/calm.py), from its
numbers, as classify_window makes it of the window: suspected preemption, a stall,
queueing or healthy."""

from __future__ import annotations

from datetime import timedelta

from builders import T0, make_window
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptdiag.diagnose.visibility import Settled, Visibility
from preemptdiag.diagnose.window_rules import calm_judge, classify_window
from preemptdiag.model.config import Thresholds
from preemptdiag.model.records import Class, Confidence

_MINUTE = timedelta(minutes=1)
_SPAN = st.tuples(st.integers(-3, 6), st.integers(-3, 6)).map(
    lambda ab: (T0 + _MINUTE * min(ab), T0 + _MINUTE * max(ab))
)
_SETTLED = st.builds(
    lambda replica, first, last, spans: Settled(replica, first[0], last[1], tuple(spans)),
    st.sampled_from(["a", "b"]),
    _SPAN,
    _SPAN,
    st.lists(_SPAN, max_size=3),
)
_VISIBILITY = st.builds(
    Visibility,
    st.booleans(),
    st.none(),
    st.just("why"),
    st.one_of(st.none(), _SPAN),
    st.just(()),
    st.lists(_SETTLED, max_size=2).map(tuple),
)


_THRESHOLDS = st.builds(
    Thresholds,
    queue_min_share=st.sampled_from([0.5, 0.3, 1.0, 0.0]),
    stall_kv_pct=st.sampled_from([5.0, 0.5, 50.0]),
    kv_pressure_pct=st.sampled_from([95.0, 90.0, 100.0, 1.0]),
)


@st.composite
def _queue(draw: st.DrawFn, n: int) -> tuple[int, float]:
    """A minute's Waiting max and share of lines with Waiting > 0 (as calm reads them:
    every one of its n lines says how many wait)."""
    waiting = draw(st.sampled_from([0, 0, 1, 3, 40]))
    pos = draw(st.integers(1, n)) if waiting else 0
    return waiting, round(round(0.0 + pos, 6) / n, 6)


@settings(max_examples=800, deadline=None)
@given(
    _VISIBILITY,
    _THRESHOLDS,
    st.sampled_from(["a", "b"]),
    st.integers(-2, 5),
    st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), _queue(n))),
    st.one_of(
        st.none(),
        st.floats(0, 100),
        st.just(0.0),
        st.just(-0.0),
        st.integers(0, 100),
        st.sampled_from([90.0, 95.0, 95, 100.0]),
        st.floats(allow_infinity=True),
    ),
    st.sampled_from([None, 0, 1, 64]),
)
def test_a_calm_window_is_judged_as_the_rules_judge_it(
    vis: Visibility,
    thr: Thresholds,
    replica: str,
    minute: int,
    lines: tuple[int, tuple[int, float]],
    kv: float | None,
    running: int | None,
) -> None:
    # A calm window: every line says how many wait, nothing preempted; its KV at the
    # pressure threshold or under it.
    n, (waiting, share) = lines
    w = make_window(
        minute,
        replica=replica,
        n_events=n,
        n_stats=n,
        kv_max=kv,
        running_max=running,
        waiting_first=waiting,
        waiting_last=0,
        waiting_max=waiting,
        waiting_share=share,
    )
    got = classify_window(w, thr, vis)
    judged = calm_judge(vis, thr)
    said = judged(replica, w.start, w.end, n, kv, waiting, share, running)
    assert (got.cls, got.confidence, got.why) == said
    assert got.cls in (Class.HEALTHY, Class.QUEUEING, Class.INSUFFICIENT_EVIDENCE)
    assert judged(replica, w.start, w.end, n, kv, waiting, share, running) == said  # (kept)


def test_a_queue_in_most_lines_is_queueing_and_one_with_nothing_running_a_stall() -> None:
    vis = Visibility(False, None, "why", None, (), ())
    judged = calm_judge(vis, Thresholds())
    start, end = T0, T0 + _MINUTE
    assert judged("a", start, end, 6, 44.0, 24, 0.833333, 16) == (
        Class.QUEUEING,
        Confidence.HIGH,
        "24 waiting, KV max 44.0%, no preemption",
    )
    assert judged("a", start, end, 6, 44.0, 3, 0.166667, 16) == (
        Class.HEALTHY,
        Confidence.HIGH,
        "KV max 44.0%, Waiting > 0 in few lines (max 3), no preemption",
    )
    assert judged("a", start, end, 6, 0.0, 115, 1.0, 0) == (
        Class.INSUFFICIENT_EVIDENCE,
        Confidence.MEDIUM,
        "115 waiting while nothing runs and KV is 0.0%: the engine is not admitting work "
        "(a stall, not memory pressure)",
    )


def test_what_it_says_once_is_said_again_alike_but_for_the_sign_and_type_of_kv() -> None:
    # (calm_judge keeps what it made of (unseen, the numbers): a month says a few
    # hundred things; an equal KV that prints otherwise is another thing)
    vis = Visibility(True, None, "why", None, (), ())
    judged = calm_judge(vis, Thresholds())
    start, end = T0, T0 + _MINUTE
    kvs = (29.0, 29, 0.0, -0.0, None)
    said = [judged("a", start, end, 6, kv, 0, 0.0, 12)[2] for kv in kvs]
    assert [s.split(",")[0] for s in said] == [
        "KV max 29.0%",
        "KV max 29%",
        "KV max 0.0%",
        "KV max -0.0%",
        "KV max ?",
    ]
    for kv, first in zip(kvs, said, strict=True):
        assert judged("a", start, end, 6, kv, 0, 0.0, 12)[2] == first
    seeing = calm_judge(Visibility(False, None, "why", None, (), ()), Thresholds())
    assert seeing("a", start, end, 6, 29.0, 0, 0.0, 12) == (
        Class.HEALTHY,
        Confidence.HIGH,
        "KV max 29.0%, nothing waiting, no preemption",
    )
    assert seeing("a", start, end, 2, 29.0, 0, 0.0, 12)[1] is Confidence.MEDIUM
    assert judged("a", start, end, 6, 29.0, 0, 0.0, 12)[1] is Confidence.MEDIUM


def test_a_pinned_pool_with_a_queue_is_suspected_where_the_log_cannot_show_preemptions() -> None:
    # (PD107: a V1 log's stats lines print no preemptions; a pinned pool with a queue
    # is what preemption looks like, so it is never queueing there)
    start, end = T0, T0 + _MINUTE
    blind = calm_judge(Visibility(True, None, "why", None, (), ()), Thresholds())
    assert blind("a", start, end, 6, 98.8, 27, 1.0, 64) == (
        Class.INSUFFICIENT_EVIDENCE,
        Confidence.LOW,
        "KV 98.8% with 27 waiting, but this log cannot show preemptions (suspected)",
    )
    # at the threshold itself, and not with nothing waiting
    assert blind("a", start, end, 6, 95.0, 1, 0.166667, 64)[0] is Class.INSUFFICIENT_EVIDENCE
    assert blind("a", start, end, 6, 99.0, 0, 0.0, 64) == (
        Class.HEALTHY,
        Confidence.MEDIUM,
        "KV max 99.0%, nothing waiting, no preemption seen (this log cannot show it)",
    )
    # where the log can show them (SGLang's retractions), a pinned pool that showed none
    # is queueing
    seeing = calm_judge(Visibility(False, None, "why", None, (), ()), Thresholds())
    assert seeing("a", start, end, 6, 98.8, 27, 1.0, 64) == (
        Class.QUEUEING,
        Confidence.HIGH,
        "27 waiting, KV max 98.8%, no preemption",
    )
