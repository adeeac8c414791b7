"""The window rules, in the order they are tried: the first that applies classifies the
window. Each rule documents itself (what it decides, why, an example) the way sqlfluff's
rules do; its test cases are data beside it (`window_rules.toml`), run by one generic
test, and `preemptdiag explain rules` prints them. The run-level thrash rule (several
preempting windows in a row) is in rules.py.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from preemptdiag.diagnose.stories import alloc_why, crash_of
from preemptdiag.diagnose.visibility import BLIND, Visibility
from preemptdiag.model.config import Thresholds
from preemptdiag.model.evolve import evolve
from preemptdiag.model.records import Class, Confidence, Window

_CONF_ORDER = (Confidence.LOW, Confidence.MEDIUM, Confidence.HIGH)


@dataclass(frozen=True, slots=True)
class WindowRule:
    id: str  # PD1NN: stable, cited in tests and docs
    name: str
    cls: Class
    check: Callable[[Window, Thresholds, Visibility], Window | None]

    @property
    def doc(self) -> str:
        return (self.check.__doc__ or "").strip()


def fmt(v: float | None, unit: str = "") -> str:
    return "?" if v is None else f"{v:.1f}{unit}" if isinstance(v, float) else f"{v}{unit}"


def _stats_confidence(w: Window) -> Confidence:
    return _lines_confidence(w.n_stats)


def _lines_confidence(n_stats: int) -> Confidence:
    if n_stats >= 3:
        return Confidence.HIGH
    return Confidence.MEDIUM if n_stats >= 1 else Confidence.LOW


def _set(w: Window, cls: Class, conf: Confidence, why: str) -> Window:
    return evolve(w, cls=cls, confidence=conf, why=why)  # replace, faster (every window)


def allocation_failure(w: Window, thr: Thresholds, vis: Visibility) -> Window | None:
    """An allocation failed: CUDA/HIP OOM, or the KV cache could not be sized at start-up.

    Why first: a failed allocation explains everything after it (the engine dies, the
    queue stops moving), and its lever is the opposite of preemption's.
    Example: `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB`.
    """
    if not w.alloc_failures:
        return None
    return _set(w, Class.ALLOCATION_FAILURE, Confidence.HIGH, alloc_why(w))


def host_kill(w: Window, thr: Thresholds, vis: Visibility) -> Window | None:
    """The kernel, a memory cgroup or the container runtime killed a process for host RAM.

    Why before preemption: a host kill is not the GPU's KV cache at all; lowering
    --max-num-seqs or the GPU memory fraction cannot help.
    Example: `Memory cgroup out of memory: Killed process 22997 (VLLM::Worker)`.
    """
    if not w.host_ooms:
        return None
    return _set(
        w,
        Class.HOST_PRESSURE,
        Confidence.HIGH,
        "host/container memory kill (kernel, cgroup or container OOM line)",
    )


def preempted(w: Window, thr: Thresholds, vis: Visibility) -> Window | None:
    """Preemptions were counted in this window (warning counter deltas, `Preemptions:`,
    scrape counter, SGLang retractions).

    Why benign here: one window alone is a burst; the run rule upgrades consecutive
    preempting windows with KV pinned to a thrash loop.
    Example: `... total_num_cumulative_preemption=51`.
    """
    if w.preemptions <= 0:
        return None
    conf = Confidence.LOW if w.preemptions_lower_bound and not w.n_stats else Confidence.MEDIUM
    return _set(
        w,
        Class.BENIGN_PREEMPTION,
        conf,
        f"{w.preemptions:.0f} preemption(s), KV max {fmt(w.kv_max, '%')}",
    )


def swap_sizing(w: Window, thr: Thresholds, vis: Visibility) -> Window | None:
    """vLLM warned that its CPU swap space is large against host RAM.

    Why low confidence: a sizing risk, not a kill; it ranks below a proven loop.
    Example: `Possibly too large swap space. 16.00 GiB out of the 31.26 GiB total CPU memory`.
    """
    if not w.swap_warnings:
        return None
    return _set(
        w,
        Class.HOST_PRESSURE,
        Confidence.LOW,
        "swap space sized against host RAM (vLLM swap-space warning)",
    )


def engine_died(w: Window, thr: Thresholds, vis: Visibility) -> Window | None:
    """The engine died and this window holds no memory evidence for why.

    Why undecided: a death alone has many causes; a requested stop's shutdown race is
    not one (events drop it), and the memory evidence, when present, wins above. The
    kernel's segfault line, when given (dmesg), names the crash: no memory lever helps.
    Example: `EngineDeadError: EngineCore encountered an issue.`
    """
    if not w.engine_deaths:
        return None
    crash = crash_of(w.evidence)
    return _set(
        w,
        Class.INSUFFICIENT_EVIDENCE,
        Confidence.MEDIUM,
        f"engine died: {crash} (the kernel's line): a crash, not memory pressure"
        if crash
        else "engine died; this window holds no memory evidence for why",
    )


def no_stats(w: Window, thr: Thresholds, vis: Visibility) -> Window | None:
    """Only start-up or context lines: nothing to judge load by. Insufficient evidence,
    not healthy, where the log says the engine prints no stats lines at all (vLLM's
    `disabling stats logging` warning with more than one API server, which
    --data-parallel-size N gives by default; or --disable-log-stats).

    Why: a quiet engine and one that stopped reporting look the same here; only the
    second says so, and then its quiet is no evidence of health.
    Example: the `non-default args` and `KV cache size` lines before the first request.
    """
    if w.n_stats:
        return None
    off = vis.stats_off_at(w.replica)
    if off is not None:
        return _set(
            w,
            Class.INSUFFICIENT_EVIDENCE,
            Confidence.LOW,
            f"no stats lines: {off.why}; this log cannot show KV usage, queueing or preemptions",
        )
    return _set(w, Class.HEALTHY, Confidence.LOW, "start-up/context lines only")


def suspected_preemption(w: Window, thr: Thresholds, vis: Visibility) -> Window | None:
    """KV pinned at the pressure threshold with requests waiting, in a log that cannot
    show preemptions (V1 without scrapes of the counter), or where V1's counter cannot
    yet (it counts a preemption when its request runs again: a flat count proves none
    only up to an empty queue, visibility.py).

    Why never queueing: queueing means KV is not exhausted; a pinned pool with a queue
    is what preemption looks like, so it is suspected, with the capture to prove it.
    Example: `Running: 30 reqs, Waiting: 145 reqs, CPU KV cache usage: 100.0%` (V1).
    """
    waiting = w.waiting_max or 0
    kv_hot = w.kv_max is not None and w.kv_max >= thr.kv_pressure_pct
    unseen = vis.unseen(w)
    if not (kv_hot and waiting > 0 and unseen is not None):
        return None
    return _set(
        w, Class.INSUFFICIENT_EVIDENCE, Confidence.LOW, _suspected_why(w.kv_max, waiting, unseen)
    )


def _suspected_why(kv_max: float | None, waiting: int, unseen: str) -> str:
    why = (
        "this log cannot show preemptions"
        if unseen == BLIND
        else "no count settles it (V1 counts a preemption only when its request runs again)"
    )
    return f"KV {fmt(kv_max, '%')} with {waiting} waiting, but {why} (suspected)"


def stall(w: Window, thr: Thresholds, vis: Visibility) -> Window | None:
    """Requests wait while nothing runs and the KV cache is nearly empty.

    Why not queueing: the engine is not admitting work at all (a hang or a stuck
    scheduler), which no capacity lever fixes.
    Example: `Running: 0 reqs, Swapped: 0 reqs, Pending: 115 reqs, GPU KV cache usage: 0.0%`.
    """
    waiting = w.waiting_max or 0
    if not (waiting > 0 and not (w.running_max or 0) and (w.kv_max or 0.0) < thr.stall_kv_pct):
        return None
    return _set(w, Class.INSUFFICIENT_EVIDENCE, Confidence.MEDIUM, _stall_why(waiting, w.kv_max))


def _stall_why(waiting: int, kv_max: float | None) -> str:
    return (
        f"{waiting} waiting while nothing runs and KV is {fmt(kv_max, '%')}: "
        "the engine is not admitting work (a stall, not memory pressure)"
    )


def _calm_confidence(w: Window, vis: Visibility) -> tuple[Confidence, str]:
    return _quiet_confidence(vis.unseen(w), w.n_stats)


def _quiet_confidence(unseen: str | None, n_stats: int) -> tuple[Confidence, str]:
    # A log that cannot show preemptions cannot be highly sure there were none.
    if unseen is not None:
        conf = min(_lines_confidence(n_stats), Confidence.MEDIUM, key=_CONF_ORDER.index)
        return conf, f"no preemption seen ({unseen})"
    return _lines_confidence(n_stats), "no preemption"


def queueing(w: Window, thr: Thresholds, vis: Visibility) -> Window | None:
    """Requests wait in most stats lines, nobody is preempted: load waits at the door,
    the intended safe behaviour.

    Why the share: one line with Waiting > 0 is a blip, not a queue.
    Example: `Running: 16 reqs, Waiting: 24 reqs, CPU KV cache usage: 20.4%`.
    """
    waiting = w.waiting_max or 0
    if not (waiting > 0 and (w.waiting_share or 0.0) >= thr.queue_min_share):
        return None
    conf, seen = _calm_confidence(w, vis)
    return _set(w, Class.QUEUEING, conf, _queueing_why(waiting, w.kv_max, seen))


def _queueing_why(waiting: int, kv_max: float | None, seen: str) -> str:
    return f"{waiting} waiting, KV max {fmt(kv_max, '%')}, {seen}"


def healthy(w: Window, thr: Thresholds, vis: Visibility) -> Window:
    """Nothing of the above: KV below pressure or nothing waiting, no preemption.

    Example: `Running: 2 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.4%`.
    """
    conf, seen = _calm_confidence(w, vis)
    return _set(w, Class.HEALTHY, conf, _healthy_why(w.kv_max, w.waiting_max, seen))


def _healthy_why(kv_max: float | None, waiting_max: int | None, seen: str) -> str:
    waiting = waiting_max or 0
    if waiting_max is None:
        queue = "queue length not logged"
    elif not waiting:
        queue = "nothing waiting"
    else:
        queue = f"Waiting > 0 in few lines (max {waiting})"
    return f"KV max {fmt(kv_max, '%')}, {queue}, {seen}"


CalmJudgement = tuple[Class, Confidence, str]
CalmJudge = Callable[
    [str, datetime, datetime, int, float | None, int | None, float | None, int | None],
    CalmJudgement,
]


def calm_judge(vis: Visibility, thr: Thresholds) -> CalmJudge:
    """What the rules make of a calm window (timeline/calm.py: stats lines alone, every
    one saying how many wait, nothing preempted: no rule before PD107 takes it; PD107,
    where its KV reaches the pressure threshold, PD108, PD109 or PD110 does): its
    class, confidence and why from its replica, start, end, stats lines, KV max,
    Waiting max and share and Running max. A month of them is not made and then
    evolved.
    tests/diagnose/test_window_rules_calm.py holds it to classify_window."""
    # (a month of windows says a few hundred things: each made once)
    said: dict[tuple[Any, ...], CalmJudgement] = {}

    def judged(
        replica: str,
        start: datetime,
        end: datetime,
        n_stats: int,
        kv_max: float | None,
        waiting_max: int | None,
        waiting_share: float | None,
        running_max: int | None,
    ) -> CalmJudgement:
        unseen = vis.unseen_at(replica, start, end)
        # (of the share and Running the rules read only these: fewer things to keep)
        queued = (waiting_share or 0.0) >= thr.queue_min_share
        numbers = (n_stats, kv_max, waiting_max, queued, bool(running_max))
        if not kv_max:  # (a zero may be -0.0, equal to 0.0 but printed otherwise: not kept)
            return _calm_judged(thr, unseen, *numbers)
        key = (unseen, type(kv_max), *numbers)
        got = said.get(key)
        if got is None:
            got = _calm_judged(thr, unseen, *numbers)
            if len(said) < _SAID_MAX:
                said[key] = got
        return got

    return judged


def _calm_judged(
    thr: Thresholds,
    unseen: str | None,
    n_stats: int,
    kv_max: float | None,
    waiting_max: int | None,
    queued: bool,  # Waiting > 0 in at least queue_min_share of its lines
    runs: bool,  # Running > 0 in one of them
) -> CalmJudgement:
    """suspected preemption, stall, queueing and healthy (PD107-PD110) of a window of
    these numbers."""
    waiting = waiting_max or 0
    if kv_max is not None and kv_max >= thr.kv_pressure_pct and waiting > 0 and unseen is not None:
        return Class.INSUFFICIENT_EVIDENCE, Confidence.LOW, _suspected_why(kv_max, waiting, unseen)
    if waiting > 0 and not runs and (kv_max or 0.0) < thr.stall_kv_pct:
        return Class.INSUFFICIENT_EVIDENCE, Confidence.MEDIUM, _stall_why(waiting, kv_max)
    conf, seen = _quiet_confidence(unseen, n_stats)
    if waiting > 0 and queued:
        return Class.QUEUEING, conf, _queueing_why(waiting, kv_max, seen)
    return Class.HEALTHY, conf, _healthy_why(kv_max, waiting_max, seen)


_SAID_MAX = 1 << 14


RULES: tuple[WindowRule, ...] = (
    WindowRule("PD101", "allocation-failure", Class.ALLOCATION_FAILURE, allocation_failure),
    WindowRule("PD102", "host-kill", Class.HOST_PRESSURE, host_kill),
    WindowRule("PD103", "preempted", Class.BENIGN_PREEMPTION, preempted),
    WindowRule("PD104", "swap-sizing", Class.HOST_PRESSURE, swap_sizing),
    WindowRule("PD105", "engine-died", Class.INSUFFICIENT_EVIDENCE, engine_died),
    WindowRule("PD106", "no-stats", Class.HEALTHY, no_stats),
    WindowRule("PD107", "suspected-preemption", Class.INSUFFICIENT_EVIDENCE, suspected_preemption),
    WindowRule("PD108", "stall", Class.INSUFFICIENT_EVIDENCE, stall),
    WindowRule("PD109", "queueing", Class.QUEUEING, queueing),
    WindowRule("PD110", "healthy", Class.HEALTHY, healthy),
)


def classify_window(w: Window, thr: Thresholds, vis: Visibility) -> Window:
    """The first rule that applies decides the window (the last one always applies)."""
    for rule in RULES[:-1]:
        got = rule.check(w, thr, vis)
        if got is not None:
            return got
    return healthy(w, thr, vis)


@cache
def rule_cases() -> tuple[dict[str, Any], ...]:
    """The rules' test cases (window_rules.toml beside this file)."""
    path = Path(__file__).with_name("window_rules.toml")
    return tuple(tomllib.loads(path.read_text(encoding="utf-8"))["case"])
