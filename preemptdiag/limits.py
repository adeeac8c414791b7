"""How many signal lines one run may keep, so a log never runs the machine out of memory.

Memory is flat in bytes read but not in signal lines: each becomes an event (its text,
fields and stamp) and a row of the windows table, ~2.2-2.6 KB measured on vLLM and
SGLang logs (bench/README.md). A log where nearly every line is a signal line (SGLang
batch lines twice a second, days of them) would otherwise grow without bound.
"""

from __future__ import annotations

from pathlib import Path

from preemptdiag.errors import DiagError

BYTES_PER_EVENT = 3 * 1024  # measured ~2.4 KB, rounded up: the guard must err early
SHARE_OF_AVAILABLE = 0.5  # leave the other half to the rest of the machine
FLOOR = 200_000  # never refuse a log this small on a busy machine (~600 MiB)
WITHOUT_MEMINFO = 2_000_000  # no /proc/meminfo (macOS, BSD): ~6 GiB


def available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def default_max_events(meminfo: Path = Path("/proc/meminfo")) -> int:
    avail = available_bytes(meminfo)
    if avail is None:
        return WITHOUT_MEMINFO
    return max(FLOOR, int(avail * SHARE_OF_AVAILABLE / BYTES_PER_EVENT))


def too_many(name: str, limit: int) -> DiagError:
    need = limit * BYTES_PER_EVENT
    size = f"{need / 2**30:.1f} GiB" if need >= 2**30 else f"{need / 2**20:.0f} MiB"
    return DiagError(
        f"{name}: more than {limit:,} signal lines (~{size} to hold them); cut the log "
        "to the incident's time range first, or raise --max-events (0: no limit)"
    )
