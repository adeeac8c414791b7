"""Levers for allocation failures: the context length the error says fits, the memory
fraction or KV space that fits what is free, a step back after a runtime OOM; SGLang's
memory fraction and admission knobs."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from preemptdiag.model.records import EngineInfo, Event, FieldValue, Kind, Lever, Verdict
from preemptdiag.timeline.events import version_at_least
from preemptdiag.timeline.knobs import Facts, arg_value


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
    cache = _extensible_cache(first, events, info)
    if cache is not None:
        return _extensible_runtime(f, cache, cur_util, engine)
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


_EXTENSIBLE = "vllm.v1.context.extensible_kv_cache"
_AFTER_WARMUP = "vllm.v1.context.memory_after_warmup"
# Config that turns vLLM 0.34's extensible KV cache off where it is the default
# (config/vllm.py, _resolve_extensible_kv_cache): a KV size of one's own.
_EXTENSIBLE_OFF = ("kv_cache_memory_bytes", "num_gpu_blocks_override")
# vLLM's own margin under the extensible KV cache (extensible_kv_cache.py,
# KV_CACHE_MARGIN_FLOOR_BYTES): the least it keeps free beyond the measured peak, 1 GiB
# on CUDA and 3 on ROCm (where ROCr maps kernel scratch outside the allocator).
_MARGIN_GIB = {"CUDA": 1, "HIP": 3}
_PLATFORM = {"CUDA": "CUDA", "HIP": "ROCm"}


@dataclass(frozen=True, slots=True)
class _Extensible:
    """The failed engine's KV cache was vLLM 0.34's extensible one: `grown` is the last
    line that says its size (`Extended KV cache to N blocks (X GiB)`, or `Memory after
    warmup: ...; N KV cache blocks (X GiB) fit ...`), None where only the release says
    so; `warmup` the last `Memory after warmup` line (what it kept for activations)."""

    grown: Event | None
    warmup: Event | None
    version: str | None


def _before(e: Event, oom: Event) -> bool:
    if e.ts is not None and oom.ts is not None:
        return e.ts <= oom.ts
    return e.source != oom.source or e.line < oom.line


def _extensible_cache(
    oom: Event | None, events: Sequence[Event], info: EngineInfo | None
) -> _Extensible | None:
    """Whether the engine that ran out of device memory at run time had sized its KV
    cache as vLLM 0.34's extensible one (on by default on CUDA and ROCm): the last
    `Extended KV cache` / `Disabling the extensible KV cache` line of its replica
    before the failure says so; else its release, unless its args set a KV size of
    their own or turn the cache off."""
    if oom is None or oom.fields.get("device") not in (None, "CUDA", "HIP"):
        return None
    # In the order the replica printed them: a (re)start's config lines begin a start
    # (and its args may turn the cache off), a `Disabling` line turns it off, a sizing
    # line shows it on (and its size), and sizing lines, the KV capacity line (0.34
    # prints it once the cache is sized) or stats lines show that the start got past
    # warmup. An OOM before that is warmup's own: the old levers (a smaller token
    # budget, the step warmup runs at) stand.
    on: bool | None = None  # (None: the release decides)
    sized = False
    # The start's sizing lines by the worker that printed them (each tensor- or
    # pipeline-parallel rank sizes its own cache): the failed one's own, where it
    # printed one, else the last.
    grown: dict[str | None, Event] = {}
    warmup: dict[str | None, Event] = {}
    for e in events:
        if e.replica != oom.replica or not _before(e, oom):
            continue
        if e.sig in (_EXTENSIBLE, _AFTER_WARMUP):
            on = sized = not e.fields.get("disabled")
            if not on:
                grown.clear()
                warmup.clear()
                continue
            for held in (grown, warmup) if e.sig == _AFTER_WARMUP else (grown,):
                held.pop(e.proc, None)  # (so the last printed stays last)
                held[e.proc] = e
        elif e.kind is Kind.CONFIG:
            sized = False
            grown.clear()
            warmup.clear()
            if _turned_off(e):
                on = False
        elif e.kind in (Kind.STATS, Kind.CAPACITY):
            sized = True
    version = info.version if info is not None else None
    if on is None:
        on = info is not None and info.engine == "vllm" and bool(version_at_least(info, 0, 34))
    if not (on and sized):
        return None
    return _Extensible(_own_or_last(grown, oom.proc), _own_or_last(warmup, oom.proc), version)


def _own_or_last(by_proc: dict[str | None, Event], proc: str | None) -> Event | None:
    if proc in by_proc:
        return by_proc[proc]
    return next(reversed(by_proc.values()), None)


def _turned_off(e: Event) -> bool:
    """A config line whose args size the KV cache themselves or turn the cache off."""
    if any(arg_value(e, k) not in (None, "None", "null") for k in _EXTENSIBLE_OFF):
        return True
    return arg_value(e, "enable_extensible_kv_cache") in ("False", "false")


def _shortfall(
    f: Mapping[str, FieldValue], size: Callable[[float], str] | None = None
) -> tuple[int | None, tuple[str, ...]]:
    """Bytes the failed allocation lacked on the device (0 where the device had them:
    a cap on torch's allocator or fragmentation refused it), and the line that says
    so, in `size`'s unit (by default the one torch gives its largest figure); None
    and no line without the figures."""
    tried, free = f.get("tried"), f.get("free")
    if not (isinstance(tried, int) and isinstance(free, int)):
        return None, ()
    size = size or _sizer(max(tried, free))
    if tried > free:
        short = tried - free
        return short, (
            f"the allocation that failed: {size(tried)} tried - {size(free)} free = "
            f"{size(short)} short",
        )
    return 0, (
        f"the allocation that failed: {size(tried)} tried with {size(free)} free on the "
        "device: fragmentation or a cap on torch's allocator refused it, not the device",
    )


_EXTENSIBLE_DO_NOT = (
    "do not lower --max-num-batched-tokens or --max-num-seqs instead: while the extensible "
    "cache sizes itself, it keeps free only the peak warmup measured at them and takes "
    "what a smaller peak frees"
)


def _extensible_runtime(
    f: Mapping[str, FieldValue], cache: _Extensible, cur_util: float | None, engine: str
) -> Lever:
    """A runtime device OOM under vLLM 0.34's extensible KV cache. That cache takes all
    memory left after the activation peak warmup measured (plus a margin), so the
    failure was a transient warmup did not see. The older levers move the wrong way
    here: a smaller token budget lowers the measured peak and the cache grows into
    what it frees. With the cache's size in the log, --kv-cache-memory-bytes fixes it
    below that by the shortfall and vLLM's own margin (vLLM's own advice for manual
    control); without it, a cap below the mode's default 1.0 holds memory back."""
    short, sums = _shortfall(f)
    device = "HIP" if f.get("device") == "HIP" else "CUDA"
    release = f"vLLM {cache.version}" if cache.version else "vLLM 0.34"
    grown = cache.grown
    how = "its default on CUDA and ROCm"
    if grown is not None:
        blocks, gib = grown.fields.get("kv_blocks"), grown.fields.get("kv_gib")
        said = (
            f"Extended KV cache to {blocks} blocks ({gib} GiB)"
            if grown.sig == _EXTENSIBLE
            else f"Memory after warmup: ... {blocks} KV cache blocks ({gib} GiB) fit ..."
        )
        how = f"the log shows `{said}` [{grown.source}:{grown.line}]"
    kept = cache.warmup.fields.get("kept_gib") if cache.warmup is not None else None
    beyond = (
        f"the {kept:g} GiB warmup kept for transient activations "
        f"[{cache.warmup.source}:{cache.warmup.line}]"
        if isinstance(kept, float) and cache.warmup is not None
        else "the activation peak warmup saw"
    )
    first = (
        f"{release} sized the KV cache from the memory measured after warmup ({how}): it "
        f"took all the device left beyond {beyond} and a margin"
    )
    fixed = _fixed_kv_size(grown, short, device)
    if fixed is not None:
        new, lines = fixed
        return Lever(
            knob="--kv-cache-memory-bytes",
            current=None,
            proposed=new,
            arithmetic=(first, *sums, *lines),
            verify=f"no {device} OOM under the same load; the engine logs `reserved "
            f"{new[:-1]}.00 GiB memory for KV Cache as specified by kv_cache_memory_bytes`",
            do_not=_EXTENSIBLE_DO_NOT,
            rationale="runtime device OOM under the extensible KV cache: a transient its "
            "warmup did not measure; a fixed KV size leaves the rest of the device free",
            engine=engine,
        )
    cur = cur_util if cur_util is not None else 1.0
    new_util, lines = _lower_cap(f, cur, cur_util is not None, short, device)
    return Lever(
        knob="--gpu-memory-utilization",
        current=f"{cur_util:.2f}" if cur_util is not None else None,
        proposed=f"{new_util:.2f}",
        arithmetic=(first, *sums, *lines),
        verify=f"no {device} OOM under the same load; the next `Extended KV cache to N blocks "
        "(X GiB)` shows an X smaller than this run's by the shortfall or more",
        do_not=_EXTENSIBLE_DO_NOT,
        rationale="runtime device OOM under the extensible KV cache: a transient its warmup "
        "did not measure; vLLM's docs keep gpu_memory_utilization below 1.0 for memory it "
        "does not measure",
        engine=engine,
    )


def _fixed_kv_size(
    grown: Event | None, short: int | None, device: str
) -> tuple[str, tuple[str, ...]] | None:
    """The KV cache's size, from its `Extended KV cache` line, less the shortfall and
    vLLM's margin, in whole GiB (the flag takes `62G`, no decimals); None without
    that line or when too little would be left."""
    kv_gib = grown.fields.get("kv_gib") if grown is not None else None
    if not isinstance(kv_gib, float):
        return None
    short_gib = (short or 0) / 1024**3
    margin = _MARGIN_GIB[device]
    fit = kv_gib - short_gib - margin
    if fit < 1:
        return None
    new = math.floor(fit)
    took = f"{kv_gib:g} GiB (the cache)" + (f" - {short_gib:.2f} GiB short" if short else "")
    return f"{new}G", (
        *(() if short is not None else ("the error names no size: the margin alone is freed",)),
        f"{took} - {margin} GiB margin (vLLM's own floor on {_PLATFORM[device]}) = {fit:.2f} "
        f"GiB -> {new}G "
        f"(whole GiB, rounded down): {kv_gib - new:.2f} GiB more stays free for what warmup "
        "did not measure",
    )


def _lower_cap(
    f: Mapping[str, FieldValue], cur: float, shown: bool, short: int | None, device: str
) -> tuple[float, tuple[str, ...]]:
    """A memory fraction below what the process held when it failed, by the shortfall
    and vLLM's margin (the torch >= 2.2 message says what it held); else a step the
    shortfall's share of the device needs, or 0.05 where the error has no figures."""
    total, tried, in_use = f.get("total"), f.get("tried"), f.get("in_use")
    said = f"{cur:.2f}" if shown else "1.00 (the mode's default: not in the log)"
    if not (isinstance(total, int) and total > 0 and isinstance(tried, int) and short is not None):
        new = round(max(cur - 0.05, 0.05), 2)
        return new, (f"the error carries no device total: {said} - 0.05 = {new:.2f}",)
    size = _sizer(total)
    need = short or tried  # (the device had room: room for it under the cap)
    if isinstance(in_use, int):
        margin = _MARGIN_GIB[device]
        budget = in_use - need - margin * 1024**3
        new = math.floor(budget / total * 100) / 100
        if 0.05 <= new < cur:
            return new, (
                f"({size(in_use)} the process held - {size(need)} - {margin} GiB "
                f"margin) / {size(total)} total = {budget / total:.4f} -> {new:.2f}, rounded "
                f"down, from {said}: a budget that far below what the process held when it "
                "failed is taken from the cache (the next run's `Extended KV cache` line shows "
                "how much)",
            )
    step = _round_up(need / total) + 0.01
    new = round(max(cur - step, 0.05), 2)
    return new, (
        f"{size(need)} / {size(total)} total = {need / total:.3f} of the device, rounded up, "
        f"+ 0.01 = {step:.2f}; {said} - {step:.2f} = {new:.2f} (whether a cap this close to "
        "what the cache took binds is for the next run to show)",
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
    gib = 1024**3
    short, lines = _shortfall(f, lambda n: f"{n / gib:.2f} GiB")
    total = f.get("total")
    if not short or not isinstance(total, int) or step <= 0:
        return lines
    freed = step * total
    enough = "enough" if freed >= short else "NOT enough: lower the load that triggered it"
    return (
        *lines,
        f"{step:.2f} x {total / gib:.2f} GiB total = {freed / gib:.2f} GiB freed for "
        f"activations ({enough})",
    )


def _num(f: Mapping[str, FieldValue], key: str) -> float | None:
    v = f.get(key)
    return float(v) if isinstance(v, int | float) else None


def _flag_bytes(n: int) -> str:
    """A byte count as --kv-cache-memory-bytes takes it, shortest exact: `40G` (GiB),
    `512M` (MiB), else the bytes (vLLM's binary suffixes take no decimals)."""
    for shift, unit in ((30, "G"), (20, "M")):
        if n > 0 and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _kv_space(f: Mapping[str, FieldValue], facts: Facts, engine: str) -> Lever:
    """CPU backend: the KV pool asked for does not fit the node's free RAM."""
    avail, want = _num(f, "avail_gib"), _num(f, "need_gib")
    cur = facts.knob_int("kv_cache_memory_bytes")
    current = (
        _flag_bytes(cur) if cur is not None else (f"{want:g} GiB" if want is not None else None)
    )
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
