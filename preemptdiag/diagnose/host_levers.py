"""The lever for host memory pressure: swap space sized to the container, else the
container's memory limit by what the kill lines show."""

from __future__ import annotations

import math
from collections.abc import Sequence

from preemptdiag.diagnose.runbook import DOCS
from preemptdiag.model.records import Class, Event, Kind, Lever, Verdict
from preemptdiag.timeline.knobs import Facts


def host_lever(verdict: Verdict, events: Sequence[Event], facts: Facts, engine: str) -> Lever:
    host = [e for e in events if e.kind is Kind.HOST_OOM]
    swaps = [e for e in events if e.kind is Kind.SWAP_WARNING]
    if not host and swaps:
        f = swaps[0].fields
        swap = float(f.get("swap_gib") or facts.knob_float("swap_space") or 4.0)
        total = f.get("total_gib")
        if isinstance(total, float | int):
            new = max(1, math.floor(float(total) * 0.2))
            math_line = (
                f"{swap:g} GiB of {float(total):g} GiB host RAM is swap space; "
                f"20% of {float(total):g} GiB = {new} GiB"
            )
        else:
            new = max(1, int(swap // 2))
            math_line = f"{swap:g} GiB / 2 = {new} GiB"
        return Lever(
            knob="--swap-space",
            current=f"{swap:g}",
            proposed=str(new),
            arithmetic=(
                math_line,
                "vLLM checks swap against host RAM, not the container "
                "limit: size it to fit the container",
            ),
            verify="no swap-space warning and no container OOM kill in the next run",
            do_not="do not raise --swap-space to fix preemption in a tight container",
            rationale="CPU swap space is pinned host memory; it competes with the container limit",
            engine=engine,
        )
    usage = _first_int(host, "anon_rss_kb") or _first_int(host, "usage_kb")
    limit = _first_int(host, "limit_kb")
    lines: list[str] = []
    proposed: str | None = None
    current: str | None = None
    if limit:
        current = _gib(limit * 1024)
    if usage:
        base = max(usage, limit or 0)
        need = base * 1024 * 1.25
        proposed = _gib(need, up=True)
        which = (
            f"the larger of resident {_gib(usage * 1024)} at the kill and the limit "
            f"{_gib(limit * 1024)} is {_gib(base * 1024)}"
            if limit
            else f"resident {_gib(usage * 1024)} at the kill"
        )
        lines.append(
            f"{which}; {_gib(base * 1024)} x 1.25 headroom = {_gib(need)}, rounded up to {proposed}"
        )
    else:
        proposed = f"{current} x 1.25" if current else "current limit x 1.25"
        lines.append(
            "the kill lines carry no RSS or limit figure: raise the limit by 25% "
            "and re-measure peak RSS (kubectl top / docker stats) in the next run"
        )
    return Lever(
        knob="container memory limit",
        current=current,
        proposed=proposed,
        arithmetic=tuple(lines),
        verify=DOCS[Class.HOST_PRESSURE].verify,
        do_not=DOCS[Class.HOST_PRESSURE].do_not,
        rationale="the kernel or container runtime killed the engine for host memory",
        engine=engine,
    )


def _first_int(events: Sequence[Event], key: str) -> int | None:
    for e in events:
        v = e.fields.get(key)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _gib(n_bytes: float, up: bool = False) -> str:
    g = n_bytes / 1024**3
    return f"{math.ceil(g)} GiB" if up else f"{g:.1f} GiB"
