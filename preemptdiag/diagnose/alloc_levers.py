"""Levers for allocation failures: the context length the error says fits, the memory
fraction or KV space that fits what is free, a step back after a runtime OOM; SGLang's
memory fraction and admission knobs."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from preemptdiag.model.records import EngineInfo, Event, FieldValue, Kind, Lever, Verdict
from preemptdiag.timeline.events import version_at_least
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


def _default_utilization(info: EngineInfo | None) -> tuple[float, str]:
    """The gpu_memory_utilization a vLLM engine ran with where the log shows none, and
    how the arithmetic names it: 0.92 from 0.32 on (a real 0.32.0 says so in its own
    error; the 0.33.0 and 0.34.0 sources' CacheConfig), 0.90 for older or unknown ones."""
    if info is not None and version_at_least(info, 0, 32):
        return 0.92, f" (vLLM {info.version}'s default 0.92, assumed: not in the log)"
    return 0.9, " (default 0.90, assumed: not in the log)"


def allocation_lever(
    verdict: Verdict,
    events: Sequence[Event],
    facts: Facts,
    engine: str,
    info: EngineInfo | None = None,
    default_max_num_seqs: int = 256,
) -> Lever:
    """The one lever for an allocation failure, from the first failure's kind and
    fields (`default_max_num_seqs`: Thresholds', where the log shows none)."""
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
    cur_util = facts.knob_float("gpu_memory_utilization")
    if st == "no_cache_memory":
        measured = _extensible(f, cur_util, facts, engine, default_max_num_seqs)
        if measured is not None:
            return measured
    startup = st in ("no_cache_memory", "zero_blocks", "kv_alloc_shortfall") or any(
        e.fields.get("phase") == "startup" for e in allocs
    )
    if startup and cur_util is not None and cur_util >= 0.95:
        # Already at the step's cap (or past it): a higher fraction only takes the room
        # CUDA graphs and NCCL need, so the profiled activation peak must shrink.
        return _halved_budget(
            facts,
            engine,
            f"gpu_memory_utilization is already {cur_util:.2f} (the step's cap is 0.95): "
            "the profiled activation peak is what left no room for KV blocks",
            verify="the engine starts and logs a positive `# GPU blocks` / `GPU KV cache size`",
            rationale="the KV cache could not be sized at start-up with the memory fraction "
            "already high: activations peak too high",
        )
    if startup:
        default, assumed = _default_utilization(info)
        base = cur_util if cur_util is not None else default
        step = round(base + 0.05, 2)
        new = min(step, 0.95)
        assumed = "" if cur_util is not None else assumed
        capped = (
            f"{step:.2f}, capped at 0.95"
            if step > new
            else f"{new:.2f} (a small step, capped at 0.95)"
        )
        return Lever(
            knob="--gpu-memory-utilization",
            current=f"{base:.2f}" if cur_util is not None else None,
            proposed=f"{new:.2f}",
            arithmetic=(
                f"{base:.2f}{assumed} + 0.05 = {capped}",
                "weights + activation peak left no room for KV blocks at this fraction",
            ),
            verify="the engine starts and logs a positive `# GPU blocks` / `GPU KV cache size`",
            do_not="never step toward 1.0; if other processes share the GPU, free it instead",
            rationale="the KV cache could not be sized at start-up; the GPU must have headroom",
            engine=engine,
        )
    trigger = _prompt_logprobs_trigger(first, events)
    if trigger is not None and first is not None:
        chunked = _chunk_lever(first, trigger, facts, engine)
        if chunked is not None:
            return chunked
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
    return _halved_budget(
        facts,
        engine,
        None,
        verify="no CUDA OOM under the same load; prompt throughput may fall slightly",
        rationale=(
            "runtime CUDA OOM with gpu_memory_utilization <= 0.90: activations peak too high"
            if cur_util is not None
            else "runtime CUDA OOM at the engine's default gpu_memory_utilization (not in "
            "the log): activations peak too high"
        ),
    )


def _halved_budget(
    facts: Facts, engine: str, why: str | None, verify: str, rationale: str
) -> Lever:
    """Half the per-step token budget: the activation peak (profiled at start-up, met
    at run time) grows with it."""
    cur_mbt = facts.knob_int("max_num_batched_tokens")
    new_mbt = max(512, (cur_mbt or 8192) // 2)
    return Lever(
        knob="--max-num-batched-tokens",
        current=str(cur_mbt) if cur_mbt else None,
        proposed=str(new_mbt),
        arithmetic=(
            *((why,) if why else ()),
            f"halve the per-step token budget ({cur_mbt or 'default 8192'} / 2 = "
            f"{new_mbt}) to lower the activation peak",
        ),
        verify=verify,
        do_not="do not raise --gpu-memory-utilization: the allocation already failed at this size",
        rationale=rationale,
        engine=engine,
    )


# vLLM 0.34's default max_num_seqs on a GPU of 70 GiB or more (engine/arg_utils.py; A100
# and GB10 aside); Thresholds.default_max_num_seqs is the one of smaller ones.
_BIG_GPU_MAX_NUM_SEQS = 1024


def _extensible(
    f: Mapping[str, FieldValue],
    cur_util: float | None,
    facts: Facts,
    engine: str,
    default_seqs: int,
) -> Lever | None:
    """The start-up failure of vLLM 0.34's extensible KV cache (on by default on
    CUDA/ROCm), by the hint the error carries; None for any other. That cache is sized
    from the memory measured after warmup, and gpu_memory_utilization defaults to 1.0
    and only caps it: the old step (+0.05 from an assumed 0.90) would shrink it.
    Capped below 1.0: the cap goes (the mode's default). Given all memory left (or a
    warmup that left none at 1.0): fewer sequences, the activation peak and CUDA
    graphs that warmup measured grow with max_num_seqs; a fraction cannot add more."""
    cap = f.get("utilization_cap")
    if f.get("after_warmup") and cap is None and cur_util is not None and cur_util < 1.0:
        cap = cur_util  # (that hint names no fraction: the log's own is the cap)
    if isinstance(cap, float) and cap < 1.0:
        return Lever(
            knob="--gpu-memory-utilization",
            current=f"{cap:g}",
            proposed="1.0",
            arithmetic=(
                f"the error says the KV cache got what was left within "
                f"gpu_memory_utilization={cap:g}: {1 - cap:.2f} of the device's memory "
                "was held out of it",
                "vLLM 0.34's extensible KV cache is sized from the memory measured after "
                "warmup; 1.0 is its default (the flag can be dropped)",
            ),
            verify="the engine starts and logs `Extended KV cache to N blocks` with N > 0",
            do_not="if another process shares the GPU, the cap kept its memory: free the "
            "GPU instead of raising it",
            rationale="the extensible KV cache was capped below the memory the device had left",
            engine=engine,
        )
    if not (f.get("all_memory_taken") or f.get("after_warmup")):
        return None
    cur = facts.knob_int("max_num_seqs")
    new = max(1, (cur or default_seqs) // 2)
    seqs = (
        f"max_num_seqs {cur} / 2 = {new}"
        if cur
        else (
            f"max_num_seqs is not in the log: {default_seqs} assumed (default_max_num_seqs; "
            f"vLLM 0.34's own is 256, {_BIG_GPU_MAX_NUM_SEQS} on a GPU of 70 GiB or more) / 2 "
            f"= {new}"
        )
    )
    return Lever(
        knob="--max-num-seqs",
        current=str(cur) if cur else None,
        proposed=str(new),
        arithmetic=(
            "the error says the extensible KV cache (vLLM 0.34) already had all the device "
            "memory left after the model, its activations and warmup: a higher "
            "gpu_memory_utilization cannot add any",
            f"{seqs}: the activation peak and the CUDA graphs warmup measured grow with it",
        ),
        verify="the engine starts and logs `Extended KV cache to N blocks` with N > 0",
        do_not="do not raise --gpu-memory-utilization: here it is already 1.0, the whole "
        "device; a shorter --max-model-len is the engine's other way",
        rationale="model, activations and CUDA graphs took all the memory the KV cache could have",
        engine=engine,
    )


def _prompt_logprobs_trigger(oom: Event | None, events: Sequence[Event]) -> Event | None:
    """The scheduler dump the dying engine core printed for the step that ran out of
    memory, if one of its new requests asked for prompt logprobs: the dump comes just
    before the OOM traceback, from the same source, within seconds."""
    if oom is None:
        return None
    found = None
    for e in events:
        if (
            e.kind is Kind.CONTEXT
            and e.fields.get("subtype") == "oom_trigger"
            and e.source == oom.source
            and e.replica == oom.replica
            and e.line < oom.line
            and (e.ts is None or oom.ts is None or 0 <= (oom.ts - e.ts).total_seconds() <= 60)
        ):
            found = e  # the last dump before the OOM is the step that failed
    return found


def _sizer(largest: int) -> Callable[[float], str]:
    """Byte sizes in one unit, the one torch's OOM message gives its largest figure
    (GiB from 1 GiB, else MiB), so a reviewer redoes the sums without converting."""
    unit, name = (1024**3, "GiB") if largest >= 1024**3 else (1024**2, "MiB")
    return lambda n: f"{n / unit:.2f} {name}"


def _chunk_lever(oom: Event, trigger: Event, facts: Facts, engine: str) -> Lever | None:
    """Bound the prompt chunk so one request's prompt-logprobs tensor fits what is free.

    The model runner computes a float32 log-softmax over the vocabulary for every
    token of the request's scheduled chunk in one tensor, so the failed allocation is
    linear in the chunk: tried / rows bytes a token. `--max-num-batched-tokens` caps
    every chunk; a power of two at or under free / (tried / rows) makes it fit and
    keeps the KV pool whole (lowering the memory fraction would shrink it instead)."""
    f, t = oom.fields, trigger.fields
    tried, free = f.get("tried"), f.get("free")
    prompt, done = t.get("prompt_tokens"), t.get("computed_tokens")
    sched = t.get("scheduled_tokens")
    if not (isinstance(tried, int) and isinstance(free, int) and isinstance(prompt, int)):
        return None
    rows = sched if isinstance(sched, int) else prompt - (done if isinstance(done, int) else 0)
    if tried <= free or rows <= 0:
        return None
    fit = rows * free // tried
    if fit < 256:
        return None  # too little is free for any useful chunk: the memory fraction it is
    new = 1 << (fit.bit_length() - 1)
    cur = facts.knob_int("max_num_batched_tokens")
    if cur is not None and new >= cur:
        return None
    line = facts.knob_lines.get("max_num_batched_tokens")
    cur_text = (
        f"{cur:,} [{line.source}:{line.line}]" if cur is not None and line else "not in the log"
    )
    rid = str(t.get("req_id") or "?")
    _size = _sizer(tried)
    where = f"[{trigger.source}:{trigger.line}]"
    return Lever(
        knob="--max-num-batched-tokens",
        current=str(cur) if cur is not None else None,
        proposed=str(new),
        arithmetic=(
            f"trigger: request {rid} asked for prompt logprobs over a {prompt:,}-token prompt "
            f"{where}; its scheduled chunk was {rows:,} tokens, and the runner's float32 "
            "log-softmax over the vocabulary is one tensor of chunk x vocabulary x 4 bytes",
            f"the allocation that failed: {_size(tried)} tried - {_size(free)} free "
            f"= {_size(tried - free)} short [{oom.source}:{oom.line}]",
            f"tokens whose logits fit what was free: floor({rows:,} x {_size(free)} / "
            f"{_size(tried)}) = {fit:,}; the largest power of two at or under it: {new:,}",
            f"a {new:,}-token chunk needs {new:,} / {rows:,} x {_size(tried)} = "
            f"{_size(tried * new / rows)} <= {_size(free)} free; current budget: {cur_text}",
        ),
        verify=(
            f"no CUDA OOM when a request with prompt logprobs over a {prompt:,}-token prompt "
            f"runs again; the engine logs `Chunked prefill is enabled with "
            f"max_num_batched_tokens={new}`; prompt throughput may fall slightly on long prompts"
        ),
        do_not=(
            "do not also lower --gpu-memory-utilization in the same run: it shrinks the KV "
            "pool, and alone it only moves the failure to a longer prompt"
        ),
        rationale=(
            f"runtime CUDA OOM tipped by one request's prompt logprobs ({rid}, "
            f"{prompt:,} prompt tokens): bound the chunk so its logits tensor fits, keeping "
            "the KV pool whole (or refuse prompt_logprobs on long prompts at the gateway)"
        ),
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


def _fraction(x: float) -> str:
    """A memory fraction as a flag takes it: two decimals, or as printed when smaller."""
    return f"{x:.2f}" if x >= 0.01 else f"{x:g}"


def _round_up(x: float) -> float:
    """x rounded up to two decimals."""
    return math.ceil(round(x * 100, 6)) / 100


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
    arithmetic: tuple[str, ...] = (
        f"{_fraction(base)} {'+ 0.04' if raise_it else '- 0.05'} = {new:.2f}",
    )
    floor = fields.get("raise_above")
    if raise_it and isinstance(floor, float) and new <= floor:
        # The error names the least fraction that fits a pool (a real 0.5.23 with
        # --mem-fraction-static=1e-05: "Raise --mem-fraction-static above 0.003"): a
        # small step from a tiny value would stay under it.
        new = min(_round_up(floor + 0.01), 0.95)
        arithmetic = (
            f"the error asks for more than {floor:g} (the least fraction that leaves a KV "
            f"pool); {floor:g} + 0.01, rounded up = {new:.2f}",
        )
    elif raise_it and isinstance(floor, float):
        arithmetic = (*arithmetic, f"{new:.2f} > {floor:g}, the least fraction the error asks for")
    return Lever(
        knob="--mem-fraction-static",
        current=_fraction(base),
        proposed=f"{new:.2f}",
        arithmetic=arithmetic,
        verify=(
            # (0.5.23 prints `KV Cache is allocated. dtype: ..., #tokens: N`; the pool line
            # is the same in every release)
            "the server starts and logs `max_total_num_tokens=N` with N > 0"
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
