"""The words of a verdict: what failed (allocation), whom the kernel killed and what
followed (host pressure), and what a healthy input showed as a whole."""

from __future__ import annotations

from collections.abc import Sequence

from preemptdiag.model.records import Class, Event, Kind, Window, window_columns
from preemptdiag.timeline.knobs import arg_value

_ALLOC_WORDS = {
    "cuda_oom": "CUDA out of memory",
    "cuda_error_oom": "CUDA error: out of memory",
    "cublas_alloc": "cuBLAS workspace allocation failed",
    "nccl_oom": "NCCL could not allocate GPU memory",
    "no_cache_memory": "no GPU memory left for KV cache blocks at start-up",
    "kv_too_small": "max seq len larger than the KV cache at start-up",
    "zero_blocks": "0 KV cache blocks at start-up",
    "swap_exhausted": "CPU swap space for SWAP preemption exhausted",
    "kv_alloc_shortfall": "KV block allocation shortfall",
    "kv_space_above_memory": "KV cache space asked for is more than the free memory",
    "mem_util_above_free": "memory utilization asked for is more than is free at start-up",
}


def _gib_pair(e: Event) -> str:
    f = e.fields
    free = f.get("avail_gib", f.get("free_gib"))
    want = f.get("need_gib", f.get("requested_gib"))
    total = f.get("total_gib")
    if e.fields.get("subtype") == "kv_too_small" or not isinstance(free, float | int):
        return ""
    of = f" of {total:g}" if isinstance(total, float | int) else ""
    return f" ({want:g} GiB asked, {free:g}{of} GiB free)" if isinstance(want, float | int) else ""


def alloc_why(w: Window) -> str:
    for e in w.evidence:
        if e.kind is Kind.ALLOC_FAILURE:
            st = str(e.fields.get("subtype") or "")
            words = _ALLOC_WORDS.get(st, st.replace("_", " ") or "allocation failure")
            extra = ""
            tried, free = e.fields.get("tried"), e.fields.get("free")
            if isinstance(tried, int) and isinstance(free, int):
                extra = f" (tried {tried / 1024**3:.2f} GiB, {free / 1024**3:.2f} GiB free)"
            cpu = e.fields.get("device") == "cpu" or e.fields.get("mem_device") == "CPU"
            where = "CPU-backend (host RAM)" if cpu else "GPU"
            return f"{where} memory allocation failed: {words}{extra}{_gib_pair(e)}"
    return "GPU memory allocation failed (allocation-failure line)"


def cpu_backend(events: Sequence[Event]) -> bool:
    """The engine's KV pool lives in host RAM (vLLM's CPU backend)."""
    return any(
        e.fields.get("device") == "cpu"
        or e.fields.get("kv_device") == "CPU"
        # SGLang's server_args (`'device': 'cpu'`, a real 0.5.23 on --device cpu)
        or (e.engine == "sglang" and arg_value(e, "device") == "cpu")
        for e in events
        if e.kind in (Kind.CONFIG, Kind.CAPACITY)
    )


def aggregated_engines(e: Event) -> int:
    """How many data-parallel engines a stats line sums up (`N Engines Aggregated: ...`,
    vLLM's --aggregate-engine-logging: Running and Waiting their sums, KV usage their
    pools' mean); 1 for one engine's line."""
    n = e.fields.get("engines_aggregated") if e.kind is Kind.STATS else None
    return n if isinstance(n, int) and n > 1 else 1


class StatsSeen:
    """What a healthy verdict says of every window with stats lines (healthy_why),
    read a chunk of windows at a time: how many, their lines, the KV and queue peaks
    (each max() of them in order: the same fold whatever the chunks, a NaN
    included), and the last one."""

    def __init__(self) -> None:
        self.windows = self.lines = 0
        self.kv: float | None = None
        self.waiting: int | None = None
        self.last = -1  # (its index)

    def add(
        self,
        at: int,
        n_stats: Sequence[int],
        kv_max: Sequence[float | None],
        waiting_max: Sequence[int | None],
    ) -> None:
        """The windows from index `at` on, a column each."""
        # (a month's windows all have stats lines: their indexes are a range)
        stats: Sequence[int] = (
            range(len(n_stats)) if all(n_stats) else [i for i, n in enumerate(n_stats) if n]
        )
        if not stats:
            return
        self.windows += len(stats)
        self.lines += sum(n_stats[i] for i in stats)
        self.last = at + stats[-1]
        kv = [v for i in stats if (v := kv_max[i]) is not None]
        if kv:
            self.kv = max(kv if self.kv is None else [self.kv, *kv])
        waiting = [v for i in stats if (v := waiting_max[i]) is not None]
        if waiting:
            self.waiting = max(waiting if self.waiting is None else [self.waiting, *waiting])


def healthy_why(windows: Sequence[Window], seen: StatsSeen, fallback: str) -> str:
    """A healthy verdict speaks for the whole input, not its first window (which is
    often start-up lines only). (`seen`: its windows with stats lines, read a chunk
    at a time.)"""
    if not seen.windows:
        return fallback
    parts = [f"{seen.lines:,} stats line(s) in {seen.windows:,} window(s)"]
    if seen.kv is not None:
        parts.append(f"KV max {seen.kv:.1f}%")
    parts.append(
        f"waiting max {seen.waiting}" if seen.waiting is not None else "queue length not logged"
    )
    tail = windows[seen.last].why.rsplit(", ", 1)[-1]  # "no preemption" or what the log cannot show
    return ", ".join(parts) + f", {tail}"


def queueing_why(windows: Sequence[Window], replica: str, fallback: str) -> str:
    """A queueing verdict gives the queue's peak over every queueing window of the
    replica, not the first one's (the queue builds: its first window is the mildest)."""
    # (read a chunk of windows a column at a time: a month of queueing calm windows
    # is not made, nor a list of its indexes, at once)
    mine = queued = 0
    last = -1
    waiting: int | None = None
    kv: float | None = None
    for at in range(0, len(windows), _CHUNK):
        part = windows[at : at + _CHUNK]
        columns = window_columns(part, ("replica", "cls", "waiting_max", "kv_max"))
        for k, (r, cls, w, v) in enumerate(zip(*columns, strict=True)):
            if r != replica:
                continue
            mine += 1
            if cls is not Class.QUEUEING:
                continue
            queued, last = queued + 1, at + k
            if w is not None and (waiting is None or w > waiting):
                waiting = w
            if v is not None and (kv is None or v > kv):
                kv = v
    if waiting is None:
        return fallback
    parts = [f"requests waiting in {queued} of {mine} window(s), up to {waiting}"]
    if kv is not None:
        parts.append(f"KV max {kv:.1f}%")
    tail = windows[last].why.rsplit(", ", 1)[-1]  # "no preemption seen (...)", as it says
    return ", ".join(parts) + f", {tail}"


_CHUNK = 4096


_KILLERS = {
    "kernel_kill",
    "oom_invoked",
    "oom_summary",
    "memcg_usage",
    "systemd_oom",
    "ray_memory_monitor",
    "shell_killed",
    "kernel_panic",
}
_AFTERMATH = {"k8s_oomkilled", "exit_137", "docker_oomkilled"}
# What the container runtime said, in words (the ids are the signatures' subtypes).
_AFTERMATH_WORDS = {
    "k8s_oomkilled": "Kubernetes reports OOMKilled",
    "exit_137": "exit code 137 (SIGKILL)",
    "docker_oomkilled": "Docker reports OOMKilled",
}


def host_story(events: Sequence[Event]) -> tuple[str | None, str | None, str | None]:
    """(why, cause, consequence) for host pressure: the kill, then what it did."""
    host = [e for e in events if e.kind is Kind.HOST_OOM]
    kills = [e for e in host if e.fields.get("subtype") in _KILLERS]
    after = [e for e in host if e.fields.get("subtype") in _AFTERMATH]
    if not kills and not after:
        return None, None, None
    cause = consequence = why = None
    if kills:
        k = next(
            (e for e in kills if e.fields.get("subtype") == "kernel_kill"),
            next((e for e in kills if e.fields.get("process")), kills[0]),
        )
        st = str(k.fields.get("subtype") or "kill")
        proc = k.fields.get("process") or k.fields.get("unit")
        pid = k.fields.get("pid")
        rss = k.fields.get("anon_rss_kb")
        when = f" at {k.ts:%H:%M:%S}" if k.ts else ""
        who = f"{proc} (pid {pid})" if proc and pid else str(proc or "a process")
        size = f", anon-rss {int(rss) / 1024**2:.1f} GiB" if isinstance(rss, int) else ""
        where = f"[{k.source}:{k.line}]"
        if st == "oom_invoked":
            # The process that invoked the killer is not its victim; the kill line
            # itself is not in the log (a cut-off report).
            cause = f"the kernel OOM killer ran{when}, invoked by {who} {where}"
            why = (
                f"the kernel OOM killer ran{when} (invoked by {who}; the kill line is not "
                "in the log): host memory, not the GPU"
            )
        elif st == "ray_memory_monitor":
            cause = f"Ray's memory monitor killed {who}{when}{size} {where}"
            why = f"Ray's memory monitor killed {who}{when} for node RAM: host memory, not the GPU"
        else:
            cause = f"{st.replace('_', ' ')}: {who} killed{when}{size} {where}"
            why = f"the kernel/cgroup OOM killer killed {who}{when}: host memory, not the GPU"
    if after:
        a = after[0]
        said = _AFTERMATH_WORDS.get(str(a.fields.get("subtype")), "terminated")
        consequence = f"container terminated: {said} [{a.source}:{a.line}]"
        if why is None:
            why = "the container runtime reports an OOM kill / exit 137: host memory, not the GPU"
    return why, cause, consequence


def crash_of(evidence: Sequence[Event]) -> str | None:
    """The kernel's segfault line among `evidence`, in words: "VLLM::EngineCor (pid
    15617) died of a segfault in libintel-ext-pt-cpu.so". A real 0.11.0's engine core
    died so mid-overload; the log itself only says `died unexpectedly`."""
    for e in evidence:
        if e.fields.get("subtype") == "segfault":
            lib = e.fields.get("library")
            where = f" in {lib}" if isinstance(lib, str) else ""
            return (
                f"{e.fields.get('process')} (pid {e.fields.get('pid')}) died of a segfault{where}"
            )
    return None
