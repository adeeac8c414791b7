"""A store that cannot be read is one clear line and exit 2, never a traceback and never
a credential; credentials from the environment or files reach the store."""

from __future__ import annotations

import http.server
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from conftest import Proxy, Store, free_port, reply, serving

from preemptdiag.cli import main
from preemptdiag.ingest.prometheus_api import choose_step, restarts, shown_url
from preemptdiag.ingest.promscrape import Scrape

SECRET = "s3cret-token"


def fail_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("preemptdiag: error: "), err
    assert "Traceback" not in err
    return err.removeprefix("preemptdiag: error: ").rstrip("\n")


@pytest.fixture
def html_server() -> Iterator[str]:
    """Something that answers HTTP, but not the Prometheus API (a UI, a proxy page)."""

    class Page(http.server.BaseHTTPRequestHandler):
        def _page(self) -> None:
            reply(self, 200, "text/html; charset=utf-8", b"<html><body>Grafana login</body></html>")

        do_GET = do_POST = _page

        def log_message(self, *args: object) -> None:
            pass

    with serving(Page) as url:
        yield url


def test_unreachable_store(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    msg = fail_line(capsys, "fleet", "--prometheus", url)
    assert msg.startswith(f"cannot reach Prometheus at {url}: ")


def test_refused_credentials_never_echo_the_token(
    capsys: pytest.CaptureFixture[str], auth_proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREEMPTDIAG_PROMETHEUS_TOKEN", "wrong-token-123")
    msg = fail_line(capsys, "fleet", "--prometheus", auth_proxy.url, "-f", "json")
    assert msg == (
        f"Prometheus at {auth_proxy.url} refused access (HTTP 401): set "
        "PREEMPTDIAG_PROMETHEUS_TOKEN (or PREEMPTDIAG_PROMETHEUS_TOKEN_FILE), or "
        "PREEMPTDIAG_PROMETHEUS_USER and PREEMPTDIAG_PROMETHEUS_PASSWORD, to credentials it accepts"
    )
    assert auth_proxy.seen == ["Bearer wrong-token-123"]


def test_bearer_token_from_a_file(
    capsys: pytest.CaptureFixture[str],
    store: Store,
    auth_proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path,
) -> None:
    token = tmp_path / "token"
    token.write_text(SECRET + "\n")  # a mounted secret ends in a newline
    monkeypatch.setenv("PREEMPTDIAG_PROMETHEUS_TOKEN_FILE", str(token))
    code = main(["fleet", "--prometheus", auth_proxy.url, *store.span_args(), "-f", "json"])
    out, err = capsys.readouterr()
    assert code == 1 and err == ""
    assert json.loads(out)["replicas"][0]["replica"] == "vllm-thrash-0"
    assert set(auth_proxy.seen) == {f"Bearer {SECRET}"}
    assert SECRET not in out


@pytest.mark.parametrize("how", ["env", "url"])
def test_basic_auth(
    capsys: pytest.CaptureFixture[str],
    store: Store,
    auth_proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    url = auth_proxy.url
    if how == "env":
        monkeypatch.setenv("PREEMPTDIAG_PROMETHEUS_USER", "ops")
        monkeypatch.setenv("PREEMPTDIAG_PROMETHEUS_PASSWORD", "pa55")
    else:
        url = url.replace("http://", "http://ops:pa55@")
    code = main(["analyze", "--prometheus", url, *store.span_args(), "-f", "json",
                 "--selector", '{pod="vllm-queueing-0"}'])  # fmt: skip
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["verdict"]["class"] == "queueing"
    assert doc["scan"]["files"] == [auth_proxy.url]  # shown without user:password@
    assert "pa55" not in out


def test_url_credentials_are_not_echoed_in_errors(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    msg = fail_line(capsys, "fleet", "--prometheus", f"http://ops:hunter2@127.0.0.1:{port}/")
    assert "hunter2" not in msg and "ops" not in msg
    assert msg.startswith(f"cannot reach Prometheus at http://127.0.0.1:{port}: ")


def test_not_the_api(capsys: pytest.CaptureFixture[str], html_server: str) -> None:
    msg = fail_line(capsys, "fleet", "--prometheus", html_server)
    assert msg == (
        f"Prometheus at {html_server}/api/v1/label/__name__/values answered HTTP 200 with "
        "text/html, not the Prometheus API's JSON: is the URL the API's base "
        "(e.g. http://prometheus:9090)?"
    )


def test_store_refuses_the_query(capsys: pytest.CaptureFixture[str], store: Store) -> None:
    msg = fail_line(
        capsys, "fleet", "--prometheus", store.url, *store.span_args(), "--selector", '{pod=~"("}'
    )
    assert msg.startswith(f"Prometheus at {store.url} refused the query (bad_data): ")
    assert "missing closing )" in msg


def test_nothing_matches(capsys: pytest.CaptureFixture[str], store: Store) -> None:
    msg = fail_line(
        capsys, "fleet", "--prometheus", store.url, *store.span_args(), "--selector", '{pod="nope"}'
    )
    assert msg == (
        f'Prometheus at {store.url} has no vLLM or SGLang series matching {{pod="nope"}} '
        f"between {store.since:%Y-%m-%d %H:%M:%S} and {store.until:%Y-%m-%d %H:%M:%S} UTC"
    )


def test_span_without_data(capsys: pytest.CaptureFixture[str], store: Store) -> None:
    msg = fail_line(
        capsys, "fleet", "--prometheus", store.url,
        "--since", "2020-01-01T00:00:00Z", "--until", "2020-01-01T01:00:00Z",
    )  # fmt: skip
    assert msg.startswith(f"Prometheus at {store.url} has no vLLM or SGLang series between ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--selector", "pod=x"],
            "--selector: not a label selector: 'pod=x' (use e.g. "
            '\'{namespace="serving",pod=~"vllm-.*"}\')',
        ),
        (
            ["--since", "2026-12-01T23:00:00Z", "--until", "2026-12-01T22:00:00Z"],
            "--since (2026-12-01 23:00:00) must be before --until",
        ),
        (["--step", "0s"], "window must be at least 1 second: '0s'"),
    ],
)
def test_bad_arguments(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert fail_line(capsys, "fleet", "--prometheus", "http://127.0.0.1:1", *argv) == message


def test_not_an_http_url(capsys: pytest.CaptureFixture[str]) -> None:
    msg = fail_line(capsys, "analyze", "--prometheus", "prometheus:9090")
    assert (
        msg == "--prometheus: not an http(s) URL: prometheus:9090 (use e.g. http://prometheus:9090)"
    )


def test_token_file_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREEMPTDIAG_PROMETHEUS_TOKEN_FILE", "/nonexistent/token")
    msg = fail_line(capsys, "fleet", "--prometheus", "http://127.0.0.1:1")
    assert msg == (
        "PREEMPTDIAG_PROMETHEUS_TOKEN_FILE: cannot read /nonexistent/token: No such file or directory"
    )


def test_selector_without_a_store(capsys: pytest.CaptureFixture[str]) -> None:
    msg = fail_line(capsys, "analyze", "x.log", "--selector", '{pod="a"}')
    assert msg == "--selector and --step need --prometheus URL"


def test_shown_url_drops_credentials_and_query() -> None:
    assert shown_url("https://u:p@h.example:9443/prom/?token=x#f") == "https://h.example:9443/prom"
    assert shown_url("http://[::1]:9090") == "http://[::1]:9090"


def test_step_fits_the_point_limit() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    assert choose_step(t0, t0 + timedelta(hours=1), 60, None) == 15
    assert choose_step(t0, t0 + timedelta(hours=1), 10, None) == 10  # never above a window
    # 30 days at 15 s would be 172,800 points: the step grows to keep under 11,000.
    assert choose_step(t0, t0 + timedelta(days=30), 60, None) == 236


def _scrape(i: int, start: float, done: float) -> Scrape:
    values = {"process_start_time_seconds": start, "request_success_total": done}
    return Scrape("s", datetime(2026, 1, 1, 0, i, tzinfo=UTC), "vllm", values)


def test_restarts_by_start_time_or_counter_reset() -> None:
    # A new process whose counter already passed the old value: only the start time tells.
    assert restarts([_scrape(0, 100.0, 50.0), _scrape(1, 200.0, 80.0)]) == 1
    assert restarts([_scrape(0, 100.0, 50.0), _scrape(1, 100.0, 3.0)]) == 1
    assert restarts([_scrape(0, 100.0, 50.0), _scrape(1, 100.0, 60.0)]) == 0


def test_since_takes_a_duration_ago() -> None:
    from preemptdiag.commands.options import parse_time

    got = parse_time("90m", "--since")
    assert got is not None
    ago = datetime.now(UTC) - got
    assert timedelta(minutes=89, seconds=59) < ago < timedelta(minutes=90, seconds=5)
    assert parse_time("2d", "--since") is not None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"data": []}', "answered JSON that is not a Prometheus API response"),
        (
            b'{"status": "success", "data": ["vllm:num_requests_running"]}',
            "a range query did not return a matrix",
        ),
    ],
)
def test_json_that_is_not_the_api(
    capsys: pytest.CaptureFixture[str], body: bytes, message: str
) -> None:
    """A JSON service at the URL, or a store whose answers do not have the API's shape."""

    class Api(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            reply(self, 200, "application/json", body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    with serving(Api) as url:
        msg = fail_line(capsys, "fleet", "--prometheus", url)
    assert message in msg and msg.startswith(f"Prometheus at {url}")
