"""`alerts`: the classification thresholds as Prometheus recording and alerting rules.

Every number in an expression is a field of the Thresholds the rules use (config
overrides included) and the window analyze uses, so an alert fires where a diagnosis
of the same series would name the class:

- thrash loop: preemption in every window of `thrash_min_windows` in a row with KV
  pinned (>= kv_pressure_pct) at some point of them, or a single window's preemptions
  at `thrash_rate_per_min` with KV pinned (rules.py, _thrash_reason);
- suspected preemption: KV pinned with requests waiting for `suspect_min_windows`
  windows and no preemption series at all (window rule PD107, the verdict's count), or
  a vLLM counter that stood still through a window whose queue never emptied: V1 counts
  a preemption only when its request runs again (diagnose/visibility.py), so there it
  proves nothing;
- queueing: requests waiting at `queue_min_share` of the points of a window, no
  preemption, not a stall, not a pinned pool that cannot show preemptions (PD109);
- engine restart: the process start time moved, or a counter went down.

Each alert's annotation is the `preemptdiag analyze` command that diagnoses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from preemptdiag import __version__
from preemptdiag.ingest.prometheus_api import REPLICA_LABELS, check_selector
from preemptdiag.ingest.promscrape import _QUANTITIES
from preemptdiag.model.config import Thresholds
from preemptdiag.model.errors import DiagError
from preemptdiag.render.rules_yaml import Node, dump_yaml

_BY = ", ".join(REPLICA_LABELS)
# A restart belongs to the target: process metrics carry no engine label.
_TARGET = ", ".join(lb for lb in REPLICA_LABELS if lb != "engine")


@dataclass(frozen=True, slots=True)
class AlertOptions:
    thresholds: Thresholds
    window_seconds: int
    selector: str = ""
    prometheus_url: str = "http://prometheus:9090"
    fmt: str = "rules"  # rules | k8s
    name: str = "preemptdiag"
    namespace: str | None = None


def duration(seconds: int) -> str:
    """Prometheus duration text: 90 -> 1m30s."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v) or "0s"


def _names(quantity: str) -> tuple[str, ...]:
    return next(cands for key, _how, cands, _scale in _QUANTITIES if key == quantity)


def _series(quantities: Sequence[str], selector: str) -> str:
    """One selector over every name the quantities go by in any engine or release."""
    names = "|".join(n for q in quantities for n in _names(q))
    inner = selector.strip()[1:-1].strip().rstrip(",") if selector else ""
    return "{" + f'__name__=~"{names}"' + (f", {inner}" if inner else "") + "}"


def _inner(selector: str) -> str:
    """The selector's matchers in braces, or nothing (`name{}` reads oddly)."""
    inner = selector.strip()[1:-1].strip().rstrip(",") if selector else ""
    return "{" + inner + "}" if inner else ""


def _per_name(quantities: Sequence[str], selector: str, agg: str, fn: str, rng: str) -> str:
    """`agg by (...) (fn(name{sel}[rng]))` for each name, joined by `or`: a range
    function drops the name, so one selector over several names could yield two series
    with one label set; with `or` the first name present wins per replica, as
    promscrape's order of preference does."""
    sel = _inner(selector)
    by = _TARGET if agg == "max" else _BY
    terms = [f"{agg} by ({by}) ({fn}({n}{sel}[{rng}]))" for q in quantities for n in _names(q)]
    return f" or on ({by}) ".join(terms)


def _vllm_counter_increase(selector: str, rng: str) -> str:
    """The increase of vLLM's preemption counter (any of its names) over `rng`."""
    sel = _inner(selector)
    names = [n for n in _names("preemptions_total") if n.startswith("vllm:")]
    return f" or on ({_BY}) ".join(f"sum by ({_BY}) (increase({n}{sel}[{rng}]))" for n in names)


def _num(x: float) -> str:
    return f"{x:g}"


def _next_command(url: str) -> str:
    """The analyze command for the alert's replica, as an alert template."""
    sel = (
        '{{ if $labels.namespace }}namespace="{{ $labels.namespace }}",{{ end }}'
        '{{ if $labels.pod }}pod="{{ $labels.pod }}"{{ else }}'
        'instance="{{ $labels.instance }}"{{ end }}'
    )
    # A literal "{" before "{{" would read as a delimiter: the template prints it.
    return f"preemptdiag analyze --prometheus {url} --selector '{{{{ \"{{\" }}}}{sel}}}' --since 1h"


def rule_groups(o: AlertOptions) -> dict[str, Node]:
    thr, w = o.thresholds, o.window_seconds
    sel = check_selector(o.selector)
    W = duration(w)
    pressure = _num(thr.kv_pressure_pct)
    per_window = _num(thr.thrash_rate_per_min * w / 60.0)
    run = duration(max(thr.thrash_min_windows - 1, 0) * w)
    suspect_for = duration(max(thr.suspect_min_windows - 1, 0) * w)
    who = (
        "{{ if $labels.pod }}{{ $labels.pod }}{{ else }}{{ $labels.instance }}{{ end }}"
        "{{ if $labels.engine }} (engine {{ $labels.engine }}){{ end }}"
    )
    nxt = _next_command(o.prometheus_url)

    def alert(
        name: str, cls: str, severity: str, expr: str, for_: str, summary: str
    ) -> dict[str, Node]:
        rule: dict[str, Node] = {"alert": name, "expr": expr}
        if for_ != "0s":
            rule["for"] = for_
        rule["labels"] = {"severity": severity, "preemptdiag_class": cls}
        rule["annotations"] = {
            "summary": f"{who}: {summary}",
            "description": f"Run next: {nxt}",
        }
        return rule

    records: list[Node] = [
        {
            "record": "preemptdiag:kv_usage:pct",
            "expr": f"100 * max by ({_BY}) ({_series(['kv_usage_perc'], sel)})",
        },
        {
            "record": "preemptdiag:waiting:sum",
            "expr": f"sum by ({_BY}) ({_series(['waiting'], sel)})",
        },
        {
            "record": "preemptdiag:running:sum",
            "expr": f"sum by ({_BY}) ({_series(['running'], sel)})",
        },
        {
            "record": "preemptdiag:waiting:positive",
            "expr": "preemptdiag:waiting:sum > bool 0",
        },
        {
            "record": "preemptdiag:preemptions:present",
            "expr": f"count by ({_BY}) ({_series(['preemptions_total'], sel)})",
        },
        {
            "record": "preemptdiag:preemptions:window",
            "expr": _per_name(["preemptions_total"], sel, "sum", "increase", W),
        },
        {
            "record": "preemptdiag:preemptions:total",
            "expr": f" or on ({_BY}) ".join(
                f"sum by ({_BY}) ({n}{_inner(sel)})" for n in _names("preemptions_total")
            ),
        },
        {
            "record": "preemptdiag:preempting:window",
            "expr": "preemptdiag:preemptions:window > bool 0",
        },
        {
            # vLLM's counter flat through a window whose queue never emptied: a request
            # preempted there may not have run again yet, and V1 counts it only then
            # (SGLang counts a retraction as it happens: its names are not here)
            "record": "preemptdiag:preemptions:late",
            "expr": f"({_vllm_counter_increase(sel, W)}) == 0"
            f" and on ({_BY}) min_over_time(preemptdiag:waiting:sum[{W}]) > 0",
        },
    ]
    # a counter that can show preemptions in the window: present, and not standing still
    # while the queue waits (the `late` record above)
    counted = f"(preemptdiag:preemptions:present unless on ({_BY}) preemptdiag:preemptions:late)"
    pinned_run = f"max_over_time(preemptdiag:kv_usage:pct[{duration(thr.thrash_min_windows * w)}])"
    pinned_w = f"max_over_time(preemptdiag:kv_usage:pct[{W}])"
    # Every point of the last (n-1) windows saw preemption in the window before it:
    # n windows in a row.
    in_a_row = (
        f"min_over_time(preemptdiag:preempting:window[{run}]) == 1"
        if thr.thrash_min_windows > 1
        else "preemptdiag:preempting:window == 1"
    )
    thrash = (
        f"({in_a_row}"
        f" unless on ({_BY}) {pinned_run} < {pressure})"
        f" or on ({_BY}) "
        f"(preemptdiag:preemptions:window >= {per_window}"
        f" and on ({_BY}) {pinned_w} >= {pressure})"
        # A counter this high with KV pinned and the queue growing: preempting for a
        # while already, even where the span shows one window of it.
        f" or on ({_BY}) "
        f"(preemptdiag:preemptions:window > 0"
        f" and on ({_BY}) max_over_time(preemptdiag:preemptions:total[{W}])"
        f" >= {thr.thrash_cumulative}"
        f" and on ({_BY}) {pinned_w} >= {pressure}"
        f" and on ({_BY}) preemptdiag:waiting:sum - preemptdiag:waiting:sum offset {W} > 0)"
    )
    suspected = (
        f"{pinned_w} >= {pressure}"
        f" and on ({_BY}) max_over_time(preemptdiag:waiting:sum[{W}]) > 0"
        f" unless on ({_BY}) {counted}"
    )
    queueing = (
        f"avg_over_time(preemptdiag:waiting:positive[{W}]) >= {_num(thr.queue_min_share)}"
        f" unless on ({_BY}) preemptdiag:preemptions:window > 0"
        f" unless on ({_BY}) ({pinned_w} >= {pressure}"
        f" unless on ({_BY}) {counted})"
        f" unless on ({_BY}) (max_over_time(preemptdiag:running:sum[{W}]) == 0"
        f" and on ({_BY}) {pinned_w} < {_num(thr.stall_kv_pct)})"
    )
    resets = _per_name(
        ["preemptions_total", "request_success_total", "generation_tokens_total"],
        sel,
        "max",
        "resets",
        W,
    )
    starts = "process_start_time_seconds" + (sel or "")
    restart = (
        f"max by ({_TARGET}) (changes({starts}[{W}])) > 0"
        f" and on ({_TARGET}) count by ({_TARGET}) ({_series(['running'], sel)})"
        f" or on ({_TARGET}) ({resets}) > 0"
    )
    alerts: list[Node] = [
        alert(
            "PreemptdiagThrashLoop",
            "thrash_loop",
            "critical",
            thrash,
            "0s",
            f"KV-cache preemption in {thr.thrash_min_windows} windows of {W} in a row (or "
            f">= {per_window} in one) with KV at >= {pressure}%: a thrash loop",
        ),
        alert(
            "PreemptdiagSuspectedPreemption",
            "insufficient_evidence",
            "warning",
            suspected,
            suspect_for,
            f"KV cache pinned at >= {pressure}% with requests waiting, and no preemption "
            "counter to prove preemption (or vLLM's standing still while the queue waits: it "
            "counts a preemption only when its request runs again): suspected, not proven",
        ),
        alert(
            "PreemptdiagQueueing",
            "queueing",
            "info",
            queueing,
            "0s",
            f"requests waiting in >= {_num(thr.queue_min_share * 100)}% of the last {W} "
            "without preemption: load waits at the door",
        ),
        alert(
            "PreemptdiagEngineRestart",
            "restart",
            "warning",
            restart,
            "0s",
            f"the engine restarted in the last {W} (process start time moved or counters reset)",
        ),
    ]
    return {
        "groups": [
            {"name": "preemptdiag.records", "rules": records},
            {"name": "preemptdiag.alerts", "rules": alerts},
        ]
    }


def render_rules(o: AlertOptions) -> str:
    if o.fmt not in ("rules", "k8s"):
        raise DiagError(f"unknown --format {o.fmt!r} for alerts (rules, k8s)")
    doc = rule_groups(o)
    thr = ", ".join(f"{k}={v}" for k, v in o.thresholds.as_dict().items())
    head = (
        f"# Generated by preemptdiag {__version__} `alerts` from the thresholds the rules use\n"
        f"# (window {duration(o.window_seconds)}; {thr}).\n"
        "# Regenerate after changing them, so alerts and diagnoses agree.\n"
    )
    if o.fmt == "k8s":
        meta: dict[str, Node] = {
            "name": o.name,
            "labels": {"app.kubernetes.io/name": "preemptdiag"},
        }
        if o.namespace:
            meta["namespace"] = o.namespace
        doc = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": meta,
            "spec": doc,
        }
    return head + dump_yaml(doc)
