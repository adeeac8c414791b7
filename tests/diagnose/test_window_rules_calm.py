"""healthy_calm: what the rules make of a calm window (timeline/calm.py), from its
numbers, as classify_window makes it of the window."""

from __future__ import annotations

from datetime import timedelta

from builders import T0, make_window
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptdiag.diagnose.visibility import Settled, Visibility
from preemptdiag.diagnose.window_rules import classify_window, healthy_calm
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


@settings(max_examples=500, deadline=None)
@given(
    _VISIBILITY,
    st.sampled_from(["a", "b"]),
    st.integers(-2, 5),
    st.integers(1, 12),
    st.one_of(st.none(), st.floats(0, 94.9), st.just(0.0), st.just(-0.0), st.integers(0, 94)),
)
def test_a_calm_window_is_judged_as_the_rules_judge_it(
    vis: Visibility, replica: str, minute: int, n: int, kv: float | None
) -> None:
    # A calm window: every line Waiting 0, nothing preempted, KV under the threshold.
    w = make_window(
        minute,
        replica=replica,
        n_events=n,
        n_stats=n,
        kv_max=kv,
        waiting_first=0,
        waiting_last=0,
        waiting_max=0,
        waiting_share=0.0,
    )
    got = classify_window(w, Thresholds(), vis)
    assert got.cls is Class.HEALTHY
    assert (got.confidence, got.why) == healthy_calm(vis, replica, w.start, w.end, n, kv)


def test_what_it_says_once_is_said_again_alike_but_for_the_sign_and_type_of_kv() -> None:
    # (healthy_calm keeps what it made of (unseen, lines, KV): a month says a few
    # hundred things; an equal KV that prints otherwise is another thing)
    vis = Visibility(True, None, "why", None, (), ())
    start, end = T0, T0 + _MINUTE
    kvs = (29.0, 29, 0.0, -0.0, None)
    said = [healthy_calm(vis, "a", start, end, 6, kv)[1] for kv in kvs]
    assert [s.split(",")[0] for s in said] == [
        "KV max 29.0%",
        "KV max 29%",
        "KV max 0.0%",
        "KV max -0.0%",
        "KV max ?",
    ]
    for kv, first in zip(kvs, said, strict=True):
        assert healthy_calm(vis, "a", start, end, 6, kv)[1] == first
    seeing = Visibility(False, None, "why", None, (), ())
    assert healthy_calm(seeing, "a", start, end, 6, 29.0) == (
        Confidence.HIGH,
        "KV max 29.0%, nothing waiting, no preemption",
    )
    assert healthy_calm(seeing, "a", start, end, 2, 29.0)[0] is Confidence.MEDIUM
    assert healthy_calm(vis, "a", start, end, 6, 29.0)[0] is Confidence.MEDIUM
