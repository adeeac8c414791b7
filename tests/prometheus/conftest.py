"""A real Prometheus for the store tests: Debian's `prometheus` package (server and
promtool), a TSDB backfilled from the real-engine recordings (series.py), served on
127.0.0.1 at a free port for the whole session.

A missing prometheus/promtool fails these tests: CI installs the package (tests/install-deps), and
a skip would hide that nothing was tested. PREEMPTDIAG_NO_PROMETHEUS=1 skips them on a
machine that cannot have it, by an explicit choice.
"""

from __future__ import annotations

import base64
import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import series

# A thrash_loop run of the real engine scraped by a real Prometheus every 5 s.
REAL_SCRAPE = series.ENGINE / "thrash_loop_prometheus"


def tool(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path:
        return path
    if os.environ.get("PREEMPTDIAG_NO_PROMETHEUS") == "1":
        pytest.skip(f"{name} not installed and PREEMPTDIAG_NO_PROMETHEUS=1")
    pytest.fail(
        f"{name} not found: install Debian's prometheus package "
        "(apt-get install prometheus), or set PREEMPTDIAG_NO_PROMETHEUS=1 to skip these tests",
        pytrace=False,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _args(since: datetime, until: datetime) -> list[str]:
    return ["--since", f"{since:%Y-%m-%dT%H:%M:%SZ}", "--until", f"{until:%Y-%m-%dT%H:%M:%SZ}"]


def _around(lo: datetime, hi: datetime) -> tuple[datetime, datetime]:
    """Whole minutes around the data, and past its end by more than Prometheus'
    5-minute lookback, so every replica's last point is inside."""
    end = hi.replace(second=0, microsecond=0) + timedelta(minutes=10)
    return lo.replace(second=0, microsecond=0), end


@dataclass(frozen=True)
class Store:
    url: str
    since: datetime
    until: datetime
    lab: tuple[datetime, datetime]  # the span of series.lab()

    def span_args(self) -> list[str]:
        return _args(self.since, self.until)

    def lab_args(self) -> list[str]:
        return _args(*self.lab)


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    promtool, prometheus = tool("promtool"), tool("prometheus")
    root = tmp_path_factory.mktemp("prometheus")
    replicas, lab = series.fleet(), series.lab()
    (root / "series.om").write_text(series.openmetrics(replicas + lab))
    # The built series, and what a real Prometheus scraped from the real engine
    # (bench/engine, PREEMPTDIAG_ENGINE_PROMETHEUS=1): separate files, separate blocks.
    for om in (root / "series.om", REAL_SCRAPE / "prometheus.om"):
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(root / "tsdb")],
            check=True,
            capture_output=True,
        )
    (root / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\n")
    port = free_port()
    log = (root / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            # The recordings are from 2026-12-01: blocks older than the retention would
            # be deleted at start-up.
            "--storage.tsdb.retention.time=100y",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"prometheus did not start: {(root / 'prometheus.log').read_text()[-2000:]}"
                )
            time.sleep(0.1)
        yield Store(url, *_around(*series.span(replicas)), _around(*series.span(lab)))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@dataclass(frozen=True)
class Proxy:
    url: str
    seen: list[str]  # the Authorization headers it received


@pytest.fixture
def auth_proxy(store: Store) -> Iterator[Proxy]:
    """The store behind a gate that wants `Bearer s3cret-token` or basic `ops:pa55`
    (Prometheus itself takes no bearer tokens; Thanos/Mimir gateways do)."""
    good = {"Bearer s3cret-token", "Basic " + base64.b64encode(b"ops:pa55").decode()}
    seen: list[str] = []

    class Gate(http.server.BaseHTTPRequestHandler):
        def _forward(self) -> None:
            auth = self.headers.get("Authorization", "")
            seen.append(auth)
            if auth not in good:
                reply(self, 401, "text/plain", b"unauthorized\n")
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
            req = urllib.request.Request(store.url + self.path, data=body, method=self.command)
            if body:
                req.add_header("Content-Type", self.headers.get("Content-Type", ""))
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    status, data = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, data = e.code, e.read()
            reply(self, status, "application/json", data)

        do_GET = do_POST = _forward

        def log_message(self, *args: object) -> None:
            pass

    with serving(Gate) as url:
        yield Proxy(url, seen)


def reply(h: http.server.BaseHTTPRequestHandler, status: int, ctype: str, body: bytes) -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A local HTTP server in a thread for the block; its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
