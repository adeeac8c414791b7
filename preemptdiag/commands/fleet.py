"""`fleet`: every replica in a Prometheus store judged by analyze's rules, worst first.

The store is read once for the whole fleet (one range query per metric name); each
replica's points then go through the one pipeline analyze uses (analyze.judge): its
own windows, verdict and lever. The exit code is the worst replica's, under the same
contract as analyze.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from preemptdiag import __version__
from preemptdiag.commands.analyze import Options, exit_code, judge, store_span
from preemptdiag.diagnose.rules import SEVERITY
from preemptdiag.ingest.prometheus_api import Replica, read_fleet
from preemptdiag.model.errors import DiagError
from preemptdiag.model.fleet import FleetReport, FleetRow
from preemptdiag.model.records import Kind, Window
from preemptdiag.timeline.scrapes import scrape_events
from preemptdiag.timeline.store import restart_notes


@dataclass(frozen=True, slots=True)
class FleetOutcome:
    report: FleetReport
    exit_code: int


def waiting_trend(windows: Sequence[Window]) -> str:
    """The sign of a least-squares line through the windows' waiting maxima: a queue
    that builds over the episode, drains, or holds."""
    ys = [float(w.waiting_max) for w in windows if w.waiting_max is not None]
    if not ys or max(ys) == 0:
        return "none"
    if len(ys) < 2:
        return "flat"
    n = len(ys)
    mx = (n - 1) / 2
    my = sum(ys) / n
    slope = sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum(
        (i - mx) ** 2 for i in range(n)
    )
    # Less than one request per window either way is a queue that holds.
    return "growing" if slope >= 1.0 else "falling" if slope <= -1.0 else "flat"


def _row(r: Replica, opts: Options, since: datetime, until: datetime) -> tuple[FleetRow, int]:
    j = judge(scrape_events(r.scrapes, r.name), opts, since, until)
    v = j.verdict
    own = [w for w in j.windows if w.replica == r.name]
    episode = [w for w in own if v.start and v.end and w.start and v.start <= w.start < v.end]
    counted = any(e.kind is Kind.PREEMPTION for e in j.events)
    preempted = sum(w.preemptions for w in own) if counted else None
    minutes = len(own) * opts.window_seconds / 60.0 if own else None
    kvs = [w.kv_max for w in own if w.kv_max is not None]
    waits = [w.waiting_max for w in own if w.waiting_max is not None]
    row = FleetRow(
        replica=r.name,
        labels=dict(r.labels),
        engine=r.scrapes[0].engine if r.scrapes else "unknown",
        verdict=v,
        lever=j.lever,
        kv_peak=max(kvs) if kvs else None,
        preemptions=preempted,
        preemptions_per_min=preempted / minutes if preempted is not None and minutes else None,
        waiting_trend=waiting_trend(episode or own),
        waiting_max=max(waits) if waits else None,
        restarts=r.restarts,
        minutes=minutes,
    )
    return row, exit_code(v, opts)


def _worst_first(row: FleetRow) -> tuple[int, float, float, str]:
    return (
        SEVERITY.index(row.verdict.cls),
        -(row.preemptions_per_min or 0.0),
        -(row.kv_peak or 0.0),
        row.replica,
    )


def run_fleet(opts: Options) -> FleetOutcome:
    if opts.prometheus is None:
        raise DiagError("fleet needs --prometheus URL")
    start, end = store_span(opts)
    fleet = read_fleet(opts.prometheus, start, end, opts.window_seconds)
    judged = [_row(r, opts, start, end) for r in fleet.replicas]
    rows = sorted((row for row, _ in judged), key=_worst_first)
    counted = Counter(row.verdict.cls for row in rows)
    counts = {str(c): counted[c] for c in SEVERITY if counted[c]}
    notes = restart_notes(fleet.replicas)
    report = FleetReport(
        url=fleet.url,
        selector=fleet.selector,
        start=start,
        end=end,
        step_s=fleet.step_s,
        queries=fleet.queries,
        window_seconds=opts.window_seconds,
        rows=tuple(rows),
        counts=counts,
        fail_on=tuple(str(c) for c in opts.fail_on),
        thresholds=opts.thresholds.as_dict(),
        tool_version=__version__,
        notes=tuple(notes),
    )
    return FleetOutcome(report, max(code for _, code in judged))
