"""Command-line values to pipeline Options: one validating conversion for times, zones,
windows and limits, shared by every command (each bad value is one clear error)."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from preemptdiag.commands.analyze import Options, default_jobs
from preemptdiag.model.config import DEFAULT_FAIL_ON, load_config, parse_duration, parse_fail_on
from preemptdiag.model.errors import DiagError
from preemptdiag.scan.limits import default_max_events
from preemptdiag.timeline.events import TimeContext

_AGO = re.compile(r"(\d{1,6}(?:\.\d+)?)\s*([smhd])")


def parse_time(text: str | None, flag: str) -> datetime | None:
    if text is None:
        return None
    from preemptdiag.model.timeparse import parse_any, parse_iso

    ago = _AGO.fullmatch(text.strip().lower())
    if ago:  # `--since 1h`: that long before now (a store's history, not a log's)
        from datetime import UTC, timedelta

        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[ago.group(2)]
        return datetime.now(UTC) - timedelta(seconds=float(ago.group(1)) * unit)
    dt = parse_iso(text) or parse_any(text)
    if dt is None:
        raise DiagError(
            f"{flag}: not a date/time: {text!r} (use ISO 8601, e.g. 2025-08-19T18:30:00Z)"
        )
    return dt


def clock_only(text: str | None) -> bool:
    """`--since 16:07`: a time of day, read on the log's own date (not today's)."""
    return text is not None and re.fullmatch(r"\s*\d{1,2}:\d\d(?::\d\d)?\s*", text) is not None


def parse_tz(text: str | None) -> Any:
    from datetime import UTC, timedelta, timezone

    if text is None or text.upper() in ("UTC", "Z"):
        return UTC
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-").replace(":", "")
    if len(body) == 4 and body.isdigit() and body.isascii():
        hours, minutes = int(body[:2]), int(body[2:])
        if hours > 23 or minutes > 59:
            raise DiagError(f"--tz: not a UTC offset: {text!r} (from -23:59 to +23:59)")
        return timezone(sign * timedelta(hours=hours, minutes=minutes))
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(text)
    except Exception:
        raise DiagError(
            f"--tz: unknown time zone {text!r} (use UTC, +02:00 or Europe/Berlin)"
        ) from None


def build_options(
    files: list[str],
    window: str | None,
    fail_on: list[str] | None,
    signatures: Path | None,
    year: int | None,
    tz: str | None,
    boot_time: str | None,
    since: str | None,
    until: str | None,
    jobs: int | None,
    no_redact: bool,
    strict: bool,
    config: Path | None,
    max_events: int | None = None,
) -> Options:

    cfg = load_config(config)
    win = parse_duration(window or cfg.window or "60s")
    if fail_on:
        fo = parse_fail_on(fail_on)
    elif cfg.fail_on is not None:
        fo = parse_fail_on(list(cfg.fail_on))
    else:
        fo = DEFAULT_FAIL_ON
    if jobs is not None and not 1 <= jobs <= 256:
        raise DiagError("--jobs must be between 1 and 256")
    if year is not None and not 1970 <= year <= 9000:
        raise DiagError(f"--year must be between 1970 and 9000, not {year}")
    if max_events is not None and max_events < 0:
        raise DiagError("--max-events must be 0 (no limit) or more")
    return Options(
        files=tuple(files),
        window_seconds=win,
        thresholds=cfg.thresholds,
        fail_on=fo,
        signatures_dir=signatures or cfg.signatures,
        time=TimeContext(
            year=year, tz=parse_tz(tz), boot_time=parse_time(boot_time, "--boot-time")
        ),
        since=parse_time(since, "--since"),
        until=parse_time(until, "--until"),
        clock_range=(clock_only(since), clock_only(until)),
        jobs=jobs if jobs is not None else default_jobs(),
        redact=not no_redact,
        strict=strict,
        max_events=default_max_events() if max_events is None else (max_events or None),
    )


_FORMAT_OF_SUFFIX = {
    ".json": "json",
    ".md": "markdown",
    ".markdown": "markdown",
    ".sarif": "sarif",
    ".txt": "terminal",
}


def plan_outputs(
    formats: list[str] | None, outputs: list[Path], inputs: list[str]
) -> list[tuple[str, Path | None]]:
    """(format, destination) pairs; None is stdout. Without --format each -o takes its
    format from its name; with both they pair by position and must agree. An -o that
    names an input (by any path: a link, ./x) or a second -o to one file is refused
    before anything is read."""
    seen: list[Path] = []
    for dest in outputs:
        if str(dest) == "-":
            continue
        for other in seen:
            if _same(dest, other):
                raise DiagError(f"-o {dest}: named twice; one report per file")
        for name in inputs:
            if name != "-" and _same(dest, Path(name)):
                raise DiagError(f"-o {dest}: that is an input file; it would be overwritten")
        seen.append(dest)
    pairs: list[tuple[str, Path | None]] = []
    if not formats:
        for dest in outputs:
            named = _FORMAT_OF_SUFFIX.get(dest.suffix.lower()) if str(dest) != "-" else "terminal"
            if named is None:
                raise DiagError(
                    f"-o {dest}: cannot tell the format from the name; add --format "
                    "(terminal, markdown, json or sarif)"
                )
            pairs.append((named, None if str(dest) == "-" else dest))
        return pairs or [("terminal", None)]
    if len(outputs) > len(formats):
        raise DiagError("more --output files than --format values")
    for i, fmt in enumerate(formats):
        out: Path | None = outputs[i] if i < len(outputs) else None
        if out is not None and str(out) == "-":
            out = None
        named = _FORMAT_OF_SUFFIX.get(out.suffix.lower()) if out is not None else None
        if named is not None and named != fmt:
            raise DiagError(
                f"-o {out} is {named} by its name but pairs with --format {fmt} "
                "(the n-th -o takes the n-th --format)"
            )
        pairs.append((fmt, out))
    return pairs


def _same(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return a.samefile(b)
    except OSError:
        return False
    return a.resolve() == b.resolve()
