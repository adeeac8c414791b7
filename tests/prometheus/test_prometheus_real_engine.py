"""A real Prometheus scraped the real engine (vLLM 0.32.0, CPU build) every 5 s during a
thrash_loop run of bench/engine (PREEMPTDIAG_ENGINE_PROMETHEUS=1); its samples, exported
through its own API, are backfilled into the test store (namespace "bench"). The ground
truth is the harness's own /metrics scrapes of that run, never preemptdiag."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from conftest import REAL_SCRAPE, Store

from preemptdiag.cli import main

TRUTH = json.loads((REAL_SCRAPE / "ground_truth.json").read_text())
LOG = REAL_SCRAPE / "server.log"


def _span() -> list[str]:
    """The run's span, from its first and last sample, in whole minutes."""
    stamps = [
        float(line.rsplit(" ", 1)[1])
        for line in (REAL_SCRAPE / "prometheus.om").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    lo = datetime.fromtimestamp(min(stamps), UTC).replace(second=0, microsecond=0)
    hi = datetime.fromtimestamp(max(stamps), UTC).replace(second=0, microsecond=0)
    hi += timedelta(minutes=2)
    return ["--since", f"{lo:%Y-%m-%dT%H:%M:%SZ}", "--until", f"{hi:%Y-%m-%dT%H:%M:%SZ}"]


def test_real_scrape_is_a_thrash_loop_with_every_preemption(
    capsys: pytest.CaptureFixture[str], store: Store
) -> None:
    code = main(
        ["fleet", "--prometheus", store.url, *_span(), "--selector", '{namespace="bench"}',
         "-f", "json"]
    )  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    (row,) = doc["replicas"]
    assert (row["replica"], row["class"], row["confidence"]) == (
        "vllm-thrash_loop",
        "thrash_loop",
        "high",
    )
    # The counter as the harness's own scrapes saw it, first to last.
    assert row["preemptions"] == TRUTH["metrics"]["preemptions_delta"]
    assert row["kv_peak_pct"] == TRUTH["metrics"]["kv_usage_max_perc"]
    # No KV capacity in a store: 90 % of the peak concurrency the store saw.
    assert (row["lever"]["knob"], row["lever"]["proposed"]) == ("--max-num-seqs", "85")


def test_real_scrape_beside_the_real_log(capsys: pytest.CaptureFixture[str], store: Store) -> None:
    """The log of the same run joins the store's replica; the lever is sized from the
    log's KV capacity and the counter proves the loop, as two file scrapes would."""
    code = main(
        ["analyze", str(LOG), "--year", "2026", "--prometheus", store.url, *_span(),
         "--selector", '{namespace="bench"}', "-f", "json"]
    )  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    v = doc["verdict"]
    assert (v["class"], v["confidence"], v["replica"], v["suspected"]) == (
        "thrash_loop",
        "high",
        str(LOG),
        False,
    )
    assert (doc["lever"]["knob"], doc["lever"]["proposed"]) == ("--max-num-seqs", "30")
    assert doc["lever"]["arithmetic"][0] == "KV tokens = 32,768 (start-up KV token count)"
    assert sum(w["preemptions"] for w in doc["windows"]) == TRUTH["metrics"]["preemptions_delta"]


def test_the_log_alone_cannot_prove_it(capsys: pytest.CaptureFixture[str]) -> None:
    """What the store adds: the same V1 log alone only suspects the loop."""
    code = main(["analyze", str(LOG), "--year", "2026", "-q"])
    assert (code, capsys.readouterr().out.split(" [")[0]) == (
        0,
        "insufficient_evidence (suspected)",
    )
