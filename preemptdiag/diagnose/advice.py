"""Verdict -> the ONE lever to change next (design.md section 4).

Each lever carries the current value when the log shows it, one proposed value, the
arithmetic, how to verify in the next run and what not to do. Never two values for
one knob; never a list of things to try.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from preemptdiag.diagnose.alloc_levers import allocation_lever, sglang_conservativeness
from preemptdiag.diagnose.budget import max_num_seqs_from_observed
from preemptdiag.diagnose.host_levers import host_lever
from preemptdiag.diagnose.runbook import (
    DOCS,
    NOT_GPU_UTIL,
    NOT_MEM_FRACTION,
    VERIFY_PREEMPT,
    VERIFY_RETRACT,
)
from preemptdiag.diagnose.stories import aggregated_engines, cpu_backend
from preemptdiag.diagnose.way_back import with_way_back
from preemptdiag.model.config import Thresholds
from preemptdiag.model.errors import DiagError
from preemptdiag.model.records import (
    Class,
    EngineInfo,
    Event,
    Lever,
    Verdict,
    Window,
)
from preemptdiag.timeline.events import version_at_least
from preemptdiag.timeline.knobs import Facts


def _no_change(cls: Class, rationale: str, engine: str) -> Lever:
    doc = DOCS[cls]
    return Lever(
        knob=None,
        current=None,
        proposed=None,
        arithmetic=(),
        verify=doc.verify,
        do_not=doc.do_not,
        rationale=rationale,
        engine=engine,
    )


def choose_lever(
    verdict: Verdict,
    windows: Sequence[Window],
    events: Sequence[Event],
    facts: Facts,
    info: EngineInfo,
    thr: Thresholds,
) -> Lever:
    """The one lever, with how to apply it and when to roll it back."""
    lever = _choose(verdict, windows, events, facts, info, thr)
    if info.engine == "unknown" and lever.knob in _SGLANG_ANALOGUE:
        # A bare traceback names no engine: the flag shown is vLLM's, and saying so is
        # the difference between a lever and a guess (a lone SGLang CUDA OOM line, say).
        analogue = _SGLANG_ANALOGUE[lever.knob]
        lever = replace(
            lever,
            rationale=f"{lever.rationale}; the log does not say which engine printed it: "
            f"{lever.knob} is vLLM's flag (on SGLang: {analogue})",
        )
    return with_way_back(lever, verdict.cls)


# vLLM's flags the levers name, and what SGLang calls the same knob.
_SGLANG_ANALOGUE = {
    "--gpu-memory-utilization": "--mem-fraction-static",
    "--max-num-seqs": "--max-running-requests",
    "--max-num-batched-tokens": "--chunked-prefill-size",
    "--max-model-len": "--context-length",
}


def _choose(
    verdict: Verdict,
    windows: Sequence[Window],
    events: Sequence[Event],
    facts: Facts,
    info: EngineInfo,
    thr: Thresholds,
) -> Lever:
    engine = info.engine if info.engine != "unknown" else "vllm"
    cls = verdict.cls
    if cls is Class.THRASH_LOOP:
        assumed = _assumed_cap(events, info, facts, thr)
        engines = _aggregated(events, verdict.replica)
        aggregated = (
            (engines, _aggregated_peaks(events, windows, verdict.replica)) if engines > 1 else None
        )
        return _thrash(verdict, windows, facts, engine, thr, assumed, aggregated)
    if cls is Class.ALLOCATION_FAILURE:
        return allocation_lever(verdict, events, facts, engine, info, thr.default_max_num_seqs)
    if cls is Class.HOST_PRESSURE:
        return host_lever(verdict, events, facts, engine)
    if cls is Class.BENIGN_PREEMPTION:
        return _no_change(
            cls,
            "occasional preemption that recovers is the scheduler working as designed; if "
            "tail latency matters, bound max_tokens per request rather than changing capacity",
            engine,
        )
    if cls is Class.QUEUEING:
        return _no_change(
            cls,
            "requests wait at the door instead of being preempted: the intended safe "
            "behaviour; add a replica only if the latency objective is breached",
            engine,
        )
    if cls is Class.INSUFFICIENT_EVIDENCE:
        capture = verdict.capture_next or "a longer excerpt that includes stats lines"
        return _no_change(
            cls,
            "the log cannot decide the class; change nothing until the evidence is in. "
            f"Capture next: {capture}",
            engine,
        )
    return _no_change(Class.HEALTHY, "nothing wrong seen", engine)


# --- thrash -----------------------------------------------------------------------


def _assumed_cap(
    events: Sequence[Event], info: EngineInfo, facts: Facts, thr: Thresholds
) -> tuple[int, str] | None:
    """The --max-num-seqs a vLLM engine ran with where its log shows none, and how the
    arithmetic names it: the CPU backend's own default from 0.32 on (128 x world size,
    engine/arg_utils.py in 0.32.0, 0.33.0 and 0.34.0: a real 0.32.0 CPU run printed its
    `CPU KV cache usage`), unless default_max_num_seqs was configured; else that
    threshold. None for SGLang (its cap is sized from its own start-up line)."""
    if info.engine == "sglang":
        return None
    built_in = Thresholds().default_max_num_seqs
    if (
        thr.default_max_num_seqs == built_in
        and cpu_backend(events)
        and version_at_least(info, 0, 32)
    ):
        tp = facts.knob_int("tensor_parallel_size") or 1
        return 128 * tp, (
            f"vLLM {info.version}'s CPU-backend default 128 × tensor_parallel_size {tp}"
        )
    return thr.default_max_num_seqs, f"default {thr.default_max_num_seqs}"


def _aggregated(events: Sequence[Event], replica: str) -> int:
    """How many engines the replica's stats lines sum up (1: one engine's lines)."""
    return max((aggregated_engines(e) for e in events if e.replica == replica), default=1)


def _aggregated_peaks(
    events: Sequence[Event], windows: Sequence[Window], replica: str
) -> list[tuple[float, int]]:
    """(KV usage, Running) at the highest KV usage of each thrash window, from the
    replica's `N Engines Aggregated` lines alone: a /metrics scrape beside them gives one
    engine's KV usage and running (promscrape's peak_running), the lines the pools' mean
    and the engines' sum, and a window's peak may be either."""
    spans = [
        (w.start, w.end)
        for w in windows
        if w.cls is Class.THRASH_LOOP and w.replica == replica and w.start and w.end
    ]
    best: dict[int, tuple[float, int]] = {}
    for e in events:
        if e.replica != replica or e.ts is None or aggregated_engines(e) == 1:
            continue
        if e.rollup is not None:
            kv, running = e.rollup.stats.peak_kv, e.rollup.stats.peak_running
        else:
            raw_kv, raw_run = e.fields.get("kv_usage"), e.fields.get("running")
            kv = float(raw_kv) if isinstance(raw_kv, int | float) else -1.0
            running = raw_run if isinstance(raw_run, int) else None
        k = next((i for i, (lo, hi) in enumerate(spans) if lo <= e.ts < hi), None)
        if k is None or running is None or kv <= 0:
            continue
        # the highest KV usage, and at a tie the fewest running (windows' kv_peak_running)
        if k not in best or (kv, -running) > (best[k][0], -best[k][1]):
            best[k] = (kv, running)
    return [best[k] for k in sorted(best)]


def _thrash(
    verdict: Verdict,
    windows: Sequence[Window],
    facts: Facts,
    engine: str,
    thr: Thresholds,
    assumed: tuple[int, str] | None,
    aggregated: tuple[int, list[tuple[float, int]]] | None = None,
) -> Lever:
    """`aggregated`: (engines, their lines' peaks) for `N Engines Aggregated` lines."""
    knob = "--max-running-requests" if engine == "sglang" else "--max-num-seqs"
    default, said = assumed if assumed is not None else (None, "")
    current_key = "max_running_requests" if engine == "sglang" else "max_num_seqs"
    current = facts.knob_int(current_key)
    # `current` is what the log shows; an assumed default is said in the arithmetic.
    shown_current = current
    arithmetic: list[str] = []
    # A single request can fill the pool: capping concurrency cannot help.
    cur_len = facts.knob_int("max_model_len") or facts.concurrency_len
    low_conc = (
        facts.max_concurrency is not None and facts.max_concurrency < thr.single_request_concurrency
    )
    len_fills = bool(cur_len and facts.kv_tokens and cur_len >= facts.kv_tokens)
    target_conc = 2
    shorter = bool(facts.kv_tokens and (not cur_len or facts.kv_tokens // target_conc < cur_len))
    # The context lever only ever lowers --max-model-len (a configured concurrency
    # threshold must not turn it into a raise).
    if engine == "vllm" and facts.kv_tokens and (low_conc or len_fills) and shorter:
        proposed_len = facts.kv_tokens // target_conc
        tell = (
            f"Maximum concurrency at {cur_len or '?'} tokens per request = "
            f"{facts.max_concurrency:.2f}x < {thr.single_request_concurrency:g}x"
            if low_conc and facts.max_concurrency is not None
            else f"max_model_len {cur_len:,} >= KV tokens {facts.kv_tokens:,}"
        )
        arithmetic = [
            f"{tell}: one long request can fill the KV pool",
            f"--max-model-len = floor(KV tokens {facts.kv_tokens:,} / {target_conc} concurrent "
            f"full-length requests) = {proposed_len:,}",
        ]
        return Lever(
            knob="--max-model-len",
            current=str(cur_len) if cur_len else None,
            proposed=str(proposed_len),
            arithmetic=tuple(arithmetic),
            verify=VERIFY_PREEMPT,
            do_not=NOT_GPU_UTIL,
            rationale="a single request can hold the whole cache; bound the context length",
            engine=engine,
        )
    thrash = [w for w in windows if w.cls is Class.THRASH_LOOP]
    engines, peaks = aggregated or (
        1,
        [
            (w.kv_max, w.kv_peak_running)
            for w in thrash
            if w.kv_max is not None and w.kv_peak_running
        ],
    )
    proposed: int | None = None
    if facts.kv_tokens and peaks:
        try:
            # Aggregated lines: Running over all the engines' pools, KV usage their mean.
            pools = facts.kv_tokens * engines
            proposed, _p95, lines = max_num_seqs_from_observed(
                pools, [(float(k), int(r)) for k, r in peaks], thr.headroom
            )
            src = facts.kv_tokens_how or "start-up lines"
            # The sizing speaks the engine's own flag (SGLang: --max-running-requests).
            arithmetic = [
                f"KV tokens = {facts.kv_tokens:,} ({src})",
                *(ln.replace("--max-num-seqs", knob) for ln in lines),
            ]
            if engines > 1:
                total = proposed
                proposed = max(1, total // engines)
                arithmetic = [
                    f"KV tokens = {facts.kv_tokens:,} ({src}) a pool × {engines} engines = "
                    f"{pools:,}: the stats lines are {engines} Engines Aggregated (Running "
                    "their sum, KV usage their pools' mean)",
                    *(ln.replace("--max-num-seqs", "sequences of all the engines") for ln in lines),
                    f"{knob} (a cap per engine) = floor({total:,} / {engines}) = {proposed:,}",
                ]
        except DiagError:
            proposed = None
    cap = current if current is not None else default
    # A cap only changes anything below what actually ran: at the thrash's peak.
    ran = max((w.running_max for w in thrash if w.running_max is not None), default=None)
    if ran is not None and engines > 1:
        ran = -(-ran // engines)  # summed over the engines: at least this many ran on one
    if current is None and default is not None:
        assumed_line = f"current {knob}: {said} (assumed: not in the log)"
        if ran is not None and ran > default:
            # More ran than the assumed cap allows: the engine's cap is another (vLLM's
            # own default is 1024 on a GPU of 70 GiB or more), at least what ran.
            cap = ran
            assumed_line = (
                f"current {knob}: not in the log, and Running reached {ran} > {said}: "
                f"the cap is at least {ran} (vLLM's default is 1024 on a GPU of 70 GiB or more)"
            )
        arithmetic.insert(1 if arithmetic else 0, assumed_line)
    if proposed is not None and cap is not None and proposed >= cap:
        arithmetic.append(
            f"the demand-based value {proposed} is not below the current cap {cap}: a cap "
            "there changes nothing"
        )
        proposed = None
    if proposed is None:
        if cap is None and ran is None:
            return sglang_conservativeness(facts, engine)
        basis = "the log shows it" if current is not None else "not in the log: default"
        if ran is not None and (cap is None or ran < cap):
            proposed = max(1, math.floor(thr.headroom * ran))
            arithmetic.append(
                f"no KV capacity + stats pair to size from; at most {ran} ran at the peak "
                f"(cap {cap if cap is not None else '?'}, {basis}), so a cap must be below "
                f"{ran} to bite: floor({thr.headroom:g} × {ran}) = {proposed}"
            )
        elif cap is not None:
            proposed = max(1, cap // 2)
            arithmetic.append(
                f"no KV capacity + stats pair to size from; Running reached the cap "
                f"({cap}, {basis}): halve it -> {proposed}"
            )
    return Lever(
        knob=knob,
        current=str(shown_current) if shown_current is not None else None,
        proposed=str(proposed),
        arithmetic=tuple(arithmetic),
        verify=VERIFY_RETRACT if engine == "sglang" else VERIFY_PREEMPT,
        do_not=NOT_MEM_FRACTION if engine == "sglang" else DOCS[Class.THRASH_LOOP].do_not,
        rationale=(
            "admit fewer concurrent sequences than the KV pool can hold at the observed "
            "request shape, so excess load queues (visible, cheap) instead of being "
            "preempted and re-prefilled"
        ),
        engine=engine,
    )
