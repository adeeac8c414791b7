"""The report's notes: how inputs were read (rotated sets, dates guessed), what the log
cannot show, and which replica failed first."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime

from preemptdiag.diagnose.stories import aggregated_engines
from preemptdiag.ingest.rotation import rotation_base
from preemptdiag.ingest.sources import Source
from preemptdiag.model.records import Class, Event, Kind, Verdict, Window, window_columns
from preemptdiag.scan.matcher import ScanResult
from preemptdiag.timeline.events import TimeContext


def rotation_notes(events: Sequence[Event]) -> list[str]:
    """Which inputs were read as one rotated log (events.build_events), oldest first."""
    first_seen: dict[str, dict[str, datetime]] = {}
    bases: dict[str, str] = {}  # one name check per file, not per event
    for e in events:
        if e.source not in bases:
            bases[e.source] = rotation_base(e.source)
        if e.ts is not None and bases[e.source] == e.replica:
            first_seen.setdefault(e.replica, {}).setdefault(e.source, e.ts)  # in time order
    return [
        f"{replica}: read as one log from its rotated files, oldest first: "
        + ", ".join(sorted(files, key=files.__getitem__))
        for replica, files in sorted(first_seen.items())
        if len(files) > 1
    ]


def visibility_notes(
    events: Sequence[Event],
    results: Sequence[ScanResult],
    v: Verdict,
    visibility: str,
    generation: str | None,
) -> list[str]:
    notes: list[str] = []
    if any(e.lower_bound for e in events if e.kind is Kind.PREEMPTION):
        notes.append(
            "preemption counts marked + are lower bounds (sampled V0 warnings or lines "
            "without a counter)"
        )
    if v.evidence_found and all(e.ts is None for e in events):
        notes.append("no line carried a timestamp: the whole input is one window")
    if (
        generation == "v1"
        and any(e.kind is Kind.STATS for e in events)
        and not any(e.kind is Kind.PREEMPTION for e in events)
    ):
        notes.append(f"preemption visibility: {visibility}")
    total_lines = sum(r.lines_read for r in results)
    if results and total_lines == 0:  # no log at all (scrapes, a store) is not empty input
        notes.append("the input was empty")
    return notes


def how_dated(r: ScanResult, time: TimeContext, src: Source) -> str:
    """How one input's stamps got their date and year."""
    if any(h.ts_wrapper and h.ts_wrapper.dated for h in r.hits):
        return "dated wrapper stamps"
    if any(h.ts_engine for h in r.hits) or any(
        h.ts_wrapper and h.ts_wrapper.kind in ("syslog", "clock") for h in r.hits
    ):
        if time.year:
            return f"--year {time.year}"
        return "the file's modification time" if src.mtime else "the time stdin was read"
    if any(h.ts_wrapper and h.ts_wrapper.kind == "uptime" for h in r.hits):
        return "dmesg uptime + --boot-time" if time.boot_time else "dmesg uptime, no boot time"
    return "no timestamps"


def alignment_notes(dated: Sequence[tuple[str, str | None]], time: TimeContext) -> list[str]:
    """Say how each input was placed in time, so a cross-file order is never
    presented as more certain than it is. `dated`: each log's name and how_dated
    (None: no hits)."""
    out: list[str] = []
    guessed: list[str] = []
    for name, how in dated:
        if how is None:
            continue
        if how == "dated wrapper stamps" or how == "dmesg uptime + --boot-time":
            continue
        if how.startswith(("--year", "the file", "the time stdin")):
            guessed.append(f"{name} (year/date from {how})")
        elif how.startswith("dmesg uptime"):
            out.append(
                f"{name}: dmesg uptime stamps need --boot-time (or a journald line "
                "with both stamps); placed by file order only"
            )
        else:
            out.append(
                f"{name}: no timestamps; its events are dated from the lines around "
                "them or kept in one undated window"
            )
    if guessed and len([how for _, how in dated if how is not None]) > 1:
        zone = str(time.tz)
        # Name only the options not given: "use --year/--tz" after --year read as
        # advice to do what was done. (--tz's default is UTC itself.)
        given = (("--year", time.year is not None), ("--tz", time.tz is not UTC))
        missing = [flag for flag, was in given if not was]
        order = (
            f"cross-file order is approximate (use {'/'.join(missing)})"
            if missing
            else "cross-file order holds if every file was written in that zone"
        )
        out.append(
            "timestamps without a year/zone in " + "; ".join(guessed) + f", read as {zone}: {order}"
        )
    return out


_DP_RANK = re.compile(r"DP(\d+) ")


def engine_notes(events: Sequence[Event]) -> list[str]:
    """Say when one replica's stats lines come from several engines (data parallel with
    one API server: `Engine 000: ...`, `Engine 001: ...`), read together."""
    seen: dict[str, set[tuple[int, str]]] = {}
    summed: dict[str, int] = {}
    for e in events:
        if e.kind is not Kind.STATS:
            continue
        idx = e.fields.get("engine_idx")
        dp = _DP_RANK.match(e.proc or "")
        if isinstance(idx, int):  # (a rollup holds one engine's lines: rollup.STREAM_FIELDS)
            seen.setdefault(e.replica, set()).add((idx, f"Engine {idx:03d}"))
        elif dp is not None:  # SGLang's `[stamp DP1 TP0]`: its own stream already
            seen.setdefault(e.replica, set()).add((int(dp[1]), f"DP{dp[1]}"))
        if (n := aggregated_engines(e)) > 1:
            summed[e.replica] = max(n, summed.get(e.replica, 0))
    notes = [
        f"{replica}: stats lines of {len(named)} engines (data parallel: "
        + ", ".join(name for _, name in sorted(named))
        + ") are read as one replica: KV usage, Running and Waiting are each engine's, so "
        "a window's maxima are its busiest engine's and its means and token rates one "
        "engine's average, not their sum"
        for replica, named in sorted(seen.items())
        if len(named) > 1
    ]
    notes += [
        f"{replica}: stats lines of {n} Engines Aggregated (--aggregate-engine-logging): "
        "Running and Waiting are the engines' sums and KV usage their pools' mean, so one "
        "engine's full pool can hide under a calm mean (each engine's own KV usage is in "
        "/metrics, by its `engine` label)"
        for replica, n in sorted(summed.items())
    ]
    return notes


def spread_notes(windows: Sequence[Window]) -> list[str]:
    """Say when per-window counts are estimates (a sampled counter's delta spread)."""
    (over,) = window_columns(windows, ("preemptions_spread_over",))
    spread = [n for n in over if n]
    if not spread:
        return []
    return [
        "preemption counts marked ~ are estimates: a counter's delta between two V0 "
        f"warnings or two scrapes, spread evenly over the windows with KV pinned between "
        f"them (up to {max(spread)} windows); only their sum is measured"
    ]


def replica_notes(windows: Sequence[Window], fail_on: Sequence[Class]) -> list[str]:
    firsts: dict[str, Window] = {}
    # (only the failing windows are read: a month's calm windows are not made)
    (classes,) = window_columns(windows, ("cls",))
    for w in (windows[i] for i, c in enumerate(classes) if c in fail_on):
        if (
            w.cls in fail_on
            and w.start is not None
            and (
                w.replica not in firsts or w.start < firsts[w.replica].start  # type: ignore[operator]
            )
        ):
            firsts[w.replica] = w
    if len(firsts) < 2:
        return []
    order = sorted(firsts.values(), key=lambda w: w.start)  # type: ignore[arg-type, return-value]
    steps = ", then ".join(f"{w.replica} ({w.cls.value} at {w.start:%H:%M:%S})" for w in order)
    return [f"first replica to fail: {order[0].replica}; order: {steps}"]
