"""commands.compare: the judgement of one change from two Sides."""

from __future__ import annotations

from dataclasses import replace

from preemptdiag.commands.compare import _judge
from preemptdiag.model.records import Change, Side

BASE = Side(
    files=("x",), verdict="thrash_loop", minutes=5.0, preemptions=1000.0,
    preemptions_per_min=200.0, kv_mean=99.0, kv_max=100.0, waiting_mean=50.0,
    waiting_max=90, prompt_tput=100.0, gen_tput=2000.0, completed=500.0, knobs={},
)  # fmt: skip


def test_fewer_preemptions_but_still_thrashing_is_not_fixed() -> None:
    after = replace(BASE, preemptions_per_min=60.0, completed=400.0)
    change, why = _judge(BASE, after)
    assert change is Change.NOT_FIXED
    assert why.startswith("preemptions 200/min -> 60/min, but the after side is still thrash_loop")


def test_no_preemption_with_throughput_held_is_improved() -> None:
    after = replace(BASE, verdict="queueing", preemptions_per_min=0.0, completed=520.0)
    assert _judge(BASE, after)[0] is Change.IMPROVED


def test_no_preemption_but_fewer_requests_done_is_inconclusive() -> None:
    after = replace(BASE, verdict="queueing", preemptions_per_min=0.0, completed=300.0)
    change, why = _judge(BASE, after)
    assert change is Change.INCONCLUSIVE and "completed requests per minute fell too" in why


def test_a_side_that_cannot_show_preemptions_is_inconclusive() -> None:
    blind = replace(BASE, verdict="insufficient_evidence", suspected=True, preemptions_per_min=0.0)
    change, why = _judge(blind, replace(BASE, verdict="queueing", preemptions_per_min=0.0))
    assert change is Change.INCONCLUSIVE and why.startswith("the before side cannot show")


def test_an_out_of_memory_failure_gone_is_improved() -> None:
    oom = replace(BASE, verdict="allocation_failure", preemptions_per_min=0.0)
    change, why = _judge(oom, replace(oom, verdict="healthy", minutes=28.0))
    assert change is Change.IMPROVED
    assert why == (
        "before shows allocation_failure, after does not (healthy, 28 min of log): confirm it "
        "held the load that failed before"
    )


def test_an_out_of_memory_failure_still_there_is_not_fixed() -> None:
    host = replace(BASE, verdict="host_pressure", preemptions_per_min=0.0)
    for after in ("host_pressure", "allocation_failure"):
        change, why = _judge(host, replace(host, verdict=after))
        assert change is Change.NOT_FIXED
        assert why == (
            f"before shows host_pressure, and the after side still fails ({after}): the change "
            "was not enough"
        )
