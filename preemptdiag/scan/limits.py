"""How many events one run may keep, so a log never runs the machine out of memory.

Memory is flat in bytes read, and stats lines are merged per stream and clock minute
(rollup.py), but every other signal line is an event of its own (its text, fields and
stamp, and a row of the windows table: ~2.2-2.6 KB measured, bench/README.md). A log
dense in such lines (or in stats lines without a usable stamp) could otherwise grow
without bound. A rollup counts as the lines it keeps (its carrier, last line, peak
and first preempting lines: up to four hits, 5-6 KB measured, not one event's 3 KB).

The limit is one budget for the run: --jobs workers add what they hold to a shared
count after every block (`Budget`), so N workers stop where one process would, and
the parent never receives (unpickles) more than the budget and a block per worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from preemptdiag.model.errors import DiagError

BYTES_PER_EVENT = 3 * 1024  # measured ~2.4 KB, rounded up: the guard must err early
SHARE_OF_AVAILABLE = 0.5  # leave the other half to the rest of the machine
FLOOR = 200_000  # never refuse a log this small on a busy machine (~600 MiB)
WITHOUT_MEMINFO = 2_000_000  # no /proc/meminfo (macOS, BSD): ~6 GiB
_NO_LIMIT = 1 << 60


def available_bytes(root: Path = Path("/")) -> int | None:
    """What this process may still allocate: MemAvailable, capped by the headroom of
    its memory cgroup (a pod or container sees the host's /proc/meminfo)."""
    figures = [b for b in (_meminfo_available(root), _cgroup_headroom(root)) if b is not None]
    return min(figures) if figures else None


def _meminfo_available(root: Path) -> int | None:
    for line in _read(root / "proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def _cgroup_headroom(root: Path) -> int | None:
    # v2: "0::/path", files memory.max / memory.current; v1: "N:memory:/path",
    # memory.limit_in_bytes / memory.usage_in_bytes under the memory controller.
    # Inside a cgroup namespace the path is "/" and the mount root is the group.
    for line in _read(root / "proc/self/cgroup").splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        rel = path.strip().lstrip("/")
        if controllers == "":
            found = _limit_minus_usage(
                [root / "sys/fs/cgroup" / rel, root / "sys/fs/cgroup"],
                "memory.max",
                "memory.current",
            )
        elif "memory" in controllers.split(","):
            base = root / "sys/fs/cgroup/memory"
            found = _limit_minus_usage(
                [base / rel, base], "memory.limit_in_bytes", "memory.usage_in_bytes"
            )
        else:
            continue
        if found is not None:
            return found
    return None


def _limit_minus_usage(dirs: list[Path], limit_file: str, usage_file: str) -> int | None:
    for d in dirs:
        limit, usage = _read(d / limit_file).strip(), _read(d / usage_file).strip()
        if limit.isdigit() and usage.isdigit():
            if int(limit) >= _NO_LIMIT:
                return None  # "unlimited" is printed as a huge page-rounded number
            return max(0, int(limit) - int(usage))
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def default_max_events(root: Path = Path("/")) -> int:
    avail = available_bytes(root)
    if avail is None:
        return WITHOUT_MEMINFO
    return max(FLOOR, int(avail * SHARE_OF_AVAILABLE / BYTES_PER_EVENT))


def too_many(name: str, limit: int) -> DiagError:
    need = limit * BYTES_PER_EVENT
    size = f"{need / 2**30:.1f} GiB" if need >= 2**30 else f"{need / 2**20:.0f} MiB"
    return DiagError(
        f"{name}: more than {limit:,} signal events (~{size} to hold them); cut the log "
        "to the incident's time range first, or raise --max-events (0: no limit)"
    )


class SharedCounts(Protocol):
    """A multiprocessing.Array of int64: one slot per source, with its lock."""

    def __getitem__(self, i: int, /) -> int: ...
    def __setitem__(self, i: int, v: int, /) -> None: ...
    def __len__(self) -> int: ...
    def get_lock(self) -> AbstractContextManager[object]: ...


class Budget:
    """--max-events across forked workers: slot `index` (a source) of `counts` holds
    what the workers scanning that source hold; past `limit` in all, the worker that
    sees it raises (the parent names the source where input order crosses it)."""

    def __init__(self, counts: SharedCounts, index: int, limit: int, name: str) -> None:
        self.counts, self.index, self.limit, self.name = counts, index, limit, name
        self.reported = 0

    def spend(self, held: int) -> None:
        delta, self.reported = held - self.reported, held
        if not delta:
            return
        with self.counts.get_lock():
            self.counts[self.index] += delta
            total = sum(self.counts[i] for i in range(len(self.counts)))
        if total > self.limit:
            raise too_many(self.name, self.limit)


def first_over(counts: Sequence[int], limit: int) -> int | None:
    """The position where the running total of `counts` first passes `limit`."""
    total = 0
    for i, n in enumerate(counts):
        total += n
        if total > limit:
            return i
    return None
