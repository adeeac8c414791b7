"""A real Prometheus scraping the real engine during a scenario (harness --prometheus).

Started once the server is up, with the engine as its only target (every
SCRAPE_INTERVAL_S, labels namespace="bench", pod="vllm-<scenario>"); after the load it
is asked, through its own API, for every raw sample of the series the rules read, which
are written as OpenMetrics (`prometheus.om`: what `promtool tsdb create-blocks-from
openmetrics` backfills), then it is stopped and its TSDB removed. Standard library only:
it runs under the engine venv's python.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

SCRAPE_INTERVAL_S = 5
# The series preemptdiag's rules read (ingest/promscrape.py), in vLLM's names.
NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "process_start_time_seconds",
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PromScraper:
    def __init__(self, engine_base: str, scenario: str, outdir: Path) -> None:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        self.outdir = outdir
        self.tsdb = outdir / "prometheus-tsdb"
        target = urllib.parse.urlsplit(engine_base).netloc
        config = outdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {SCRAPE_INTERVAL_S}s\n"
            "scrape_configs:\n"
            "  - job_name: vllm\n"
            "    static_configs:\n"
            f"      - targets: ['{target}']\n"
            f"        labels: {{namespace: bench, pod: vllm-{scenario}}}\n"
        )
        self.url = f"http://127.0.0.1:{_port()}"
        self.log = (outdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.tsdb}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.started = time.time()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("prometheus did not become ready")

    def export(self) -> Path:
        """Every raw sample since the start, as OpenMetrics; stops the server."""
        time.sleep(SCRAPE_INTERVAL_S + 1)  # one scrape after the harness's last
        span = int(time.time() - self.started) + SCRAPE_INTERVAL_S
        query = '{__name__=~"' + "|".join(NAMES) + '",job="vllm"}' + f"[{span}s]"
        params = urllib.parse.urlencode({"query": query, "time": f"{time.time():.3f}"})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=30) as r:
            result = json.load(r)["data"]["result"]
        by_name: dict[str, list[str]] = {}
        for series in sorted(result, key=lambda s: sorted(s["metric"].items())):
            labels = dict(series["metric"])
            name = labels.pop("__name__")
            tag = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            by_name.setdefault(name, []).extend(
                f"{name}{{{tag}}} {value} {float(ts):.3f}" for ts, value in series["values"]
            )
        path = self.outdir / "prometheus.om"
        lines = [ln for name in sorted(by_name) for ln in by_name[name]]
        path.write_text("\n".join([*lines, "# EOF"]) + "\n")
        self.stop()
        return path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        shutil.rmtree(self.tsdb, ignore_errors=True)
