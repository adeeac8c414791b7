from pathlib import Path

import pytest

from preemptdiag.commands.analyze import scan_sources
from preemptdiag.ingest.sources import open_source
from preemptdiag.model.errors import DiagError
from preemptdiag.scan.limits import (
    FLOOR,
    WITHOUT_MEMINFO,
    available_bytes,
    default_max_events,
    too_many,
)
from preemptdiag.scan.matcher import Matcher
from preemptdiag.scan.signatures import load

MATCHER = Matcher(load())
RETRACT = (
    "[2025-11-02 09:58:{s:02d} TP0] KV cache pool is full. Retract requests. "
    "#retracted_reqs: 1, #new_token_ratio: 0.4512 -> 0.8127"
)


def machine(
    root: Path,
    available_kib: int | None,
    cgroup: str = "",
    files: dict[str, str] | None = None,
) -> Path:
    """A fake / with /proc/meminfo, /proc/self/cgroup and cgroup files under it."""
    (root / "proc/self").mkdir(parents=True)
    lines = ["MemTotal:       25165824 kB"]
    if available_kib is not None:
        lines.append(f"MemAvailable:   {available_kib} kB")
    (root / "proc/meminfo").write_text("\n".join(lines) + "\n")
    (root / "proc/self/cgroup").write_text(cgroup)
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    return root


GIB = 2**30


def test_half_of_available_memory_at_3_kib_an_event(tmp_path: Path) -> None:
    root = machine(tmp_path, 16 * 1024 * 1024)  # 16 GiB
    assert available_bytes(root) == 16 * GIB
    assert default_max_events(root) == 16 * GIB // 2 // 3072  # 2,796,202


def test_a_busy_machine_still_reads_a_modest_log(tmp_path: Path) -> None:
    assert default_max_events(machine(tmp_path, 100 * 1024)) == FLOOR


def test_without_meminfo(tmp_path: Path) -> None:
    assert default_max_events(tmp_path / "absent") == WITHOUT_MEMINFO
    assert default_max_events(machine(tmp_path, None)) == WITHOUT_MEMINFO


def test_a_pod_sees_its_cgroup_v2_limit_not_the_host(tmp_path: Path) -> None:
    root = machine(
        tmp_path,
        64 * 1024 * 1024,  # the host's 64 GiB
        "0::/kubepods/pod1/c1\n",
        {
            "sys/fs/cgroup/kubepods/pod1/c1/memory.max": str(4 * GIB),
            "sys/fs/cgroup/kubepods/pod1/c1/memory.current": str(1 * GIB),
        },
    )
    assert available_bytes(root) == 3 * GIB


def test_cgroup_v1_namespaced_root_and_unlimited(tmp_path: Path) -> None:
    limited = machine(
        tmp_path / "a",
        64 * 1024 * 1024,
        "5:cpu:/\n4:memory:/\n",
        {
            "sys/fs/cgroup/memory/memory.limit_in_bytes": str(2 * GIB),
            "sys/fs/cgroup/memory/memory.usage_in_bytes": str(GIB // 2),
        },
    )
    assert available_bytes(limited) == GIB + GIB // 2
    unlimited = machine(
        tmp_path / "b",
        8 * 1024 * 1024,
        "4:memory:/x\n",
        {
            "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
            "sys/fs/cgroup/memory/memory.usage_in_bytes": str(GIB),
        },
    )
    assert available_bytes(unlimited) == 8 * GIB
    v2_max = machine(
        tmp_path / "c",
        8 * 1024 * 1024,
        "0::/\n",
        {"sys/fs/cgroup/memory.max": "max", "sys/fs/cgroup/memory.current": "1"},
    )
    assert available_bytes(v2_max) == 8 * GIB


def test_message_sizes_what_the_limit_holds() -> None:
    assert too_many("a.log", 1000).message == (
        "a.log: more than 1,000 signal events (~3 MiB to hold them); cut the log to the "
        "incident's time range first, or raise --max-events (0: no limit)"
    )
    assert "(~5.7 GiB to hold them)" in too_many("a.log", 2_000_000).message


def _dense(path: Path, n: int) -> Path:
    path.write_text("".join(RETRACT.format(s=i % 60) + "\n" for i in range(n)))
    return path


def test_limit_counts_across_files(tmp_path: Path) -> None:
    a, b = _dense(tmp_path / "a.log", 30), _dense(tmp_path / "b.log", 30)
    srcs = [open_source(str(a)), open_source(str(b))]
    assert [len(r.hits) for r in scan_sources(srcs, MATCHER, 1, max_hits=60)] == [30, 30]
    with pytest.raises(DiagError, match=r"b\.log: more than 59 signal events"):
        scan_sources(srcs, MATCHER, 1, max_hits=59)


def test_limit_in_forked_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import preemptdiag.scan.parallel as parallel

    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1)
    path = _dense(tmp_path / "big.log", 400)
    src = open_source(str(path))
    assert parallel.can_split(src, 2)
    # Each worker holds a quarter or so, under the limit: the merged total trips it.
    with pytest.raises(DiagError, match=r"big\.log: more than 300 signal events"):
        scan_sources([src], MATCHER, 2, max_hits=300)
    # One worker's range alone over the limit stops inside that worker.
    with pytest.raises(DiagError, match=r"big\.log: more than 20 signal events"):
        scan_sources([src], MATCHER, 2, max_hits=20)
    assert len(scan_sources([src], MATCHER, 2, max_hits=400)[0].hits) == 400
