"""Time preemptdiag against `grep -E -c` on generated vLLM logs; print a Markdown table.

    python bench/run.py [--sizes 100MiB,1GiB] [--dense 10MiB] [--gz 100MiB] [--jobs 1,2]
                        [--spans 1,10,30] [--busy 30] [--pinned 30] [--v0 30] [--requests 1GiB]
                        [--thrash 1,3] [--ways stdin,tz,window,since] [--kubectl 10] [--kubectl-thrash 1]
                        [--repeat 3] [--engines hyperscan,aho,python]

Files come from bench/generate.py (seed 0), kept in a temp dir and reused across
runs; each is read once before timing so every tool meets a warm page cache.

Rows:
- start-up: `preemptdiag --help`, and `analyze` of samples/v0_thrash_loop.log (4 KiB).
- per size: `grep -E -c`: GNU grep, LC_ALL=C, the alternation of the same literal set.
- `analyze`: `python -m preemptdiag analyze FILE --format json --jobs N`, end to end.
  When the command fails (the CLI still being built), the row says so.
- `SIZE dense` (`--dense`, default 10MiB): an SGLang log with request logging off,
  where nearly every line is a signal line (bench/generate.py --profile sglang-dense).
  Bytes are not the cost there: every line is matched, parsed and kept as an event.
- `N d stats` (`--spans`, days, default 1,10,30): a healthy V1 server with request
  logging off, one stats line every 10 s (bench/generate.py --profile vllm-stats):
  signal lines grow with the log's span, not its traffic.
- `N d busy` (`--busy`, days, default 30): the same stats lines of a server at its
  --max-num-seqs cap, requests waiting on every line, nothing preempted
  (--profile vllm-stats-busy): every window queueing, none a healthy minute's.
- `N d pinned` (`--pinned`, days, default 30): the same stats lines of a server at its
  cap with its KV pool at 90-100 % and a queue the whole time (--profile
  vllm-stats-pinned): a V1 server under steady load, as vLLM prints it (no preemption
  shown), its windows suspected preemption (PD107) or queueing by the minute.
- `N d V0` (`--v0`, days, default 30): a V0 server's stats lines (`INFO MM-DD HH:MM:SS
  metrics.py:396] ...`, no process name), quiet and queueing by the hour
  (--profile vllm-v0-stats).
- `SIZE requests` (`--requests`, default 1GiB): a busy V1 chat server with request
  logging on, short prompts in `Received request` lines, uvicorn access lines
  (--profile vllm-requests): many short lines a GiB, many loose literal hits.
- `rg -c` (when ripgrep is installed; `n/a` otherwise): the second reference, the
  same alternation. It maps the file, so its peak RSS counts the file's pages.
- `N d thrash` (`--thrash`, days, default 1,3): an SGLang server in a thrash loop all
  along, a retraction every ~5 s (--profile sglang-thrash), and `N d thrash x8` the same
  retracting every ~1 s, each printed by 8 TP ranks (--profile sglang-thrash-ranks):
  every minute an incident's, so memory follows the busy minutes, not the retractions.
- `--ways` (default none): the `N d stats` logs also read the ways a user may ask
  for them, each a row of its own: piped (`analyze - < FILE`, "stdin"), with a named
  zone (`--tz Europe/Berlin`, "tz"), in 5-minute windows (`--window 300`, "window"),
  and from the second day on (`--since 2026-06-04T00:00`, "since"). Each once kept
  every stats line as an event.
- `N d stats, kubectl` (`--kubectl`, days, default none): the `N d stats` log with
  the stamp `kubectl logs --timestamps` puts in front of every line (--profile
  vllm-stats-kubectl: as many lines, ~31 bytes more each).
- `N d thrash x8, kubectl` (`--kubectl-thrash`, days, default none): as many bytes of
  the `N d thrash x8` log and of it so stamped, each rank's copy of a retraction a
  nanosecond of its own (--profile sglang-thrash-ranks-kubectl).
- `SIZE .gz` (`--gz`, default 100MiB): the vLLM log gzipped at the default level, as
  logrotate leaves it, against `gzip -dc FILE | grep -E -c` (one worker: a gzip stream
  cannot be cut; MB/s counts the log's bytes, decompressed).
- `scan (ENGINE)`: the prefilter alone (iter_blocks + LineFinder + number_lines, over
  `split_ranges` parts in N processes), in a child process. By default only the
  engine `analyze` uses (the fastest installed); `--engines` times others too. The
  pure-Python engine ("python") is slow on large literal sets and runs once.

Seconds are the best of `--repeat` rounds in which the commands take turns (this box
is shared and its speed drifts by up to 2x within a minute; interleaving exposes every
tool to the same drift, and the best run is the least disturbed). MB/s uses 10^6
bytes. Peak RSS is the largest single process (the child or one of its workers:
ru_maxrss via GNU time's %M; without /usr/bin/time, wait4's figure, which also counts
this script's own RSS at the fork, so an upper bound). "x grep" is seconds / grep's
seconds; "CPU s" is user + system time of the command and its children (wait4),
"x grep CPU" and "x rg CPU" its ratio to each reference's. The scan rows also check
that the candidate-line count equals grep's count.
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from generate import PROFILES, parse_size, span_bytes, thrash_bytes  # noqa: E402

# Used while signatures/ holds too few literals to be representative.
FALLBACK_LITERALS = (
    "reempt",
    "throughput",
    "Waiting: ",
    "blocks",
    "KV cache",
    "KV Cache",
    "concurrency",
    "out of memory",
    "ut of memory",
    "LLM engine",
    "args: ",
    "version ",
    "swap space",
    "ALLOC_FAILED",
    "need_size",
    "died unexpectedly",
    "fatal error",
    "EngineDead",
    "already dead",
    "etract",
    "#running-req",
    "oom",
    "OOM",
    "Killed",
    "code 137",
    "Exit Code:",
    "ExitCode",
    "Exited (137)",
    "Restart Count",
    "memory pressure",
    "exception",
)
MIN_SIGNATURE_LITERALS = 15
_ERE_SPECIAL = set(".[]()*+?{}|^$\\")
TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None


def literal_set(sig_dir: Path = REPO / "signatures") -> tuple[list[str], str]:
    """Every `prefilter` literal in signatures/*.toml, or the fallback set."""
    found: dict[str, None] = {}
    for path in sorted(sig_dir.glob("*.toml")):
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            continue  # someone is mid-edit; the benchmark must not care
        for sig in data.get("signature", []):
            for lit in sig.get("prefilter", []):
                if isinstance(lit, str) and lit:
                    found.setdefault(lit, None)
    if len(found) >= MIN_SIGNATURE_LITERALS:
        return list(found), f"{len(found)} literals from {sig_dir}/*.toml"
    return list(FALLBACK_LITERALS), (
        f"fallback set of {len(FALLBACK_LITERALS)} literals (signatures/ has {len(found)})"
    )


def ere(literals: Sequence[str]) -> str:
    return "|".join("".join("\\" + c if c in _ERE_SPECIAL else c for c in lit) for lit in literals)


def ensure_file(directory: Path, size: int, profile: str = "vllm") -> Path:
    if profile.endswith("-gz"):
        return _ensure_gz(ensure_file(directory, size, profile.removesuffix("-gz")))
    path = directory / f"{profile}-{size}-seed0.log"
    if not path.exists():
        tmp = path.with_suffix(".part")
        with tmp.open("wb") as f:
            PROFILES[profile](f, size, 0)
        tmp.replace(path)  # a killed run never leaves a half file to reuse
    return _cached(path)


def _ensure_gz(plain: Path) -> Path:
    """`plain` gzipped at gzip's default level, as logrotate leaves it."""
    path = plain.with_name(plain.name + ".gz")
    if not path.exists():
        tmp = path.with_suffix(".part")
        with (
            plain.open("rb") as src,
            tmp.open("wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as dst,
        ):
            shutil.copyfileobj(src, dst, 16 << 20)
        tmp.replace(path)
    return _cached(path)


def _cached(path: Path) -> Path:
    with path.open("rb") as f:  # into the page cache
        while f.read(16 << 20):
            pass
    return path


@dataclass(frozen=True, slots=True)
class Run:
    seconds: float
    cpu: float  # user + system seconds, children included
    rss_mib: float
    rc: int
    stdout: str
    stderr: str


def timed(cmd: Sequence[str], env: dict[str, str] | None = None) -> Run:
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile(mode="r") as rss_file,
    ):
        if TIME:
            # A child forked from this (large) Python process starts with our RSS as
            # its high-water mark; one forked from GNU time starts near zero.
            cmd = [TIME, "-f", "%M", "-o", rss_file.name, *cmd]
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        seconds = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        rss_kib = float(usage.ru_maxrss)
        if TIME:
            text = rss_file.read().strip().splitlines()
            rss_kib = float(text[-1]) if text and text[-1].isdigit() else float("nan")
        out.seek(0)
        err.seek(0)
        return Run(
            seconds,
            usage.ru_utime + usage.ru_stime,
            rss_kib / 1024,
            p.returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )


def best_interleaved(cmds: Sequence[Timed], repeat: int) -> list[Run]:
    """Best run of each command over `repeat` rounds, the commands taking turns, so
    a noisy minute on a shared box hits every tool alike."""
    found: list[Run | None] = [None] * len(cmds)
    for round_no in range(repeat):
        for i, c in enumerate(cmds):
            if round_no >= c.rounds:
                continue
            r = timed(c.cmd, c.env)
            prev = found[i]
            if (
                prev is None
                or (r.rc == prev.rc and r.seconds < prev.seconds)
                or prev.rc not in (0, 1)
            ):
                found[i] = r
    return [r for r in found if r is not None]


@dataclass(frozen=True, slots=True)
class Timed:
    tool: str
    jobs: int
    cmd: list[str]
    env: dict[str, str]
    rounds: int = 99


def scan_only(path: str, jobs: int, engine: str, literals: list[str]) -> None:
    """Child-process body: the prefilter alone, as scan.py drives it."""
    from concurrent.futures import ProcessPoolExecutor

    from preemptdiag.scan.prefilter import split_ranges

    ranges = split_ranges(path, jobs)
    args = [(path, r, engine, literals) for r in ranges]
    if jobs == 1:
        parts = [_scan_part(a) for a in args]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            parts = list(pool.map(_scan_part, args))
    print(
        json.dumps({"candidates": sum(p[0] for p in parts), "newlines": sum(p[1] for p in parts)})
    )


def _scan_part(arg: tuple[str, tuple[int, int], str, list[str]]) -> tuple[int, int]:
    from preemptdiag.scan.prefilter import LineFinder, iter_blocks, number_lines

    path, rng, engine, literals = arg
    finder = LineFinder([lit.encode() for lit in literals], engine=engine)  # type: ignore[arg-type]
    n_cand = 0
    next_line = 1
    with open(path, "rb", buffering=0) as f:
        for block, size, _ in iter_blocks(f, byte_range=rng):
            spans = finder.candidate_lines(block, size)
            _, newlines = number_lines(block, spans, next_line, size)
            next_line += newlines
            n_cand += len(spans)
    return n_cand, next_line - 1


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    tool: str
    jobs: str
    run: Run | None  # None: the tool is not installed
    mbs: float  # NaN: start-up rows have no size
    grep: Run | None = None
    rg: Run | None = None

    def markdown(self) -> str:
        r = self.run
        if r is None:
            return f"| {self.label} | {self.tool} | - | n/a | n/a | n/a | n/a | n/a | n/a | n/a |"

        def ratio(num: float, ref: float | None) -> str:
            return f"{num / ref:.2f}" if ref else "-"

        speed = "-" if self.mbs != self.mbs else f"{self.mbs:.0f}"
        return (
            f"| {self.label} | {self.tool} | {self.jobs} | {r.seconds:.2f} | {r.cpu:.2f} | "
            f"{speed} | {r.rss_mib:.0f} | {ratio(r.seconds, self.grep and self.grep.seconds)} | "
            f"{ratio(r.cpu, self.grep and self.grep.cpu)} | "
            f"{ratio(r.cpu, self.rg.cpu) if self.rg else 'n/a'} |"
        )


# --ways: what each reads the stats log as (the generated log starts on June 3rd, in
# the year of its file time: 2026 given with --year, so --since names a date in it).
WAYS = {
    "stdin": ("analyze - < FILE", ["-"]),
    "tz": ("analyze --tz Europe/Berlin", ["--tz", "Europe/Berlin"]),
    "window": ("analyze --window 300", ["--window", "300"]),
    "since": ("analyze --since 2nd day", ["--year", "2026", "--since", "2026-06-04T00:00"]),
}


def _way(way: str, py: list[str], path: Path, jobs: int) -> tuple[str, list[str]]:
    """(the row's tool, the command) of analyze reading `path` the way `way` says."""
    if way not in WAYS:
        raise SystemExit(f"--ways: unknown way {way!r} (any of {', '.join(WAYS)})")
    tool, extra = WAYS[way]
    flags = ["--format", "json", "--jobs", str(jobs)]
    if way == "stdin":
        line = shlex.join([*py, "analyze", "-", *flags])
        return tool, ["sh", "-c", f"{line} < {shlex.quote(str(path))}"]
    return tool, [*py, "analyze", str(path), *extra, *flags]


def _count_lines(path: Path) -> int:
    n = 0
    with path.open("rb") as f:
        while chunk := f.read(16 << 20):
            n += chunk.count(b"\n")
    return n


def _fmt_size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="preemptdiag benchmark")
    ap.add_argument("--sizes", default="100MiB,1GiB")
    ap.add_argument(
        "--dense",
        default="10MiB",
        help="sizes of the SGLang log with request logging off (every line a signal line)",
    )
    ap.add_argument(
        "--gz",
        default="100MiB",
        help="sizes of the vLLM log to time gzipped (one worker: a gzip stream cannot be cut)",
    )
    ap.add_argument(
        "--spans",
        default="1,10,30",
        help="days of a stats-only healthy V1 log (one stats line every 10 s)",
    )
    ap.add_argument(
        "--busy",
        default="30",
        help="days of a stats-only V1 log of a server queueing on every line",
    )
    ap.add_argument(
        "--pinned",
        default="30",
        help="days of a stats-only V1 log of a server with its KV pool pinned and a queue",
    )
    ap.add_argument(
        "--v0",
        default="30",
        help="days of a stats-only V0 log, quiet and queueing by the hour",
    )
    ap.add_argument(
        "--requests",
        default="1GiB",
        help="sizes of the V1 log with request logging on (short prompts, access lines)",
    )
    ap.add_argument(
        "--thrash",
        default="1,3",
        help="days of an SGLang log thrashing all along (one rank, and eight)",
    )
    ap.add_argument(
        "--kubectl",
        default="",
        help="days of the stats-only log with a kubectl --timestamps stamp on every line",
    )
    ap.add_argument(
        "--kubectl-thrash",
        default="",
        help="days of the eight-rank SGLang thrash log, kubectl --timestamps stamped",
    )
    ap.add_argument(
        "--ways",
        default="",
        help="the stats spans also read piped, with a named zone, in 5-minute windows or "
        "--since: any of stdin,tz,window,since",
    )
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--engines", help="prefilter engines to time (default: the one auto picks)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "preemptdiag-bench")
    ap.add_argument("--scan-only", metavar="FILE", help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--literals", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    jobs_list = [int(j) for j in args.jobs.split(",")]
    if args.scan_only:
        scan_only(args.scan_only, jobs_list[0], args.engine, json.loads(args.literals))
        return 0

    grep = shutil.which("grep")
    rg = shutil.which("rg")
    literals, origin = literal_set()
    notes: list[str] = [f"literal set: {origin}"]
    args.dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, LC_ALL="C", PYTHONPATH=str(REPO))
    # Time what an installed copy runs: pip writes bytecode at install. Some shells
    # set PYTHONDONTWRITEBYTECODE, and compiling every module per run adds ~60 ms.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    compileall.compile_dir(REPO / "preemptdiag", quiet=1)
    from preemptdiag.scan.prefilter import available_engines

    engines = args.engines.split(",") if args.engines else available_engines()[:1]

    rows: list[Row] = []
    py = [sys.executable, "-m", "preemptdiag"]
    sample = REPO / "samples" / "v0_thrash_loop.log"
    startup = [
        Timed("--help", 1, [*py, "--help"], env),
        Timed(f"analyze {sample.name}", 1, [*py, "analyze", str(sample), "--format", "json"], env),
    ]
    for c, r in zip(startup, best_interleaved(startup, max(args.repeat, 5)), strict=True):
        rows.append(Row("start-up", c.tool, "1", r, float("nan")))
    todo = [(parse_size(s), s, "vllm") for s in args.sizes.split(",") if s]
    todo += [(parse_size(s), s, "sglang-dense") for s in args.dense.split(",") if s]
    todo += [(span_bytes(float(d)), f"{d} d", "vllm-stats") for d in args.spans.split(",") if d]
    todo += [
        (span_bytes(float(d)), f"{d} d", "vllm-stats-kubectl") for d in args.kubectl.split(",") if d
    ]
    todo += [(span_bytes(float(d)), f"{d} d", "vllm-stats-busy") for d in args.busy.split(",") if d]
    todo += [
        (span_bytes(float(d)), f"{d} d", "vllm-stats-pinned") for d in args.pinned.split(",") if d
    ]
    todo += [(span_bytes(float(d)), f"{d} d", "vllm-v0-stats") for d in args.v0.split(",") if d]
    todo += [(parse_size(s), s, "vllm-requests") for s in args.requests.split(",") if s]
    todo += [(parse_size(s), s, "vllm-gz") for s in args.gz.split(",") if s]
    for d in (d for d in args.thrash.split(",") if d):
        todo.append((thrash_bytes(float(d)), f"{d} d", "sglang-thrash"))
        todo.append((thrash_bytes(float(d), every_s=1.0, ranks=8), f"{d} d", "sglang-thrash-ranks"))
    for d in (d for d in args.kubectl_thrash.split(",") if d):
        size = thrash_bytes(float(d), every_s=1.0, ranks=8)
        todo.append((size, f"{d} d", "sglang-thrash-ranks"))
        todo.append((size, f"{d} d", "sglang-thrash-ranks-kubectl"))
    suffix = {
        "vllm": "",
        "sglang-dense": " dense",
        "vllm-gz": " .gz",
        "vllm-stats": " stats",
        "vllm-stats-kubectl": " stats, kubectl",
        "vllm-stats-busy": " busy",
        "vllm-stats-pinned": " pinned",
        "vllm-v0-stats": " V0",
        "vllm-requests": " requests",
        "sglang-thrash": " thrash",
        "sglang-thrash-ranks": " thrash x8",
        "sglang-thrash-ranks-kubectl": " thrash x8, kubectl",
    }
    for size, size_text, profile in todo:
        path = ensure_file(args.dir, size, profile)
        gz = profile.endswith("-gz")
        # MB/s counts the log's bytes: decompressed ones for a .gz.
        real = (path.with_suffix("") if gz else path).stat().st_size
        name = size_text if "stats" in profile or "thrash" in profile else _fmt_size(size)
        label = name + suffix[profile]
        cmds: list[Timed] = []
        if grep and gz:
            # The yardstick for a .gz: decompress and grep in a pipe (two processes).
            pipe = f"gzip -dc {shlex.quote(str(path))} | {grep} -E -c {shlex.quote(ere(literals))}"
            cmds.append(Timed("gzip -dc, grep -E -c", 1, ["sh", "-c", pipe], env))
        elif grep:
            cmds.append(Timed("grep -E -c", 1, [grep, "-E", "-c", ere(literals), str(path)], env))
        if rg and not gz:
            cmds.append(Timed("rg -c", 1, [rg, "-c", ere(literals), str(path)], env))
        for jobs in jobs_list[:1] if gz else jobs_list:
            analyze = [*py, "analyze", str(path), "--format", "json", "--jobs", str(jobs)]
            cmds.append(Timed("analyze", jobs, analyze, env))
            for way in (w for w in args.ways.split(",") if w) if profile == "vllm-stats" else ():
                tool, cmd = _way(way, py, path, jobs)
                cmds.append(Timed(tool, jobs, cmd, env))
            for engine in engines if profile == "vllm" else ():
                scan = [
                    sys.executable,
                    str(HERE / "run.py"),
                    "--scan-only",
                    str(path),
                    "--jobs",
                    str(jobs),
                    "--engine",
                    engine,
                    "--literals",
                    json.dumps(literals),
                ]
                cmds.append(
                    Timed(f"scan ({engine})", jobs, scan, env, 1 if engine == "python" else 99)
                )
        runs = best_interleaved(cmds, args.repeat)
        grep_run = next((r for c, r in zip(cmds, runs, strict=True) if "grep" in c.tool), None)
        rg_run = next((r for c, r in zip(cmds, runs, strict=True) if c.tool == "rg -c"), None)
        grep_count = int(grep_run.stdout.strip() or 0) if grep_run else None
        if rg_run and grep_count is not None and int(rg_run.stdout.strip() or 0) != grep_count:
            notes.append(f"MISMATCH {label} rg -c: {rg_run.stdout.strip()}, grep {grep_count}")
        for c, r in zip(cmds, runs, strict=True):
            if c.tool.startswith("scan"):
                if r.rc != 0:
                    notes.append(f"{c.tool} failed: {r.stderr.strip()[-300:]}")
                    continue
                got = json.loads(r.stdout)["candidates"]
                if grep_count is not None and got != grep_count:
                    notes.append(
                        f"MISMATCH {label} {c.tool} jobs {c.jobs}: "
                        f"{got} candidate lines, grep counted {grep_count}"
                    )
            elif c.tool.startswith("analyze") and r.rc not in (0, 1):
                why = (r.stderr.strip().splitlines() or ["no output"])[0][:120]
                notes.append(
                    f"analyze: not available ({label}, --jobs {c.jobs}: exit {r.rc}: {why})"
                )
                continue
            rows.append(
                Row(label, c.tool, str(c.jobs), r, real / 1e6 / r.seconds, grep_run, rg_run)
            )
        lines = _count_lines(path.with_suffix("") if gz else path)
        if grep_count is not None:
            notes.append(f"{label}: {grep_count} candidate lines of {lines} lines, {real} bytes")
        if rg is None and not gz:
            rows.append(Row(label, "rg -c: n/a (ripgrep not installed)", "-", None, float("nan")))

    print(
        "| size | tool | jobs | seconds | CPU s | MB/s | peak RSS MiB | x grep | "
        "x grep CPU | x rg CPU |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(row.markdown())
    print()
    for note in notes:
        print(f"- {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
