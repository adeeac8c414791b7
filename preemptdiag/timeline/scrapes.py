"""/metrics scrapes on a log's timeline: placed by their own stamp (or a file time that can
be trusted), gauges as stats events, the preemption counter as cumulative events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from preemptdiag.ingest.promscrape import Scrape, parse_scrapes
from preemptdiag.ingest.sources import Source
from preemptdiag.model.records import Event, FieldValue, Kind

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _scrape_event(
    s: Scrape,
    replica: str,
    sig: str,
    kind: Kind,
    fields: dict[str, FieldValue],
    text: str,
    preemptions: int = 0,
    quantity: str = "",
) -> Event:
    return Event(
        source=s.source,
        # The line of the sample itself, so evidence and arithmetic cite it.
        line=s.lines.get(quantity, 1),
        sig=sig,
        kind=kind,
        ts=s.ts,
        fields=fields,
        text=text,
        replica=replica,
        preemptions=preemptions,
        engine="prometheus",
    )


def scrape_events(scrapes: Sequence[Scrape], replica: str) -> list[Event]:
    """Scrapes become events on the log's timeline: gauges as stats, counter as a
    cumulative preemption count (its deltas are spread like V0's sampled counter)."""
    out: list[Event] = []
    prev: float | None = None
    prev_start: float | None = None
    for i, s in enumerate(sorted(scrapes, key=lambda s: (s.ts is None, s.ts or _EPOCH))):
        v = s.values
        # A restart resets the counter even when it has climbed past its old value
        # by the next point (a store's step can span a restart and some minutes).
        start = v.get("process_start_time_seconds")
        restarted = prev_start is not None and start is not None and start > prev_start + 1.0
        prev_start = start if start is not None else prev_start
        gauges: dict[str, FieldValue] = {
            "kv_usage": v.get("kv_usage_perc"),
            "running": int(v["running"]) if "running" in v else None,
            "waiting": int(v["waiting"]) if "waiting" in v else None,
            "engine": s.engine,
        }
        if "peak_running" in v:  # several engines: the fullest one's (promscrape)
            gauges["peak_running"] = int(v["peak_running"])
        shown = [q for q in ("kv_usage_perc", "running", "waiting") if q in v]
        # A scrape without the gauges is no stats line: a real 0.32.0 started with
        # --disable-log-stats serves /metrics with no vllm:* series at all.
        if shown:
            out.append(
                _scrape_event(
                    s,
                    replica,
                    "prometheus.gauges",
                    Kind.STATS,
                    gauges,
                    f"/metrics scrape {s.source} (gauges)",
                    quantity=next((q for q in shown if q in s.lines), ""),
                )
            )
        done = v.get("request_success_total")
        if done is not None:
            out.append(
                _scrape_event(
                    s,
                    replica,
                    "prometheus.request_success_total",
                    Kind.CONTEXT,
                    {"value": done},
                    f"vllm:request_success_total = {done:g}",
                    quantity="request_success_total",
                )
            )
        total = v.get("preemptions_total")
        if total is None:
            continue
        delta = 0.0 if prev is None else (total if restarted or total < prev else total - prev)
        prev = total
        name = "vllm:num_preemptions_total" if s.engine != "sglang" else "retractions"
        out.append(
            _scrape_event(
                s,
                replica,
                "prometheus.num_preemptions_total",
                Kind.PREEMPTION,
                {"cumulative": int(total), "mode": "RECOMPUTE", "scrape": i},
                f"{name} = {total:g} (scrape {i + 1})",
                round(delta),
                quantity="preemptions_total",
            )
        )
    return out


def counted_once(events: Sequence[Event]) -> list[Event]:
    """`events` with the /metrics counter's deltas set to 0 for the replicas whose log
    counts every preemption itself (SGLang's retraction lines, V0's warnings with their
    cumulative counter): the counter's events stay, as evidence and for the span they
    cover, but the same preemptions are not counted twice. A real 0.5.23 logged 22
    retractions while its counter rose by 22: both together made 44, or with the
    counter's first read lost, 27 and a thrash loop where the log showed bursts."""
    logged = {e.replica for e in events if e.kind is Kind.PREEMPTION and e.engine != "prometheus"}
    if not logged:
        return list(events)
    return [
        replace(e, preemptions=0)
        if e.engine == "prometheus" and e.kind is Kind.PREEMPTION and e.replica in logged
        else e
        for e in events
    ]


# A scrape dated only by its file's time joins a log only within this of its span: a
# copied file's time is when it was copied, not when it was scraped.
_MTIME_SLACK_S = 3600.0


def scrape_note(summary: dict[str, object]) -> str:
    def num(key: str, fmt: str) -> str:
        v = summary.get(key)
        return format(v, fmt) if isinstance(v, int | float) else "?"

    parts = [f"/metrics: {summary.get('scrapes')} scrape(s) over {num('span_seconds', '.0f')} s"]
    if summary.get("with_engine_series") == 0:
        # (a real 0.32.0 started with --disable-log-stats serves only process metrics)
        parts.append("none holds a vllm:* series (--disable-log-stats turns them off)")
    if summary.get("preemptions") is not None:
        parts.append(
            f"preemptions +{num('preemptions', '.0f')} ({num('preemptions_per_min', '.1f')}/min)"
        )
    if summary.get("completed") is not None:
        parts.append(f"completed +{num('completed', '.0f')}")
    if summary.get("e2e_p95_last") is not None:
        parts.append(f"e2e p95 since start {num('e2e_p95_last', '.1f')} s")
    if summary.get("counter_reset"):
        parts.append("counter reset (restart) between scrapes")
    return ", ".join(parts)


def read_text(src: Source) -> str:
    from preemptdiag.ingest.sources import open_binary

    with open_binary(src) as f:
        return f.read().decode("utf-8", errors="replace")


def placed_scrapes(
    proms: Sequence[Source], events: Sequence[Event]
) -> tuple[list[Scrape], list[str]]:
    """Every scrape with a time to place it by: its own stamp, else its file's time
    when that lies near the log's span (or there is no log). Also the names of the
    files that could not be placed."""
    stamps = [e.ts for e in events if e.ts is not None]
    lo, hi = (min(stamps), max(stamps)) if stamps else (None, None)
    placed: list[Scrape] = []
    unplaced: list[str] = []
    # Files copied together get one time: their order and spacing are then unknown.
    undated_times = [p.mtime for p in proms if p.mtime is not None]
    copied_together = len(undated_times) > 1 and (
        (max(undated_times) - min(undated_times)).total_seconds() < 2.0
    )
    for p in proms:
        own = parse_scrapes(read_text(p), p.name, None)
        near = p.mtime is not None and (
            lo is None
            or hi is None
            or (
                (lo - p.mtime).total_seconds() <= _MTIME_SLACK_S
                and (p.mtime - hi).total_seconds() <= _MTIME_SLACK_S
            )
        )
        if any(sc.ts is None for sc in own) and (not near or copied_together):
            unplaced.append(p.name)
            own = [sc for sc in own if sc.ts is not None]
        placed.extend(replace(sc, ts=sc.ts or p.mtime) for sc in own)
    return placed, unplaced
