"""timeline.scrapes: /metrics counter events beside a log that counts preemptions itself."""

from __future__ import annotations

from dataclasses import replace

from builders import make_event

from preemptdiag.model.records import Event, Kind
from preemptdiag.timeline.scrapes import counted_once


def _counter(replica: str, rise: int) -> Event:
    e = make_event(Kind.PREEMPTION, {"cumulative": rise}, source=f"{replica}.prom")
    return replace(e, replica=replica, engine="prometheus", preemptions=rise)


def _retract(replica: str) -> Event:
    e = make_event(Kind.PREEMPTION, {"retracted_reqs": 1}, source=replica)
    return replace(e, replica=replica, engine="sglang", preemptions=1)


def test_a_log_that_counts_its_preemptions_is_not_counted_twice() -> None:
    # a real SGLang 0.5.23: 22 retraction lines, and the counter rose by 22
    events = [_retract("a.log"), _counter("a.log", 22), _counter("b.log", 5)]
    got = counted_once(events)
    assert [e.preemptions for e in got] == [1, 0, 5]  # b.log's log counts none itself
    assert got[1].fields == {"cumulative": 22}  # the counter's read stays, as evidence


def test_without_logged_preemptions_the_counter_counts() -> None:
    events = [_counter("a.log", 3)]
    assert counted_once(events) == events
