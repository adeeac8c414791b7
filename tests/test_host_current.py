"""Host memory evidence seen in real incidents: a kernel OOM report cut before its
`Killed process` line, and Ray's memory-monitor kill message. Lines that say "oom"
in other senses must match nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import analyze_lines, first_hits, system_sigs

from preemptdiag.diagnose.stories import _KILLERS
from preemptdiag.model.records import FieldValue, Kind
from preemptdiag.scan.signatures import Signature

SIG_DIR = Path(__file__).resolve().parent.parent / "signatures"
K = "Oct 30 12:00:01 gpu-node-7 kernel: [812345.1010{n}] "

# A kernel OOM report as the ring buffer left it: the victim line never came.
CUT_REPORT = [
    K.format(n=10) + "sglang::schedu invoked oom-killer: "
    "gfp_mask=0x140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO), order=0, oom_score_adj=0",
    K.format(n=20) + "CPU: 12 PID: 30017 Comm: sglang::schedu Not tainted 5.15.0-105-generic",
    K.format(n=30) + "Mem-Info:",
    K.format(n=40) + "active_anon:30123456 inactive_anon:1024 isolated_anon:0",
    K.format(n=50) + "Free swap  = 0kB",
    K.format(n=60) + "Total swap = 0kB",
    K.format(n=70) + "Tasks state (memory values in pages):",
    K.format(n=80) + "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents "
    "oom_score_adj name",
    K.format(n=90) + "[  30017]     0 30017 22030864  7530864 61534208        0             0 "
    "sglang::schedu",
]

RAY_DETAIL = (
    "Memory on the node (IP: 10.0.0.1, ID: 6416deba2a6076b39bac8f9e2a405e5699ba1edddccf9d7e32cbb9ed)"
    " where the task (task ID: f8fbd7e11d4841630de13f6d9a990c6f5cf47f6c02000000, "
    "name=RayWorkerWrapper.execute_method, pid=30017, memory used=27.10GB) was running was "
    "29.43GB / 30.00GB (0.981), which exceeds the memory usage threshold of 0.95. Ray killed "
    "this worker (ID: ad3de5a37126424c0dbc38c9b757d413753be34304bf078c3d58247d) because it was "
    "the most recently scheduled task; to see more information about memory usage on this node, "
    "use `ray logs raylet.out -ip 10.0.0.1`."
)
RAY_FIELDS: dict[str, FieldValue] = {
    "subtype": "ray_memory_monitor",
    "process": "RayWorkerWrapper.execute_method",
    "pid": 30017,
    "task_used_gb": 27.1,
    "used_gb": 29.43,
    "total_gb": 30.0,
    "node_usage": 98.1,
    "threshold": 95.0,
}


@pytest.fixture(scope="module")
def sigs(tmp_path_factory: pytest.TempPathFactory) -> list[Signature]:
    return system_sigs(tmp_path_factory.mktemp("sigs"))


def hits(sigs: list[Signature], line: str) -> dict[str, dict[str, FieldValue]]:
    return first_hits(sigs, line, drop_none=True)


@pytest.mark.parametrize(
    ("index", "sid", "fields"),
    [
        (0, "system.kernel.oom_invoked", {"process": "sglang::schedu"}),
        (4, "system.kernel.oom_free_swap", {}),
        (6, "system.kernel.oom_tasks", {}),
        (7, "system.kernel.oom_tasks", {}),
    ],
)
def test_each_part_of_a_cut_report_is_a_kill(
    sigs: list[Signature], index: int, sid: str, fields: dict[str, FieldValue]
) -> None:
    got = hits(sigs, CUT_REPORT[index])
    assert got == {sid: {"subtype": "oom_invoked", **fields}}
    (sig,) = [s for s in sigs if s.id == sid]
    assert sig.kind is Kind.HOST_OOM
    assert got[sid]["subtype"] in _KILLERS


@pytest.mark.parametrize("index", [1, 2, 3, 5, 8])
def test_the_rest_of_the_report_matches_nothing(sigs: list[Signature], index: int) -> None:
    assert hits(sigs, CUT_REPORT[index]) == {}


def _analyze(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, lines: list[str]
) -> tuple[int, dict]:  # type: ignore[type-arg]
    return analyze_lines(capsys, tmp_path, lines, "host.log")


def test_cut_kernel_report_alone_is_host_pressure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, report = _analyze(capsys, tmp_path, CUT_REPORT)
    v = report["verdict"]
    assert (v["class"], v["confidence"], code) == ("host_pressure", "high", 1)
    assert v["cause"].startswith("the kernel OOM killer ran at 12:00:01, invoked by sglang::schedu")
    assert "the kill line is not in the log" in v["why"]
    assert [e["signature"] for e in v["evidence"]] == [
        "system.kernel.oom_invoked",
        "system.kernel.oom_free_swap",
        "system.kernel.oom_tasks",
    ]
    assert report["scan"]["recognised"] == {"host_oom": 4}


@pytest.mark.parametrize("index", [0, 4, 6, 7])
def test_any_one_part_alone_is_host_pressure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, index: int
) -> None:
    code, report = _analyze(capsys, tmp_path, [CUT_REPORT[index]])
    assert (report["verdict"]["class"], code) == ("host_pressure", 1)


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (RAY_DETAIL, RAY_FIELDS),
        # Headline and detail joined on one line: one hit, not two.
        (
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on "
            "memory. " + RAY_DETAIL,
            RAY_FIELDS,
        ),
        (
            "(raylet) Task _map_task failed due to oom. There are infinite oom retries remaining,"
            " so the task will be retried. Error: 1 worker(s) were killed due to the node running"
            " low on memory. Memory on the node (IP: 10.0.50.112, ID: 4cb25bc084aeb5a31ca5402a)"
            " was 28.62GB / 30.00GB (0.954017), which exceeds the memory usage threshold of "
            "0.950000; Object store memory usage:",
            {
                "subtype": "ray_memory_monitor",
                "workers": 1,
                "used_gb": 28.62,
                "total_gb": 30.0,
                "node_usage": 95.4017,
                "threshold": 95.0,
            },
        ),
        (
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
            {"subtype": "ray_memory_monitor"},
        ),
    ],
)
def test_ray_memory_monitor_kill(
    sigs: list[Signature], line: str, fields: dict[str, FieldValue]
) -> None:
    assert hits(sigs, line) == {"ray.task.oom": fields}
    (sig,) = [s for s in sigs if s.id == "ray.task.oom"]
    assert len(list(sig.finditer(line))) == 1
    assert fields["subtype"] in _KILLERS


def test_ray_kill_detail_alone_is_host_pressure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, report = _analyze(capsys, tmp_path, [RAY_DETAIL])
    v = report["verdict"]
    assert (v["class"], code) == ("host_pressure", 1)
    assert v["cause"].startswith(
        "Ray's memory monitor killed RayWorkerWrapper.execute_method (pid 30017)"
    )


@pytest.mark.parametrize(
    "line",
    [
        "INFO 10-30 12:00:00 [gpu_worker.py:200] Setting oom_score_adj to 500 for worker 3",
        "vm.oom_kill_allocating_task = 0",
        "vm.oom_dump_tasks = 1",
        "Oct 30 12:00:00 gpu-node-7 systemd[1]: Starting Userspace Out-Of-Memory (OOM) Killer...",
        "docker run --oom-kill-disable --memory 32g lmsysorg/sglang:latest",
        "INFO: zoom level 2, bloom filter in room 5",
        "celery@worker1 ready. Tasks state: 3 active, 0 scheduled",
        "kubelet: eviction manager: attempting to reclaim memory; oom_score_adj of pod is 1000",
        "Free swap space is 0kB on this host (swapoff -a)",
        "SwapFree:              0 kB",
        K.format(n=55) + "Free swap  = 8388604kB",
        "python3 invoked oom-killer test script with --dry-run",
        "(raylet) Refer to the documentation on how to address the out of memory issue: "
        "https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-prevention.html.",
        "(raylet) To adjust the kill threshold, set the environment variable "
        "`RAY_memory_usage_threshold` when starting Ray.",
        "Ray memory monitor: usage 0.50, below the memory usage threshold of 0.95",
        "[2026-10-30 12:00:00 TP0] Scheduler OOM guard: retract threshold 0.95, nothing retracted",
        "[2026-10-30 12:00:00] The server is fired up and ready to roll! (no OOM so far)",
        "[2026-10-30 12:00:00 TP0] Retract requests disabled; KV cache pool is full at 97%",
    ],
)
def test_other_senses_of_oom_match_nothing(sigs: list[Signature], line: str) -> None:
    assert hits(sigs, line) == {}


def test_cuda_oom_is_not_host_evidence(sigs: list[Signature]) -> None:
    line = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.10 GiB of which 1.02 GiB is free."
    )
    host = {s.id for s in sigs if s.kind is Kind.HOST_OOM}
    assert not host & set(hits(sigs, line))
