"""Verdict -> the ONE lever to change next (design.md section 4).

Each lever carries the current value when the log shows it, one proposed value, the
arithmetic, how to verify in the next run and what not to do. Never two values for
one knob; never a list of things to try.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from preemptdiag.diagnose.budget import max_num_seqs_from_observed
from preemptdiag.diagnose.runbook import (
    DOCS,
    NOT_GPU_UTIL,
    NOT_MEM_FRACTION,
    VERIFY_PREEMPT,
    VERIFY_RETRACT,
)
from preemptdiag.model.config import Thresholds
from preemptdiag.model.errors import DiagError
from preemptdiag.model.records import (
    Class,
    EngineInfo,
    Event,
    FieldValue,
    Kind,
    Lever,
    Verdict,
    Window,
)
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


def _alloc_events(verdict: Verdict, events: Sequence[Event]) -> list[Event]:
    own = [e for e in verdict.evidence if e.kind is Kind.ALLOC_FAILURE]
    return own or [e for e in events if e.kind is Kind.ALLOC_FAILURE]


def choose_lever(
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
        return _thrash(verdict, windows, facts, engine, thr)
    if cls is Class.ALLOCATION_FAILURE:
        return _allocation(verdict, events, facts, engine)
    if cls is Class.HOST_PRESSURE:
        return _host(verdict, events, facts, engine)
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


def _thrash(
    verdict: Verdict, windows: Sequence[Window], facts: Facts, engine: str, thr: Thresholds
) -> Lever:
    knob, default = (
        ("--max-running-requests", None)
        if engine == "sglang"
        else ("--max-num-seqs", thr.default_max_num_seqs)
    )
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
    if engine == "vllm" and facts.kv_tokens and (low_conc or len_fills):
        target_conc = 2
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
    peaks = [
        (w.kv_max, w.kv_peak_running) for w in thrash if w.kv_max is not None and w.kv_peak_running
    ]
    proposed: int | None = None
    if facts.kv_tokens and peaks:
        try:
            proposed, _p95, lines = max_num_seqs_from_observed(
                facts.kv_tokens, [(float(k), int(r)) for k, r in peaks], thr.headroom
            )
            src = facts.kv_tokens_how or "start-up lines"
            # The sizing speaks the engine's own flag (SGLang: --max-running-requests).
            arithmetic = [
                f"KV tokens = {facts.kv_tokens:,} ({src})",
                *(ln.replace("--max-num-seqs", knob) for ln in lines),
            ]
        except DiagError:
            proposed = None
    cap = current if current is not None else default
    if current is None and default is not None:
        arithmetic.insert(
            1 if arithmetic else 0,
            f"current {knob}: default {default} (assumed: not in the log)",
        )
    # A cap only changes anything below what actually ran: at the thrash's peak.
    ran = max((w.running_max for w in thrash if w.running_max is not None), default=None)
    if proposed is not None and cap is not None and proposed >= cap:
        arithmetic.append(
            f"the demand-based value {proposed} is not below the current cap {cap}: a cap "
            "there changes nothing"
        )
        proposed = None
    if proposed is None:
        if cap is None and ran is None:
            return _sglang_conservativeness(facts, engine)
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


def _sglang_conservativeness(facts: Facts, engine: str) -> Lever:
    cur = facts.knob_float("schedule_conservativeness") or 1.0
    new = round(cur * 1.3, 2)
    return Lever(
        knob="--schedule-conservativeness",
        current=f"{cur:g}",
        proposed=f"{new:g}",
        arithmetic=(
            f"{cur:g} x 1.3 = {new:g} (SGLang: 'use a larger value if you see "
            "requests being retracted frequently')",
        ),
        verify="retractions per minute drop to 0; #queue-req may rise; gen throughput holds",
        do_not="do not raise --mem-fraction-static toward 1.0 to make room",
        rationale="the log shows no --max-running-requests to size from; admit more conservatively",
        engine=engine,
    )


# --- allocation failure ------------------------------------------------------------


def _allocation(verdict: Verdict, events: Sequence[Event], facts: Facts, engine: str) -> Lever:
    allocs = _alloc_events(verdict, events)
    subtypes = [str(e.fields.get("subtype") or "") for e in allocs]
    first = allocs[0] if allocs else None
    st = subtypes[0] if subtypes else ""
    f = first.fields if first else {}
    if st == "kv_too_small" or isinstance(f.get("estimated_max_model_len"), int):
        target = f.get("estimated_max_model_len") or f.get("kv_tokens")
        cur = f.get("max_model_len") or facts.knobs.get("max_model_len")
        return Lever(
            knob="--max-model-len",
            current=str(cur) if cur is not None else None,
            proposed=str(target) if target is not None else None,
            arithmetic=(
                (
                    f"the error estimates the longest context the KV cache can hold: "
                    f"{target} tokens; max_model_len is {cur}, so one full-length request "
                    "cannot fit"
                )
                if isinstance(f.get("estimated_max_model_len"), int)
                else (
                    f"the error says the KV cache holds {target} tokens but one request may "
                    f"need max_model_len = {cur}; the context must fit the pool"
                ),
            ),
            verify="the engine starts and logs `Maximum concurrency for N tokens per request` >= 1x",
            do_not="do not raise --gpu-memory-utilization toward 1.0 to force it in",
            rationale="a single full-length request cannot fit the KV pool at start-up",
            engine=engine,
        )
    if st == "swap_exhausted":
        shown = facts.knob_float("swap_space")
        cur = shown or 4.0
        new = cur * 2
        assumed = "" if shown else " (default 4, assumed: not in the log)"
        return Lever(
            knob="--swap-space",
            current=f"{cur:g}" if shown else None,
            proposed=f"{new:g}",
            arithmetic=(
                f"SWAP-mode preemption (n>1 / beam search) ran out of CPU swap: "
                f"{cur:g} GiB{assumed} x 2 = {new:g} GiB per GPU, if host RAM allows",
            ),
            verify="no 'lack of CPU swap space' abort; Swapped drains back to 0",
            do_not="OS swap does not help: this is vLLM's CPU KV pool",
            rationale="the CPU KV swap pool, not the GPU, was exhausted",
            engine=engine,
        )
    if engine == "sglang":
        return _sglang_alloc(st, f, facts)
    if st == "kv_space_above_memory":
        return _kv_space(f, facts, engine)
    if st == "mem_util_above_free":
        return _util_to_free(f, facts, engine)
    startup = st in ("no_cache_memory", "zero_blocks", "kv_alloc_shortfall") or any(
        e.fields.get("phase") == "startup" for e in allocs
    )
    cur_util = facts.knob_float("gpu_memory_utilization")
    if startup:
        base = cur_util if cur_util is not None else 0.9
        new = min(round(base + 0.05, 2), 0.95)
        assumed = "" if cur_util is not None else " (default 0.90, assumed: not in the log)"
        return Lever(
            knob="--gpu-memory-utilization",
            current=f"{base:.2f}" if cur_util is not None else None,
            proposed=f"{new:.2f}",
            arithmetic=(
                f"{base:.2f}{assumed} + 0.05 = {new:.2f} (a small step, capped at 0.95)",
                "weights + activation peak left no room for KV blocks at this fraction",
            ),
            verify="the engine starts and logs a positive `# GPU blocks` / `GPU KV cache size`",
            do_not="never step toward 1.0; if other processes share the GPU, free it instead",
            rationale="the KV cache could not be sized at start-up; the GPU must have headroom",
            engine=engine,
        )
    if cur_util is not None and cur_util > 0.9:
        return Lever(
            knob="--gpu-memory-utilization",
            current=f"{cur_util:.2f}",
            proposed="0.90",
            arithmetic=(
                f"{cur_util:.2f} > 0.90: step back to 0.90, the last value that leaves "
                "headroom for activations, CUDA graphs and NCCL buffers",
            ),
            verify="no CUDA OOM under the same load; `GPU KV cache size` smaller but non-zero",
            do_not="do not lower --max-num-seqs as well in the same run",
            rationale="runtime CUDA OOM: the KV reservation left too little for everything else",
            engine=engine,
        )
    cur_mbt = facts.knob_int("max_num_batched_tokens")
    new_mbt = max(512, (cur_mbt or 8192) // 2)
    return Lever(
        knob="--max-num-batched-tokens",
        current=str(cur_mbt) if cur_mbt else None,
        proposed=str(new_mbt),
        arithmetic=(
            f"halve the per-step token budget ({cur_mbt or 'default 8192'} / 2 = "
            f"{new_mbt}) to lower the activation peak",
        ),
        verify="no CUDA OOM under the same load; prompt throughput may fall slightly",
        do_not="do not raise --gpu-memory-utilization: the allocation already failed at this size",
        rationale="runtime CUDA OOM with gpu_memory_utilization <= 0.90: activations peak too high",
        engine=engine,
    )


def _num(f: Mapping[str, FieldValue], key: str) -> float | None:
    v = f.get(key)
    return float(v) if isinstance(v, int | float) else None


def _kv_space(f: Mapping[str, FieldValue], facts: Facts, engine: str) -> Lever:
    """CPU backend: the KV pool asked for does not fit the node's free RAM."""
    avail, want = _num(f, "avail_gib"), _num(f, "need_gib")
    cur = facts.knobs.get("kv_cache_memory_bytes")
    current = cur if cur is not None else (f"{want:g} GiB" if want is not None else None)
    if avail is None:
        proposed, lines = None, ["the error carries no free-memory figure"]
    else:
        fit = avail * 0.8
        proposed = f"{math.floor(fit)}G" if fit >= 1 else f"{max(1, math.floor(fit * 1024))}M"
        lines = [
            f"{want if want is not None else '?'} GiB asked for the KV cache > {avail:g} GiB "
            "free on the NUMA node",
            f"0.8 x {avail:g} GiB free = {fit:.2f} GiB (room for the process itself) -> {proposed}",
        ]
    return Lever(
        knob="--kv-cache-memory-bytes",
        current=current,
        proposed=proposed,
        arithmetic=tuple(lines),
        verify="the engine starts and logs `CPU KV cache size: N tokens`; no kv allocation error",
        do_not="do not raise --gpu-memory-utilization: on the CPU backend that reserves more "
        "host RAM, not less",
        rationale="the KV pool must fit the host memory that is free when the engine starts",
        engine=engine,
    )


def _util_to_free(f: Mapping[str, FieldValue], facts: Facts, engine: str) -> Lever:
    """The memory fraction asked for is more than is free: ask for what is free."""
    util, free, total = (
        _num(f, "gpu_memory_utilization"),
        _num(f, "free_gib"),
        _num(f, "total_gib"),
    )
    cur = util if util is not None else facts.knob_float("gpu_memory_utilization")
    lines: list[str] = []
    proposed: str | None = None
    if free is not None and total:
        share = free / total
        new = math.floor((share - 0.02) * 100) / 100
        proposed = f"{max(new, 0.05):.2f}"
        lines = [
            f"free {free:g} GiB / total {total:g} GiB = {share:.3f} of the device at start-up",
            f"{share:.3f} - 0.02 margin = {share - 0.02:.3f} -> {proposed} (rounded down)",
        ]
        if cur is not None:
            lines.insert(0, f"asked for {cur:g} of the device, more than is free")
    return Lever(
        knob="--gpu-memory-utilization",
        current=f"{cur:g}" if cur is not None else None,
        proposed=proposed,
        arithmetic=tuple(lines) or ("the error carries no free/total figure",),
        verify="the engine starts; the KV cache size line shows a smaller but non-zero pool",
        do_not="do not raise it: the fraction already asks for more than is free; if another "
        "process holds the memory, stopping that is the alternative",
        rationale="other processes hold part of the device (host RAM on the CPU backend); the "
        "engine may only reserve what is free",
        engine=engine,
    )


def _sglang_alloc(st: str, f: object, facts: Facts) -> Lever:
    if st in ("sglang_runtime_oom", "sglang_retract_abort"):
        # "Prefill/Decode out of memory. Try to lower your batch size": the KV token
        # pool ran dry while serving (not a CUDA allocation): admit less work.
        cur_mrr = facts.knob_int("max_running_requests")
        if cur_mrr:
            new_mrr = max(1, cur_mrr // 2)
            return Lever(
                knob="--max-running-requests",
                current=str(cur_mrr),
                proposed=str(new_mrr),
                arithmetic=(
                    f"the KV token pool ran out while serving: halve the admitted "
                    f"requests, {cur_mrr} / 2 = {new_mrr}",
                ),
                verify="no 'out of memory. Try to lower your batch size' and no retractions "
                "under the same load; #queue-req may rise",
                do_not="do not raise --mem-fraction-static toward 1.0 to make room",
                rationale="SGLang's KV token pool, not CUDA, was exhausted at runtime",
                engine="sglang",
            )
        return _sglang_conservativeness(facts, "sglang")
    cur = facts.knob_float("mem_fraction_static")
    fields = f if isinstance(f, dict) else {}
    if cur is None and isinstance(fields.get("mem_fraction_static"), float):
        cur = float(fields["mem_fraction_static"])
    raise_it = st in ("sglang_not_enough_memory", "weights_leave_no_kv", "negative_profiled_tokens")
    base = cur if cur is not None else 0.88
    new = min(round(base + 0.04, 2), 0.95) if raise_it else round(base - 0.05, 2)
    return Lever(
        knob="--mem-fraction-static",
        current=f"{base:.2f}",
        proposed=f"{new:.2f}",
        arithmetic=(f"{base:.2f} {'+ 0.04' if raise_it else '- 0.05'} = {new:.2f}",),
        verify=(
            "the server starts and logs `KV Cache is allocated. #tokens: N` with N > 0"
            if raise_it
            else "no CUDA OOM under the same load"
        ),
        do_not=(
            "if weights alone exceed the GPU, use more tensor parallelism or quantization instead"
            if raise_it
            else "do not raise --mem-fraction-static after a runtime OOM"
        ),
        rationale=(
            "weights left no room for the KV pool at start-up"
            if raise_it
            else "runtime CUDA OOM: the static pool left too little for activations"
        ),
        engine="sglang",
    )


# --- host pressure -----------------------------------------------------------------


def _host(verdict: Verdict, events: Sequence[Event], facts: Facts, engine: str) -> Lever:
    host = [e for e in events if e.kind is Kind.HOST_OOM]
    swaps = [e for e in events if e.kind is Kind.SWAP_WARNING]
    if not host and swaps:
        f = swaps[0].fields
        swap = float(f.get("swap_gib") or facts.knob_float("swap_space") or 4.0)
        total = f.get("total_gib")
        if isinstance(total, float | int):
            new = max(1, math.floor(float(total) * 0.2))
            math_line = (
                f"{swap:g} GiB of {float(total):g} GiB host RAM is swap space; "
                f"20% of {float(total):g} GiB = {new} GiB"
            )
        else:
            new = max(1, int(swap // 2))
            math_line = f"{swap:g} GiB / 2 = {new} GiB"
        return Lever(
            knob="--swap-space",
            current=f"{swap:g}",
            proposed=str(new),
            arithmetic=(
                math_line,
                "vLLM checks swap against host RAM, not the container "
                "limit: size it to fit the container",
            ),
            verify="no swap-space warning and no container OOM kill in the next run",
            do_not="do not raise --swap-space to fix preemption in a tight container",
            rationale="CPU swap space is pinned host memory; it competes with the container limit",
            engine=engine,
        )
    usage = _first_int(host, "anon_rss_kb") or _first_int(host, "usage_kb")
    limit = _first_int(host, "limit_kb")
    lines: list[str] = []
    proposed: str | None = None
    current: str | None = None
    if limit:
        current = _gib(limit * 1024)
    if usage:
        base = max(usage, limit or 0)
        need = base * 1024 * 1.25
        proposed = _gib(need, up=True)
        which = (
            f"the larger of resident {_gib(usage * 1024)} at the kill and the limit "
            f"{_gib(limit * 1024)} is {_gib(base * 1024)}"
            if limit
            else f"resident {_gib(usage * 1024)} at the kill"
        )
        lines.append(
            f"{which}; {_gib(base * 1024)} x 1.25 headroom = {_gib(need)}, rounded up to {proposed}"
        )
    else:
        proposed = f"{current} x 1.25" if current else "current limit x 1.25"
        lines.append(
            "the kill lines carry no RSS or limit figure: raise the limit by 25% "
            "and re-measure peak RSS (kubectl top / docker stats) in the next run"
        )
    return Lever(
        knob="container memory limit",
        current=current,
        proposed=proposed,
        arithmetic=tuple(lines),
        verify=DOCS[Class.HOST_PRESSURE].verify,
        do_not=DOCS[Class.HOST_PRESSURE].do_not,
        rationale="the kernel or container runtime killed the engine for host memory",
        engine=engine,
    )


def _first_int(events: Sequence[Event], key: str) -> int | None:
    for e in events:
        v = e.fields.get(key)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _gib(n_bytes: float, up: bool = False) -> str:
    g = n_bytes / 1024**3
    return f"{math.ceil(g)} GiB" if up else f"{g:.1f} GiB"
