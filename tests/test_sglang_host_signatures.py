"""SGLang, host, k8s, docker and Ray signatures: the cases where wordings are close."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import first_hits, system_sigs

from preemptdiag.model.records import FieldValue, Kind
from preemptdiag.scan.signatures import Signature, check_examples, overlaps

SIG_DIR = Path(__file__).resolve().parent.parent / "signatures"
FILES = ("sglang.toml", "host.toml", "k8s.toml", "docker.toml", "ray.toml")


@pytest.fixture(scope="module")
def sigs(tmp_path_factory: pytest.TempPathFactory) -> list[Signature]:
    return system_sigs(tmp_path_factory.mktemp("sigs"))


def hits(sigs: list[Signature], line: str) -> dict[str, dict[str, FieldValue]]:
    return first_hits(sigs, line)


def test_own_examples_pass_and_do_not_overlap(sigs: list[Signature]) -> None:
    assert {s.id: check_examples(s) for s in sigs if check_examples(s)} == {}
    assert overlaps(sigs) == []
    assert {s.engine for s in sigs} == {"sglang", "system", "k8s", "docker", "ray"}


def test_negative_profiled_value_is_a_failure_positive_is_context(
    sigs: list[Signature],
) -> None:
    neg = hits(
        sigs,
        "[2025-01-01 00:00:00 DP2 TP2] max_total_tokens=98304 is larger than "
        "the profiled value -12345. Use the profiled value instead.",
    )
    assert list(neg) == ["sglang.alloc.negative_profiled_tokens"]
    assert neg["sglang.alloc.negative_profiled_tokens"]["kv_tokens"] == -12345
    assert neg["sglang.alloc.negative_profiled_tokens"]["phase"] == "startup"
    pos = hits(
        sigs,
        "max_total_tokens=98304 is larger than the profiled value 12345. "
        "Use the profiled value instead.",
    )
    assert list(pos) == ["sglang.context.profiled_tokens_capped"]
    assert pos["sglang.context.profiled_tokens_capped"]["kv_tokens"] == 12345


def test_old_retraction_wording_is_preemption_not_runtime_oom(sigs: list[Signature]) -> None:
    retract = hits(
        sigs,
        "[2025-02-02 02:02:02 TP4] Decode out of memory happened. "
        "#retracted_reqs: 6, #new_token_ratio: 0.1000 -> 0.4000",
    )
    assert retract == {
        "sglang.retract": {
            "mode": "RETRACT",
            "engine": "sglang",
            "count": 6,
            "aborted_reqs": None,
            "new_tokens_gained": None,
            "mamba_num_gained": None,
            "new_token_ratio": 0.4,
        }
    }
    oom = hits(sigs, "RuntimeError: Decode out of memory. Try to lower your batch size.")
    assert list(oom) == ["sglang.alloc.runtime_oom"]
    assert oom["sglang.alloc.runtime_oom"]["stage"] == "Decode"


def test_sglang_kind_of_each_wording(sigs: list[Signature]) -> None:
    by_id = {s.id: s for s in sigs}
    assert by_id["sglang.retract"].kind is Kind.PREEMPTION
    assert by_id["sglang.alloc.runtime_oom"].kind is Kind.ALLOC_FAILURE
    assert by_id["sglang.context.profiled_tokens_capped"].kind is Kind.CONTEXT


def test_docker_oomkilled_true_matches_false_does_not(sigs: list[Signature]) -> None:
    assert list(hits(sigs, '        "OOMKilled": true,')) == ["docker.inspect.oomkilled"]
    assert hits(sigs, '        "OOMKilled": false,') == {}


@pytest.mark.parametrize(
    "line",
    [
        'I0101 00:00:00.000001       1 scheduler.go:352] "Unable to schedule pod; no fit; '
        'waiting" pod="ns/model-0" err="0/8 nodes are available: 8 Insufficient '
        "nvidia.com/gpu.memory. preemption: 0/8 nodes are available: 8 No preemption "
        'victims found for incoming pod."',
        "  Warning  FailedScheduling  1m  default-scheduler  0/2 nodes are available: "
        "2 Insufficient nvidia.com/gpu.memory. preemption: 0/2 nodes are available: "
        "2 No preemption victims found for incoming pod.",
    ],
)
def test_k8s_pod_preemption_matches_nothing(sigs: list[Signature], line: str) -> None:
    assert hits(sigs, line) == {}


def test_truncated_decode_line_gives_no_stats(sigs: list[Signature]) -> None:
    cut = (
        "[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 12, #token: 4000, "
        "token usaccept rate: 0.40, npu graph: False, gen throughput (token/s): 88.00, #q"
    )
    assert hits(sigs, cut) == {}


def test_glued_decode_records_keep_their_own_queue(sigs: list[Signature]) -> None:
    # The first record has no #queue-req; it must not borrow the second record's.
    [decode] = [s for s in sigs if s.id == "sglang.stats.decode"]
    glued = (
        "#running-req: 3, #token: 300, token usage: 0.10, gen throughput (token/s): 9.00"
        "#running-req: 4, #token: 400, token usage: 0.20, gen throughput (token/s): 8.00, "
        "#queue-req: 7"
    )
    got = [decode.extract(m) for m in decode.finditer(glued)]
    assert [(g["running"], g["kv_usage"], g["waiting"]) for g in got] == [
        (3, 10.0, None),
        (4, 20.0, 7),
    ]


def test_wrapped_raylet_line_still_counts(sigs: list[Signature]) -> None:
    whole = hits(
        sigs,
        "(raylet) node_manager.cc:3000: 2 Workers (tasks / actors) killed due "
        "to memory pressure (OOM), 0 Workers crashed due to other reasons",
    )
    assert whole["ray.raylet.oom_kill"]["workers"] == 2
    wrapped = hits(sigs, " actors) killed due to memory pressure (OOM), 0 Workers crashed")
    assert wrapped == {"ray.raylet.oom_kill": {"subtype": "ray_memory_monitor", "workers": None}}
    none_killed = hits(
        sigs,
        "(raylet) node_manager.cc:3000: 0 Workers (tasks / actors) killed "
        "due to memory pressure (OOM), 3 Workers crashed",
    )
    assert none_killed == {}


def test_kernel_kill_eras(sigs: list[Signature]) -> None:
    modern = hits(
        sigs,
        "Memory cgroup out of memory: Killed process 77 (python3) "
        "total-vm:100kB, anon-rss:64kB, file-rss:0kB, shmem-rss:0kB, "
        "UID:0 pgtables:8kB oom_score_adj:0",
    )
    assert list(modern) == ["system.kernel.kill"]
    assert modern["system.kernel.kill"]["anon_rss_kb"] == 64
    legacy = hits(sigs, "Out of memory: Kill process 77 (python3) score 900 or sacrifice child")
    assert list(legacy) == ["system.kernel.kill_legacy"]
    assert legacy["system.kernel.kill_legacy"]["pid"] == 77


def test_decode_fields_stop_at_the_next_glued_record(sigs: list[Signature]) -> None:
    # #retracted-req (the PD-decode retracted queue, read as retracted_queue) of the
    # record glued behind is not this record's; the quick
    # look-ahead that skips the bounded scan on lines without the field must not
    # change that (it only ever skips scans that would fail).
    first = (
        "[2025-07-01 13:00:00 TP0] Decode batch, #running-req: 3, #token: 900, token usage: "
        "0.01, cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 0, "
    )
    second = (
        "[2025-07-01 13:00:04 TP0] Decode batch, #running-req: 2, #token: 800, token usage: "
        "0.02, #retracted-req: 1, cuda graph: True, gen throughput (token/s): 40.00, "
        "#queue-req: 5, "
    )
    (decode,) = [s for s in sigs if s.id == "sglang.stats.decode"]
    got = [decode.extract(m) for m in decode.finditer(first + second)]
    assert [(f["running"], f["retracted_queue"], f["waiting"]) for f in got] == [
        (3, None, 0),
        (2, 1, 5),
    ]
    alone = [decode.extract(m) for m in decode.finditer(first)]
    assert [(f["retracted_queue"], f["gen_tput"]) for f in alone] == [(None, 50.0)]
