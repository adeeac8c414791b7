"""Runbook text per class: the single source for `explain` and for the levers' prose.

advice.py takes its verify / do-not sentences from here, so `preemptdiag explain`
and the report can never drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from preemptdiag.model.records import Class


@dataclass(frozen=True, slots=True)
class ClassDoc:
    title: str
    mechanism: str
    confirm: str
    levers: tuple[str, ...]  # in the order the advice tries them
    verify: str
    do_not: str


VERIFY_PREEMPT = (
    "in the next run under the same load, preemptions per minute must drop to 0 "
    "(V0 warning counter / `Preemptions:` / vllm:num_preemptions_total stops rising); "
    "Waiting may rise, completed requests per second must not fall and p99 "
    "end-to-end latency must drop"
)
VERIFY_RETRACT = (
    "in the next run under the same load, retractions per minute must drop to 0 (no "
    "`KV cache pool is full. Retract requests.` line); #queue-req may rise, generation "
    "throughput and completed requests must not fall"
)
NOT_MEM_FRACTION = (
    "do not push --mem-fraction-static toward 1.0 to make room: that turns retraction "
    "into CUDA OOM; do not change a second knob in the same run"
)
NOT_GPU_UTIL = (
    "do not push --gpu-memory-utilization toward 1.0 to make room: that turns "
    "preemption into CUDA OOM"
)

DOCS: dict[Class, ClassDoc] = {
    Class.HEALTHY: ClassDoc(
        title="healthy",
        mechanism="Stats lines show KV usage below the pressure threshold, nothing waiting "
        "and no preemption.",
        confirm="KV max below the threshold in every window; Waiting/Pending 0; no "
        "preemption line, field or counter increase.",
        levers=("none",),
        verify="keep watching preemptions and Waiting under peak load",
        do_not="do not tune what is not broken",
    ),
    Class.QUEUEING: ClassDoc(
        title="queueing (admission queue, the intended safe behaviour)",
        mechanism="Requests wait at the door (Waiting/Pending > 0) while running ones keep "
        "their KV blocks. Nobody loses work; time-to-first-token grows.",
        confirm="Waiting > 0 with Running > 0, KV not exhausted, no preemption signal.",
        levers=("none; add a replica only if the latency objective is breached",),
        verify="Waiting drains when load falls; time-to-first-token within your objective",
        do_not="do not raise --max-num-seqs to empty the queue: that trades queueing for "
        "preemption",
    ),
    Class.BENIGN_PREEMPTION: ClassDoc(
        title="benign preemption",
        mechanism="The KV pool ran out of free blocks once; the scheduler evicted a running "
        "request (RECOMPUTE: blocks freed, re-prefilled later; SWAP: copied to CPU) and "
        "the engine recovered.",
        confirm="Preemption in isolated windows; KV usage drops back below the threshold; "
        "Waiting does not keep growing.",
        levers=("none; bound max_tokens per request if tail latency matters",),
        verify="preemptions stay isolated (no consecutive windows) and KV usage drops back",
        do_not="do not lower --max-num-seqs or raise --gpu-memory-utilization for a burst",
    ),
    Class.THRASH_LOOP: ClassDoc(
        title="preemption thrash loop",
        mechanism="The scheduler admits more sequences (--max-num-seqs) than the KV pool can "
        "hold once they grow. Evicted requests come back, re-prefill and compete for blocks "
        "again: evictions beget evictions, prompt throughput balloons (V0) while completed "
        "work falls. Nothing errors.",
        confirm="Preemption in several consecutive windows (or a high rate / a counter past "
        "#51) with KV pinned at >= ~95% and the waiting or swapped queue growing.",
        levers=(
            "--max-model-len when one request can fill the pool (Maximum concurrency < ~2x)",
            "--max-num-seqs = floor(0.9 x KV tokens / p95 live tokens per running sequence); "
            "without capacity lines, half the current value",
            "SGLang: --max-running-requests the same way, else a larger "
            "--schedule-conservativeness",
        ),
        verify=VERIFY_PREEMPT,
        do_not=NOT_GPU_UTIL + "; do not change a second knob in the same run",
    ),
    Class.ALLOCATION_FAILURE: ClassDoc(
        title="GPU allocation failure",
        mechanism="A GPU allocation failed: torch/HIP CUDA OOM while serving, or the KV "
        "cache could not be sized at start-up (max seq len larger than the pool, no memory "
        "for cache blocks, 0 GPU blocks). Unlike preemption this errors and often kills the "
        "engine.",
        confirm="CUDA out of memory text, a vLLM KV sizing ValueError, or an engine-death "
        "line right after one.",
        levers=(
            "start-up, max seq len > KV tokens: --max-model-len to the token count the "
            "error prints",
            "start-up, no memory for cache blocks: --gpu-memory-utilization +0.05 (never "
            "toward 1.0)",
            "runtime CUDA OOM: --gpu-memory-utilization back to 0.90 if it was raised above, "
            "else halve --max-num-batched-tokens",
            "SGLang: --mem-fraction-static up at start-up, down after a runtime OOM",
        ),
        verify="the engine starts (positive `# GPU blocks` / `GPU KV cache size`) and no "
        "CUDA OOM under the same load",
        do_not="do not fix an allocation failure by lowering --max-num-seqs and raising "
        "memory in the same run",
    ),
    Class.HOST_PRESSURE: ClassDoc(
        title="host / container memory pressure",
        mechanism="System RAM or the container's cgroup limit ran out, not the GPU: the "
        "kernel OOM killer or the container runtime killed the engine (exit 137, "
        "OOMKilled). CPU swap space and pinned memory count against this limit.",
        confirm="Kernel oom-killer / `Killed process` lines, `Reason: OOMKilled` / "
        '`Exit Code: 137`, docker `"OOMKilled": true`, or vLLM\'s swap-space warning.',
        levers=(
            "with a swap-space warning / SWAP preemption: lower --swap-space to fit the container",
            "otherwise: raise the container/cgroup memory limit by the gap the OOM line shows",
        ),
        verify="no OOMKilled / exit 137 / oom-kill line in the next run under the same load",
        do_not="do not lower --gpu-memory-utilization or --max-num-seqs: GPU memory was "
        "not the problem",
    ),
    Class.INSUFFICIENT_EVIDENCE: ClassDoc(
        title="insufficient evidence",
        mechanism="The log cannot decide: e.g. a V1 log prints no preemption "
        "line, so KV pinned at 100% with requests waiting may be preemption or queueing; or "
        "the engine died with no memory evidence in the excerpt.",
        confirm="Capture the one missing thing the report names (usually two /metrics "
        "scrapes of vllm:num_preemptions_total a few minutes apart).",
        levers=("none until the evidence is in",),
        verify="re-run preemptdiag with the new capture next to this log",
        do_not="do not change a knob on a suspicion: the levers for preemption, CUDA OOM "
        "and host OOM point in opposite directions",
    ),
}
