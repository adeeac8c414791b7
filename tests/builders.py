"""Record builders shared by the tests: one place that knows every Window field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from preemptdiag.model.records import Event, Kind, Window

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)

# A calm, fully observed minute: tests override only what their scenario is about.
WINDOW_DEFAULTS: dict[str, Any] = dict(
    replica="a.log", n_events=12, n_stats=12, preemptions=0.0, preemptions_lower_bound=False,
    max_cumulative=None, kv_max=50.0, kv_mean=45.0, running_max=20, running_mean=18.0,
    waiting_first=0, waiting_last=0, waiting_max=0, swapped_first=0, swapped_last=0,
    swapped_max=0, prompt_tput=100.0, gen_tput=500.0, alloc_failures=0, host_ooms=0,
    engine_deaths=0, swap_warnings=0, evidence=(), waiting_share=0.0,
)  # fmt: skip


def make_window(minute: int, **overrides: Any) -> Window:
    fields = {
        **WINDOW_DEFAULTS,
        "start": T0 + timedelta(minutes=minute),
        "end": T0 + timedelta(minutes=minute + 1),
        **overrides,
    }
    return Window(**fields)


def make_event(
    kind: Kind, fields: dict[str, Any], minute: int = 0, source: str = "a", sig: str = "s"
) -> Event:
    return Event(
        source=source, line=minute + 1, sig=sig, kind=kind,
        ts=T0 + timedelta(minutes=minute), fields=fields, text=str(fields.get("subtype", "")),
    )  # fmt: skip
