"""timeline.windows: a small events table is aggregated in Python (no polars import),
and must give exactly what the polars query gives: same windows, same order, same
values and value types, on every shipped log, the shared corpus, fuzzed logs and
generated tables with missing values, ties and several replicas."""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from builders import T0, bench_module, make_event

from preemptdiag.commands.analyze import Options, run_analysis
from preemptdiag.model.config import Thresholds
from preemptdiag.model.errors import DiagError
from preemptdiag.model.records import Event, Kind
from preemptdiag.scan.rollup import snap6
from preemptdiag.timeline import windows as windows_mod
from preemptdiag.timeline.events import TimeContext
from preemptdiag.timeline.windows import (
    _agg_rows,
    _aggregated,
    _aggregated_small,
    build_windows,
)

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "corpus"
LOGS = sorted(
    p
    for d in (ROOT / "samples", ROOT / "tests" / "fixtures", *([CORPUS] if CORPUS.is_dir() else []))
    for p in d.rglob("*")
    if p.is_file() and p.suffix in (".log", ".txt", ".gz") and p.stat().st_size < 4_000_000
)


def _typed(rows: Sequence[dict[str, Any]]) -> list[list[tuple[Any, ...]]]:
    # Exact: value and type (an int where polars gives an int, -0.0 apart from 0.0).
    return [
        [(k, type(v), v, math.copysign(1, v) if isinstance(v, float) else 0) for k, v in r.items()]
        for r in rows
    ]


def _same(events: Sequence[Event], seconds: int = 60) -> int:
    small = _aggregated_small(events, seconds)
    big = list(_agg_rows(_aggregated(events, seconds)))
    assert _typed(small) == _typed(big)
    return len(small)


def _events_of(path: Path, **opts: Any) -> tuple[Event, ...]:
    return run_analysis(Options(files=(str(path),), time=TimeContext(year=2026), **opts)).events


def test_snap6_is_polars_round_6() -> None:
    import polars as pl

    rng = random.Random(6)
    values = [0.0, -0.0, 5e-7, -5e-7, 2.5e-6, 1e15, 1e300, -1e300, 123456789.1234565]
    values += [k / 10**7 + rng.choice((0.0, 5e-8, -5e-8)) for k in rng.sample(range(10**9), 20000)]
    values += [rng.uniform(-1000, 1000) for _ in range(20000)]
    # means of sums with 2 decimals over line counts: where ties at the 7th decimal are
    values += [round(rng.randrange(10**6) / 100, 2) / rng.randrange(1, 400) for _ in range(20000)]
    got = pl.Series(values, dtype=pl.Float64).round(6).to_list()
    mine = [snap6(v) for v in values]
    assert [(a, math.copysign(1, a)) for a in mine] == [(b, math.copysign(1, b)) for b in got]


@pytest.mark.parametrize("path", LOGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_shipped_log_aggregates_alike(path: Path) -> None:
    events = _events_of(path)
    if events:
        _same(events)
        _same(events, 300)


def test_fuzzed_logs_aggregate_alike(tmp_path: Path) -> None:
    fuzz = bench_module("fuzz")
    seeds = fuzz.seed_files()
    checked = 0
    # (the cases follow the seed files, and a new recording moves them: inputs until 40
    # windows were compared, not a fixed number of inputs)
    for i in range(300):
        if checked > 40:
            break
        case = fuzz.make_case(161, i, seeds)
        log = tmp_path / f"{i}{case.suffix}"
        log.write_bytes(case.data)
        try:
            events = _events_of(log)
        except DiagError:  # (an input refused with its one line, as analyze says it)
            continue
        if events:
            checked += _same(events)
    assert checked > 40


def _random_events(rng: random.Random, n: int) -> list[Event]:
    out: list[Event] = []
    kinds = [Kind.STATS] * 6 + [Kind.PREEMPTION, Kind.ALLOC_FAILURE, Kind.HOST_OOM,
             Kind.ENGINE_DEAD, Kind.SWAP_WARNING, Kind.CONTEXT]  # fmt: skip
    for i in range(n):
        kind = rng.choice(kinds)
        fields: dict[str, Any] = {}
        if kind is Kind.STATS:
            for k, gen in (
                ("kv_usage", lambda: rng.choice((99.9, 100.0, 0.0, round(rng.uniform(0, 100), 1)))),
                ("running", lambda: rng.randrange(0, 64)),
                ("waiting", lambda: rng.randrange(0, 9)),
                ("swapped", lambda: rng.randrange(0, 3)),
                ("prompt_tput", lambda: round(rng.uniform(0, 5000), 1)),
                ("gen_tput", lambda: round(rng.uniform(0, 900), 1)),
            ):
                if rng.random() < 0.8:
                    fields[k] = gen()
        if kind is Kind.PREEMPTION and rng.random() < 0.5:
            fields["cumulative"] = rng.randrange(1, 500)
        e = make_event(kind, fields, minute=rng.randrange(0, 6))
        out.append(
            replace(
                e,
                replica=rng.choice(("pod-a", "pod-b", "Ärger-0")),
                line=i + 1,
                ts=None if rng.random() < 0.05 else T0 + timedelta(seconds=rng.randrange(360)),
                preemptions=rng.choice((0, 0, 1, 50)),
                lower_bound=rng.random() < 0.1,
                source=rng.choice(("a.log", "b.log")),
            )
        )
    return out


def test_generated_tables_aggregate_alike() -> None:
    rng = random.Random(1606)
    for _ in range(60):
        _same(_random_events(rng, rng.randrange(1, 300)))


def test_a_small_log_is_analysed_without_importing_polars() -> None:
    # (in a fresh interpreter: this one has polars already)
    import json
    import subprocess

    code = (
        "import sys\n"
        "from preemptdiag.cli import main\n"
        "code = main(['analyze', '--format', 'json', sys.argv[1]])\n"
        "print('polars' in sys.modules, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "samples" / "v0_thrash_loop.log")],
        capture_output=True,
        text=True,
    )
    assert (r.returncode, r.stderr) == (1, "False\n")
    assert json.loads(r.stdout)["verdict"]["class"] == "thrash_loop"


def test_the_two_paths_give_the_same_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    events = _events_of(ROOT / "samples" / "v0_thrash_loop.log")
    small = build_windows(events, 60, Thresholds())
    monkeypatch.setattr(windows_mod, "SMALL_TABLE", 0)
    assert build_windows(events, 60, Thresholds()) == small
