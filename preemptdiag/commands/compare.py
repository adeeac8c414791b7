"""`preemptdiag compare BEFORE AFTER`: did the one change help?

Each side is one capture (a log and/or /metrics scrapes, comma-separated). The
verdict follows the seeds' stepped comparison: fewer preemptions is only an
improvement if completed work did not fall and the cost did not just move into the
admission queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from preemptdiag.commands.analyze import Options, Outcome, run_analysis, stdin_once
from preemptdiag.model.records import Change, Comparison, Event, Kind, Side
from preemptdiag.scan.rollup import AGG_FIELDS, number
from preemptdiag.timeline.events import rollup_ends
from preemptdiag.timeline.knobs import read_facts


class _Values:
    """Sum, count and maximum of one field over stats lines (rollups included)."""

    def __init__(self, stats: Sequence[Event], key: str) -> None:
        self.total, self.n = 0.0, 0
        self.top: float | None = None
        i = AGG_FIELDS.index(key)
        for e in stats:
            if e.rollup is not None:
                st = e.rollup.stats
                total, n, top = st.sums[i], st.counts[i], st.maxes[i]
            else:
                v = number(e.fields.get(key))
                total, n, top = (v or 0.0), (0 if v is None else 1), v
            self.total += total
            self.n += n
            if top is not None and (self.top is None or top > self.top):
                self.top = top

    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


def summarize(outcome: Outcome, files: Sequence[str]) -> Side:
    evs = outcome.events
    stats = [e for e in evs if e.kind is Kind.STATS]
    times = [e.ts for e in evs if e.ts is not None]
    times += [m.ts for m in rollup_ends(evs) if m.ts is not None]
    minutes = (max(times) - min(times)).total_seconds() / 60.0 if len(times) > 1 else None
    pre = float(sum(e.preemptions for e in evs))
    kv = _Values(stats, "kv_usage")
    waiting = _Values(stats, "waiting")
    completed = None
    succ = [e for e in evs if e.sig == "prometheus.request_success_total"]
    if len(succ) >= 2:
        a, b = succ[0].fields.get("value"), succ[-1].fields.get("value")
        if isinstance(a, int | float) and isinstance(b, int | float):
            completed = float(b) - float(a)
    return Side(
        files=tuple(files),
        verdict=outcome.report.verdict.cls.value,
        minutes=round(minutes, 2) if minutes else None,
        preemptions=pre,
        preemptions_per_min=round(pre / minutes, 2) if minutes else None,
        kv_mean=kv.mean(),
        kv_max=kv.top,
        waiting_mean=waiting.mean(),
        waiting_max=int(waiting.top) if waiting.top is not None else None,
        prompt_tput=_Values(stats, "prompt_tput").mean(),
        gen_tput=_Values(stats, "gen_tput").mean(),
        completed=completed,
        knobs=dict(read_facts(evs).knobs),
        suspected=outcome.report.verdict.suspected,
    )


def _judge(b: Side, a: Side) -> tuple[Change, str]:
    failing = ("thrash_loop", "allocation_failure", "host_pressure")
    if a.verdict in failing and b.verdict not in failing:
        return Change.REGRESSED, f"after shows {a.verdict}, before did not"
    if b.verdict in ("allocation_failure", "host_pressure"):
        # An out-of-memory lever's test is the failure itself, not preemptions.
        if a.verdict in failing:
            return Change.NOT_FIXED, (
                f"before shows {b.verdict}, and the after side still fails ({a.verdict}): "
                "the change was not enough"
            )
        span = f"{a.minutes:g} min of log" if a.minutes else "no time span"
        return Change.IMPROVED, (
            f"before shows {b.verdict}, after does not ({a.verdict}, {span}): confirm it "
            "held the load that failed before"
        )
    if b.suspected or a.suspected:
        side = "before" if b.suspected else "after"
        return Change.INCONCLUSIVE, (
            f"the {side} side cannot show preemptions (V1 stats lines do not print them): "
            "give each side its /metrics scrapes"
        )
    bp, ap = b.preemptions_per_min, a.preemptions_per_min
    if bp is None or ap is None:
        return Change.INCONCLUSIVE, "one side has no time span to compute a rate from"
    if a.verdict in failing and ap < bp:
        done = ""
        bc, ac = b.completed_per_min, a.completed_per_min
        if bc is not None and ac is not None:
            done = f"; completed {bc:.1f} -> {ac:.1f}/min"
        return Change.NOT_FIXED, (
            f"preemptions {bp:g}/min -> {ap:g}/min, but the after side is still "
            f"{a.verdict}{done}: the change was not enough"
        )
    bc, ac = b.completed_per_min, a.completed_per_min
    fewer_done = bc is not None and ac is not None and ac < 0.9 * bc
    gen_drop = b.gen_tput is not None and a.gen_tput is not None and a.gen_tput < 0.9 * b.gen_tput
    queue_up = (a.waiting_mean or 0.0) > 2.0 * max(b.waiting_mean or 0.0, 1.0)
    if ap < bp * 0.5 or (bp > 0 and ap == 0):
        if gen_drop and queue_up:
            return (
                Change.MOVED_TO_QUEUEING,
                f"preemptions {bp:g}/min -> {ap:g}/min, but Waiting mean "
                f"{b.waiting_mean or 0:.1f} -> {a.waiting_mean or 0:.1f} and generation "
                f"throughput fell {b.gen_tput:.0f} -> {a.gen_tput:.0f} tok/s",
            )
        if gen_drop or fewer_done:
            what = "generation throughput" if gen_drop else "completed requests per minute"
            return (
                Change.INCONCLUSIVE,
                f"preemptions fell ({bp:g} -> {ap:g}/min) but {what} fell too; "
                "compare completed requests and p99 end-to-end latency",
            )
        return (
            Change.IMPROVED,
            f"preemptions {bp:g}/min -> {ap:g}/min with generation throughput "
            f"{_tok(b.gen_tput)} -> {_tok(a.gen_tput)} tok/s",
        )
    if ap > bp * 1.5 and ap > 0:
        return Change.REGRESSED, f"preemptions rose {bp:g}/min -> {ap:g}/min"
    if gen_drop:
        return Change.REGRESSED, (
            f"generation throughput fell {_tok(b.gen_tput)} -> {_tok(a.gen_tput)} tok/s "
            "without fewer preemptions"
        )
    return Change.INCONCLUSIVE, f"preemptions {bp:g}/min -> {ap:g}/min: no clear difference"


def _tok(v: float | None) -> str:
    return "?" if v is None else f"{v:.0f}"


def compare(before: Sequence[str], after: Sequence[str], opts: Options) -> Comparison:
    stdin_once([*before, *after])
    # (summarize reads every stats line's event: no calm minutes)
    ob = run_analysis(replace(opts, files=tuple(before), calm=False))
    oa = run_analysis(replace(opts, files=tuple(after), calm=False))
    b, a = summarize(ob, before), summarize(oa, after)
    changed = {
        k: (b.knobs.get(k), a.knobs.get(k))
        for k in sorted(set(b.knobs) | set(a.knobs))
        if b.knobs.get(k) != a.knobs.get(k)
    }
    change, why = _judge(b, a)
    if len(changed) > 1:
        why += f" (note: {len(changed)} knobs changed; one change per experiment)"
    return Comparison(before=b, after=a, changed_knobs=changed, change=change, why=why)


def exit_code(c: Comparison) -> int:
    return 1 if c.change in (Change.REGRESSED, Change.MOVED_TO_QUEUEING, Change.NOT_FIXED) else 0
