"""The pipeline, end to end: sources -> scan -> events -> windows -> rules -> advice.

Renderers take the Report this returns; the exit code is computed here, once, so
every format agrees on it.
"""

from __future__ import annotations

import importlib
import math
import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack, nullcontext, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta, tzinfo
from enum import Enum
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

from preemptdiag import __version__
from preemptdiag.commands.notes import (
    alignment_notes,
    engine_notes,
    how_dated,
    replica_notes,
    rotation_notes,
    spread_notes,
    visibility_notes,
)
from preemptdiag.diagnose.advice import choose_lever
from preemptdiag.diagnose.rules import classify, verdict
from preemptdiag.diagnose.visibility import Visibility, preemption_visibility
from preemptdiag.diagnose.window_rules import calm_judge
from preemptdiag.ingest.promscrape import looks_like_prometheus
from preemptdiag.ingest.scrape_series import summarize
from preemptdiag.ingest.sources import Source, open_source
from preemptdiag.ingest.spool import spooled
from preemptdiag.model.config import DEFAULT_FAIL_ON, Thresholds
from preemptdiag.model.errors import DiagError
from preemptdiag.model.gcpause import cyclic_gc_paused
from preemptdiag.model.records import (
    Class,
    EngineInfo,
    Event,
    Hit,
    Kind,
    Lever,
    ReadWindow,
    Report,
    ScanStats,
    Verdict,
    Window,
    Windows,
    spilling,
    window_runs,
)
from preemptdiag.render.redact import Redactor
from preemptdiag.render.sanitise import sanitised
from preemptdiag.scan.bulk import BIG_BYTES
from preemptdiag.scan.limits import too_many
from preemptdiag.scan.matcher import Matcher, ScanResult
from preemptdiag.scan.parallel import dense, plan, scan_parallel
from preemptdiag.scan.passes import scan_fast
from preemptdiag.scan.rollup import Rollups
from preemptdiag.scan.signatures import Signature, load
from preemptdiag.timeline.attach import attach_system_sources
from preemptdiag.timeline.calm import Placed, Weights, place, replicas_of, trimmed, weights
from preemptdiag.timeline.calm import lines as calm_lines
from preemptdiag.timeline.calm import lines_of as calm_lines_of
from preemptdiag.timeline.calm import noted as calm_noted
from preemptdiag.timeline.calm import pinned as calm_pinned
from preemptdiag.timeline.calm import windows as calm_windows
from preemptdiag.timeline.events import TimeContext, build_events, detect_engine, rollup_ends
from preemptdiag.timeline.knobs import read_facts
from preemptdiag.timeline.replicas import replica_facts
from preemptdiag.timeline.scrapes import (
    counted_once,
    placed_scrapes,
    scrape_events,
    scrape_note,
)
from preemptdiag.timeline.windows import SMALL_TABLE, build_windows

if TYPE_CHECKING:
    # (a type here: the module is imported where a store is read, not on every run)
    from preemptdiag.ingest.prometheus_api import PromSource

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
    # (--since, --until) given as a bare time of day: placed in the log's span (_time_range)
    clock_range: tuple[bool, bool] = (False, False)
    jobs: int = 1
    redact: bool = True
    strict: bool = False
    max_events: int | None = None  # signal lines kept at most (limits.py); None: no limit
    rollup: bool = True  # merge stats lines per stream and minute when exact (rollup.py)
    # keep calm stream-minutes as numbers, not events, when exact (timeline/calm.py);
    # compare reads every stats line's event, so it turns this off
    calm: bool = True
    prometheus: PromSource | None = None  # a Prometheus-API store read beside the files


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
    rollup: int = Rollups.NONE,
    calm_kv: float | None = None,
    calm_window: tuple[int, int] = (1, 0),
) -> list[ScanResult]:
    """Scan every source, in order. With several jobs and enough work the files go
    to forked processes (parallel.plan) and the parent runs `preload` meanwhile when
    one of them is dense in signal lines and their results hold more hits than
    windows.py aggregates in Python; otherwise this process scans, with `preload`
    in a thread once a pipe has given PRELOAD_AFTER bytes (see _Later). More than
    `max_hits` hits in all is a DiagError naming the source that crossed it
    (limits.py)."""
    tasks = plan(sources, jobs, matcher.finder())
    done: dict[int, ScanResult] = {}
    if tasks:
        split = {i for i, _ in tasks}
        size = sum(sources[i].size or 0 for i in split)
        start = partial(progress, size) if progress and size else None
        # (a sparse log's few events are aggregated in Python, windows.SMALL_TABLE:
        # polars imported for them cost a GiB of request logging ~0.3 s of CPU and
        # ~47 MiB, measured with --jobs 2; so are a dense log's once its calm
        # minutes, which need no polars here, are not among them: ~30 MiB of a
        # month's stats lines)
        busy = any(dense(sources[i].head, matcher.finder()) for i in split)
        done = scan_parallel(
            sources,
            tasks,
            matcher,
            jobs,
            start,
            partial(_preload_past, preload) if busy and preload is not None else None,
            max_hits,
            rollup,
            calm_kv,
            calm_window,
        )
        preload = None
        _check_limit(sources, done, max_hits)
    piped = any(s.path is None for s in sources)
    kept = sum(r.held for r in done.values())
    later = _Later(preload) if preload is not None and piped else None
    with later if later is not None else nullcontext():
        for i, src in enumerate(sources):
            if i in done:
                continue
            left = None if max_hits is None else max_hits - kept
            start_fn = partial(progress, src.size) if progress and src.size else None
            progress_fn = start_fn() if start_fn else None
            if progress_fn is None and later is not None and src.path is None:
                progress_fn = later.read
            done[i] = scan_fast(
                src,
                matcher,
                progress=progress_fn,
                max_hits=left,
                rollup=rollup,
                calm_kv=calm_kv,
                calm_window=calm_window,
            )
            kept += done[i].held
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
        kept += done[i].held if i in done else 0
        if kept > max_hits:
            raise too_many(src.name, max_hits)


def _preload_past(preload: Callable[[], None], hits: int) -> bool:
    """`preload`, once the workers' results hold more hits than windows.py aggregates
    without polars; whether it ran."""
    if hits <= SMALL_TABLE:
        return False
    preload()
    return True


def _import_polars() -> None:
    # Only to start the import early; if polars is missing, windows.py says so.
    with suppress(ImportError):
        importlib.import_module("polars")


def _redact_events(evs: Sequence[Event], redactor: Redactor) -> tuple[Event, ...]:
    # An event redaction leaves as it was is kept, not copied: on a month of stats
    # lines, copies of clean lines were most of this stage's time.
    out = []
    for e in evs:
        text = redactor(e.text)
        out.append(e if text == e.text else replace(e, text=text))
    return tuple(out)


# ReadWindows whose evidence lines redaction is asked about at once (Redactor.keeps)
_REDACT_CHUNK = 256


def _redact_windows(windows: Sequence[Window], redactor: Redactor) -> Windows:
    """Each window redacted (_redact_window); a chunk's ReadWindows as they are when
    redaction leaves all their evidence lines as they are (a run of them kept as the
    run it is: window_runs)."""
    parts: list[Sequence[Window]] = []
    for kind, group in window_runs(windows):
        if not issubclass(kind, ReadWindow):
            parts.append([_redact_window(w, redactor) for w in group])
            continue
        reads = cast(Sequence[ReadWindow], group)
        kept = 0  # (group[kept:i] is left as it is)
        for i in range(0, len(reads), _REDACT_CHUNK):
            chunk = reads[i : i + _REDACT_CHUNK]
            if not redactor.keeps(kind.evidence_texts(chunk)):
                parts += (group[kept:i], [_redact_window(w, redactor) for w in chunk])
                kept = i + len(chunk)
        parts.append(group[kept:] if kept else group)
    return Windows(parts)


def _redact_window(w: Window, redactor: Redactor) -> Window:
    if isinstance(w, ReadWindow):
        text = w.evidence_line()[4]
        if redactor(text) == text:
            return w  # (its one evidence line, without making its event)
    evidence = _redact_events(w.evidence, redactor)
    same = all(a is b for a, b in zip(evidence, w.evidence, strict=True))
    return w if same else replace(w, evidence=evidence)


class _Later:
    """Runs `work` in a thread once a pipe has given PRELOAD_AFTER bytes, while the
    scan waits on the rest of it (`read` is the scan's progress callback); joined
    when the block ends.

    Only worth it while the scan waits on a pipe. On a file the thread was measured
    to cost more than it saves (1 GiB: 0.67 s against 0.65 s importing after the
    scan, .gz alike): the import holds the GIL, and Hyperscan's callback for every
    literal hit then waits for it, so the two run one after the other anyway. Not
    from the pipe's first byte: `kubectl logs pod | preemptdiag analyze -` of a
    small log needs no polars at all (windows.SMALL_TABLE), and the import cost it
    ~0.12 s of CPU and ~40 MiB.
    """

    def __init__(self, work: Callable[[], None]) -> None:
        self.work = work
        self.seen = 0
        self.thread: threading.Thread | None = None

    def read(self, size: int) -> None:
        self.seen += size
        if self.thread is None and self.seen >= PRELOAD_AFTER:
            self.thread = threading.Thread(target=self.work, name="preload", daemon=True)
            self.thread.start()

    def __enter__(self) -> _Later:
        return self

    def __exit__(self, *_: object) -> None:
        if self.thread is not None:
            self.thread.join()


# Piped bytes after which polars is imported beside the scan: bulk.BIG_BYTES, the
# size from which a file's scan may turn to polars after its first dense block.
PRELOAD_AFTER = BIG_BYTES


def store_span(opts: Options, now: datetime | None = None) -> tuple[datetime, datetime]:
    """The span a store is read over: --since/--until, else the last hour. A bare
    time of day is today's (a store has no first log line to take a date from)."""
    end = opts.until or (now or datetime.now(UTC))
    start = opts.since or end - timedelta(hours=1)
    if any(opts.clock_range):
        today = datetime.now(opts.time.tz).date()
        if opts.clock_range[0]:
            start = datetime.combine(today, start.timetz().replace(tzinfo=None), opts.time.tz)
        if opts.clock_range[1]:
            end = datetime.combine(today, end.timetz().replace(tzinfo=None), opts.time.tz)
            if end <= start:
                end += timedelta(days=1)
    return start.astimezone(UTC), end.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class Judgement:
    """What the rules make of one set of events: its windows, verdict and lever."""

    verdict: Verdict
    windows: Sequence[Window]
    lever: Lever
    info: EngineInfo
    visibility: Visibility
    events: list[Event]  # within --since/--until


def judge(
    unfiltered: Sequence[Event],
    opts: Options,
    since: datetime | None,
    until: datetime | None,
) -> Judgement:
    """The one path from events to verdict and lever (analyze's and fleet's)."""
    got = _judge(unfiltered, opts, since, until, [], {})
    # (only calm minutes and a late count over rollups make it give up: fleet judges
    # scrapes)
    assert isinstance(got, Judgement)
    return got


class Again(Enum):
    """What analyze scans its logs again without, when what the scan summed cannot
    stand for its lines here."""

    CALM = "calm minutes"  # a calm window shares its window with an event
    # a calm minute at the KV pressure threshold where a V0 counter's delta may be
    # spread onto it (windows.spread_counter_deltas)
    PINNED = "calm minutes at the KV pressure threshold"
    ROLLUPS = "rollups and calm minutes"  # a late V1 count reads every stats line
    # copies of preemption lines across a rollup's edges, or an engine start among
    # its lines (events.build_events' doubts)
    PREEMPTIONS = "rollups of preemption lines"


# A late V1 count (visibility.Settled) reads every stats line's time, count and
# Waiting; a rollup keeps a minute's first and last line, a calm minute none. Its logs
# are read again line by line where that costs little; past these (and from stdin
# streamed once, ingest/spool.py) its spans are read a minute at a time, and the report
# says so (_LATE_ROLLED). A month of stats lines one by one was ~30 s and ~400 MiB.
LINE_BY_LINE_MAX_BYTES = 64 << 20
# The KV usage calm minutes stay under: none, at first. A month of a server with its
# pool pinned and a queue (the usual under steady load) was ~180 MiB and ~9 s as
# events; as calm minutes, PD107 classifies them (window_rules.calm_judge). Where a V0
# counter's delta may be spread onto them, analyze scans again with the pressure
# threshold as the limit (Again.PINNED).
CALM_KV = math.inf
LINE_BY_LINE_MAX_LINES = 20_000


def _judge(
    unfiltered: Sequence[Event],
    opts: Options,
    since: datetime | None,
    until: datetime | None,
    calm: list[Placed],
    counted: Weights,
    again: bool = False,
    aside: int = 0,
) -> Judgement | Again:
    """judge, with calm minutes beside the events (timeline/calm.py) and their lines
    (`counted`, calm.weights; `aside`: the lines of those --since/--until left out);
    what to scan again without when the calm minutes or (`again`: the logs can be read
    again) the rollups cannot stand for their lines."""
    events = list(unfiltered)
    if since or until:
        events = [
            e
            for e in events
            if e.ts is None
            or ((since is None or e.ts >= since) and (until is None or e.ts < until))
        ]
    info = detect_engine(events, calm_lines(counted))
    # (the replicas with a V0 counter, whose deltas windows spreads: no calm minute of
    # theirs may be pinned; a walk of the events only where there are calm minutes)
    counters = (
        {e.replica for e in events if isinstance(e.fields.get("cumulative"), int)}
        if calm
        else set()
    )
    if counters and calm_pinned(calm, counters, opts.thresholds.kv_pressure_pct):
        return Again.PINNED
    vis = preemption_visibility(events, info)
    built = build_windows(
        events,
        opts.window_seconds,
        opts.thresholds,
        vis.counted_since if vis.settled else None,
    )
    # A late V1 count's lines, summed (bench/fuzz.py found the reason's time moved
    # from a line's to its minute's, and a window's confidence with it).
    late = {s.replica for s in vis.settled}
    if late:
        summed = sum(e.lines for e in events if _rolled_stats(e) and e.replica in late)
        summed += calm_lines_of(calm, late)
        if summed and again and summed <= LINE_BY_LINE_MAX_LINES:
            return Again.ROLLUPS
        if late & replicas_of(calm):
            return Again.CALM  # (the minutes' lines must be reads and drains at least)
    windows: Sequence[Window] = classify(
        built,
        opts.thresholds,
        vis,
        opts.window_seconds,
        info.generation,
    )
    if calm:
        # (classified as they are made: suspected, a stall, queueing or healthy, and a
        # calm window between two benign ones in time leaves them no run of consecutive
        # windows, rules.classify)
        judge = calm_judge(vis, opts.thresholds)
        merged = calm_windows(calm, windows, opts.window_seconds, judge)
        if merged is None:
            return Again.CALM
        windows = merged
    v = verdict(windows, opts.thresholds, vis, opts.window_seconds, events)
    if not windows and unfiltered:
        v = replace(v, why=_filtered_out(unfiltered, since, until, aside), filtered_out=True)
    facts = read_facts(_replica_events(unfiltered, v.replica))
    lever = choose_lever(v, windows, events, facts, info, opts.thresholds)
    return Judgement(v, windows, lever, info, vis, events)


def _late_rolled(vis: Visibility, events: Sequence[Event]) -> bool:
    """Whether a replica whose V1 count is late has stats lines rolled up."""
    late = {s.replica for s in vis.settled}
    return bool(late) and any(_rolled_stats(e) and e.replica in late for e in events)


def _rolled_stats(e: Event) -> bool:
    return e.rollup is not None and e.kind is Kind.STATS


_LATE_ROLLED = (
    "preemption visibility: the late V1 count's spans are read a minute at a time, not "
    "line by line (a minute's stats lines were merged: the log was piped, or over "
    f"{LINE_BY_LINE_MAX_BYTES >> 20} MiB or {LINE_BY_LINE_MAX_LINES:,} such lines), so "
    "a window at their edges may be judged a minute early or late"
)


def stdin_once(names: Sequence[str]) -> None:
    """Refuse `-` named more than once in one command: stdin can be read only once,
    and a second read would judge an empty input."""
    if sum(1 for n in names if n == "-") > 1:
        raise DiagError("stdin (-) can be read only once; pass it once")


def run_analysis(
    opts: Options,
    progress: ProgressFactory | None = None,
    opened: Mapping[str, Source] | None = None,
) -> Outcome:
    """analyze's whole run; `opened`: inputs its caller opened already, by name (check
    reads stdin's copy in several runs)."""
    if not opts.files and opts.prometheus is None:
        raise DiagError("no input files (pass one or more logs, or - for stdin)")
    stdin_once(opts.files)
    sigs = load(opts.signatures_dir)
    opened = opened or {}
    with ExitStack() as spools:
        # (stdin read from a copy on disk, so it can be scanned again: ingest/spool.py)
        sources = [
            opened[f] if f in opened else spools.enter_context(spooled(open_source(f)))
            for f in opts.files
        ]
        return _analysed(opts, sigs, sources, progress)


def _analysed(
    opts: Options,
    sigs: tuple[Signature, ...],
    sources: list[Source],
    progress: ProgressFactory | None,
) -> Outcome:
    logs = [s for s in sources if not looks_like_prometheus(s.head)]
    proms = [s for s in sources if looks_like_prometheus(s.head)]
    rollup = Rollups.ALL if opts.rollup and _rollup_exact(opts) else Rollups.NONE
    calm_kv = CALM_KV if rollup and _calm_exact(opts, logs, proms) else None
    window = _calm_window(opts)
    matcher = Matcher(sigs)
    # The scan makes no reference cycles (tests/test_scan.py checks every shipped and
    # fuzzed input), so the collector only walked its growing heap of hits again and
    # again: ~1 s of a month of stats lines. The packed columns of calm minutes go to
    # a temporary file (records.spilling): held in memory, they grew with the span.
    with cyclic_gc_paused(), spilling():
        results = scan_sources(
            logs,
            matcher,
            opts.jobs,
            progress,
            _import_polars,
            opts.max_events,
            rollup,
            calm_kv,
            window,
        )
        # (stdin streamed, where it could not be copied to a file, cannot be read again)
        again = all(s.path is not None for s in logs)
        done = _judged(opts, results, logs, proms, again)
        while isinstance(done, Again):
            # What the scan summed cannot stand for its lines here: scan again without
            # it, one thing at a time. (Rare: the test suite's inputs, the corpus and
            # the fuzzers name which.)
            if done is Again.PREEMPTIONS:
                # Copies of a preemption line across a minute's rollup, or an engine
                # start among its lines, out of time order (events.build_events).
                assert rollup & Rollups.PREEMPTIONS
                rollup = Rollups.STATS
            elif done is Again.PINNED:
                # A V0 counter's delta is spread onto windows with KV pinned: a minute
                # at the pressure threshold is no calm minute.
                assert calm_kv is not None
                calm_kv = opts.thresholds.kv_pressure_pct
            elif done is Again.CALM:
                # Calm minutes (timeline/calm.py): as they all would have been, events.
                assert calm_kv is not None
                calm_kv = None
            else:
                # A late V1 count reads every stats line (visibility.Settled): line by
                # line, where that costs little. (A V1 log with `Preemptions:` or
                # /metrics scrapes.)
                assert again
                rollup, calm_kv, again = Rollups.NONE, None, False
            results = scan_sources(
                logs, matcher, opts.jobs, None, None, opts.max_events, rollup, calm_kv, window
            )
            done = _judged(opts, results, logs, proms, again)
        assert isinstance(done, Outcome)
        return done


def _judged(
    opts: Options,
    results: list[ScanResult],
    logs: list[Source],
    proms: list[Source],
    again: bool,
) -> Outcome | Again:
    """Everything after the scan: events, windows, verdict, lever, the report. What
    to scan again without when the scan's calm minutes or rollups cannot stand for
    their lines (and `again`: the logs can be read again)."""
    readable, again = again, again and sum(r.bytes_read for r in results) <= LINE_BY_LINE_MAX_BYTES
    # How each log was dated, read off its hits: once they are events nothing else
    # needs them, and a month of stats rollups' hits (~0.5 KB a minute) go.
    dated = [
        (src.name, how_dated(r, opts.time, src) if r.hits else None)
        for r, src in zip(results, logs, strict=True)
    ]
    hits_by_source: list[tuple[Sequence[Hit], datetime | None]] = [
        (r.hits, s.mtime) for r, s in zip(results, logs, strict=True)
    ]
    doubts: set[str] = set()
    events = build_events(hits_by_source, opts.time, doubts)
    del hits_by_source
    if doubts and readable:
        return Again.PREEMPTIONS
    calm = _placed(results, events, opts.window_seconds, opts.time.tz)
    if calm is None:
        return Again.CALM
    notes: list[str] = rotation_notes(events)
    notes.extend(f"{d} (the log was piped): a count may be off" for d in sorted(doubts))
    events = attach_system_sources(events, notes)
    store: tuple[str, int] | None = None  # (shown URL, replicas) of a store read
    if proms:
        replicas = sorted({e.replica for e in events}) or ["metrics"]
        if len(replicas) > 1:
            notes.append(f"/metrics scrapes attached to {replicas[0]} (several replicas present)")
        # One counter series across all scrape files: deltas run from file to file.
        scrapes, unplaced = placed_scrapes(proms, events)
        if unplaced:
            notes.append(
                f"/metrics: {', '.join(unplaced)} carry no time of their own and their file "
                "times fall outside the log's span (or are one copy time), so they cannot be "
                "placed on its timeline and were not used (scrape with `date -u` or `# scraped_at: ...` first, or "
                "keep file times: cp -p)"
            )
        if scrapes:
            events.extend(scrape_events(scrapes, replicas[0]))
            notes.append(scrape_note(summarize(scrapes)))
        events.sort(key=lambda e: (e.ts is None, e.ts or _EPOCH, e.source, e.line))
    if opts.prometheus is not None:
        from preemptdiag.ingest.prometheus_api import read_fleet
        from preemptdiag.timeline.store import store_events

        start, end = store_span(opts)
        fleet = read_fleet(opts.prometheus, start, end, opts.window_seconds)
        store_evs, store_notes = store_events(fleet, events)
        store = (fleet.url, len(fleet.replicas))
        events.extend(store_evs)
        notes.extend(store_notes)
        events.sort(key=lambda e: (e.ts is None, e.ts or _EPOCH, e.source, e.line))
    if proms or opts.prometheus is not None:
        events = counted_once(events)
    # Configuration and capacity are facts of a replica, whatever --since/--until
    # keep: the filter narrows the windows and their evidence, not what the engine is.
    unfiltered = events
    since, until = _time_range(opts, events)
    # (the calm minutes' lines, for detect_engine: all of them count toward a replica's
    # engine, as its events do, whatever --since/--until keep)
    counted = weights(calm)
    aside = 0  # (the lines of the calm minutes --since/--until leave out)
    kept: list[Event] = []  # (what the notes read of the calm minutes kept)
    if since or until:
        aside = sum(p.lines for p in calm)
        calm = trimmed(calm, since, until)
        aside -= sum(p.lines for p in calm)
        kept = calm_noted(calm)
    j = _judge(
        unfiltered, opts, since, until, calm, weights(calm) if aside else counted, again, aside
    )
    if isinstance(j, Again):
        return j
    del calm  # (its windows are made; the minutes' numbers and lines can go)
    v, windows, lever, info, vis, events = (
        j.verdict,
        j.windows,
        j.lever,
        j.info,
        j.visibility,
        j.events,
    )
    redactor = Redactor(enabled=opts.redact)
    v = replace(v, evidence=_redact_events(v.evidence, redactor))
    windows = _redact_windows(windows, redactor)
    # (a range may keep calm minutes and no event of their replica's stats lines)
    notes.extend(visibility_notes([*events, *kept], results, v, vis.reason, info.generation))
    if _late_rolled(vis, events):
        notes.append(_LATE_ROLLED)
    notes.extend(alignment_notes(dated, opts.time))
    notes.extend(replica_notes(windows, opts.fail_on))
    notes.extend(spread_notes(windows))
    notes.extend(engine_notes([*events, *kept]))
    stats = _scan_stats(results, logs, proms)
    if store is not None:
        stats = replace(
            stats,
            files=(*stats.files, store[0]),
            recognised={**stats.recognised, "prometheus replicas": store[1]},
        )
    # Every string a log put in the report is cleaned of terminal control once, here,
    # so all formats (and check's and compare's lines) show the same safe text.
    report = sanitised(
        Report(
            verdict=v,
            lever=lever,
            windows=windows,
            engine=info,
            stats=stats,
            thresholds=opts.thresholds.as_dict(),
            window_seconds=opts.window_seconds,
            notes=tuple(notes),
            tool_version=__version__,
            replicas=replica_facts(
                unfiltered,
                {
                    **{p.name: "scrape stamps or file time" for p in proms},
                    **{
                        e.source: "the store's sample times"
                        for e in unfiltered
                        if store and e.engine == "prometheus"
                    },
                    **{name: how or "no timestamps" for name, how in dated},
                },
                counted,
            ),
        )
    )
    return Outcome(report=report, exit_code=exit_code(v, opts), events=tuple(events))


def _placed(
    results: Sequence[ScanResult], events: Sequence[Event], seconds: int, tz: tzinfo
) -> list[Placed] | None:
    """Every file's calm minutes on the timeline (calm.place), the scan's hits and
    rows let go; None when one cannot be placed. (The one list holds them: calm
    windows empties it as it reads their frames.)"""
    calm: list[Placed] = []
    for r in results:
        placed = place(r.calm, r.hits, events, seconds, tz)
        if placed is None:
            return None
        calm += placed
        r.hits, r.calm = [], []
    return calm


def _time_range(opts: Options, events: Sequence[Event]) -> tuple[datetime | None, datetime | None]:
    """--since/--until; a bare time of day is read on the one date of the log's span (in
    --tz) where that time falls, or the date it starts when none; an --until clock is
    then the first such time after --since. A time of day that falls on two dates of
    the span (a week's log and `--since 03:00`) is refused: the first date was a guess
    that could put the report a week before the incident asked about."""
    since, until = opts.since, opts.until
    if not any(opts.clock_range):
        return since, until
    stamps = [e.ts for e in events if e.ts is not None]
    stamps += [m.ts for m in rollup_ends(events) if m.ts is not None]
    if not stamps:
        return since, until
    first, last = min(stamps), max(stamps)
    tz = opts.time.tz

    def on_day(t: datetime, day: date) -> datetime:
        return datetime.combine(day, t.timetz().replace(tzinfo=None), tzinfo=tz)

    def placed(t: datetime, flag: str) -> datetime:
        day0, day1 = first.astimezone(tz).date(), last.astimezone(tz).date()
        days = (day0 + timedelta(days=k) for k in range((day1 - day0).days + 1))
        inside = [c for c in (on_day(t, d) for d in days) if first <= c <= last]
        if len(inside) > 1:
            raise DiagError(
                f"{flag} {t:%H:%M:%S}: a time of day, and the log's span "
                f"({first.astimezone(tz):%Y-%m-%d %H:%M} to {last.astimezone(tz):%Y-%m-%d %H:%M}"
                f" {tz}) holds it on {len(inside)} dates; give the date too "
                f"({flag} {inside[-1]:%Y-%m-%dT%H:%M:%S})"
            )
        return inside[0] if inside else on_day(t, day0)

    if since is not None and opts.clock_range[0]:
        since = placed(since, "--since")
    if until is not None and opts.clock_range[1]:
        if since is None:
            until = placed(until, "--until")
        else:
            until = on_day(until, since.astimezone(tz).date())
            if until <= since:
                until += timedelta(days=1)
    return since, until


def _filtered_out(
    events: Sequence[Event], since: datetime | None, until: datetime | None, calm: int = 0
) -> str:
    # (every line's: a rollup's lines count, and its last may be its latest; `calm`: the
    # calm minutes' lines, each inside the span of its file's events: calm.place)
    stamps = [e.ts for e in events if e.ts is not None]
    stamps += [m.ts for m in rollup_ends(events) if m.ts is not None]
    span = f"{min(stamps):%Y-%m-%d %H:%M:%S} to {max(stamps):%Y-%m-%d %H:%M:%S}" if stamps else "?"
    lo = f"{since:%Y-%m-%d %H:%M:%S}" if since else "the start"
    hi = f"{until:%Y-%m-%d %H:%M:%S}" if until else "the end"
    return (
        f"{sum(e.lines for e in events) + calm} event(s) matched, but none fall between {lo} and {hi} "
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


def _calm_exact(opts: Options, logs: Sequence[Source], proms: Sequence[Source]) -> bool:
    """Whether calm minutes may stand for their lines (timeline/calm.py): not beside
    /metrics scrapes or a store (a V1 count read there reads every stats line's
    Waiting), nor for stdin streamed once (where they cannot, the files are scanned
    again without them; stdin is read from a copy on disk where one can be made:
    ingest/spool.py), nor in windows other than whole minutes that divide a day."""
    return (
        opts.calm
        # (the lane keeps a window's minutes calm by their neighbours: _calm_window)
        and opts.window_seconds % 60 == 0
        and 86_400 % opts.window_seconds == 0
        and all(s.path is not None for s in logs)  # (read twice if they cannot)
        and not proms
        and opts.prometheus is None
    )


def _calm_window(opts: Options) -> tuple[int, int]:
    """(minutes a window, the offset of --tz in minutes) for the lane, which keeps a
    window all calm minutes or all events by its stamps' clock minutes (lane.calm_of).
    A named zone's offset is today's: its shifts are of an hour, which moves no
    window of minutes that divide an hour on its clock. (Where a window falls
    otherwise, a clash makes analyze scan again without calm minutes: exact.)"""
    offset = datetime.now(opts.time.tz).utcoffset()
    shift = int(offset.total_seconds()) // 60 if offset is not None else 0
    return max(opts.window_seconds // 60, 1), shift


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


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 8))
