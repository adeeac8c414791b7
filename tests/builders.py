"""Record builders shared by the tests: one place that knows every Window field."""

from __future__ import annotations

import gc
import io
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from preemptdiag.ingest.sources import Source
from preemptdiag.model.records import Event, FieldValue, Kind, Window
from preemptdiag.scan import passes
from preemptdiag.scan.matcher import Matcher
from preemptdiag.scan.signatures import Signature, load_dir

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)

# A calm, fully observed minute: tests override only what their scenario is about.
WINDOW_DEFAULTS: dict[str, Any] = dict(
    replica="a.log", n_events=12, n_stats=12, preemptions=0.0, preemptions_lower_bound=False,
    max_cumulative=None, kv_max=50.0, kv_mean=45.0, running_max=20, running_mean=18.0,
    waiting_first=0, waiting_last=0, waiting_max=0, swapped_first=0, swapped_last=0,
    swapped_max=0, prompt_tput=100.0, gen_tput=500.0, alloc_failures=0, host_ooms=0,
    engine_deaths=0, swap_warnings=0, evidence=(), waiting_share=0.0,
)  # fmt: skip


def make_window(minute: int, **overrides: Any) -> Window:
    fields = {
        **WINDOW_DEFAULTS,
        "start": T0 + timedelta(minutes=minute),
        "end": T0 + timedelta(minutes=minute + 1),
        **overrides,
    }
    return Window(**fields)


def make_event(
    kind: Kind, fields: dict[str, Any], minute: int = 0, source: str = "a", sig: str = "s"
) -> Event:
    return Event(
        source=source, line=minute + 1, sig=sig, kind=kind,
        ts=T0 + timedelta(minutes=minute), fields=fields, text=str(fields.get("subtype", "")),
    )  # fmt: skip


# --- SGLang, host, k8s, docker and Ray signatures, apart from the vLLM files ----------

SIG_DIR = Path(__file__).resolve().parent.parent / "signatures"
SYSTEM_SIG_FILES = ("sglang.toml", "host.toml", "k8s.toml", "docker.toml", "ray.toml")


def system_sigs(tmp: Path) -> list[Signature]:
    """Only the non-vLLM signature files (copied to `tmp`), so a problem in another
    family's file can neither hide nor cause a failure of these tests."""
    for name in SYSTEM_SIG_FILES:
        shutil.copy(SIG_DIR / name, tmp / name)
    return load_dir(tmp)


def first_hits(
    sigs: list[Signature], line: str, drop_none: bool = False
) -> dict[str, dict[str, FieldValue]]:
    """Signature id -> fields of its first match, as the scanner would see the line."""
    out: dict[str, dict[str, FieldValue]] = {}
    for s in sigs:
        if s.prefilter_hit(line):
            for m in s.finditer(line):
                fields = s.extract(m)
                out[s.id] = {k: v for k, v in fields.items() if v is not None or not drop_none}
                break
    return out


def analyze_lines(
    capsys: Any, tmp_path: Path, lines: list[str], name: str = "built.log"
) -> tuple[int, dict[str, Any]]:
    """Write `lines` as a log and run `analyze --format json` on it through the CLI."""
    import json

    from preemptdiag.cli import main

    log = tmp_path / name
    log.write_text("\n".join(lines) + "\n")
    code = main(["analyze", "--format", "json", str(log)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    report: dict[str, Any] = json.loads(out)
    return code, report


# --- long logs: a healthy V1 server's stats lines ------------------------------------


def v1_stats_line(ts: datetime, running: int, waiting: int, kv: float) -> str:
    """A vLLM V1 stats line as 0.10+ prints it (no year: analyze it with --year)."""
    return (
        f"(APIServer pid=1) INFO {ts:%m-%d %H:%M:%S} [loggers.py:123] Engine 000: Avg prompt "
        f"throughput: 812.4 tokens/s, Avg generation throughput: 402.7 tokens/s, Running: "
        f"{running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: {kv:.1f}%, Prefix "
        "cache hit rate: 12.0%"
    )


def healthy_v1_log(
    start: datetime,
    minutes: int,
    every: int = 10,
    spikes: dict[int, tuple[int, float]] | None = None,
) -> list[str]:
    """`minutes` of a calm V1 server, one stats line every `every` seconds: Running
    10-29, Waiting 0, KV 20.0-49.0 %. `spikes` maps a line number (0-based) to (waiting,
    KV %) on that line alone, so a test knows the exact peaks."""
    spikes = spikes or {}
    lines = []
    for i in range(minutes * 60 // every):
        waiting, kv = spikes.get(i, (0, 20.0 + (i * 7) % 30))
        lines.append(v1_stats_line(start + timedelta(seconds=i * every), 10 + i % 20, waiting, kv))
    return lines


def bench_module(stem: str) -> ModuleType:
    """bench/<stem>.py, imported once (bench/ is not a package of the wheel)."""
    import importlib.util
    import sys

    name = f"_preemptdiag_bench_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parent.parent / "bench" / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def scan_garbage(src: Source, matcher: Matcher) -> int:
    """Objects in reference cycles that one scan of `src` left behind, rollups on (as
    analyze scans): analyze runs with the cyclic collector paused (gcpause.py), so
    any such object would stay until the run ends."""
    matcher.finder()  # built before: compiling the prefilter is no scan
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        passes.scan_fast(src, matcher, rollup=True)
        return gc.collect()
    finally:
        if was:
            gc.enable()


class Pipe(io.RawIOBase):
    """stdin as a pipe gives it: short reads (at most `chunk` bytes), no seeking,
    each byte read once; `served` counts what was read."""

    def __init__(self, data: bytes, chunk: int = 4096) -> None:
        self.data = data
        self.chunk = chunk
        self.served = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), self.chunk, len(self.data) - self.served)
        b[:n] = self.data[self.served : self.served + n]
        self.served += n
        return n
