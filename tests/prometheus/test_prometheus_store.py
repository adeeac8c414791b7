"""`fleet` and `analyze --prometheus` against a real Prometheus holding four replicas built
from the real-engine recordings: healthy, queueing, thrashing (1,982 preemptions by the
counter, ground_truth.json) and restarted (the healthy run served twice by two
processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Store

from preemptdiag.cli import main

ENGINE = "tests/fixtures/engine/vllm-0.32.0"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def fleet_json(capsys: pytest.CaptureFixture[str], store: Store, *extra: str) -> tuple[int, dict]:
    code, out, err = run(
        capsys, "fleet", "--prometheus", store.url, *store.span_args(), "-f", "json", *extra
    )
    assert err == ""
    return code, json.loads(out)


def test_fleet_names_the_thrashing_replica_first_with_its_lever(
    capsys: pytest.CaptureFixture[str], store: Store
) -> None:
    code, doc = fleet_json(capsys, store)
    assert code == 1  # thrash_loop is in the default --fail-on
    assert doc["schema"] == "preemptdiag/fleet"
    rows = {r["replica"]: r for r in doc["replicas"]}
    assert [r["replica"] for r in doc["replicas"]] == [
        "vllm-thrash-0",
        "vllm-queueing-0",
        "vllm-healthy-0",
        "vllm-restarted-0",
    ]
    assert {k: (r["class"], r["restarts"]) for k, r in rows.items()} == {
        "vllm-thrash-0": ("thrash_loop", 0),
        "vllm-queueing-0": ("queueing", 0),
        "vllm-healthy-0": ("healthy", 0),
        "vllm-restarted-0": ("healthy", 1),
    }
    assert doc["summary"] == {"thrash_loop": 1, "queueing": 1, "healthy": 2}
    thrash = rows["vllm-thrash-0"]
    # Every preemption of the counter, none invented: the recording's delta.
    assert thrash["preemptions"] == 1982
    assert thrash["kv_peak_pct"] == 100.0
    assert thrash["confidence"] == "high"
    assert thrash["waiting"]["trend"] == "growing"
    # No KV capacity in a store: the lever is the peak concurrency's 90 %.
    assert (thrash["lever"]["knob"], thrash["lever"]["proposed"]) == ("--max-num-seqs", "107")
    queue = rows["vllm-queueing-0"]
    assert queue["preemptions"] == 0
    assert queue["waiting"] == {"trend": "growing", "max": 309}
    assert queue["lever"]["knob"] is None
    # The restart reset the counters: no preemption or negative count made of it.
    assert rows["vllm-restarted-0"]["preemptions"] == 0
    assert rows["vllm-restarted-0"]["labels"] == {
        "engine": "0",
        "instance": "10.0.0.4:8000",
        "job": "vllm",
        "namespace": "serving",
        "pod": "vllm-restarted-0",
    }
    assert any("vllm-restarted-0 (1x)" in n for n in doc["notes"])


def test_fleet_terminal_lines_worst_first(capsys: pytest.CaptureFixture[str], store: Store) -> None:
    code, out, _ = run(capsys, "fleet", "--prometheus", store.url, *store.span_args())
    assert code == 1
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("replica "))
    rows = [ln.split()[:2] for ln in lines[head + 2 : head + 6]]
    assert rows == [
        ["vllm-thrash-0", "thrash_loop"],
        ["vllm-queueing-0", "queueing"],
        ["vllm-healthy-0", "healthy"],
        ["vllm-restarted-0", "healthy"],
    ]
    assert "--max-num-seqs default → 107" in lines[head + 2]
    assert "summary  thrash_loop 1, queueing 1, healthy 2" in lines


def test_fleet_markdown_and_sarif(
    capsys: pytest.CaptureFixture[str], store: Store, tmp_path
) -> None:
    md, sarif = tmp_path / "f.md", tmp_path / "f.sarif"
    code, out, _ = run(
        capsys,
        "fleet",
        "--prometheus",
        store.url,
        *store.span_args(),
        "-o",
        str(md),
        "-o",
        str(sarif),
    )
    assert (code, out) == (1, "")
    text = md.read_text()
    assert text.startswith("### preemptdiag fleet: thrash_loop 1, queueing 1, healthy 2\n")
    assert "| `vllm-thrash-0` | `thrash_loop` | high | 100.0% |" in text
    results = json.loads(sarif.read_text())["runs"][0]["results"]
    assert [(r["ruleId"], r["locations"][0]["logicalLocations"][0]["name"]) for r in results] == [
        ("thrash_loop", "vllm-thrash-0"),
        ("queueing", "vllm-queueing-0"),
    ]


@pytest.mark.parametrize(
    ("fail_on", "expected"), [("none", 0), ("queueing", 1), ("benign_preemption", 0)]
)
def test_fleet_exit_code_is_the_worst_replicas(
    capsys: pytest.CaptureFixture[str], store: Store, fail_on: str, expected: int
) -> None:
    code, _ = fleet_json(capsys, store, "--fail-on", fail_on)
    assert code == expected


def test_fleet_selector_narrows_to_matching_replicas(
    capsys: pytest.CaptureFixture[str], store: Store
) -> None:
    code, doc = fleet_json(capsys, store, "--selector", '{pod=~"vllm-(healthy|queueing)-0"}')
    assert code == 0
    assert [r["replica"] for r in doc["replicas"]] == ["vllm-queueing-0", "vllm-healthy-0"]
    assert doc["source"]["selector"] == '{pod=~"vllm-(healthy|queueing)-0"}'


def test_analyze_store_alone(capsys: pytest.CaptureFixture[str], store: Store) -> None:
    code, out, _ = run(
        capsys, "analyze", "--prometheus", store.url, *store.span_args(),
        "--selector", '{pod="vllm-thrash-0"}', "-f", "json",
    )  # fmt: skip
    doc = json.loads(out)
    assert code == 1
    assert (doc["verdict"]["class"], doc["verdict"]["replica"]) == ("thrash_loop", "vllm-thrash-0")
    assert sum(w["preemptions"] for w in doc["windows"]) == 1982
    assert doc["scan"]["files"] == [store.url]


def test_analyze_store_beside_the_log_joins_it_and_sizes_from_the_log(
    capsys: pytest.CaptureFixture[str], store: Store
) -> None:
    """The V1 log cannot show preemptions and the store has no KV capacity: together
    they prove the loop and size the lever as the recorded fix run did (27)."""
    log = f"{ENGINE}/thrash_loop/server.log"
    code, out, _ = run(
        capsys, "analyze", log, "--year", "2026", "--prometheus", store.url, *store.span_args(),
        "--selector", '{pod="vllm-thrash-0"}', "-f", "json",
    )  # fmt: skip
    doc = json.loads(out)
    assert code == 1
    v = doc["verdict"]
    assert (v["class"], v["confidence"], v["replica"], v["suspected"]) == (
        "thrash_loop",
        "high",
        log,
        False,
    )
    assert (doc["lever"]["knob"], doc["lever"]["proposed"]) == ("--max-num-seqs", "27")
    assert {w["replica"] for w in doc["windows"]} == {log}
    assert any(f"vllm-thrash-0 joined to the log {log} by time span" in n for n in doc["notes"])


def test_analyze_log_names_its_replica_among_many(
    capsys: pytest.CaptureFixture[str], store: Store, tmp_path
) -> None:
    """With the whole fleet in view the span is ambiguous: the pod in the log's name
    decides which replica it joins."""
    log = tmp_path / "vllm-thrash-0.log"
    log.write_bytes(Path(f"{ENGINE}/thrash_loop/server.log").read_bytes())
    code, out, _ = run(
        capsys, "analyze", str(log), "--year", "2026", "--prometheus", store.url,
        *store.span_args(), "-f", "json",
    )  # fmt: skip
    doc = json.loads(out)
    assert code == 1
    assert doc["verdict"]["replica"] == str(log)
    assert doc["lever"]["proposed"] == "27"
    replicas = {w["replica"] for w in doc["windows"]}
    assert replicas == {str(log), "vllm-healthy-0", "vllm-queueing-0", "vllm-restarted-0"}
    assert any(f"vllm-thrash-0 joined to the log {log} by its name" in n for n in doc["notes"])


def test_healthy_replica_alone_passes(capsys: pytest.CaptureFixture[str], store: Store) -> None:
    code, out, _ = run(
        capsys, "analyze", "--prometheus", store.url, *store.span_args(),
        "--selector", '{pod="vllm-healthy-0"}', "-q",
    )  # fmt: skip
    assert code == 0
    assert out.startswith("healthy [")


def test_fleet_of_other_engines_and_releases(
    capsys: pytest.CaptureFixture[str], store: Store
) -> None:
    """Names are asked of the store, not fixed to one release: SGLang's own names, a
    vLLM's older KV gauge, and two data-parallel engines of one pod as two replicas."""
    code, out, err = run(
        capsys, "fleet", "--prometheus", store.url, *store.lab_args(),
        "--selector", '{namespace="lab"}', "-f", "json",
    )  # fmt: skip
    assert (code, err) == (1, "")
    doc = json.loads(out)
    got = {
        r["replica"]: (r["class"], r["engine"], r["preemptions"], round(r["kv_peak_pct"], 2))
        for r in doc["replicas"]
    }
    assert got == {
        "sglang-0": ("thrash_loop", "sglang", 1982, 100.0),
        "vllm-dp-0[engine=1]": ("thrash_loop", "vllm", 695, 100.0),
        # ground_truth.json: KV max 44.31 %, thrash_halved 695 preemptions.
        "vllm-old-0": ("queueing", "vllm", 0, 44.31),
        "vllm-dp-0[engine=0]": ("healthy", "vllm", 0, 0.8),  # the log line rounds to 0.8 %
    }
    assert [r["replica"] for r in doc["replicas"]][2:] == ["vllm-old-0", "vllm-dp-0[engine=0]"]
    # SGLang's knob, not vLLM's: the engine comes from the metric names.
    assert doc["replicas"][0]["lever"]["knob"] == "--max-running-requests"
    assert doc["replicas"][0]["labels"] == {
        "instance": "10.1.0.1:30000",
        "job": "vllm",
        "namespace": "lab",
        "pod": "sglang-0",
    }
    # The fleet's span holds none of these: discovery is per span.
    code, out, err = run(
        capsys, "fleet", "--prometheus", store.url, *store.span_args(),
        "--selector", '{namespace="lab"}',
    )  # fmt: skip
    assert code == 2 and "has no vLLM or SGLang series matching" in err
