"""The floor of a columnar analysis of a long stats log, and whether it can be exact.

issue 16 asks for a month of stats lines in < 2 s and < 100 MiB. The object path
(Hit -> Event -> Window -> report) costs ~200 us and ~4.5 KB a minute (bench/README,
sessions 13-15), so the plan is to hold minutes and windows as columns from the scan
to the renderers. This script is that plan's measured floor, with polars alone, on a
V1 stats log of one engine (bench/generate.py's `vllm-stats` profile, or any log whose
stats lines are vLLM V1's): the lines as one column, the stats signature's own
pattern (signatures/vllm_stats.toml) as the captures, the engine stamps as times, one
`group_by` into the windows' numbers, and those rows written as JSON text.

With --check it also runs `preemptdiag analyze --format json` on the same log and
compares every window's numbers with the columns': the aggregation the columnar path
needs gives the same values as today's path, or the script says where not.

    python bench/columnar_floor.py /tmp/d30.log --year 2026 --check

It reads what it needs of a stats line only (no evidence lines, no other signature,
one engine stream, no --since/--until), so it is a floor, not the product; and not a
test (timings). Peak RSS here is mostly polars: its import is ~45 MiB, and its
allocator keeps freed block buffers (`_RJEM_MALLOC_CONF=dirty_decay_ms:0,
muzzy_decay_ms:0` in the environment takes a 30-day run from ~140 to ~116 MiB).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from preemptdiag.scan.lane import _lane_pattern  # noqa: E402
from preemptdiag.scan.signatures import load  # noqa: E402
from preemptdiag.timeline.windows import snapped_mean  # noqa: E402

# vLLM's record head, as lines.py reads it: `(Proc pid=N) LEVEL MM-DD HH:MM:SS [f:l] `
_HEAD = r"^\((?P<proc>[A-Za-z_][\w-]*) pid=\d+\) (?:INFO|DEBUG|WARNING) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) \[[^\]]+\] "
# The window fields compared with analyze's JSON.
_FIELDS = (
    "n_stats",
    "kv_max",
    "kv_mean",
    "kv_peak_running",
    "running_max",
    "running_mean",
    "waiting_first",
    "waiting_last",
    "waiting_max",
    "prompt_tput",
    "gen_tput",
)


_BLOCK = 1 << 20


def _block_windows(block: bytes, row0: int, year: int, seconds: int, pattern: str) -> pl.DataFrame:
    """One block's stats lines as partial windows: sums, counts, maxima, first and
    last values with their line numbers."""
    lines = pl.Series("line", block.decode("utf-8", "replace").split("\n")[:-1])
    stats = (
        pl.DataFrame({"line": lines})
        .with_row_index("row", offset=row0)
        .filter(pl.col("line").str.contains(pattern))
        .with_columns(
            pl.col("line").str.extract_groups(_HEAD).alias("head"),
            pl.col("line").str.extract_groups(pattern).alias("f"),
        )
        .unnest("head", "f")
        .select(
            "row",
            wstart=pl.concat_str(pl.lit(f"{year}-"), pl.col("ts"))
            .str.strptime(pl.Datetime("us", "UTC"), "%Y-%m-%d %H:%M:%S")
            .dt.truncate(f"{seconds}s"),
            kv=pl.col("kv_usage").cast(pl.Float64),
            running=pl.col("running").cast(pl.Int64),
            waiting=pl.col("waiting").cast(pl.Int64),
            prompt=pl.col("prompt_tput").cast(pl.Float64),
            gen=pl.col("gen_tput").cast(pl.Float64),
        )
    )
    at_peak = pl.col("kv") == pl.col("kv").max()
    return stats.group_by("wstart").agg(
        n=pl.len(),
        kv_max=pl.col("kv").max(),
        kv_sum=pl.col("kv").sum(),
        kv_n=pl.col("kv").count(),
        peak_running=pl.col("running").filter(at_peak).min(),
        running_max=pl.col("running").max(),
        running_sum=pl.col("running").sum().cast(pl.Float64),
        running_n=pl.col("running").count(),
        waiting_first=pl.col("waiting").sort_by("row").first(),
        first_row=pl.col("row").min(),
        waiting_last=pl.col("waiting").sort_by("row").last(),
        last_row=pl.col("row").max(),
        waiting_max=pl.col("waiting").max(),
        prompt_sum=pl.col("prompt").sum(),
        prompt_n=pl.col("prompt").count(),
        gen_sum=pl.col("gen").sum(),
        gen_n=pl.col("gen").count(),
    )


def _windows(path: Path, year: int, seconds: int) -> tuple[pl.DataFrame, dict[str, float]]:
    took: dict[str, float] = {}
    sig = next(s for s in load() if s.id == "vllm.v1.stats")
    pattern = _lane_pattern(sig)
    assert pattern is not None, "polars cannot run the stats pattern"
    t = time.perf_counter()
    # The file a block at a time, as the scan reads it (polars' own CSV reader maps
    # the whole file: its pages count in RSS), each block's stats lines aggregated by
    # window at once, so what grows with the span is a few numbers a window.
    parts: list[pl.DataFrame] = []
    row0 = 0
    with path.open("rb") as f:
        tail = b""
        while block := f.read(_BLOCK):
            block = tail + block
            cut = block.rfind(b"\n") + 1
            tail, block = block[cut:], block[:cut]
            if block:
                parts.append(_block_windows(block, row0, year, seconds, pattern))
                row0 += block.count(b"\n")
        if tail:
            parts.append(_block_windows(tail + b"\n", row0, year, seconds, pattern))
    took["read, match, type, aggregate, a 1 MiB block at a time"] = time.perf_counter() - t

    t = time.perf_counter()
    at_peak = pl.col("kv_max") == pl.col("kv_max").max()
    windows = (
        pl.concat(parts)
        .group_by("wstart")
        .agg(
            n_stats=pl.col("n").sum(),
            kv_max=pl.col("kv_max").max(),
            kv_mean=snapped_mean("kv_sum", "kv_n"),
            kv_peak_running=pl.col("peak_running").filter(at_peak).min(),
            running_max=pl.col("running_max").max(),
            running_mean=snapped_mean("running_sum", "running_n"),
            waiting_first=pl.col("waiting_first").sort_by("first_row").first(),
            waiting_last=pl.col("waiting_last").sort_by("last_row").last(),
            waiting_max=pl.col("waiting_max").max(),
            prompt_tput=snapped_mean("prompt_sum", "prompt_n"),
            gen_tput=snapped_mean("gen_sum", "gen_n"),
        )
        .sort("wstart")
    )
    took["block windows -> windows (group_by)"] = time.perf_counter() - t

    t = time.perf_counter()
    # (concat_str, not pl.format: format reads a `{name}` as a column)
    cells: list[pl.Expr] = [
        pl.lit('{"start": "'),
        pl.col("wstart").dt.strftime("%Y-%m-%dT%H:%M:%S+00:00"),
        pl.lit('"'),
    ]
    for c in ("n_stats", "kv_max", "kv_mean", "running_max", "running_mean", "waiting_last",
              "prompt_tput", "gen_tput"):  # fmt: skip
        cells += [pl.lit(f', "{c}": '), pl.col(c).cast(pl.Utf8).fill_null("null")]
    cells.append(pl.lit("}"))
    text = windows.select(pl.concat_str(cells).alias("json"))["json"].str.join(",\n")
    took["windows -> JSON text"] = time.perf_counter() - t
    took["(JSON bytes)"] = float(len(text[0]))
    return windows, took


def _check(path: Path, year: int, windows: pl.DataFrame) -> int:
    """Windows of analyze's JSON whose numbers differ from the columns' (printed)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "preemptdiag",
            "analyze",
            str(path),
            "--format",
            "json",
            "--year",
            str(year),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    report: dict[str, Any] = json.loads(out.stdout)
    theirs = {w["start"]: w for w in report["windows"]}
    ours = {f"{w['wstart']:%Y-%m-%dT%H:%M:%S+00:00}": w for w in windows.to_dicts()}
    other = [k for k, w in theirs.items() if k not in ours]
    if other:
        print(
            f"{len(other)} window(s) of analyze hold no stats line (start-up lines): not compared"
        )
    bad = sum(1 for k in ours if k not in theirs)
    for k, b in ours.items():
        a = theirs.get(k)
        for f in _FIELDS if a is not None else ():
            if a[f] != b[f]:
                bad += 1
                if bad <= 10:
                    print(f"{k} {f}: analyze {a[f]!r}, columns {b[f]!r}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--year", type=int, default=2026, help="the year of the log's stamps")
    ap.add_argument("--window", type=int, default=60, help="seconds")
    ap.add_argument("--check", action="store_true", help="compare with analyze's JSON")
    args = ap.parse_args()
    t0 = time.perf_counter()
    windows, took = _windows(args.log, args.year, args.window)
    total = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("| step | s |\n|---|---:|")
    for step, s in took.items():
        print(f"| {step} | {s:.0f} |" if step.startswith("(") else f"| {step} | {s:.2f} |")
    print(f"| all | {total:.2f} |")
    print(f"\n{windows.height} windows; peak RSS {rss:.0f} MiB (polars and this script)")
    if args.check:
        bad = _check(args.log, args.year, windows)
        print(f"check against analyze's JSON: {bad} differing value(s) in {len(_FIELDS)} fields")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
