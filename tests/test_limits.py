from pathlib import Path

import pytest

from preemptdiag.analyze import scan_sources
from preemptdiag.errors import DiagError
from preemptdiag.limits import (
    FLOOR,
    WITHOUT_MEMINFO,
    available_bytes,
    default_max_events,
    too_many,
)
from preemptdiag.signatures import load
from preemptdiag.sources import open_source

DECODE = (
    "[2025-11-02 09:58:{s:02d} TP0] Decode batch, #running-req: 10, #token: 9323, "
    "token usage: 0.04, cuda graph: True, gen throughput (token/s): 158.09, #queue-req: 0, "
)


def meminfo(tmp_path: Path, available_kib: int | None) -> Path:
    p = tmp_path / "meminfo"
    lines = ["MemTotal:       25165824 kB"]
    if available_kib is not None:
        lines.append(f"MemAvailable:   {available_kib} kB")
    p.write_text("\n".join(lines) + "\n")
    return p


def test_half_of_available_memory_at_3_kib_an_event(tmp_path: Path) -> None:
    p = meminfo(tmp_path, 16 * 1024 * 1024)  # 16 GiB
    assert available_bytes(p) == 16 * 2**30
    assert default_max_events(p) == 16 * 2**30 // 2 // 3072  # 2,796,202


def test_a_busy_machine_still_reads_a_modest_log(tmp_path: Path) -> None:
    assert default_max_events(meminfo(tmp_path, 100 * 1024)) == FLOOR


def test_without_meminfo(tmp_path: Path) -> None:
    assert default_max_events(tmp_path / "absent") == WITHOUT_MEMINFO
    assert default_max_events(meminfo(tmp_path, None)) == WITHOUT_MEMINFO


def test_message_sizes_what_the_limit_holds() -> None:
    assert too_many("a.log", 1000).message == (
        "a.log: more than 1,000 signal lines (~3 MiB to hold them); cut the log to the "
        "incident's time range first, or raise --max-events (0: no limit)"
    )
    assert "(~5.7 GiB to hold them)" in too_many("a.log", 2_000_000).message


def _dense(path: Path, n: int) -> Path:
    path.write_text("".join(DECODE.format(s=i % 60) + "\n" for i in range(n)))
    return path


def test_limit_counts_across_files(tmp_path: Path) -> None:
    a, b = _dense(tmp_path / "a.log", 30), _dense(tmp_path / "b.log", 30)
    srcs = [open_source(str(a)), open_source(str(b))]
    assert [len(r.hits) for r in scan_sources(srcs, load(None), 1, max_hits=60)] == [30, 30]
    with pytest.raises(DiagError, match=r"b\.log: more than 59 signal lines"):
        scan_sources(srcs, load(None), 1, max_hits=59)


def test_limit_in_forked_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import preemptdiag.parallel as parallel

    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1)
    path = _dense(tmp_path / "big.log", 400)
    src = open_source(str(path))
    assert parallel.can_split(src, 2)
    # Each worker holds a quarter or so, under the limit: the merged total trips it.
    with pytest.raises(DiagError, match=r"big\.log: more than 300 signal lines"):
        scan_sources([src], load(None), 2, max_hits=300)
    # One worker's range alone over the limit stops inside that worker.
    with pytest.raises(DiagError, match=r"big\.log: more than 20 signal lines"):
        scan_sources([src], load(None), 2, max_hits=20)
    assert len(scan_sources([src], load(None), 2, max_hits=400)[0].hits) == 400
