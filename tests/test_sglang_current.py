"""SGLang 0.5.23 line formats (current-formats.md), and the older ones they replaced.

Lines are built from the format strings in SGLang's released source: scheduler.py
(retraction, start-up capacity), metrics_reporter.py and pool_stats_observer.py
(batch stats), pool_configurator.py (Not enough memory).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import analyze_lines, first_hits, system_sigs

from preemptdiag.model.records import FieldValue, Kind
from preemptdiag.scan.rollup import stats_preemptions
from preemptdiag.scan.signatures import Signature

SIG_DIR = Path(__file__).resolve().parent.parent / "signatures"
P = "[2026-10-30 12:00:00 TP0] "


@pytest.fixture(scope="module")
def sigs(tmp_path_factory: pytest.TempPathFactory) -> list[Signature]:
    return system_sigs(tmp_path_factory.mktemp("sigs"))


def hits(sigs: list[Signature], line: str) -> dict[str, dict[str, FieldValue]]:
    return first_hits(sigs, line, drop_none=True)


RETRACT = {"mode": "RETRACT", "engine": "sglang"}


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (
            P + "KV cache pool is full. Retract requests. #retracted_reqs: 3, "
            "#new_tokens_gained: 12288, #new_token_ratio: 0.4512 -> 0.8127",
            {"count": 3, "new_tokens_gained": 12288, "new_token_ratio": 0.8127},
        ),
        (
            P + "KV cache pool is full. Retract requests. #retracted_reqs: 7, "
            "#new_tokens_gained: 28672, #mamba_num_gained: 7, #new_token_ratio: 0.0700 -> 0.3300",
            {
                "count": 7,
                "new_tokens_gained": 28672,
                "mamba_num_gained": 7,
                "new_token_ratio": 0.33,
            },
        ),
        (
            "[2025-10-05 18:00:41 TP0] KV cache pool is full. Retract requests. "
            "#retracted_reqs: 5, #aborted_retracted_reqs: 1, #new_token_ratio: 0.1200 -> 0.4400",
            {"count": 5, "aborted_reqs": 1, "new_token_ratio": 0.44},
        ),
        (
            "[2025-08-02 10:11:12 TP0] KV cache pool is full. Retract requests. "
            "#retracted_reqs: 3, #new_token_ratio: 0.4512 -> 0.8127",
            {"count": 3, "new_token_ratio": 0.8127},
        ),
        (
            "[2025-01-20 04:12:09 TP3] Decode out of memory happened. "
            "#retracted_reqs: 4, #new_token_ratio: 0.2250 -> 0.6125",
            {"count": 4, "new_token_ratio": 0.6125},
        ),
    ],
)
def test_every_retraction_wording_is_one_preemption(
    sigs: list[Signature], line: str, fields: dict[str, FieldValue]
) -> None:
    assert hits(sigs, line) == {"sglang.retract": {**RETRACT, **fields}}


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (
            P + "Testing retraction. #retracted_reqs: 2, #new_tokens_gained: 512",
            {"test_retracted_reqs": 2, "new_tokens_gained": 512},
        ),
        (
            P + "Testing retraction. #retracted_reqs: 1, #new_tokens_gained: 256, "
            "#mamba_num_gained: 1",
            {"test_retracted_reqs": 1, "new_tokens_gained": 256, "mamba_num_gained": 1},
        ),
    ],
)
def test_testing_retraction_is_context_not_preemption(
    sigs: list[Signature], line: str, fields: dict[str, FieldValue]
) -> None:
    got = hits(sigs, line)
    assert got == {
        "sglang.context.testing_retraction": {"engine": "sglang", "mode": "TEST_RETRACT", **fields}
    }
    (sig,) = [s for s in sigs if s.id == "sglang.context.testing_retraction"]
    assert sig.kind is Kind.CONTEXT
    # Neither name events.py (count) nor rollup.py (retracted_reqs) counts.
    assert not {"count", "retracted_reqs", "preemptions"} & set(sig.fields)


STATS_CASES = [
    # plain model, CUDA, 0.5.23: no trailing ", " after #queue-req
    (
        P + "Decode batch, #running-req: 48, #token: 90112, token usage: 0.97, cuda graph: True, "
        "gen throughput (token/s): 2210.50, #queue-req: 12",
        "sglang.stats.decode",
        {"running": 48, "tokens": 90112, "kv_usage": 97.0, "gen_tput": 2210.5, "waiting": 12},
    ),
    # LOG_FORWARD_ITERS suffix, spec decode, CPU label
    (
        P + "Decode batch [40960], #running-req: 11, #token: 40960, token usage: 0.57, "
        "accept len: 3.01, accept rate: 0.75, cpu graph: False, gen throughput (token/s): 77.00, "
        "#queue-req: 1",
        "sglang.stats.decode",
        {"running": 11, "tokens": 40960, "kv_usage": 57.0, "gen_tput": 77.0, "waiting": 1},
    ),
    # hybrid SWA, PD decode (prealloc fields), NPU label
    (
        P + "Decode batch, #running-req: 32, #full token: 65536, full token usage: 0.96, "
        "#swa token: 8192, swa token usage: 0.40, pre-allocated usage: 0.05, #prealloc-req: 2, "
        "#transfer-req: 1, #retracted-req: 3, npu graph: True, gen throughput (token/s): 980.10, "
        "#queue-req: 6",
        "sglang.stats.decode",
        {
            "running": 32,
            "tokens": 65536,
            "kv_usage": 96.0,
            "swa_usage": 40.0,
            "retracted_queue": 3,
            "gen_tput": 980.1,
            "waiting": 6,
        },
    ),
    # hybrid SSM (mamba), MUSA label, MFU suffix
    (
        P + "Decode batch, #running-req: 9, #full token: 180019, full token usage: 0.93, "
        "mamba num: 9, mamba usage: 0.99, musa graph: True, gen throughput (token/s): 31.20, "
        "#queue-req: 0, est. decode TFLOPS/s (per GPU): 12.34, est. read BW (GB/s per GPU): "
        "2890.11, est. write BW (GB/s per GPU): 10.50",
        "sglang.stats.decode",
        {
            "running": 9,
            "tokens": 180019,
            "kv_usage": 93.0,
            "mamba_usage": 99.0,
            "gen_tput": 31.2,
            "waiting": 0,
        },
    ),
    # hisparse: the device pool's usage is the KV usage
    (
        P + "Decode batch, #running-req: 16, #gpu token: 30000, gpu token usage: 0.98, "
        "#cpu token: 500000, cpu token usage: 0.61, cuda graph: True, "
        "gen throughput (token/s): 400.00, #queue-req: 25",
        "sglang.stats.decode",
        {"running": 16, "tokens": 30000, "kv_usage": 98.0, "gen_tput": 400.0, "waiting": 25},
    ),
    (
        P + "Prefill batch, #new-seq: 4, #new-token: 8192, #cached-token: 1024, token usage: 0.97, "
        "#running-req: 120, #queue-req: 38, #pending-token: 9000, cuda graph: False, "
        "input throughput (token/s): 15000.25",
        "sglang.stats.prefill",
        {
            "new_seq": 4,
            "new_tokens": 8192,
            "cached_tokens": 1024,
            "kv_usage": 97.0,
            "running": 120,
            "waiting": 38,
            "prompt_tput": 15000.25,
        },
    ),
    # PD prefill, hybrid SWA, every optional field
    (
        "[2026-10-30 12:00:00 DP0 TP0] Prefill batch [4096], #new-seq: 2, #new-token: 6000, "
        "#cached-token: 200, full token usage: 0.95, swa token usage: 0.31, #running-req: 40, "
        "#queue-req: 17, #pending-token: 52000, #replay-token: 128, #bootstrap-req: 3, "
        "#inflight-req: 1, #optimistic-req: 0, waiting-image-req: 2, npu graph: False, "
        "input throughput (token/s): 8123.40, est. prefill TFLOPS/s (per GPU): 310.22",
        "sglang.stats.prefill",
        {
            "new_seq": 2,
            "new_tokens": 6000,
            "cached_tokens": 200,
            "kv_usage": 95.0,
            "swa_usage": 31.0,
            "running": 40,
            "waiting": 17,
            "prompt_tput": 8123.4,
        },
    ),
    (
        P + "Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, "
        "full token usage: 0.41, mamba usage: 0.97, #running-req: 8, #queue-req: 0, "
        "#pending-token: 0, musa graph: False, input throughput (token/s): 2000.00",
        "sglang.stats.prefill",
        {
            "new_seq": 1,
            "new_tokens": 512,
            "cached_tokens": 0,
            "kv_usage": 41.0,
            "mamba_usage": 97.0,
            "running": 8,
            "waiting": 0,
            "prompt_tput": 2000.0,
        },
    ),
]


@pytest.mark.parametrize(("line", "sid", "fields"), STATS_CASES)
def test_current_batch_lines(
    sigs: list[Signature], line: str, sid: str, fields: dict[str, FieldValue]
) -> None:
    batch = "decode" if sid.endswith("decode") else "prefill"
    assert hits(sigs, line) == {sid: {"engine": "sglang", "batch": batch, **fields}}


def test_pd_decode_retracted_queue_is_not_counted_as_preemptions(sigs: list[Signature]) -> None:
    # #retracted-req is the length of the PD-decode retracted queue, printed every
    # interval: the retraction line counts those requests once, the gauge must not.
    line = STATS_CASES[2][0]
    fields = hits(sigs, line)["sglang.stats.decode"]
    assert fields["retracted_queue"] == 3
    assert stats_preemptions(fields) == (0, False)


def test_old_period_form_still_reads_the_same_fields(sigs: list[Signature]) -> None:
    old = (
        "[2025-03-20 08:15:02 TP0] Decode batch. #running-req: 233, #token: 370959, "
        "token usage: 0.82, gen throughput (token/s): 4594.01, #queue-req: 417, "
    )
    new = old.replace("Decode batch.", "Decode batch,").replace(
        "token usage: 0.82, ", "token usage: 0.82, cuda graph: True, "
    )[:-2]
    assert hits(sigs, old) == hits(sigs, new)


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (
            P + "max_total_num_tokens=210968, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            "max_running_requests=2048, context_len=32768, available_gpu_mem=11.42 GB",
            {"available_gpu_gib": 11.42},
        ),
        (
            P + "max_total_num_tokens=210968, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            "max_running_requests=2048, context_len=32768, available_cpu_mem=20.13 GB",
            {"available_cpu_gib": 20.13},
        ),
    ],
)
def test_startup_capacity_gpu_and_cpu(
    sigs: list[Signature], line: str, fields: dict[str, FieldValue]
) -> None:
    assert hits(sigs, line) == {
        "sglang.capacity.pool": {
            "engine": "sglang",
            "kv_tokens": 210968,
            "chunked_prefill_size": 8192,
            "max_running_requests": 2048,
            "context_len": 32768,
            **fields,
        }
    }


@pytest.mark.parametrize(
    ("tail", "value"),
    [("", None), (" Current value: mem_fraction_static=0.88", 0.88)],
)
def test_not_enough_memory_with_and_without_the_value(
    sigs: list[Signature], tail: str, value: float | None
) -> None:
    line = (
        P + "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." + tail
    )
    want: dict[str, FieldValue] = {
        "subtype": "sglang_not_enough_memory",
        "phase": "startup",
        "engine": "sglang",
    }
    if value is not None:
        want["mem_fraction_static"] = value
    assert hits(sigs, line) == {"sglang.alloc.not_enough_memory": want}


# --- end to end -----------------------------------------------------------------------


def _stamp(t: str, rank: int = 0) -> str:
    return f"[2026-10-30 {t} TP{rank}] "


def _thrash_log(retraction: str) -> list[str]:
    """Six minutes at 0.97-0.99 token usage, a queue growing 5 -> 97, and a retraction
    printed by both TP ranks four times a minute."""
    lines = [
        _stamp("11:59:00") + "server_args=ServerArgs(model_path='/models/demo-8b', tp_size=2, "
        "mem_fraction_static=0.88, max_running_requests=2048, chunked_prefill_size=8192, "
        "schedule_conservativeness=1.0)",
        _stamp("11:59:30") + "max_total_num_tokens=210968, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=2048, context_len=32768, "
        "available_gpu_mem=11.42 GB",
    ]
    queue = 5
    for minute in range(6):
        for sec in (5, 20, 35, 50):
            t = f"12:{minute:02d}:{sec:02d}"
            usage = f"0.9{7 + sec % 3}"
            lines.append(
                _stamp(t) + f"Prefill batch, #new-seq: 2, #new-token: 4096, #cached-token: 512, "
                f"token usage: {usage}, #running-req: 60, #queue-req: {queue}, "
                f"#pending-token: {queue * 2000}, cuda graph: False, "
                "input throughput (token/s): 8123.40"
            )
            lines.append(
                _stamp(t)
                + f"Decode batch, #running-req: 62, #token: 206000, token usage: {usage}, "
                f"cuda graph: True, gen throughput (token/s): {900 - minute * 50:.2f}, "
                f"#queue-req: {queue}"
            )
            lines.extend(_stamp(t, rank) + retraction for rank in (0, 1))
            queue += 4
    return lines


def _analyze(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, lines: list[str]
) -> tuple[int, dict]:  # type: ignore[type-arg]
    return analyze_lines(capsys, tmp_path, lines, "sglang.log")


REAL = (
    "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 12288, "
    "#new_token_ratio: 0.4512 -> 0.8127"
)
TEST = "Testing retraction. #retracted_reqs: 3, #new_tokens_gained: 12288"


def test_current_format_thrash_log_is_a_thrash_loop(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, report = _analyze(capsys, tmp_path, _thrash_log(REAL))
    v = report["verdict"]
    assert (v["class"], v["confidence"], code) == ("thrash_loop", "high", 1)
    assert report["engine"]["engine"] == "sglang"
    hot = [w for w in report["windows"] if w["class"] == "thrash_loop"]
    assert len(hot) == 6
    # 4 retractions of 3 a minute; the TP1 copy of each line counts once.
    assert [w["preemptions"] for w in hot] == [12.0] * 6
    assert [w["kv_max"] for w in hot] == [99.0] * 6
    assert (hot[0]["waiting_first"], hot[0]["waiting_last"]) == (5, 17)
    assert all(w["waiting_last"] > w["waiting_first"] for w in hot)
    assert hot[0]["prompt_tput"] == 8123.4
    assert report["lever"]["knob"] == "--max-running-requests"
    assert report["lever"]["current"] == "2048"
    assert report["scan"]["recognised"] == {
        "capacity": 1,
        "config": 1,
        "preemption": 48,
        "stats": 48,
    }


def test_testing_retraction_counts_no_preemption(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, report = _analyze(capsys, tmp_path, _thrash_log(TEST))
    assert code == 0
    assert sum(w["preemptions"] for w in report["windows"]) == 0
    assert report["verdict"]["class"] not in ("thrash_loop", "benign_preemption")
    assert report["scan"]["recognised"]["context"] == 48
    assert "preemption" not in report["scan"]["recognised"]


def test_log_of_only_testing_retraction_lines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = [_stamp(f"12:0{m}:05") + TEST for m in range(4)]
    code, report = _analyze(capsys, tmp_path, lines)
    v = report["verdict"]
    assert (v["class"], code) == ("healthy", 0)
    assert [w["preemptions"] for w in report["windows"]] == [0.0] * 4
    assert report["scan"]["recognised"] == {"context": 4}
    assert report["engine"]["engine"] == "sglang"
