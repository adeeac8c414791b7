"""The pipeline, end to end: sources -> scan -> events -> windows -> rules -> advice.

Renderers take the Report this returns; the exit code is computed here, once, so
every format agrees on it.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from preemptdiag import __version__
from preemptdiag.diagnose.advice import choose_lever
from preemptdiag.diagnose.rules import classify, preemption_visibility, verdict
from preemptdiag.ingest.promscrape import Scrape, looks_like_prometheus, parse_scrapes, summarize
from preemptdiag.ingest.rotation import rotation_base
from preemptdiag.ingest.sources import Source, open_source
from preemptdiag.model.config import DEFAULT_FAIL_ON, Thresholds
from preemptdiag.model.errors import DiagError
from preemptdiag.model.records import (
    Class,
    Event,
    FieldValue,
    Hit,
    Kind,
    Report,
    ScanStats,
    Verdict,
    Window,
)
from preemptdiag.render.redact import Redactor
from preemptdiag.scan.limits import too_many
from preemptdiag.scan.matcher import Matcher, ScanResult
from preemptdiag.scan.parallel import plan, scan_parallel
from preemptdiag.scan.passes import scan_fast
from preemptdiag.scan.signatures import load
from preemptdiag.timeline.events import TimeContext, build_events, detect_engine
from preemptdiag.timeline.knobs import read_facts
from preemptdiag.timeline.windows import build_windows

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Options:
    files: tuple[str, ...]
    window_seconds: int = 60
    thresholds: Thresholds = field(default_factory=Thresholds)
    fail_on: tuple[Class, ...] = DEFAULT_FAIL_ON
    signatures_dir: Path | None = None
    time: TimeContext = field(default_factory=TimeContext)
    since: datetime | None = None
    until: datetime | None = None
    # (--since, --until) given as a bare time of day: placed on the log's first date
    clock_range: tuple[bool, bool] = (False, False)
    jobs: int = 1
    redact: bool = True
    strict: bool = False
    max_events: int | None = None  # signal lines kept at most (limits.py); None: no limit
    rollup: bool = True  # merge stats lines per stream and minute when exact (rollup.py)


@dataclass(frozen=True, slots=True)
class Outcome:
    report: Report
    exit_code: int
    events: tuple[Event, ...]


ProgressFactory = Callable[[int], Callable[[int], None]]


def scan_sources(
    sources: Sequence[Source],
    matcher: Matcher,
    jobs: int,
    progress: ProgressFactory | None = None,
    preload: Callable[[], None] | None = None,
    max_hits: int | None = None,
    rollup: bool = False,
) -> list[ScanResult]:
    """Scan every source, in order. With several jobs and enough work the files go
    to forked processes (parallel.plan) and the parent runs `preload` meanwhile;
    otherwise this process scans, with `preload` in a thread only while a pipe is
    read (see _in_background). More than `max_hits` hits in all is a DiagError
    naming the source that crossed it (limits.py)."""
    tasks = plan(sources, jobs, matcher.finder())
    done: dict[int, ScanResult] = {}
    if tasks:
        size = sum(sources[i].size or 0 for i in {i for i, _ in tasks})
        start = partial(progress, size) if progress and size else None
        done = scan_parallel(sources, tasks, matcher, jobs, start, preload, max_hits, rollup)
        preload = None
        _check_limit(sources, done, max_hits)
    piped = any(s.path is None for s in sources)
    kept = sum(len(r.hits) for r in done.values())
    with _in_background(preload) if preload is not None and piped else nullcontext():
        for i, src in enumerate(sources):
            if i in done:
                continue
            left = None if max_hits is None else max_hits - kept
            start_fn = partial(progress, src.size) if progress and src.size else None
            progress_fn = start_fn() if start_fn else None
            done[i] = scan_fast(src, matcher, progress=progress_fn, max_hits=left, rollup=rollup)
            kept += len(done[i].hits)
    _check_limit(sources, done, max_hits)
    return [done[i] for i in range(len(sources))]


def _check_limit(
    sources: Sequence[Source], done: Mapping[int, ScanResult], max_hits: int | None
) -> None:
    """A DiagError naming the source, in input order, where the hits pass `max_hits`."""
    if max_hits is None:
        return
    kept = 0
    for i, src in enumerate(sources):
        kept += len(done[i].hits) if i in done else 0
        if kept > max_hits:
            raise too_many(src.name, max_hits)


def _import_polars() -> None:
    # Only to start the import early; if polars is missing, windows.py says so.
    with suppress(ImportError):
        importlib.import_module("polars")


def _scrape_event(
    s: Scrape,
    replica: str,
    sig: str,
    kind: Kind,
    fields: dict[str, FieldValue],
    text: str,
    preemptions: int = 0,
) -> Event:
    return Event(
        source=s.source,
        line=1,
        sig=sig,
        kind=kind,
        ts=s.ts,
        fields=fields,
        text=text,
        replica=replica,
        preemptions=preemptions,
    )


def _scrape_events(scrapes: Sequence[Scrape], replica: str) -> list[Event]:
    """Scrapes become events on the log's timeline: gauges as stats, counter as a
    cumulative preemption count (its deltas are spread like V0's sampled counter)."""
    out: list[Event] = []
    prev: float | None = None
    for i, s in enumerate(sorted(scrapes, key=lambda s: (s.ts is None, s.ts or _EPOCH))):
        v = s.values
        gauges: dict[str, FieldValue] = {
            "kv_usage": v.get("kv_usage_perc"),
            "running": int(v["running"]) if "running" in v else None,
            "waiting": int(v["waiting"]) if "waiting" in v else None,
            "engine": s.engine,
        }
        out.append(
            _scrape_event(
                s,
                replica,
                "prometheus.gauges",
                Kind.STATS,
                gauges,
                f"/metrics scrape {s.source} (gauges)",
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
                )
            )
        total = v.get("preemptions_total")
        if total is None:
            continue
        delta = 0.0 if prev is None else (total - prev if total >= prev else total)
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
            )
        )
    return out


_SYSTEM_PREFIXES = ("system.", "k8s.", "docker.", "ray.")
# A scrape dated only by its file's time joins a log only within this of its span: a
# copied file's time is when it was copied, not when it was scraped.
_MTIME_SLACK_S = 3600.0


def _placed_scrapes(
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
        own = parse_scrapes(_read_text(p), p.name, None)
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


def _rotation_notes(events: Sequence[Event]) -> list[str]:
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


# System evidence counts for an engine from shortly before its first line (a kill
# of the previous instance is not this one's) to a while after its last (the log stops
# at the kill, the container runtime reports it later).
_SYSTEM_BEFORE_S = 60.0
_SYSTEM_AFTER_S = 600.0


def _attach_system_sources(events: list[Event], notes: list[str]) -> list[Event]:
    """Kernel, kubectl and docker files describe the engine's node or pod: each
    system event joins the one engine replica whose span holds it; with several
    candidates it stays apart (which replica a node kill hit cannot be told from
    the lines); outside every engine's span it is set aside with a note, so old
    evidence never drives the verdict."""
    engine = [e for e in events if not e.sig.startswith(_SYSTEM_PREFIXES)]
    spans: dict[str, tuple[datetime, datetime]] = {}
    for e in engine:
        if e.ts is not None:
            lo, hi = spans.get(e.replica, (e.ts, e.ts))
            spans[e.replica] = (min(lo, e.ts), max(hi, e.ts))
    engine_replicas = {e.replica for e in engine}
    system = [e for e in events if e.replica not in engine_replicas]
    if not system or not engine_replicas:
        return events

    def holders(t: datetime | None) -> list[str]:
        if t is None:
            return sorted(engine_replicas) if len(engine_replicas) == 1 else []
        return [
            r
            for r, (lo, hi) in spans.items()
            if (lo - t).total_seconds() <= _SYSTEM_BEFORE_S
            and (t - hi).total_seconds() <= _SYSTEM_AFTER_S
        ]

    moved: dict[str, set[str]] = {}
    outside: list[Event] = []
    out: list[Event] = []
    for e in events:
        if e.replica in engine_replicas:
            out.append(e)
            continue
        hold = holders(e.ts)
        if len(hold) == 1:
            moved.setdefault(hold[0], set()).add(e.replica)
            out.append(replace(e, replica=hold[0]))
        elif not hold and spans and e.ts is not None:
            outside.append(e)
        else:
            out.append(e)
    for target, sources in sorted(moved.items()):
        notes.append(
            f"system evidence from {', '.join(sorted(sources))} placed on the timeline of {target}"
        )
    if outside:
        first, last = min(e.ts for e in outside if e.ts), max(e.ts for e in outside if e.ts)
        files = ", ".join(sorted({e.source for e in outside}))
        notes.append(
            f"{len(outside)} system event(s) from {files} ({first:%Y-%m-%d %H:%M} to "
            f"{last:%Y-%m-%d %H:%M}) lie outside every engine log's span and were not used "
            "(check --year/--tz, or that the files belong to this incident)"
        )
    return out


def _scrape_note(summary: dict[str, object]) -> str:
    def num(key: str, fmt: str) -> str:
        v = summary.get(key)
        return format(v, fmt) if isinstance(v, int | float) else "?"

    parts = [f"/metrics: {summary.get('scrapes')} scrape(s) over {num('span_seconds', '.0f')} s"]
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


def _redact_events(evs: Sequence[Event], redactor: Redactor) -> tuple[Event, ...]:
    return tuple(replace(e, text=redactor(e.text)) for e in evs)


def _redact_window(w: Window, redactor: Redactor) -> Window:
    return replace(w, evidence=_redact_events(w.evidence, redactor))


@contextmanager
def _in_background(work: Callable[[], None]) -> Iterator[None]:
    """Run `work` in a thread while the block runs; joined before leaving.

    Only worth it while the scan waits on a pipe. On a file the thread was measured
    to cost more than it saves (1 GiB: 0.67 s against 0.65 s importing after the
    scan, .gz alike): the import holds the GIL, and Hyperscan's callback for every
    literal hit then waits for it, so the two run one after the other anyway.
    """
    thread = threading.Thread(target=work, name="preload", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def run_analysis(opts: Options, progress: ProgressFactory | None = None) -> Outcome:
    if not opts.files:
        raise DiagError("no input files (pass one or more logs, or - for stdin)")
    if opts.files.count("-") > 1:
        raise DiagError("stdin (-) can be read only once; pass it once")
    sigs = load(opts.signatures_dir)
    sources = [open_source(f) for f in opts.files]
    logs = [s for s in sources if not looks_like_prometheus(s.head)]
    proms = [s for s in sources if looks_like_prometheus(s.head)]
    rollup = opts.rollup and _rollup_exact(opts)
    matcher = Matcher(sigs)
    results = scan_sources(
        logs, matcher, opts.jobs, progress, _import_polars, opts.max_events, rollup
    )
    hits_by_source: list[tuple[Sequence[Hit], datetime | None]] = [
        (r.hits, s.mtime) for r, s in zip(results, logs, strict=True)
    ]
    events = build_events(hits_by_source, opts.time)
    notes: list[str] = _rotation_notes(events)
    events = _attach_system_sources(events, notes)
    if proms:
        replicas = sorted({e.replica for e in events}) or ["metrics"]
        if len(replicas) > 1:
            notes.append(f"/metrics scrapes attached to {replicas[0]} (several replicas present)")
        # One counter series across all scrape files: deltas run from file to file.
        scrapes, unplaced = _placed_scrapes(proms, events)
        if unplaced:
            notes.append(
                f"/metrics: {', '.join(unplaced)} carry no time of their own and their file "
                "times fall outside the log's span (or are one copy time), so they cannot be "
                "placed on its timeline and were not used (scrape with `date -u` or `# scraped_at: ...` first, or "
                "keep file times: cp -p)"
            )
        if scrapes:
            events.extend(_scrape_events(scrapes, replicas[0]))
            notes.append(_scrape_note(summarize(scrapes)))
        events.sort(key=lambda e: (e.ts is None, e.ts or _EPOCH, e.source, e.line))
    # Configuration and capacity are facts of a replica, whatever --since/--until
    # keep: the filter narrows the windows and their evidence, not what the engine is.
    unfiltered = events
    since, until = _time_range(opts, events)
    if since or until:
        events = [
            e
            for e in events
            if e.ts is None
            or ((since is None or e.ts >= since) and (until is None or e.ts < until))
        ]
    info = detect_engine(events)
    vis = preemption_visibility(events, info)
    windows = classify(
        build_windows(events, opts.window_seconds, opts.thresholds),
        opts.thresholds,
        vis,
        opts.window_seconds,
    )
    v = verdict(windows, opts.thresholds, vis, opts.window_seconds, events)
    if not windows and unfiltered:
        v = replace(v, why=_filtered_out(unfiltered, since, until), filtered_out=True)
    facts = read_facts(_replica_events(unfiltered, v.replica))
    lever = choose_lever(v, windows, events, facts, info, opts.thresholds)
    redactor = Redactor(enabled=opts.redact)
    v = replace(v, evidence=_redact_events(v.evidence, redactor))
    windows = [_redact_window(w, redactor) for w in windows]
    notes.extend(_notes(events, results, v, vis.reason, info.generation))
    notes.extend(_alignment_notes(results, logs, opts))
    notes.extend(_replica_notes(windows, opts.fail_on))
    stats = _scan_stats(results, logs, proms)
    report = Report(
        verdict=v,
        lever=lever,
        windows=tuple(windows),
        engine=info,
        stats=stats,
        thresholds=opts.thresholds.as_dict(),
        window_seconds=opts.window_seconds,
        notes=tuple(notes),
        tool_version=__version__,
    )
    return Outcome(report=report, exit_code=exit_code(v, opts), events=tuple(events))


def _time_range(opts: Options, events: Sequence[Event]) -> tuple[datetime | None, datetime | None]:
    """--since/--until; a bare time of day is read on the date the log starts (in
    --tz), and an --until clock at or before --since's is on the next day."""
    since, until = opts.since, opts.until
    first = next((e.ts for e in events if e.ts is not None), None)
    if first is None:
        return since, until
    day = first.astimezone(opts.time.tz).date()

    def on_day(t: datetime) -> datetime:
        return datetime.combine(day, t.timetz().replace(tzinfo=None), tzinfo=opts.time.tz)

    if since is not None and opts.clock_range[0]:
        since = on_day(since)
    if until is not None and opts.clock_range[1]:
        until = on_day(until)
        if since is not None and until <= since:
            until += timedelta(days=1)
    return since, until


def _filtered_out(events: Sequence[Event], since: datetime | None, until: datetime | None) -> str:
    stamps = [e.ts for e in events if e.ts is not None]
    span = f"{min(stamps):%Y-%m-%d %H:%M:%S} to {max(stamps):%Y-%m-%d %H:%M:%S}" if stamps else "?"
    lo = f"{since:%Y-%m-%d %H:%M:%S}" if since else "the start"
    hi = f"{until:%Y-%m-%d %H:%M:%S}" if until else "the end"
    return (
        f"{len(events)} event(s) matched, but none fall between {lo} and {hi} "
        f"(--since/--until); the input spans {span} UTC"
    )


def _replica_events(events: Sequence[Event], replica: str) -> list[Event]:
    """The events of one replica (all of them when the verdict names none): its
    config and capacity must not come from another engine in the same run."""
    own = [e for e in events if e.replica == replica]
    return own if replica and own else list(events)


def _rollup_exact(opts: Options) -> bool:
    """Whether a clock minute always falls in one window and on one side of
    --since/--until, so merging a minute's stats lines changes no result."""

    def on_minute(t: datetime | None) -> bool:
        return t is None or (t.second == 0 and t.microsecond == 0)

    # A fixed zone must be whole minutes; named zones have been since 1972.
    offset = opts.time.tz.utcoffset(None)
    return (
        opts.window_seconds % 60 == 0
        and on_minute(opts.since)
        and on_minute(opts.until)
        and (offset is None or offset.total_seconds() % 60 == 0)
    )


def _read_text(src: Source) -> str:
    from preemptdiag.ingest.sources import open_binary

    with open_binary(src) as f:
        return f.read().decode("utf-8", errors="replace")


def exit_code(v: Verdict, opts: Options) -> int:
    if not v.evidence_found:
        return 2 if opts.strict else 0
    return 1 if v.cls in opts.fail_on else 0


def _scan_stats(
    results: Sequence[ScanResult], logs: Sequence[Source], proms: Sequence[Source]
) -> ScanStats:
    recognised: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    for r in results:
        recognised.update(r.recognised)
        skipped.update(r.skipped)
    if proms:
        recognised["prometheus scrape files"] += len(proms)
    return ScanStats(
        files=tuple(s.name for s in (*logs, *proms)),
        lines_read=sum(r.lines_read for r in results),
        bytes_read=sum(r.bytes_read for r in results),
        recognised=dict(sorted(recognised.items())),
        skipped=dict(sorted(skipped.items())),
    )


def _notes(
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
    if total_lines == 0:
        notes.append("the input was empty")
    return notes


def _alignment_notes(
    results: Sequence[ScanResult], logs: Sequence[Source], opts: Options
) -> list[str]:
    """Say how each input was placed in time, so a cross-file order is never
    presented as more certain than it is."""
    out: list[str] = []
    guessed: list[str] = []
    for r, src in zip(results, logs, strict=True):
        if not r.hits:
            continue
        dated = any(
            h.ts_wrapper and h.ts_wrapper.split("|")[0] in ("iso", "sql", "dmesg_t") for h in r.hits
        )
        engine_only = any(h.ts_engine for h in r.hits)
        uptime_only = any(h.ts_wrapper and h.ts_wrapper.startswith("uptime|") for h in r.hits)
        if dated:
            continue
        if engine_only or any(
            h.ts_wrapper and h.ts_wrapper.startswith(("syslog|", "clock|")) for h in r.hits
        ):
            how = f"--year {opts.time.year}" if opts.time.year else "the file's modification time"
            guessed.append(f"{src.name} (year/date from {how})")
        elif uptime_only and opts.time.boot_time is None:
            out.append(
                f"{src.name}: dmesg uptime stamps need --boot-time (or a journald line "
                "with both stamps); placed by file order only"
            )
        else:
            out.append(
                f"{src.name}: no timestamps; its events are dated from the lines around "
                "them or kept in one undated window"
            )
    if guessed and len([r for r in results if r.hits]) > 1:
        zone = "UTC" if opts.time.tz is None else str(opts.time.tz)
        out.append(
            "timestamps without a year/zone in "
            + "; ".join(guessed)
            + f", read as {zone}: cross-file order is approximate (use --year/--tz)"
        )
    return out


def _replica_notes(windows: Sequence[Window], fail_on: Sequence[Class]) -> list[str]:
    firsts: dict[str, Window] = {}
    for w in windows:
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


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 8))
