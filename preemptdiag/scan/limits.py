"""How many events one run may keep, so a log never runs the machine out of memory.

Memory is flat in bytes read, and stats lines are merged per stream and clock minute
(rollup.py), but every other signal line is an event of its own (its text, fields and
stamp, and a row of the windows table: ~2.2-2.6 KB measured, bench/README.md). A log
dense in such lines (or in stats lines without a usable stamp) could otherwise grow
without bound. A rollup counts as one event though it holds a few lines (~9 KB with
its window, against ~2.4 KB for a plain event); it stands for a minute of log, so a
limit it could reach means years of one stream.
"""

from __future__ import annotations

from pathlib import Path

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
