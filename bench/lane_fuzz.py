"""Differential fuzzer of the scan's polars paths: the stats lane and bulk.py against
one line at a time.

    python bench/lane_fuzz.py --seed 1 --count 5000 [--seconds 900]
    python bench/lane_fuzz.py --seed 1 --index 873 --keep DIR   # replay one input

bench/fuzz.py's inputs are small logs, where neither polars path runs: bulk.py waits
for AFTER_LINES candidate lines, the lane (scan/lane.py) for them or a big file. Here
each input is a dense generated log (bench/generate.py: a quiet server's stats lines,
a queueing one's, a V0 server's, SGLang batch lines with and without retractions,
request logging, the mixed profile) of 20-150 KB, damaged by up to
three of fuzz.py's mutators (late ones last, as there), and scanned three ways in
blocks of 4-64 KiB: one line at a time (polars never paid), bulk.py from the first
line (the lane off), and the lane tried on every block (bulk.py where it refuses).
The oracle: all three give the same hits, rollup members (stats and preemption
lines), skips, counts and
line and byte totals; and analyze's report (the lane on every block) is the same with
calm minutes (timeline/calm.py) as without. Input i of seed S is built from Random(f"{S}:{i}") alone.
Found with it (session 13): a damaged `usage: 999...9%` cast and aggregated as 1e41 %
where the converter refuses it, and rsyslog's `#033[` escape kept in a process name
that normalise cleans.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import fuzz  # noqa: E402
import generate  # noqa: E402

import preemptdiag.commands.analyze as analyze  # noqa: E402
import preemptdiag.scan.bulk as bulk  # noqa: E402
import preemptdiag.scan.lane as lane  # noqa: E402
import preemptdiag.scan.lane_plain as lane_plain  # noqa: E402
import preemptdiag.scan.passes as passes  # noqa: E402
from preemptdiag.ingest.sources import open_source  # noqa: E402
from preemptdiag.model.errors import DiagError  # noqa: E402
from preemptdiag.render.json_format import report_dict  # noqa: E402
from preemptdiag.scan.matcher import Matcher, ScanResult  # noqa: E402
from preemptdiag.scan.passes import scan_fast  # noqa: E402
from preemptdiag.scan.rollup import Rollups  # noqa: E402
from preemptdiag.scan.signatures import load  # noqa: E402
from preemptdiag.timeline.events import TimeContext  # noqa: E402

# The quiet server twice: the month-of-stats shape is the lane's main work.
PROFILES = (
    "vllm-stats",
    "vllm-stats-busy",
    "vllm-v0-stats",
    "sglang-dense",
    "vllm",
    "vllm-requests",
    # a thrashing SGLang server's retractions, one rank's or eight's (session 32: the
    # plain lane reads them)
    "sglang-thrash",
    "sglang-thrash-ranks",
    # every line stamped by `kubectl logs --timestamps` (session 35: the plain lane
    # reads them, timed by that stamp)
    "vllm-stats-kubectl",
    # the pool pinned and a queue all along: calm minutes at any KV usage (session 36)
    "vllm-stats-pinned",
)
SIZES = (20_000, 60_000, 150_000)
BLOCKS = (4096, 16384, 65536)
# Mutators that leave most lines as they were (wrappers and other encodings make no
# block the lane could take: fuzz.py covers them end to end).
MUTATIONS = tuple(n for n in fuzz.MUTATIONS if n not in ("wrappers", "encodings"))


@dataclass(frozen=True)
class Input:
    index: int
    data: bytes
    block: int
    profile: str
    mutations: tuple[str, ...]


def make_input(seed: int, index: int) -> Input:
    rng = random.Random(f"{seed}:{index}")
    profile = rng.choice(PROFILES)
    out = io.BytesIO()
    generate.PROFILES[profile](out, rng.choice(SIZES), rng.randrange(1 << 30))
    data = out.getvalue()
    names = [rng.choice(MUTATIONS) for _ in range(rng.choice((0, 1, 1, 2, 3)))]
    names.sort(key=lambda n: n in fuzz._LATE)
    for n in names:
        data = fuzz.MUTATIONS[n](data, rng)
    if rng.random() < 0.3:
        data = fuzz.plant(data, rng)
        names.append("plant")
    return Input(index, data, rng.choice(BLOCKS), profile, tuple(names))


@contextmanager
def _scan_settings(block: int, after: int, lane_on: bool, plain: bool = True) -> Iterator[None]:
    """The scan's module settings for one way of scanning, restored after."""
    saved = (
        passes.BLOCK_BYTES,
        bulk.AFTER_LINES,
        lane.ENABLED,
        lane_plain.ENABLED,
        lane.Lane.missed,
    )
    passes.BLOCK_BYTES, bulk.AFTER_LINES, lane.ENABLED = block, after, lane_on
    lane_plain.ENABLED = plain
    lane.Lane.missed = lambda self, block: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        (
            passes.BLOCK_BYTES,
            bulk.AFTER_LINES,
            lane.ENABLED,
            lane_plain.ENABLED,
            lane.Lane.missed,  # type: ignore[method-assign]
        ) = saved


def _key(r: ScanResult) -> tuple[object, ...]:
    return r.hits, r.members, r.skipped, r.recognised, r.lines_read, r.bytes_read


@dataclass
class Tally:
    inputs: int = 0
    lane_blocks: int = 0  # blocks the lane took: what the run held to line by line
    plain_blocks: int = 0  # of them, those lane_plain.py took (the polars lane: the rest)
    calm_minutes: int = 0  # calm minutes placed: what the calm reports were held to
    found: list[str] = field(default_factory=list)


def differs(path: Path, block: int, matcher: Matcher, tally: Tally) -> str | None:
    """Which way of scanning `path` differs from one line at a time; None if none."""
    results = {}
    real, real_plain = lane.try_block, lane_plain.take

    def counted(*args: Any) -> int | None:
        got = real(*args)
        tally.lane_blocks += got is not None
        return got

    def plain(*args: Any) -> int | None:
        got = real_plain(*args)
        tally.plain_blocks += bool(got) and args[-1] < len(args[2])  # (not a part's again)
        return got

    ways = (
        ("line", 10**9, False, True),
        ("bulk", 0, False, True),
        ("lane", 0, True, True),
        ("polars lane", 0, True, False),
    )
    for name, after, lane_on, plain_on in ways:
        lane.try_block, lane_plain.take = counted, plain  # type: ignore[assignment]
        with _scan_settings(block, after, lane_on, plain_on):
            try:
                results[name] = _key(scan_fast(open_source(str(path)), matcher, rollup=Rollups.ALL))
            except DiagError as e:  # (a mutated file may be no text log at all)
                results[name] = (str(e),)
            finally:
                lane.try_block, lane_plain.take = real, real_plain  # type: ignore[assignment]
    wrong = [n for n in ("bulk", "lane", "polars lane") if results[n] != results["line"]]
    return ", ".join(wrong) or None


def calm_differs(path: Path, block: int, tally: Tally) -> str | None:
    """Whether analyze's report of `path` (the lane on every block) differs with its
    calm minutes (timeline/calm.py) from the one without; None if not."""
    reports = []
    real = analyze.place

    def counted(*args: Any) -> Any:
        got = real(*args)
        tally.calm_minutes += sum(p.minutes for p in got or ())
        return got

    for on in (False, True):
        opts = analyze.Options(files=(str(path),), time=TimeContext(year=2026), jobs=1, calm=on)
        analyze.place = counted  # type: ignore[assignment]
        with _scan_settings(block, 0, True):
            try:
                got = analyze.run_analysis(opts)
                reports.append((got.exit_code, report_dict(got.report)))
            except DiagError as e:
                reports.append((2, {"error": str(e)}))
            finally:
                analyze.place = real  # type: ignore[assignment]
    return None if reports[0] == reports[1] else "calm"


def run(
    seed: int, indices: range, seconds: float = float("inf"), keep: Path | None = None
) -> Tally:
    matcher = Matcher(load())
    tally = Tally()
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for i in indices:
            if time.monotonic() - began > seconds:
                break
            case = make_input(seed, i)
            path = (keep or Path(tmp)) / f"lane-{seed}-{i}.log"
            path.write_bytes(case.data)
            tally.inputs += 1
            wrong = differs(path, case.block, matcher, tally) or calm_differs(
                path, case.block, tally
            )
            if wrong:
                tally.found.append(
                    f"--seed {seed} --index {i}: {wrong} != line by line "
                    f"({case.profile}, {list(case.mutations)}, blocks of {case.block})"
                )
    return tally


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--index", type=int, help="replay this input only")
    ap.add_argument("--seconds", type=float, default=float("inf"))
    ap.add_argument("--keep", type=Path, help="write the inputs here")
    args = ap.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    indices = range(args.index, args.index + 1) if args.index is not None else range(args.count)
    tally = run(args.seed, indices, args.seconds, args.keep)
    for line in tally.found:
        print(line, file=sys.stderr)
    print(
        f"seed {args.seed}: {tally.inputs} inputs, {tally.lane_blocks} blocks through the "
        f"lane ({tally.plain_blocks} of them lane_plain's), {tally.calm_minutes} calm minutes, {len(tally.found)} differing",
        file=sys.stderr,
    )
    return 1 if tally.found else 0


if __name__ == "__main__":
    raise SystemExit(main())
