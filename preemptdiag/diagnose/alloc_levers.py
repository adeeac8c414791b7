"""Levers for allocation failures: the context length the error says fits, the memory
fraction or KV space that fits what is free, a step back after a runtime OOM; SGLang's
memory fraction and admission knobs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from preemptdiag.model.records import Event, FieldValue, Kind, Lever, Verdict
from preemptdiag.timeline.knobs import Facts


def _alloc_events(verdict: Verdict, events: Sequence[Event]) -> list[Event]:
    own = [e for e in verdict.evidence if e.kind is Kind.ALLOC_FAILURE]
    return own or [e for e in events if e.kind is Kind.ALLOC_FAILURE]


def sglang_conservativeness(facts: Facts, engine: str) -> Lever:
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


def allocation_lever(verdict: Verdict, events: Sequence[Event], facts: Facts, engine: str) -> Lever:
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
                *_oom_sums(f, cur_util - 0.90),
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


def _oom_sums(f: Mapping[str, FieldValue], step: float) -> tuple[str, ...]:
    """The OOM line's own figures: the shortfall, and whether the step frees it."""
    tried, free, total = f.get("tried"), f.get("free"), f.get("total")
    if not (isinstance(tried, int) and isinstance(free, int)):
        return ()
    gib = 1024**3
    short = tried - free
    lines = [
        f"the allocation that failed: {tried / gib:.2f} GiB tried - {free / gib:.2f} GiB free "
        f"= {short / gib:.2f} GiB short"
    ]
    if isinstance(total, int) and step > 0:
        freed = step * total
        enough = "enough" if freed >= short else "NOT enough: lower the load that triggered it"
        lines.append(
            f"{step:.2f} x {total / gib:.2f} GiB total = {freed / gib:.2f} GiB freed for "
            f"activations ({enough})"
        )
    return tuple(lines)


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
        return sglang_conservativeness(facts, "sglang")
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
