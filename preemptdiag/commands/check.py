"""`check`: the files of one incident judged together, one line per file.

An incident arrives as several files: an engine log (or its rotated set) with the
node's kernel log, `kubectl describe` and /metrics scrapes beside it. Judged one by one,
the scrapes say nothing and the engine log alone cannot show V1 preemptions, so the
hook would pass what `analyze` fails. Grouping:

1. an argument `a.log+b.prom` names a group explicitly;
2. otherwise each engine log, with the rotated files of the same log, is a group, and a
   file without engine lines (kernel, kubectl, docker, scrapes) joins the engine group
   of its folder when there is one there, else the engine group whose time span holds
   its own;
3. what joins nothing stands alone.

Every file still gets its line (its group's verdict), a file that cannot be read is
one error line, and the others go on. The exit code is the worst group's (2 when a
file could not be read).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from preemptdiag.commands.analyze import Options, Outcome, run_analysis, stdin_once
from preemptdiag.ingest.rotation import rotation_base
from preemptdiag.ingest.sources import Source, open_source
from preemptdiag.ingest.spool import spooled
from preemptdiag.model.errors import DiagError
from preemptdiag.model.records import SYSTEM_ENGINES
from preemptdiag.render.summary import verdict_line

HOOK_PATTERN = (".log", ".txt", ".prom")
# Lines that describe the node, the pod or the metrics, not the engine's own log.
_NOT_ENGINE = SYSTEM_ENGINES | {"prometheus"}
_COMPRESSED = ("", ".gz", ".bz2", ".xz", ".zst")


@dataclass(frozen=True, slots=True)
class _Probe:
    """What one file alone says: whether it holds engine lines, and when."""

    path: str
    engine: bool
    start: datetime | None
    end: datetime | None


def expand(args: Sequence[str]) -> list[str]:
    """Directories walked (sorted) for the hook's file pattern; other names kept."""
    out: list[str] = []
    for a in args:
        if a != "-" and "+" not in a and os.path.isdir(a):
            for root, dirs, names in os.walk(a):
                dirs.sort()
                out += [os.path.join(root, n) for n in sorted(names) if _hooked(n)]
        else:
            out.append(a)
    return out


def _hooked(name: str) -> bool:
    """The hook's pattern, and the rotated files of such a log (`vllm.log.1`,
    `vllm.log.2.gz`, `vllm.log-20251104`), which belong with it."""
    base = rotation_base(name)
    return any(
        n.endswith(ext + z) for n in (name, base) for ext in HOOK_PATTERN for z in _COMPRESSED
    )


def _probe(path: str, analyze: Callable[[tuple[str, ...]], Outcome]) -> _Probe:
    out = analyze((path,))
    engine = [e for e in out.events if e.engine not in _NOT_ENGINE]
    stamps = [e.ts for e in (engine or out.events) if e.ts is not None]
    return _Probe(
        path,
        bool(engine),
        min(stamps) if stamps else None,
        max(stamps) if stamps else None,
    )


def plan(probes: Sequence[_Probe]) -> list[list[str]]:
    """Groups of files in argument order (see the module docstring)."""
    groups: list[list[str]] = []
    owner: dict[str, int] = {}  # rotation base of an engine log -> its group
    spans: list[tuple[int, _Probe]] = []
    for p in probes:
        if not p.engine:
            continue
        base = rotation_base(p.path)
        if base in owner:
            groups[owner[base]].append(p.path)
        else:
            owner[base] = len(groups)
            groups.append([p.path])
        spans.append((owner[base], p))
    for p in probes:
        if p.engine:
            continue
        folder = os.path.dirname(os.path.abspath(p.path))
        here = {g for g, e in spans if os.path.dirname(os.path.abspath(e.path)) == folder}
        holding = {
            g
            for g, e in spans
            if p.start and p.end and e.start and e.end and p.start <= e.end and e.start <= p.end
        }
        pick = here if len(here) == 1 else holding if len(holding) == 1 else set()
        if pick:
            groups[pick.pop()].append(p.path)
        else:
            groups.append([p.path])
    order = {p.path: i for i, p in enumerate(probes)}
    return sorted((sorted(g, key=order.__getitem__) for g in groups), key=lambda g: order[g[0]])


def run_check(args: Sequence[str], opts: Options, emit: Callable[[str], None]) -> int:
    """Judge every incident once and print one line per file; the worst exit code."""
    files = expand(args)
    if not files:
        raise DiagError("no input files (pass logs, folders, or a+b groups)")
    parts = [part for f in files for part in (f.split("+") if "+" in f else [f])]
    stdin_once(parts)
    with ExitStack() as spool:
        # stdin is read by the probe and by its group's run: from one copy of it
        # (ingest/spool.py), opened here for both. (Each run read the pipe anew, and
        # the second found it empty: `check -` of a thrash loop said "no vLLM evidence
        # found" and passed.)
        stdin: Source | DiagError | None = None
        if "-" in parts:
            try:
                stdin = spool.enter_context(spooled(open_source("-")))
            except DiagError as exc:
                stdin = exc  # (its group's lines say so; the others go on)
        return _checked(files, opts, emit, stdin)


def _checked(
    files: list[str], opts: Options, emit: Callable[[str], None], stdin: Source | DiagError | None
) -> int:
    opened = {"-": stdin} if isinstance(stdin, Source) else {}

    def analyze(names: tuple[str, ...]) -> Outcome:
        if isinstance(stdin, DiagError) and "-" in names:
            raise stdin
        return run_analysis(replace(opts, files=names), opened=opened)

    worst = 0
    probes: list[_Probe] = []
    explicit: list[list[str]] = []
    for f in files:
        if "+" in f and not os.path.exists(f):
            explicit.append([part for part in f.split("+") if part])
            continue
        if f == "-" and isinstance(stdin, Source) and stdin.path is None:
            explicit.append([f])  # (streamed, no copy: read once, by itself)
            continue
        try:
            probes.append(_probe(f, analyze))
        except DiagError as exc:
            emit(f"{f}: error: {exc}")
            worst = max(worst, 2)
    for group in [*explicit, *plan(probes)]:
        try:
            outcome = analyze(tuple(group))
        except DiagError as exc:
            for f in group:
                emit(f"{f}: error: {exc}")
            worst = max(worst, 2)
            continue
        line = verdict_line(outcome.report)
        for f in group:
            others = [Path(g).name for g in group if g != f]
            with_ = f" (judged with {', '.join(others)})" if others else ""
            emit(f"{f}: {line}{with_}")
        worst = max(worst, outcome.exit_code)
    return worst
