"""Classify windows and pick the incident verdict (design.md section 3).

Each rule is a small function of one window's features; the run-level thrash rule
looks at consecutive windows of one replica. Thresholds come from config.Thresholds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import groupby

from preemptdiag.model.config import Thresholds
from preemptdiag.model.records import Class, Confidence, EngineInfo, Event, Kind, Verdict, Window
from preemptdiag.timeline.events import version_at_least

# Most severe first. insufficient_evidence sits above benign: a suspected loop that
# the log cannot prove deserves attention before a proven harmless burst.
SEVERITY: tuple[Class, ...] = (
    Class.ALLOCATION_FAILURE,
    Class.HOST_PRESSURE,
    Class.THRASH_LOOP,
    Class.INSUFFICIENT_EVIDENCE,
    Class.BENIGN_PREEMPTION,
    Class.QUEUEING,
    Class.HEALTHY,
)
MAX_VERDICT_EVIDENCE = 8
_SCRAPE = "prometheus."

CAPTURE_V1 = (
    "two /metrics scrapes during the incident, a few minutes apart "
    "(`curl -s localhost:8000/metrics > t1.prom`, then t2.prom) so "
    "vllm:num_preemptions_total shows whether it was preempting (V1 stats lines do not "
    "print preemptions in current releases)"
)
CAPTURE_LEGACY = (
    "the same load on vLLM >= 0.4.3 (which logs preemptions with a cumulative counter), "
    "or /metrics scrapes of vllm:num_preemptions_total"
)


@dataclass(frozen=True, slots=True)
class Visibility:
    """Can this log show preemptions at all, and where?

    `covered` is set when only /metrics counters can show them: windows outside the
    first..last scrape are as blind as a log without scrapes."""

    blind: bool
    capture_next: str | None
    reason: str
    covered: tuple[datetime, datetime] | None = None

    def blind_at(self, w: Window) -> bool:
        if self.blind or self.covered is None:
            return self.blind
        lo, hi = self.covered
        if w.start is None or w.end is None:
            return False
        return w.end <= lo or w.start >= hi


_V1_SILENT = (
    "V1 stats lines print no preemptions (vLLM resets the interval counter before "
    "logging it, vllm PR #38452) and this log shows no `Preemptions:` field"
)


def preemption_visibility(events: Sequence[Event], info: EngineInfo) -> Visibility:
    stats = [e for e in events if e.kind is Kind.STATS]
    if any(e.fields.get("preemptions") is not None for e in stats):
        return Visibility(False, None, "stats line carries a Preemptions field")
    logged = [e for e in events if e.kind is Kind.PREEMPTION and not e.sig.startswith(_SCRAPE)]
    scraped = [e.ts for e in events if e.kind is Kind.PREEMPTION and e.sig.startswith(_SCRAPE)]
    if logged:
        return Visibility(False, None, "preemption lines present")
    if info.engine == "sglang":
        return Visibility(False, None, "SGLang logs every retraction")
    if info.generation == "v1":
        return _counter_visibility(scraped, CAPTURE_V1, _V1_SILENT)
    # Stats printed from llm_engine.py predate v0.3.1; the warning came in v0.4.3.
    if any(" llm_engine.py:" in e.text for e in stats) or version_at_least(info, 0, 4, 3) is False:
        return _counter_visibility(
            scraped, CAPTURE_LEGACY, "vLLM before 0.4.3 logs no preemption line"
        )
    return Visibility(False, None, "V0 logs preemption #1, #51, ... with a counter")


def _counter_visibility(
    scraped: Sequence[datetime | None], capture: str, silent: str
) -> Visibility:
    """A log that is silent about preemption sees them only where scrapes of the
    counter bracket the time."""
    stamps = sorted(t for t in scraped if t is not None)
    if len(stamps) >= 2:
        return Visibility(
            False,
            capture,
            f"{silent}; vllm:num_preemptions_total scrapes cover "
            f"{stamps[0]:%H:%M:%S}-{stamps[-1]:%H:%M:%S}",
            covered=(stamps[0], stamps[-1]),
        )
    if scraped and not stamps:
        return Visibility(False, None, f"{silent}; undated /metrics scrapes stand in")
    return Visibility(True, capture, silent)


_CONF_ORDER = (Confidence.LOW, Confidence.MEDIUM, Confidence.HIGH)


def _stats_confidence(w: Window) -> Confidence:
    if w.n_stats >= 3:
        return Confidence.HIGH
    return Confidence.MEDIUM if w.n_stats >= 1 else Confidence.LOW


def _fmt(v: float | None, unit: str = "") -> str:
    return "?" if v is None else f"{v:.1f}{unit}" if isinstance(v, float) else f"{v}{unit}"


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


def _alloc_why(w: Window) -> str:
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


def classify_window(w: Window, thr: Thresholds, vis: Visibility) -> Window:
    kv_hot = w.kv_max is not None and w.kv_max >= thr.kv_pressure_pct
    if w.alloc_failures:
        return replace(
            w, cls=Class.ALLOCATION_FAILURE, confidence=Confidence.HIGH, why=_alloc_why(w)
        )
    if w.host_ooms:
        return replace(
            w,
            cls=Class.HOST_PRESSURE,
            confidence=Confidence.HIGH,
            why="host/container memory kill (kernel, cgroup or container OOM line)",
        )
    if w.preemptions > 0:
        conf = Confidence.LOW if w.preemptions_lower_bound and not w.n_stats else Confidence.MEDIUM
        return replace(
            w,
            cls=Class.BENIGN_PREEMPTION,
            confidence=conf,
            why=f"{w.preemptions:.0f} preemption(s), KV max {_fmt(w.kv_max, '%')}",
        )
    if w.swap_warnings:
        return replace(
            w,
            cls=Class.HOST_PRESSURE,
            confidence=Confidence.LOW,
            why="swap space sized against host RAM (vLLM swap-space warning)",
        )
    if w.engine_deaths:
        return replace(
            w,
            cls=Class.INSUFFICIENT_EVIDENCE,
            confidence=Confidence.MEDIUM,
            why="engine died; this window holds no memory evidence for why",
        )
    if not w.n_stats:
        return replace(
            w, cls=Class.HEALTHY, confidence=Confidence.LOW, why="start-up/context lines only"
        )
    waiting = w.waiting_max or 0
    blind = vis.blind_at(w)
    if kv_hot and waiting > 0 and blind:
        return replace(
            w,
            cls=Class.INSUFFICIENT_EVIDENCE,
            confidence=Confidence.LOW,
            why=(
                f"KV {_fmt(w.kv_max, '%')} with {waiting} waiting, but this log cannot show "
                "preemptions (suspected)"
            ),
        )
    if waiting > 0 and not (w.running_max or 0) and (w.kv_max or 0.0) < thr.stall_kv_pct:
        return replace(
            w,
            cls=Class.INSUFFICIENT_EVIDENCE,
            confidence=Confidence.MEDIUM,
            why=(
                f"{waiting} waiting while nothing runs and KV is {_fmt(w.kv_max, '%')}: "
                "the engine is not admitting work (a stall, not memory pressure)"
            ),
        )
    seen = "no preemption seen (this log cannot show it)" if blind else "no preemption"
    # A log that cannot show preemptions cannot be highly sure there were none.
    conf = (
        min(_stats_confidence(w), Confidence.MEDIUM, key=_CONF_ORDER.index)
        if blind
        else (_stats_confidence(w))
    )
    if waiting > 0 and (w.waiting_share or 0.0) >= thr.queue_min_share:
        return replace(
            w,
            cls=Class.QUEUEING,
            confidence=conf,
            why=f"{waiting} waiting, KV max {_fmt(w.kv_max, '%')}, {seen}",
        )
    if w.waiting_max is None:
        queue = "queue length not logged"
    elif not waiting:
        queue = "nothing waiting"
    else:
        queue = f"Waiting > 0 in few lines (max {waiting})"
    return replace(
        w,
        cls=Class.HEALTHY,
        confidence=conf,
        why=f"KV max {_fmt(w.kv_max, '%')}, {queue}, {seen}",
    )


def _consecutive(a: Window, b: Window, seconds: int) -> bool:
    if a.start is None or b.start is None:
        return False
    return (b.start - a.start).total_seconds() <= seconds


def _queue_growing(w: Window) -> bool:
    return (w.waiting_last or 0) > (w.waiting_first or 0) or (w.swapped_last or 0) > (
        w.swapped_first or 0
    )


def _thrash_reason(run: Sequence[Window], thr: Thresholds, seconds: int) -> str | None:
    kv_vals = [w.kv_max for w in run if w.kv_max is not None]
    kv_hot = bool(kv_vals) and max(kv_vals) >= thr.kv_pressure_pct
    total = sum(w.preemptions for w in run)
    if len(run) >= thr.thrash_min_windows and (kv_hot or not kv_vals):
        return f"preemption in {len(run)} consecutive windows ({total:.0f} in all)" + (
            f", KV up to {max(kv_vals):.1f}%" if kv_vals else ""
        )
    rate_limit = thr.thrash_rate_per_min * seconds / 60.0
    for w in run:
        if kv_hot and w.preemptions >= rate_limit:
            return (
                f"{w.preemptions:.0f} preemptions in one {seconds}s window with KV at "
                f"{max(kv_vals):.1f}%"
            )
        if (
            w.max_cumulative is not None
            and w.max_cumulative >= thr.thrash_cumulative
            and w.kv_max is not None
            and w.kv_max >= thr.kv_pressure_pct
            and _queue_growing(w)
        ):
            return (
                f"cumulative preemption counter at {w.max_cumulative} with KV "
                f"{w.kv_max:.1f}% and the waiting/swapped queue growing"
            )
    return None


def classify(
    windows: Sequence[Window], thr: Thresholds, vis: Visibility, seconds: int
) -> list[Window]:
    out = [classify_window(w, thr, vis) for w in windows]
    result: list[Window] = []
    for _, group in groupby(out, key=lambda w: w.replica):
        ws = list(group)
        i = 0
        while i < len(ws):
            if ws[i].cls is not Class.BENIGN_PREEMPTION:
                result.append(ws[i])
                i += 1
                continue
            j = i + 1
            while (
                j < len(ws)
                and ws[j].cls is Class.BENIGN_PREEMPTION
                and _consecutive(ws[j - 1], ws[j], seconds)
            ):
                j += 1
            run = ws[i:j]
            reason = _thrash_reason(run, thr, seconds)
            for w in run:
                if reason is None:
                    result.append(w)
                    continue
                exact = not w.preemptions_lower_bound and w.n_stats > 0
                result.append(
                    replace(
                        w,
                        cls=Class.THRASH_LOOP,
                        confidence=Confidence.HIGH if exact else Confidence.MEDIUM,
                        why=reason,
                    )
                )
            i = j
    return result


def _rank(w: Window) -> int:
    r = SEVERITY.index(w.cls)
    # A swap-size warning alone is a risk note, not an incident: rank it below a
    # proven loop so it never hides one.
    if w.cls is Class.HOST_PRESSURE and not w.host_ooms:
        r = SEVERITY.index(Class.BENIGN_PREEMPTION)
    return r


def _episode(windows: Sequence[Window], seconds: int) -> list[Window]:
    """The earliest run of windows (one replica) of the most severe class."""
    best = min(_rank(w) for w in windows)
    ordered = sorted(windows, key=lambda w: (w.start is None, w.start or 0, w.replica))
    first = next(w for w in ordered if _rank(w) == best)
    same = [w for w in windows if w.replica == first.replica]
    k = same.index(first)
    run = [first]
    for w in same[k + 1 :]:
        if w.cls is first.cls and _consecutive(run[-1], w, seconds):
            run.append(w)
        else:
            break
    return run


def _verdict_evidence(run: Sequence[Window]) -> tuple[Event, ...]:
    seen: set[tuple[str, int]] = set()
    decisive: list[Event] = []
    stats: list[Event] = []
    for w in run:
        for e in w.evidence:
            key = (e.source, e.line)
            if key in seen:
                continue
            seen.add(key)
            (stats if e.kind is Kind.STATS else decisive).append(e)
    # Keep the earliest decisive lines and the hottest stats lines.
    stats.sort(key=lambda e: -(float(e.fields.get("kv_usage") or 0.0)))
    picked = decisive[: MAX_VERDICT_EVIDENCE - min(2, len(stats))] + stats[:2]
    return tuple(sorted(picked, key=lambda e: (e.source, e.line)))


def _cpu_backend(events: Sequence[Event]) -> bool:
    """The engine's KV pool lives in host RAM (vLLM's CPU backend)."""
    return any(
        e.fields.get("device") == "cpu" or e.fields.get("kv_device") == "CPU"
        for e in events
        if e.kind in (Kind.CONFIG, Kind.CAPACITY)
    )


def _suspect(w: Window, thr: Thresholds, vis: Visibility) -> bool:
    """An insufficient-evidence window for KV pressure the log cannot explain (not
    one that is undecided because the engine died)."""
    return (
        w.cls is Class.INSUFFICIENT_EVIDENCE
        and not w.engine_deaths
        and vis.blind_at(w)
        and (w.kv_max or 0.0) >= thr.kv_pressure_pct
        and (w.waiting_max or 0) > 0
    )


def _healthy_why(windows: Sequence[Window], fallback: str) -> str:
    """A healthy verdict speaks for the whole input, not its first window (which is
    often start-up lines only)."""
    stats = [w for w in windows if w.n_stats]
    if not stats:
        return fallback
    kv = [w.kv_max for w in stats if w.kv_max is not None]
    waiting = [w.waiting_max for w in stats if w.waiting_max is not None]
    n = sum(w.n_stats for w in stats)
    parts = [f"{n} stats line(s) in {len(stats)} window(s)"]
    if kv:
        parts.append(f"KV max {max(kv):.1f}%")
    parts.append(f"waiting max {max(waiting)}" if waiting else "queue length not logged")
    tail = stats[-1].why.rsplit(", ", 1)[-1]  # "no preemption" or what the log cannot show
    return ", ".join(parts) + f", {tail}"


def _first_ts(windows: Sequence[Window], cls: Class) -> Window | None:
    c = [w for w in windows if w.cls is cls and w.start is not None]
    return min(c, key=lambda w: w.start) if c else None  # type: ignore[arg-type,return-value]


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


def _host_story(events: Sequence[Event]) -> tuple[str | None, str | None, str | None]:
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
        consequence = f"container terminated: {a.fields.get('subtype')} [{a.source}:{a.line}]"
        if why is None:
            why = "the container runtime reports an OOM kill / exit 137: host memory, not the GPU"
    return why, cause, consequence


def verdict(
    windows: Sequence[Window],
    thr: Thresholds,
    vis: Visibility,
    seconds: int,
    events: Sequence[Event] = (),
) -> Verdict:
    if not windows:
        return Verdict(
            cls=Class.INSUFFICIENT_EVIDENCE,
            confidence=Confidence.LOW,
            start=None,
            end=None,
            replica="",
            why="no vLLM evidence found: no line matched a known signature",
            evidence=(),
            evidence_found=False,
        )
    run = _episode(windows, seconds)
    head = run[0]
    conf_order = (Confidence.LOW, Confidence.MEDIUM, Confidence.HIGH)
    conf = max((w.confidence for w in run), key=conf_order.index)
    cause = consequence = None
    alloc = _first_ts(windows, Class.ALLOCATION_FAILURE)
    host = next(
        (w for w in sorted((w for w in windows if w.host_ooms and w.start), key=lambda w: w.start)),  # type: ignore[arg-type, return-value]
        None,
    )
    cls = head.cls
    why = head.why
    if cls is Class.HEALTHY:
        why = _healthy_why(windows, why)
    if cls is Class.ALLOCATION_FAILURE and why.startswith("GPU ") and _cpu_backend(events):
        why = "CPU-backend (host RAM) " + why.removeprefix("GPU ")
    if alloc and host:
        if host.start <= alloc.start:  # type: ignore[operator]
            cls, cause, consequence = (
                Class.HOST_PRESSURE,
                "host/container memory kill",
                "GPU allocation failure / engine death afterwards",
            )
            run = [host]
            why = "the kernel/container killed the engine for host memory before any GPU error"
        else:
            cause, consequence = (
                "GPU allocation failure (CUDA OOM / KV sizing)",
                "container restart / OOM report afterwards",
            )
    elif cls is Class.ALLOCATION_FAILURE and any(w.engine_deaths for w in windows):
        cause, consequence = "GPU allocation failure", "engine death"
    if cls is Class.HOST_PRESSURE and events:
        h_why, h_cause, h_cons = _host_story(events)
        why = h_why or why
        cause = h_cause or cause
        consequence = h_cons or consequence
    suspected = cls is Class.INSUFFICIENT_EVIDENCE and _suspect(head, thr, vis)
    if suspected:
        n = sum(1 for w in windows if _suspect(w, thr, vis))
        if n >= thr.suspect_min_windows:
            conf = Confidence.MEDIUM
        why = (
            f"KV cache pinned at >= {thr.kv_pressure_pct:g}% with requests waiting in {n} "
            f"window(s), but {vis.reason}: preemption is suspected, not proven"
        )
    return Verdict(
        cls=cls,
        confidence=conf,
        start=run[0].start,
        end=run[-1].end,
        replica=run[0].replica,
        why=why,
        evidence=_verdict_evidence(run),
        cause=cause,
        consequence=consequence,
        suspected=suspected,
        capture_next=vis.capture_next if suspected else None,
    )
