"""Thresholds and settings: defaults in one place, overridable from a config file.

Config is read from `preemptdiag.toml` (top level) or `[tool.preemptdiag]` in
`pyproject.toml`, searched from the current directory upwards; command-line flags win.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from preemptdiag.model.errors import DiagError
from preemptdiag.model.records import Class

DEFAULT_FAIL_ON = (Class.THRASH_LOOP, Class.ALLOCATION_FAILURE, Class.HOST_PRESSURE)


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Every number the rules compare against. The report prints these."""

    # KV usage (percent) at or above which the pool counts as exhausted.
    kv_pressure_pct: float = 95.0
    # Consecutive windows with preemption that make a loop rather than a burst.
    thrash_min_windows: int = 3
    # Preemptions per minute in a single window that are a loop on their own.
    thrash_rate_per_min: float = 30.0
    # A V0 cumulative counter this high, seen with KV pressure and a growing queue,
    # says the engine has been preempting for a while even in a short excerpt.
    thrash_cumulative: int = 51
    # Share of a window's stats lines with Waiting > 0 that makes it queueing (one
    # stray waiting request between agent turns is not a queue).
    queue_min_share: float = 0.5
    # KV usage below which a non-empty queue with nothing running is a stall, not load.
    stall_kv_pct: float = 5.0
    # V0 prompt tok/s over generation tok/s that signals re-prefill.
    reprefill_ratio: float = 3.0
    # Windows of pinned KV + waiting needed before a blind (V1) log is "suspected".
    suspect_min_windows: int = 2
    # Headroom factor in the max-num-seqs formula.
    headroom: float = 0.9
    # max_num_seqs default when the log does not show it (vLLM's default).
    default_max_num_seqs: int = 256
    # Maximum concurrency (x) below which one request can fill the KV pool.
    single_request_concurrency: float = 2.0

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class FileConfig:
    thresholds: Thresholds
    window: str | None = None
    fail_on: tuple[str, ...] | None = None
    signatures: Path | None = None
    source: Path | None = None


def _find_config(start: Path) -> tuple[Path, dict[str, Any]] | None:
    for d in (start, *start.parents):
        own = d / "preemptdiag.toml"
        if own.is_file():
            return own, _read(own)
        py = d / "pyproject.toml"
        if py.is_file():
            try:
                data = _read(py)
            except DiagError:
                continue  # another project's broken pyproject.toml is not ours to judge
            tool = data.get("tool")
            section = tool.get("preemptdiag") if isinstance(tool, dict) else None
            if isinstance(section, dict):
                return py, section
    return None


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DiagError(f"cannot read config {path}: {exc}") from None


_TOP_KEYS = frozenset({"window", "fail-on", "fail_on", "signatures", "thresholds"})
# Where a threshold makes sense at all (percentages, shares, the headroom factor).
_THRESHOLD_RANGES: dict[str, tuple[float, float]] = {
    "kv_pressure_pct": (1.0, 100.0),
    "stall_kv_pct": (0.0, 100.0),
    "queue_min_share": (0.0, 1.0),
    "headroom": (0.05, 1.0),
    "single_request_concurrency": (0.0, 1000.0),
}


def load_config(explicit: Path | None = None, cwd: Path | None = None) -> FileConfig:
    if explicit is not None:
        if not explicit.is_file():
            raise DiagError(f"config file not found: {explicit}")
        data = _read(explicit)
        if explicit.name == "pyproject.toml":
            tool = data.get("tool")
            data = tool.get("preemptdiag", {}) if isinstance(tool, dict) else {}
            if not isinstance(data, dict):
                raise DiagError(f"{explicit}: [tool.preemptdiag] must be a table")
        found: tuple[Path, dict[str, Any]] | None = (explicit, data)
    else:
        found = _find_config((cwd or Path.cwd()).resolve())
    if found is None:
        return FileConfig(thresholds=Thresholds())
    path, data = found
    known = {f.name: f.type for f in fields(Thresholds)}
    raw_thr = data.get("thresholds", {})
    if not isinstance(raw_thr, dict):
        raise DiagError(f"{path}: [thresholds] must be a table")
    updates: dict[str, Any] = {}
    for k, v in raw_thr.items():
        if k not in known:
            raise DiagError(f"{path}: unknown threshold {k!r} (known: {', '.join(sorted(known))})")
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            raise DiagError(f"{path}: threshold {k!r} must be a finite number")
        if known[k] == "int" and (not float(v).is_integer() or v < 1):
            raise DiagError(f"{path}: threshold {k!r} must be a whole number >= 1")
        lo, hi = _THRESHOLD_RANGES.get(k, (0.0, math.inf))
        if not lo <= v <= hi:
            raise DiagError(f"{path}: threshold {k!r} must be between {lo:g} and {hi:g}")
        updates[k] = int(v) if known[k] == "int" else float(v)
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise DiagError(
            f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_TOP_KEYS))})"
        )
    fail_on = data.get("fail-on", data.get("fail_on"))
    if isinstance(fail_on, str):
        fail_on = [s.strip() for s in fail_on.split(",") if s.strip()]
    if fail_on is not None and (
        not isinstance(fail_on, list) or not all(isinstance(c, str) for c in fail_on)
    ):
        raise DiagError(f"{path}: fail-on must be a class name or a list of them")
    window = data.get("window")
    if window is not None and not isinstance(window, str | int):
        raise DiagError(f'{path}: window must be a duration such as "60s"')
    sig = data.get("signatures")
    if sig is not None and not isinstance(sig, str):
        raise DiagError(f"{path}: signatures must be a directory path")
    return FileConfig(
        thresholds=replace(Thresholds(), **updates),
        window=str(data["window"]) if "window" in data else None,
        fail_on=tuple(fail_on) if fail_on is not None else None,
        signatures=(path.parent / sig) if isinstance(sig, str) else None,
        source=path,
    )


def parse_fail_on(values: tuple[str, ...] | list[str]) -> tuple[Class, ...]:
    out: list[Class] = []
    for v in values:
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            if part == "none":
                continue
            try:
                out.append(Class(part))
            except ValueError:
                known = ", ".join(c.value for c in Class)
                raise DiagError(
                    f"unknown class in --fail-on: {part!r} (known: {known}, none)"
                ) from None
    return tuple(out)


# A window longer than a week says nothing a week does not, and keeps the arithmetic
# of window starts far from datetime's limits.
MAX_WINDOW_S = 7 * 24 * 3600


def parse_duration(text: str) -> int:
    """'60s', '5m', '1h', '90' -> seconds."""
    t = text.strip().lower()
    mult = 1
    if t.endswith("ms"):
        raise DiagError(f"window must be at least 1 second: {text!r}")
    if t and t[-1] in "smh":
        mult = {"s": 1, "m": 60, "h": 3600}[t[-1]]
        t = t[:-1]
    try:
        value = float(t)
    except ValueError:
        raise DiagError(f"not a duration: {text!r} (use e.g. 60s, 5m, 1h)") from None
    if not math.isfinite(value) or value * mult > MAX_WINDOW_S:
        raise DiagError(f"window must be at most 7 days: {text!r}")
    seconds = int(value * mult)
    if seconds < 1:
        raise DiagError(f"window must be at least 1 second: {text!r}")
    return seconds
