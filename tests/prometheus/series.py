"""Series for a real Prometheus, built from the real-engine recordings (vllm-0.32.0/).

Each recording has three /metrics scrapes (real names, labels, counter values, scrape
times) and the server's stats lines every 10 s (real Running, Waiting and KV usage at
real times). A replica's series is: the gauges at every stats line and scrape, and the
counters read between the scrapes around each point; the preemption counter's rise
between two scrapes is laid on the points where KV was pinned (where the engine
preempts), evenly when none was. Nothing is invented but that interpolation and, for
the restarted replica, the restart itself: the healthy recording served twice, the
second time by a new process (counters from zero, a later process start time).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ENGINE = Path(__file__).resolve().parent.parent / "fixtures" / "engine" / "vllm-0.32.0"

_STATS = re.compile(
    r"INFO (?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d) \[loggers\.py:\d+\] Engine \d+: .*?"
    r"Running: (?P<run>\d+) reqs, Waiting: (?P<wait>\d+) reqs, .*?KV cache usage: (?P<kv>[\d.]+)%"
)
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = (
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)
PINNED = 0.95  # the rules' default kv_pressure_pct, as a fraction


@dataclass
class Replica:
    """One engine's series: name -> (labels, [(unix seconds, value)])."""

    pod: str
    instance: str
    namespace: str = "serving"
    series: dict[str, list[tuple[dict[str, str], list[tuple[float, float]]]]] = field(
        default_factory=dict
    )

    def target(self) -> dict[str, str]:
        return {
            "job": "vllm",
            "namespace": self.namespace,
            "pod": self.pod,
            "instance": self.instance,
        }

    def span(self) -> tuple[float, float]:
        ts = [t for rows in self.series.values() for _, pts in rows for t, _ in pts]
        return min(ts), max(ts)


def _scrapes(scenario: str) -> list[tuple[float, dict[str, float], float]]:
    """(time, engine-level values, process start) of each kept scrape."""
    out = []
    for p in sorted((ENGINE / scenario).glob("metrics-*.prom")):
        text = p.read_text()
        ts = datetime.fromisoformat(
            re.search(r"# scraped_at: (\S+)", text).group(1).replace("Z", "+00:00")  # type: ignore[union-attr]
        ).timestamp()
        values: dict[str, float] = {}
        start = 0.0
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            value = float(line.rsplit(" ", 1)[1])
            if name in GAUGES or name in COUNTERS:
                # request_success_total comes per finished_reason: the engine's sum.
                values[name] = values.get(name, 0.0) + value
            elif name == "process_start_time_seconds":
                start = value
        out.append((ts, values, start))
    return out


def _stats(scenario: str) -> list[tuple[float, dict[str, float]]]:
    out = []
    for line in (ENGINE / scenario / "server.log").read_text().splitlines():
        m = _STATS.search(line)
        if m:
            ts = datetime.strptime(f"2026-{m['md']} {m['hms']}", "%Y-%m-%d %H:%M:%S")
            out.append(
                (
                    ts.replace(tzinfo=UTC).timestamp(),
                    {
                        GAUGES[0]: float(m["run"]),
                        GAUGES[1]: float(m["wait"]),
                        GAUGES[2]: float(m["kv"]) / 100.0,
                    },
                )
            )
    return out


def _counter_at(
    name: str,
    t: float,
    scrapes: Sequence[tuple[float, dict[str, float], float]],
    pinned: list[float],
) -> float:
    times = [s[0] for s in scrapes]
    i = bisect.bisect_right(times, t)
    if i == 0:
        return scrapes[0][1][name]
    if i == len(scrapes):
        return scrapes[-1][1][name]
    (t0, a, _), (t1, b, _) = scrapes[i - 1], scrapes[i]
    rise = b[name] - a[name]
    if name == "vllm:num_preemptions_total":
        hot = [p for p in pinned if t0 < p <= t1]
        if hot:
            return a[name] + round(rise * sum(1 for p in hot if p <= t) / len(hot))
    return a[name] + round(rise * (t - t0) / (t1 - t0))


def replica(
    scenario: str,
    pod: str,
    instance: str,
    *,
    shift: float = 0.0,
    namespace: str = "serving",
    engine_index: str = "0",
) -> Replica:
    scrapes = _scrapes(scenario)
    stats = _stats(scenario)
    points = sorted(
        [(t, g) for t, g in stats] + [(t, {k: v[k] for k in GAUGES}) for t, v, _ in scrapes]
    )
    pinned = [t for t, g in points if g[GAUGES[2]] >= PINNED]
    r = Replica(pod, instance, namespace)
    engine = {"engine": engine_index, "model_name": "tiny-llama"}
    for name in GAUGES:
        r.series[name] = [(engine, [(t + shift, g[name]) for t, g in points])]
    for name in COUNTERS:
        r.series[name] = [
            (engine, [(t + shift, _counter_at(name, t, scrapes, pinned)) for t, _ in points])
        ]
    r.series["process_start_time_seconds"] = [
        ({}, [(t + shift, scrapes[0][2] + shift) for t, _ in points])
    ]
    return r


def restarted(scenario: str, pod: str, instance: str) -> Replica:
    """The recording served twice by one pod: a new process the second time."""
    first = replica(scenario, pod, instance)
    lo, hi = first.span()
    second = replica(scenario, pod, instance, shift=hi - lo + 20.0)
    for name, rows in second.series.items():
        first.series[name][0][1].extend(rows[0][1])
    return first


def fleet() -> list[Replica]:
    """The four-replica store: healthy, queueing, thrashing, restarted."""
    return [
        replica("healthy", "vllm-healthy-0", "10.0.0.1:8000"),
        replica("queueing", "vllm-queueing-0", "10.0.0.2:8000"),
        replica("thrash_loop", "vllm-thrash-0", "10.0.0.3:8000"),
        restarted("healthy", "vllm-restarted-0", "10.0.0.4:8000"),
    ]


LAB_SHIFT = -86_400.0  # the lab replicas: a day before the fleet, in namespace "lab"
SGLANG_NAMES = {
    "vllm:num_requests_running": "sglang:num_running_reqs",
    "vllm:num_requests_waiting": "sglang:num_queue_reqs",
    "vllm:kv_cache_usage_perc": "sglang:token_usage",
    "vllm:num_preemptions_total": "sglang:num_retracted_requests_total",
    "vllm:prompt_tokens_total": "sglang:prompt_tokens_total",
    "vllm:generation_tokens_total": "sglang:generation_tokens_total",
    "vllm:request_success_total": "sglang:num_requests_total",
}


def renamed(r: Replica, names: dict[str, str], drop_engine: bool = False) -> Replica:
    """The same values under another engine's or release's metric names."""
    out = Replica(r.pod, r.instance, r.namespace)
    for name, rows in r.series.items():
        out.series[names.get(name, name)] = [
            ({k: v for k, v in labels.items() if not (drop_engine and k == "engine")}, pts)
            for labels, pts in rows
        ]
    return out


def lab() -> list[Replica]:
    """Other engines and releases, a day earlier: an SGLang replica (its own metric
    names, no engine label) serving the thrash recording, a vLLM before 0.10 (the
    gpu_cache_usage_perc name) serving the queueing one, and one pod with two
    data-parallel engines, engine 0 healthy and engine 1 thrashing (thrash_halved)."""
    at: dict[str, Any] = {"shift": LAB_SHIFT, "namespace": "lab"}
    dp_second = replica("thrash_halved", "vllm-dp-0", "10.1.0.3:8000", engine_index="1", **at)
    del dp_second.series["process_start_time_seconds"]  # one pod, one process
    return [
        renamed(replica("thrash_loop", "sglang-0", "10.1.0.1:30000", **at), SGLANG_NAMES, True),
        renamed(
            replica("queueing", "vllm-old-0", "10.1.0.2:8000", **at),
            {"vllm:kv_cache_usage_perc": "vllm:gpu_cache_usage_perc"},
        ),
        replica("healthy", "vllm-dp-0", "10.1.0.3:8000", **at),
        dp_second,
    ]


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(d.items())) + "}"


def openmetrics(replicas: Sequence[Replica]) -> str:
    """The series as OpenMetrics text for `promtool tsdb create-blocks-from openmetrics`:
    each family's samples together, each series in time order, `# EOF` last."""
    names = sorted({n for r in replicas for n in r.series})
    lines: list[str] = []
    for name in names:
        for r in replicas:
            for labels, pts in r.series.get(name, []):
                tag = _labels({**r.target(), **labels})
                lines += [f"{name}{tag} {v:.17g} {t:.3f}" for t, v in pts]
    return "\n".join([*lines, "# EOF"]) + "\n"


def span(replicas: Sequence[Replica]) -> tuple[datetime, datetime]:
    los, his = zip(*(r.span() for r in replicas), strict=True)
    return datetime.fromtimestamp(min(los), UTC), datetime.fromtimestamp(max(his), UTC)


def blind(scenario: str, pod: str, instance: str) -> Replica:
    """The recording as a store without a preemption counter sees it (an SGLang or vLLM
    build that does not export one, or a scrape config that drops it)."""
    r = replica(scenario, pod, instance)
    del r.series["vllm:num_preemptions_total"]
    return r


def wedged(pod: str, instance: str, minutes: int = 6) -> Replica:
    """A V1 engine wedged for `minutes`: its pool pinned, Running falling and the queue
    growing while vllm:num_preemptions_total stands still. The first 100 s of the real
    0.11.0 overload (vllm-0.11.0/thrash_loop_cpu0.2/scrapes) looked so: V1 counts a
    preemption only when its request runs again, and none did yet. There they ran again
    after 100 s; here none does (an engine whose preempted requests never get back in),
    so the counter never moves. Synthetic: the 0.11.0 scrapes' first values, held."""
    r = Replica(pod, instance)
    engine = {"engine": "0", "model_name": "tiny-llama"}
    times = [k * 10.0 for k in range(minutes * 6 + 1)]
    values = {
        "vllm:kv_cache_usage_perc": [1.0 for _ in times],
        "vllm:num_requests_running": [float(max(107 - 3 * k, 30)) for k in range(len(times))],
        "vllm:num_requests_waiting": [float(42 + 35 * k) for k in range(len(times))],
        "vllm:num_preemptions_total": [0.0 for _ in times],
        "vllm:request_success_total": [0.0 for _ in times],
    }
    for name, vals in values.items():
        r.series[name] = [(engine, list(zip(times, vals, strict=True)))]
    r.series["process_start_time_seconds"] = [({}, [(t, 1.7965e9) for t in times])]
    return r


def promtool_series(replicas: Sequence[Replica], interval: float) -> list[dict[str, str]]:
    """input_series for `promtool test rules`: each replica's series from time 0 (its own
    start), sampled every `interval` seconds with the last value at or before."""
    out = []
    for r in replicas:
        lo, hi = r.span()
        steps = int((hi - lo) // interval) + 1
        for name, rows in sorted(r.series.items()):
            for labels, pts in rows:
                times = [t for t, _ in pts]
                vals = []
                for k in range(steps):
                    i = bisect.bisect_right(times, lo + k * interval)
                    vals.append(f"{pts[i - 1][1]:.17g}" if i else "_")
                out.append(
                    {"series": name + _labels({**r.target(), **labels}), "values": " ".join(vals)}
                )
    return out
