"""Records of `fleet`: every replica of a store judged by the same rules, worst first."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from preemptdiag.model.records import Lever, Verdict


@dataclass(frozen=True, slots=True)
class FleetRow:
    """One replica: its verdict and lever, and the figures its line shows."""

    replica: str
    labels: Mapping[str, str]
    engine: str
    verdict: Verdict
    lever: Lever
    kv_peak: float | None  # percent
    preemptions: float | None  # None: no preemption counter in the store
    preemptions_per_min: float | None
    waiting_trend: str  # growing | falling | flat | none (nothing waited)
    waiting_max: int | None
    restarts: int
    minutes: float | None  # span of its windows


@dataclass(frozen=True, slots=True)
class FleetReport:
    url: str
    selector: str
    start: datetime
    end: datetime
    step_s: int
    queries: int
    window_seconds: int
    rows: tuple[FleetRow, ...]  # worst first
    counts: Mapping[str, int]  # class -> replicas, most severe first
    fail_on: tuple[str, ...]
    thresholds: Mapping[str, Any]
    tool_version: str = ""
    notes: tuple[str, ...] = field(default=())
