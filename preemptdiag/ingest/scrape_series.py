"""What a series of scrapes says: the deltas between consecutive scrapes (counter resets
handled) and a summary for the report."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from preemptdiag.ingest.promscrape import _COUNTERS, Scrape


@dataclass(frozen=True)
class ScrapeDelta:
    """What happened between two consecutive scrapes."""

    start: Scrape
    end: Scrape
    seconds: float | None
    preemptions: float | None
    preemptions_per_min: float | None
    completed: float | None
    prompt_tokens: float | None
    generation_tokens: float | None
    counter_reset: bool


def deltas(scrapes: Sequence[Scrape]) -> list[ScrapeDelta]:
    """Counter increases between consecutive scrapes, Prometheus increase() style:
    a counter that went down restarted from zero, so its increase is its new value."""
    if all(s.ts is not None for s in scrapes):
        ordered = sorted(scrapes, key=lambda s: s.ts or datetime.min.replace(tzinfo=UTC))
    else:
        ordered = list(scrapes)  # file order is the best guess without times
    out: list[ScrapeDelta] = []
    for a, b in itertools.pairwise(ordered):
        seconds = (b.ts - a.ts).total_seconds() if a.ts is not None and b.ts is not None else None
        restarted = _restarted(a, b)
        incs = {
            key: _increase(a.values.get(key), b.values.get(key), restarted) for key in _COUNTERS
        }
        pre = incs["preemptions_total"][0]
        out.append(
            ScrapeDelta(
                start=a,
                end=b,
                seconds=seconds,
                preemptions=pre,
                preemptions_per_min=pre / seconds * 60.0 if pre is not None and seconds else None,
                completed=incs["request_success_total"][0],
                prompt_tokens=incs["prompt_tokens_total"][0],
                generation_tokens=incs["generation_tokens_total"][0],
                counter_reset=any(reset for _, reset in incs.values()),
            )
        )
    return out


def summarize(scrapes: Sequence[Scrape]) -> dict[str, object]:
    """A small JSON-able summary for the report."""
    ds = deltas(scrapes)
    ordered = [ds[0].start, *(d.end for d in ds)] if ds else list(scrapes)
    first, last = (ordered[0], ordered[-1]) if ordered else (None, None)
    span = None
    if first and last and first.ts is not None and last.ts is not None:
        span = (last.ts - first.ts).total_seconds()
    pre = _sum_known(d.preemptions for d in ds)
    return {
        "scrapes": len(scrapes),
        "engine": last.engine if last else "unknown",
        "span_seconds": span,
        "preemptions": pre,
        "preemptions_per_min": pre / span * 60.0 if pre is not None and span else None,
        "preemptions_total_last": last.values.get("preemptions_total") if last else None,
        "counter_reset": any(d.counter_reset for d in ds),
        "kv_usage_max": _max_known(s.values.get("kv_usage_perc") for s in ordered),
        "waiting_max": _max_known(s.values.get("waiting") for s in ordered),
        "completed": _sum_known(d.completed for d in ds),
        "e2e_p95_last": last.values.get("e2e_p95") if last else None,
        "with_engine_series": sum(1 for s in scrapes if _ENGINE_SERIES & s.values.keys()),
    }


# The values a scrape holds only when the engine exports its vllm:* series.
_ENGINE_SERIES = frozenset(
    {"kv_usage_perc", "running", "waiting", "preemptions_total", "request_success_total"}
)


def _increase(a: float | None, b: float | None, restarted: bool) -> tuple[float | None, bool]:
    """(increase, was reset)."""
    if a is None or b is None:
        return None, False
    if b < a or restarted:
        return b, True
    return b - a, False


def _restarted(a: Scrape, b: Scrape) -> bool:
    sa, sb = a.values.get("process_start_time_seconds"), b.values.get("process_start_time_seconds")
    return sa is not None and sb is not None and sb > sa + 1.0


def _sum_known(xs: Iterable[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return sum(known) if known else None


def _max_known(xs: Iterable[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return max(known) if known else None
