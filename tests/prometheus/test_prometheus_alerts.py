"""`alerts`: the generated rules pass `promtool check rules`, and `promtool test rules`
proves each alert fires on its class's series (built from the real-engine recordings)
and stays quiet on the others; config overrides move alert and diagnosis together."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import series
import yaml
from conftest import Store, tool

from preemptdiag.cli import main

ALERTS = (
    "PreemptdiagThrashLoop",
    "PreemptdiagSuspectedPreemption",
    "PreemptdiagQueueing",
    "PreemptdiagEngineRestart",
)
# The six replicas of the unit test: the four of the store, the thrash recording as a
# store without a preemption counter sees it, and a V1 engine wedged with its pool
# pinned and its counter standing still (series.wedged): suspected, not queueing.
REPLICAS = {
    "healthy": ("vllm-healthy-0", "10.0.0.1:8000"),
    "queueing": ("vllm-queueing-0", "10.0.0.2:8000"),
    "thrash": ("vllm-thrash-0", "10.0.0.3:8000"),
    "restarted": ("vllm-restarted-0", "10.0.0.4:8000"),
    "blind": ("vllm-blind-0", "10.0.0.5:8000"),
    "wedged": ("vllm-wedged-0", "10.0.0.6:8000"),
}
DEFAULT_FIRING = {
    # eval time -> alert -> the replicas it must fire for (and only those)
    "2m": {
        "PreemptdiagThrashLoop": ["thrash"],
        "PreemptdiagSuspectedPreemption": ["blind", "wedged"],
        "PreemptdiagQueueing": ["queueing"],
        "PreemptdiagEngineRestart": ["restarted"],
    },
    "3m": {
        "PreemptdiagThrashLoop": ["thrash"],
        "PreemptdiagSuspectedPreemption": ["blind", "wedged"],
        "PreemptdiagQueueing": ["queueing"],
        "PreemptdiagEngineRestart": [],
    },
    "5m": {
        "PreemptdiagThrashLoop": ["thrash"],
        "PreemptdiagSuspectedPreemption": ["blind", "wedged"],
        "PreemptdiagQueueing": [],
        "PreemptdiagEngineRestart": [],
    },
}


def generate(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(["alerts", *argv])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    return out


def unit_series() -> list[dict[str, str]]:
    reps = [
        series.replica("healthy", *REPLICAS["healthy"]),
        series.replica("queueing", *REPLICAS["queueing"]),
        series.replica("thrash_loop", *REPLICAS["thrash"]),
        series.restarted("healthy", *REPLICAS["restarted"]),
        series.blind("thrash_loop", *REPLICAS["blind"]),
        series.wedged(*REPLICAS["wedged"]),
    ]
    return series.promtool_series(reps, 10.0)


def expected(rules: dict[str, Any], alert: str, who: str) -> dict[str, Any]:
    """The alert as promtool must see it for one replica: its labels, and the
    annotations' templates expanded for that replica."""
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)
    pod, instance = REPLICAS[who]
    target = {"namespace": "serving", "pod": pod, "instance": instance, "job": "vllm"}
    labels = {**rule["labels"], **target}
    if alert != "PreemptdiagEngineRestart":  # a restart is the target's, not an engine's
        labels["engine"] = "0"
    engine = " (engine 0)" if "engine" in labels else ""
    summary = rule["annotations"]["summary"].split("}}: ", 1)[1]
    return {
        "exp_labels": labels,
        "exp_annotations": {
            "summary": f"{pod}{engine}: {summary}",
            "description": "Run next: preemptdiag analyze --prometheus http://prometheus:9090 "
            f'--selector \'{{namespace="serving",pod="{pod}"}}\' --since 1h',
        },
    }


def promtool_test(tmp_path: Path, rules_text: str, firing: dict[str, dict[str, list[str]]]) -> None:
    rules = yaml.safe_load(rules_text)
    (tmp_path / "rules.yml").write_text(rules_text)
    doc = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "10s",
        "tests": [
            {
                "interval": "10s",
                "input_series": unit_series(),
                "alert_rule_test": [
                    {
                        "eval_time": t,
                        "alertname": a,
                        "exp_alerts": [expected(rules, a, who) for who in whom],
                    }
                    for t, alerts in firing.items()
                    for a, whom in alerts.items()
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(json.dumps(doc))
    got = subprocess.run(
        [tool("promtool"), "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert got.returncode == 0, got.stdout[-4000:] + got.stderr[-2000:]


def test_rules_pass_promtool_check(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    assert main(["alerts", "-o", str(path), "--selector", '{namespace="serving"}']) == 0
    got = subprocess.run(
        [tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True
    )
    assert got.returncode == 0, got.stdout + got.stderr
    assert "SUCCESS: 13 rules found" in got.stdout
    records = {
        r["record"]: r["expr"]
        for g in yaml.safe_load(path.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    assert records["preemptdiag:kv_usage:pct"] == (
        "100 * max by (namespace, pod, instance, job, engine) "
        '({__name__=~"vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc|sglang:token_usage", '
        'namespace="serving"})'
    )
    assert records["preemptdiag:preemptions:window"].startswith(
        "sum by (namespace, pod, instance, job, engine) "
        '(increase(vllm:num_preemptions_total{namespace="serving"}[1m])) or on '
    )


def test_each_alert_fires_on_its_class_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    promtool_test(tmp_path, generate(capsys), DEFAULT_FIRING)


def test_k8s_format_is_a_prometheusrule_around_the_same_groups(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plain = yaml.safe_load(generate(capsys))
    k8s = yaml.safe_load(generate(capsys, "-f", "k8s", "--namespace", "monitoring"))
    assert (k8s["apiVersion"], k8s["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert k8s["metadata"] == {
        "name": "preemptdiag",
        "labels": {"app.kubernetes.io/name": "preemptdiag"},
        "namespace": "monitoring",
    }
    assert k8s["spec"] == plain
    # The spec is what the operator hands Prometheus: it must pass promtool too.
    (tmp_path / "spec.yml").write_text(json.dumps(k8s["spec"]))
    got = subprocess.run(
        [tool("promtool"), "check", "rules", str(tmp_path / "spec.yml")],
        capture_output=True,
        text=True,
    )
    assert got.returncode == 0, got.stdout + got.stderr


def test_config_overrides_move_alert_and_diagnosis_together(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, store: Store
) -> None:
    """A stricter thrash definition silences the thrash alert on the thrash series, and
    analyze with the same config no longer calls that replica a thrash loop."""
    cfg = tmp_path / "preemptdiag.toml"
    cfg.write_text(
        "[thresholds]\nthrash_min_windows = 12\nthrash_rate_per_min = 100000\n"
        "thrash_cumulative = 100000\n"
    )
    text = generate(capsys, "--config", str(cfg))
    assert "[11m]" in text and ">= 100000" in text
    quiet = {t: {**alerts, "PreemptdiagThrashLoop": []} for t, alerts in DEFAULT_FIRING.items()}
    promtool_test(tmp_path, text, quiet)
    code = main(
        ["analyze", "--prometheus", store.url, *store.span_args(), "--config", str(cfg),
         "--selector", '{pod="vllm-thrash-0"}', "-f", "json"]
    )  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert (code, doc["verdict"]["class"]) == (0, "benign_preemption")
    assert doc["thresholds"]["thrash_min_windows"] == 12


def test_annotation_url_never_carries_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    text = generate(capsys, "--prometheus", "https://ops:hunter2@prom.example:9443/api?x=1")
    assert "hunter2" not in text and "ops:" not in text
    assert "--prometheus https://prom.example:9443/api --selector" in text
