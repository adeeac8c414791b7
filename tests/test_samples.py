"""Every shipped sample: exact class, lever and exit code, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preemptdiag.cli import main

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def analyze(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["analyze", "--format", "json", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, json.loads(out)


# file(s) -> (class, suspected, knob, current, proposed, exit code)
CASES = {
    "v0_healthy.log": ("healthy", False, None, None, None, 0),
    "v1_queueing.log": ("queueing", False, None, None, None, 0),
    "v0_benign_preemption.log": ("benign_preemption", False, None, None, None, 0),
    "v0_thrash_loop.log": ("thrash_loop", False, "--max-num-seqs", "256", "46", 1),
    "v1_thrash_loop.log": ("thrash_loop", False, "--max-num-seqs", "256", "78", 1),
    "v1_suspected_no_counter.log": ("insufficient_evidence", True, None, None, None, 0),
    "v1_cuda_oom.log": (
        "allocation_failure",
        False,
        "--max-num-batched-tokens",
        "8192",
        "2048",
        1,
    ),
    "v1_034_extensible_oom.log": (
        "allocation_failure",
        False,
        "--kv-cache-memory-bytes",
        None,
        "53G",
        1,
    ),
    "v0_startup_kv_too_small.log": (
        "allocation_failure",
        False,
        "--max-model-len",
        "131072",
        "86432",
        1,
    ),
    "sglang_thrash.log": ("thrash_loop", False, "--max-running-requests", "2048", "52", 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sample_verdict_and_lever(capsys: pytest.CaptureFixture[str], name: str) -> None:
    cls, suspected, knob, current, proposed, code = CASES[name]
    got_code, report = analyze(capsys, str(SAMPLES / name))
    v, lever = report["verdict"], report["lever"]
    assert (v["class"], v["suspected"]) == (cls, suspected), v["why"]
    assert (lever["knob"], lever["current"], lever["proposed"]) == (knob, current, proposed)
    assert got_code == code


def test_thrash_arithmetic_can_be_redone_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = analyze(capsys, str(SAMPLES / "v0_thrash_loop.log"))
    math = report["lever"]["arithmetic"]
    # 7,282 blocks x 16 = 116,512 tokens; peak 99.9% with 52 running -> 2,238.37 live
    # tokens per sequence; floor(0.9 x 116,512 / 2,238.37) = 46.
    assert math[0] == "KV tokens = 116,512 (# GPU blocks 7,282 x block size 16)"
    assert "99.9 / 100 × 116,512 / 52 = 2,238.37" in math[2]
    assert math[3] == "--max-num-seqs = floor(0.9 × 116,512 / 2,238.37) = 46"
    assert int(0.9 * 116_512 / (0.999 * 116_512 / 52)) == 46


def test_v1_suspected_becomes_confident_with_two_scrapes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = str(SAMPLES / "v1_suspected_no_counter.log")
    _, alone = analyze(capsys, log)
    assert alone["verdict"]["confidence"] == "medium"
    assert alone["verdict"]["capture_next"].startswith("two /metrics scrapes")
    code, both = analyze(
        capsys, log, str(SAMPLES / "scrapes/v1_before.prom"), str(SAMPLES / "scrapes/v1_after.prom")
    )
    v = both["verdict"]
    assert (v["class"], v["confidence"], v["suspected"], code) == ("thrash_loop", "high", False, 1)
    # 5,350 - 1,200 = 4,150 preemptions between the scrapes, spread over the pinned windows.
    assert round(sum(w["preemptions"] for w in both["windows"])) == 4150


def test_host_oom_incident_across_three_files(capsys: pytest.CaptureFixture[str]) -> None:
    files = [
        str(SAMPLES / "host_oom_incident" / f) for f in ("engine.log", "dmesg.log", "describe.txt")
    ]
    code, report = analyze(capsys, *files)
    v, lever = report["verdict"], report["lever"]
    assert v["class"] == "host_pressure"
    assert (lever["knob"], lever["current"], lever["proposed"]) == (
        "container memory limit",
        "32.0 GiB",
        "40 GiB",
    )
    assert code == 1


def test_rotated_log_reads_as_the_whole_one(capsys: pytest.CaptureFixture[str]) -> None:
    # v0_thrash_loop.log as logrotate left it, passed as a shell glob lists it.
    files = [str(SAMPLES / "rotated" / f) for f in ("vllm.log", "vllm.log.1", "vllm.log.2.gz")]
    code, report = analyze(capsys, *files)
    whole_code, whole = analyze(capsys, str(SAMPLES / "v0_thrash_loop.log"))
    v, lever = report["verdict"], report["lever"]
    assert (v["class"], v["why"]) == ("thrash_loop", whole["verdict"]["why"])
    assert (lever["knob"], lever["current"], lever["proposed"]) == ("--max-num-seqs", "256", "46")
    assert v["replica"] == files[0]
    assert [w["preemptions"] for w in report["windows"]] == [
        w["preemptions"] for w in whole["windows"]
    ]
    assert code == whole_code == 1
    # Alone, the newest file has neither the start-up lines nor the counter's start.
    _, alone = analyze(capsys, files[0])
    assert alone["lever"]["proposed"] != "46"


def test_unrecognised_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = analyze(capsys, str(SAMPLES / "unrecognised.txt"))
    assert report["verdict"]["evidence_found"] is False
    assert code == 0
    assert main(["analyze", "--strict", str(SAMPLES / "unrecognised.txt")]) == 2
    capsys.readouterr()


def test_compare_before_after(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "compare",
            "--format",
            "json",
            str(SAMPLES / "compare/before.log"),
            str(SAMPLES / "compare/after.log"),
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert data["change"] == "improved"
    assert data["changed_knobs"] == {"max_num_seqs": {"before": "256", "after": "48"}}
    assert data["before"]["verdict"] == "thrash_loop"
    assert data["after"]["preemptions"] == 0
    assert code == 0


def test_fail_on_changes_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    thrash = str(SAMPLES / "v0_thrash_loop.log")
    assert main(["analyze", "-q", "--fail-on", "none", thrash]) == 0
    assert main(["analyze", "-q", "--fail-on", "queueing", str(SAMPLES / "v1_queueing.log")]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("thrash_loop [high]")


def test_cuda_oom_arithmetic_uses_the_oom_lines_own_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, report = analyze(capsys, str(SAMPLES / "v1_cuda_oom.log"))
    math = report["lever"]["arithmetic"]
    # 2.00 GiB tried, 1.21 GiB free: 0.79 short; 4,186 x 1.21 / 2.00 = 2,532 tokens fit.
    assert "2.00 GiB tried - 1.21 GiB free = 0.79 GiB short" in math[1]
    assert "floor(4,186 x 1.21 GiB / 2.00 GiB) = 2,532" in math[2]


def test_reprefill_ratio_is_v0_thrash_evidence_only(capsys: pytest.CaptureFixture[str]) -> None:
    _, v0 = analyze(capsys, str(SAMPLES / "v0_thrash_loop.log"))
    assert v0["verdict"]["why"].endswith(
        "; prompt tok/s 6.1x generation (re-prefill of preempted requests)"
    )
    _, v1 = analyze(capsys, str(SAMPLES / "v1_thrash_loop.log"))
    assert "re-prefill" not in v1["verdict"]["why"]  # V1 counts each prompt once


def test_queueing_why_gives_the_queues_peak_not_its_first_window(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, report = analyze(capsys, str(SAMPLES / "v1_queueing.log"))
    # The first queueing window had 8 waiting at 63.1 %; the queue peaked at 38, 82.3 %.
    assert report["verdict"]["why"] == (
        "requests waiting in 7 of 9 window(s), up to 38, KV max 82.3%, "
        "no preemption seen (this log cannot show it)"
    )


@pytest.mark.parametrize(
    ("lines", "confidence", "note"),
    [
        (75, "low", " (only 1 window(s) of stats: too short a look to be sure)"),
        (120, "medium", " (only 2 window(s) of stats: too short a look to be sure)"),
        (None, "high", ""),
    ],
)
def test_healthy_confidence_grows_with_the_look(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    lines: int | None,
    confidence: str,
    note: str,
) -> None:
    # An excerpt of v0_healthy.log: 35 s (8 stats lines), 2 minutes (17), all 7 minutes.
    text = (SAMPLES / "v0_healthy.log").read_text().splitlines(keepends=True)
    log = tmp_path / "excerpt.log"
    log.write_text("".join(text[:lines]))
    _, report = analyze(capsys, str(log))
    v = report["verdict"]
    assert (v["class"], v["confidence"]) == ("healthy", confidence)
    assert v["why"].endswith("no preemption" + note)


def test_the_extensible_oom_lever_applied_is_the_change_compare_sees(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The 0.34 sample's lever applied: the next start sets the KV size (53G) and serves
    # the same traffic. compare names that one knob, from the args line.
    before = (SAMPLES / "v1_034_extensible_oom.log").read_text().splitlines()
    sized = f"'max_logprobs': 20, 'kv_cache_memory_bytes': {53 << 30}}}"
    after = [
        ln.replace("'max_logprobs': 20}", sized)
        for ln in before
        if "ERROR" not in ln and "extensible_kv_cache.py" not in ln
    ]
    (tmp_path / "after.log").write_text("\n".join(after) + "\n")
    code = main(
        ["compare", "--format", "json", str(SAMPLES / "v1_034_extensible_oom.log"),
         str(tmp_path / "after.log")]
    )  # fmt: skip
    c = json.loads(capsys.readouterr().out)
    assert c["changed_knobs"] == {"kv_cache_memory_bytes": {"before": None, "after": str(53 << 30)}}
    assert (c["before"]["verdict"], c["after"]["verdict"]) == ("allocation_failure", "healthy")
    assert (c["change"], code) == ("improved", 0)
