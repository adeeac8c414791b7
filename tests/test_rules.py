"""Window classification and the incident verdict, on hand-built windows."""

from __future__ import annotations

from dataclasses import replace

from builders import make_event, make_window

from preemptdiag.diagnose.rules import classify, verdict
from preemptdiag.diagnose.visibility import Visibility
from preemptdiag.model.config import Thresholds
from preemptdiag.model.records import Class, Confidence, Event, Kind, Window

THR = Thresholds()
SEEING = Visibility(False, None, "V0 logs preemptions")
BLIND = Visibility(True, "two /metrics scrapes", "V1 before 0.11.1 logs no preemption line")


def win(i: int, **kw: object) -> Window:
    return make_window(i, **kw)


def classes(ws: list[Window], vis: Visibility = SEEING) -> list[str]:
    return [w.cls.value for w in classify(ws, THR, vis, 60)]


def test_three_consecutive_preempting_windows_at_full_kv_are_a_loop() -> None:
    ws = [win(0)] + [win(i, preemptions=5.0, kv_max=99.0) for i in (1, 2, 3)] + [win(4)]
    assert classes(ws) == ["healthy", "thrash_loop", "thrash_loop", "thrash_loop", "healthy"]


def test_isolated_preemptions_are_benign() -> None:
    ws = [win(0, preemptions=1.0, kv_max=98.0), win(1), win(2, preemptions=1.0, kv_max=97.0)]
    assert classes(ws) == ["benign_preemption", "healthy", "benign_preemption"]


def test_a_gap_breaks_the_run() -> None:
    ws = [win(i, preemptions=2.0, kv_max=99.0) for i in (0, 1, 5)]
    assert classes(ws) == ["benign_preemption"] * 3


def test_high_rate_in_one_window_is_a_loop() -> None:
    assert classes([win(0, preemptions=40.0, kv_max=99.5)]) == ["thrash_loop"]
    assert classes([win(0, preemptions=40.0, kv_max=80.0)]) == ["benign_preemption"]


def test_counter_past_51_with_growing_queue_is_a_loop() -> None:
    w = win(
        0,
        preemptions=1.0,
        preemptions_lower_bound=True,
        max_cumulative=151,
        kv_max=99.2,
        swapped_first=100,
        swapped_last=137,
    )
    assert classes([w]) == ["thrash_loop"]
    assert classes([replace(w, swapped_last=100)]) == ["benign_preemption"]


def test_queueing_needs_a_sustained_queue() -> None:
    assert classes([win(0, waiting_max=12, waiting_last=12, waiting_share=1.0)]) == ["queueing"]
    assert classes([win(0, waiting_max=1, waiting_share=0.25)]) == ["healthy"]


def test_blind_log_with_pinned_kv_is_suspected_not_thrash() -> None:
    ws = [win(i, kv_max=99.9, waiting_max=20 + i, waiting_share=1.0) for i in range(4)]
    assert classes(ws, BLIND) == ["insufficient_evidence"] * 4
    v = verdict(classify(ws, THR, BLIND, 60), THR, BLIND, 60)
    assert (v.cls, v.suspected, v.confidence) == (
        Class.INSUFFICIENT_EVIDENCE,
        True,
        Confidence.MEDIUM,
    )
    assert v.capture_next == "two /metrics scrapes"
    # The same windows in a log that can show preemptions are plain queueing.
    assert classes(ws, SEEING) == ["queueing"] * 4


def test_nothing_running_and_empty_kv_is_a_stall_not_queueing() -> None:
    w = win(0, running_max=0, kv_max=0.0, waiting_max=22, waiting_share=1.0)
    assert classes([w]) == ["insufficient_evidence"]


def _ev(kind: Kind, minute: int, subtype: str, src: str = "x.log") -> Event:
    return make_event(kind, {"subtype": subtype}, minute, source=src)


def test_kernel_kill_before_cuda_oom_is_host_pressure_as_cause() -> None:
    kill = _ev(Kind.HOST_OOM, 1, "kernel_kill", "dmesg.log")
    oom = _ev(Kind.ALLOC_FAILURE, 3, "cuda_oom")
    ws = classify(
        [win(1, host_ooms=1, evidence=(kill,)), win(3, alloc_failures=1, evidence=(oom,))],
        THR,
        SEEING,
        60,
    )
    v = verdict(ws, THR, SEEING, 60, [kill, oom])
    assert v.cls is Class.HOST_PRESSURE
    assert v.cause is not None and v.cause.startswith("kernel kill: ")


def test_cuda_oom_before_restart_is_allocation_failure_with_restart_as_consequence() -> None:
    oom = _ev(Kind.ALLOC_FAILURE, 1, "cuda_oom")
    restart = _ev(Kind.HOST_OOM, 2, "k8s_oomkilled", "describe.txt")
    ws = classify(
        [win(1, alloc_failures=1, evidence=(oom,)), win(2, host_ooms=1, evidence=(restart,))],
        THR,
        SEEING,
        60,
    )
    v = verdict(ws, THR, SEEING, 60, [oom, restart])
    assert v.cls is Class.ALLOCATION_FAILURE
    assert v.consequence == "container restart / OOM report afterwards"


def test_swap_warning_alone_never_hides_a_loop() -> None:
    ws = [win(0, swap_warnings=1, n_stats=0)] + [
        win(i, preemptions=5.0, kv_max=99.0) for i in (1, 2, 3)
    ]
    v = verdict(classify(ws, THR, SEEING, 60), THR, SEEING, 60)
    assert v.cls is Class.THRASH_LOOP


def test_no_windows_means_no_evidence() -> None:
    v = verdict([], THR, SEEING, 60)
    assert v.evidence_found is False
    assert v.why.startswith("no vLLM evidence found")
