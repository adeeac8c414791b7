"""What vLLM 0.32/0.33 prints, as the real engine prints it: stats lines that never
carry preemptions, the CPU device word, start-up failures (also hard-wrapped by a
terminal at any width), the shutdown race, and a footer that names what it could not
read. Built logs; the recorded real runs are in test_real_engine.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from preemptdiag.cli import main
from preemptdiag.timeline.events import parse_version

P = "(APIServer pid=88) INFO 12-01"
E = "(EngineCore pid=90)"


def analyze(
    capsys: pytest.CaptureFixture[str], *args: str, code: int | None = None
) -> dict[str, Any]:
    got = main(["analyze", "--format", "json", "--year", "2026", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if code is not None:
        assert got == code, err
    report: dict[str, Any] = json.loads(out)
    return report


def _stats(t: str, running: int, waiting: int, kv: float, device: str = "CPU") -> str:
    return (
        f"{P} {t} [loggers.py:335] Engine 000: Avg prompt throughput: 51.2 tokens/s, "
        f"Avg generation throughput: 700.3 tokens/s, Running: {running} reqs, Waiting: "
        f"{waiting} reqs, {device} KV cache usage: {kv}%, Prefix cache hit rate: 0.0%"
    )


def _overload(tmp_path: Path) -> Path:
    lines = [
        f"{E} INFO 12-01 10:00:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with "
        "config: model='m'",
        f"{E} INFO 12-01 10:00:05 [kv_cache_utils.py:2327] CPU KV cache size: 32,768 tokens, "
        "Maximum concurrency for 2,048 tokens per request: 16.00x",
    ]
    for i in range(36):  # six minutes at 10 s, KV pinned, the queue growing
        m, s = divmod(10 * i, 60)
        lines.append(_stats(f"10:{1 + m:02d}:{s:02d}", 30, 10 + 15 * i, 99.8))
    p = tmp_path / "v1_overload.log"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("device", ["CPU", "GPU", "XPU"])
def test_v1_overload_without_scrapes_is_suspected_never_queueing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, device: str
) -> None:
    log = _overload(tmp_path)
    log.write_text(log.read_text().replace("CPU KV cache usage", f"{device} KV cache usage"))
    r = analyze(capsys, str(log), code=0)
    v = r["verdict"]
    assert (v["class"], v["suspected"], v["confidence"]) == (
        "insufficient_evidence",
        True,
        "medium",
    )
    assert "PR #38452" in v["why"]
    assert v["capture_next"].startswith("two /metrics scrapes")
    assert {w["class"] for w in r["windows"] if w["n_stats"]} == {"insufficient_evidence"}
    assert r["scan"]["recognised"]["stats"] == 36 and r["scan"]["skipped"] == {}


def test_a_preemptions_field_that_appears_is_evidence(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A build with the upstream fix prints the field: then the log can see.
    log = _overload(tmp_path)
    text = (
        log.read_text()
        .replace("Waiting: ", "Waiting: ")
        .replace(" reqs, CPU KV cache usage", " reqs, Preemptions: 9, CPU KV cache usage")
    )
    log.write_text(text)
    r = analyze(capsys, str(log), code=1)
    assert (r["verdict"]["class"], r["verdict"]["confidence"]) == ("thrash_loop", "high")
    lever = r["lever"]
    assert (lever["knob"], lever["current"]) == ("--max-num-seqs", None)
    assert lever["arithmetic"][:2] == [
        "KV tokens = 32,768 (start-up KV token count)",
        # (the real 0.32.0 CPU build's own default, not a GPU's)
        "current --max-num-seqs: vLLM 0.32.0's CPU-backend default 128 × tensor_parallel_size "
        "1 (assumed: not in the log)",
    ]


def test_a_changed_stats_line_is_counted_as_unparsed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "v1_new.log"
    ok = _stats("10:00:00", 3, 0, 10.0)
    changed = ok.replace("Running: 3 reqs", "Running: 3 reqs (2 paused)")
    log.write_text(f"{ok}\n{changed}\n{changed}\n")
    r = analyze(capsys, str(log))
    assert r["scan"]["skipped"] == {"unparsed: vllm.v1.stats": 2}
    assert r["scan"]["recognised"] == {"stats": 1}


_MAX_LEN = (
    f"{E} ERROR 12-01 10:00:09 [core.py:1100] ValueError: To serve at least one request with "
    "the model's max seq len (4096), (0.0 GiB KV cache is needed, which is larger than the "
    "available KV cache memory (0.0 GiB). Based on the available memory, the estimated maximum "
    "model length is 2016. Try increasing `gpu_memory_utilization` (which also controls CPU "
    "memory on the CPU backend) or decreasing `max_model_len` when initializing the engine."
)


@pytest.mark.parametrize("width", [0, 60, 80, 100, 120, 200])
def test_max_seq_len_error_at_any_terminal_width(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, width: int
) -> None:
    pieces = (
        [_MAX_LEN[i : i + width] for i in range(0, len(_MAX_LEN), width)] if width else [_MAX_LEN]
    )
    log = tmp_path / "startup.log"
    log.write_text(
        "\n".join([*pieces, f"{E} ERROR 12-01 10:00:10 [core.py:1110] EngineCore failed to start."])
        + "\n"
    )
    r = analyze(capsys, str(log), code=1)
    v, lever = r["verdict"], r["lever"]
    assert v["class"] == "allocation_failure"
    assert [e["line"] for e in v["evidence"] if "max_seq_len" in e["signature"]] == [1]
    assert (lever["knob"], lever["current"], lever["proposed"]) == (
        "--max-model-len",
        "4096",
        "2016",
    )
    assert r["scan"]["skipped"] == {}


@pytest.mark.parametrize(
    ("line", "knob", "current", "proposed"),
    [
        (
            "ValueError: Available memory on node 0 (7.94/10.21 GiB) on kv cache allocation is "
            "less than requested memory for kv (40.0 GiB). Decrease --kv-cache-memory-bytes, "
            "VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.",
            "--kv-cache-memory-bytes",
            "40 GiB",
            "6G",  # 0.8 x 7.94 = 6.35 GiB
        ),
        (
            "ValueError: Available memory on node 0 (7.84/10.21 GiB) on startup is less than "
            "desired CPU memory utilization (0.92, 9.4 GiB). On the CPU backend, the "
            "`--gpu-memory-utilization` flag controls the fraction of CPU memory reserved",
            "--gpu-memory-utilization",
            "0.92",
            "0.74",  # 7.84 / 10.21 = 0.768; - 0.02 = 0.748
        ),
        (
            "ValueError: Free memory on device cuda:0 (60.12/79.19 GiB) on startup is less than "
            "desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or "
            "reduce GPU memory used by other processes.",
            "--gpu-memory-utilization",
            "0.9",
            "0.73",  # 60.12 / 79.19 = 0.759; - 0.02 = 0.739
        ),
    ],
    ids=["kv_space_above_ram", "cpu_util_above_free", "gpu_util_above_free"],
)
def test_startup_memory_errors_get_the_lever_from_their_own_figures(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    line: str,
    knob: str,
    current: str,
    proposed: str,
) -> None:
    log = tmp_path / "startup.log"
    log.write_text(f"(Worker pid=9) ERROR 12-01 10:00:09 [multiproc_executor.py:800] {line}\n")
    r = analyze(capsys, str(log), code=1)
    lever = r["lever"]
    assert r["verdict"]["class"] == "allocation_failure"
    assert (lever["knob"], lever["current"], lever["proposed"]) == (knob, current, proposed)
    assert "raise" in lever["do_not"]


def test_engine_dead_after_a_requested_stop_is_the_shutdown_race(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "stop.log"
    lines = [_stats(f"10:00:{s:02d}", 2, 0, 1.0) for s in (0, 10, 20, 30)]
    lines += [
        f"{E} INFO 12-01 10:00:33 [core.py:1454] [shutdown] EngineCore: trigger received "
        "signal=SIGINT",
        f"{P} 10:00:33 [launcher.py:254] [shutdown] API server: shutdown triggered",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
        "trace (above) for the root cause.",
    ]
    log.write_text("\n".join(lines) + "\n")
    r = analyze(capsys, str(log), code=0)
    assert r["verdict"]["class"] == "healthy"
    assert all(w["engine_deaths"] == 0 for w in r["windows"])
    # Without the stop, the same traceback is a death the report must not hide.
    log.write_text("\n".join(lines[:4] + lines[6:]) + "\n")
    r = analyze(capsys, str(log))
    assert r["verdict"]["class"] == "insufficient_evidence"
    assert "engine died" in r["verdict"]["why"]


def test_a_number_past_64_bits_is_a_counted_skip_not_an_internal_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "huge.log"
    log.write_text(
        _stats("10:00:00", 2, 0, 1.0).replace("Waiting: 0", "Waiting: " + "9" * 30) + "\n"
    )
    r = analyze(capsys, str(log), code=0)
    assert r["scan"]["skipped"] == {"unreadable value: vllm.v1.stats": 1}


@pytest.mark.parametrize(
    ("text", "release"),
    [("0.11.0+cu126", (0, 11, 0)), ("v0.6.3.post1", (0, 6, 3)), ("0.32.0", (0, 32, 0))],
)
def test_versions_are_read_as_pep_440_says(text: str, release: tuple[int, ...]) -> None:
    v = parse_version(text)
    assert v is not None and v.release == release
    assert parse_version("main") is None


def test_scrapes_without_a_time_far_from_the_log_are_not_placed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # `curl > t1.prom` copied later: the file times say when they were copied.
    import os

    log = _overload(tmp_path)
    for i, total in enumerate((0, 900)):
        p = tmp_path / f"t{i}.prom"
        p.write_text(
            "# HELP vllm:num_preemptions_total Cumulative number of preemption\n"
            "# TYPE vllm:num_preemptions_total counter\n"
            f'vllm:num_preemptions_total{{engine="0"}} {total}.0\n'
        )
        os.utime(p, (1_900_000_000 + 60 * i, 1_900_000_000 + 60 * i))  # 2030
    r = analyze(capsys, str(log), str(tmp_path / "t0.prom"), str(tmp_path / "t1.prom"))
    assert (r["verdict"]["class"], r["verdict"]["suspected"]) == ("insufficient_evidence", True)
    assert any("cannot be placed on its timeline" in n for n in r["notes"])
    assert sum(w["preemptions"] for w in r["windows"]) == 0
