"""A Prometheus-API store (Prometheus, Thanos, Mimir, VictoriaMetrics) as a source.

The store already holds every replica's scrapes; this module asks it for the series the
rules need, one range query per metric name for the whole fleet (the store aggregates
by replica, so hundreds of replicas cost the same dozen HTTP calls), and turns each
replica's points into the same `Scrape` records a `/metrics` file gives. From there the
path is the one scrape files take: events, windows, the same rules.

Metric names differ by engine and release; which ones the store has is asked of it
(`/api/v1/label/__name__/values`), and each quantity takes, per replica, the first name
in promscrape's order of preference that has data there.

Credentials come from the environment (or files it names), never from the command
line, and no message or report ever carries them: errors name the store by its URL
with any user:password@ and query string removed.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from preemptdiag.ingest.promscrape import _MAX, _QUANTITIES, Scrape
from preemptdiag.model.errors import DiagError

if TYPE_CHECKING:
    import httpx

# The labels that tell replicas apart: a Kubernetes pod (with its namespace), else the
# scrape target (instance/job); `engine` is vLLM's engine index, so each data-parallel
# engine of one pod, which schedules (and preempts) on its own, is a replica of its own.
REPLICA_LABELS: tuple[str, ...] = ("namespace", "pod", "instance", "job", "engine")

ENV_TOKEN = "PREEMPTDIAG_PROMETHEUS_TOKEN"
ENV_USER = "PREEMPTDIAG_PROMETHEUS_USER"
ENV_PASSWORD = "PREEMPTDIAG_PROMETHEUS_PASSWORD"
# Mimir/Cortex tenants: sent as X-Scope-OrgID.
ENV_ORG = "PREEMPTDIAG_PROMETHEUS_ORG_ID"

# Prometheus refuses a range query of more than 11,000 points per series.
MAX_POINTS = 11_000
DEFAULT_STEP_S = 15  # a common scrape interval; a shorter one only repeats samples
_TIMEOUT_S = 30.0

# A series selector as --selector takes it: `{label op "value", ...}`.
_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_SELECTOR = re.compile(rf"\{{(?:{_MATCHER}(?:,{_MATCHER})*,?\s*)?\}}")


@dataclass(frozen=True, slots=True)
class Credentials:
    """How to authenticate; `secrets` are the values no message may show."""

    headers: Mapping[str, str] = field(default_factory=dict)
    basic: tuple[str, str] | None = None

    @property
    def secrets(self) -> tuple[str, ...]:
        out = [v for k, v in self.headers.items() if k.lower() == "authorization"]
        if self.basic:
            out.append(self.basic[1])
        return tuple(s for s in out if s)


@dataclass(frozen=True, slots=True)
class PromSource:
    """Where to read, what, and over which span."""

    url: str
    selector: str = ""
    step_s: int | None = None  # None: DEFAULT_STEP_S, raised to fit MAX_POINTS


@dataclass(frozen=True, slots=True)
class Replica:
    """One engine instance as the store sees it."""

    name: str
    labels: Mapping[str, str]
    scrapes: tuple[Scrape, ...]
    names_used: tuple[str, ...]  # metric names its quantities were read from
    restarts: int  # process start time moved or a counter went down


@dataclass(frozen=True, slots=True)
class Fleet:
    url: str  # shown form: no credentials, no query string
    selector: str
    start: datetime
    end: datetime
    step_s: int
    replicas: tuple[Replica, ...]
    queries: int  # HTTP calls made


def shown_url(url: str) -> str:
    """The URL as messages and reports may show it: no user:password@, no query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def _read_secret(env: Mapping[str, str], name: str) -> str | None:
    """`NAME` itself, or the first line of the file `NAME_FILE` names (a mounted
    Kubernetes secret, a service-account token)."""
    value = env.get(name)
    path = env.get(f"{name}_FILE")
    if value and path:
        raise DiagError(f"set {name} or {name}_FILE, not both")
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise DiagError(f"{name}_FILE: cannot read {path}: {reason}") from None
        value = text.strip()
        if not value:
            raise DiagError(f"{name}_FILE: {path} is empty")
    return value or None


def credentials(url: str, env: Mapping[str, str] | None = None) -> Credentials:
    """Bearer token or basic auth from the environment (or user:password@ in the URL)."""
    env = os.environ if env is None else env
    token = _read_secret(env, ENV_TOKEN)
    user = env.get(ENV_USER)
    password = _read_secret(env, ENV_PASSWORD)
    parts = urlsplit(url)
    if parts.username is not None and not user:
        user, password = parts.username, parts.password or ""
    if token and user:
        raise DiagError(f"set a bearer token ({ENV_TOKEN}) or basic auth ({ENV_USER}), not both")
    if password and not user:
        raise DiagError(f"{ENV_PASSWORD} is set but {ENV_USER} is not")
    headers: dict[str, str] = {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    org = env.get(ENV_ORG)
    if org:
        headers["X-Scope-OrgID"] = org
    return Credentials(headers=headers, basic=(user, password or "") if user else None)


def check_selector(selector: str) -> str:
    """The selector, stripped, or a DiagError before any query is sent."""
    sel = selector.strip()
    if not sel or sel.replace(" ", "") == "{}":
        return ""
    if not _SELECTOR.fullmatch(sel):
        raise DiagError(
            f"--selector: not a label selector: {sel[:80]!r} "
            '(use e.g. \'{namespace="serving",pod=~"vllm-.*"}\')'
        )
    return sel


def choose_step(start: datetime, end: datetime, window_s: int, step_s: int | None) -> int:
    """The scrape-interval-sized step (never longer than a window, so every window gets
    points), raised where the span would pass Prometheus' point limit."""
    span = (end - start).total_seconds()
    if span <= 0:
        raise DiagError(f"--since ({start:%Y-%m-%d %H:%M:%S}) must be before --until")
    step = step_s if step_s is not None else min(DEFAULT_STEP_S, window_s)
    if step < 1:
        raise DiagError("--step must be at least 1 second")
    return max(step, math.ceil(span / MAX_POINTS))


class Client:
    """GETs and POSTs to the API, each answer checked: every failure is one DiagError
    that names the store by its shown URL and never a credential."""

    def __init__(self, url: str, creds: Credentials, transport: httpx.BaseTransport | None = None):
        import httpx  # ~60 ms; only runs that read a store pay it

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DiagError(
                f"--prometheus: not an http(s) URL: {shown_url(url) or '(empty)'} "
                "(use e.g. http://prometheus:9090)"
            )
        self.shown = shown_url(url)
        self._secrets = creds.secrets
        base = urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path, "", ""))
        self._http = httpx.Client(
            base_url=base.rstrip("/") + "/",
            headers=dict(creds.headers),
            auth=httpx.BasicAuth(*creds.basic) if creds.basic else None,
            timeout=_TIMEOUT_S,
            follow_redirects=True,
            transport=transport,
        )
        self.calls = 0

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fail(self, text: str) -> DiagError:
        for s in self._secrets:
            text = text.replace(s, "***")
        return DiagError(text)

    def api(self, path: str, params: Mapping[str, str | Sequence[str]], post: bool = False) -> Any:
        """`data` of a successful API answer."""
        import httpx

        where = f"Prometheus at {self.shown}"
        self.calls += 1
        try:
            if post:
                resp = self._http.post(path, data=dict(params))
            else:
                resp = self._http.get(path, params=dict(params))
        except httpx.TimeoutException:
            raise self._fail(f"{where}: no answer within {_TIMEOUT_S:.0f} s ({path})") from None
        except httpx.HTTPError as exc:
            reason = str(exc).split("\n", 1)[0] or type(exc).__name__
            raise self._fail(f"cannot reach {where}: {reason}") from None
        if resp.status_code in (401, 403):
            raise self._fail(
                f"{where} refused access (HTTP {resp.status_code}): set {ENV_TOKEN} "
                f"(or {ENV_TOKEN}_FILE), or {ENV_USER} and {ENV_PASSWORD}, to credentials it accepts"
            )
        try:
            body = resp.json()
        except ValueError:
            kind = resp.headers.get("content-type", "no content type").split(";")[0]
            raise self._fail(
                f"{where}/{path} answered HTTP {resp.status_code} with {kind}, not the Prometheus "
                "API's JSON: is the URL the API's base (e.g. http://prometheus:9090)?"
            ) from None
        if not isinstance(body, dict) or "status" not in body:
            raise self._fail(f"{where}/{path} answered JSON that is not a Prometheus API response")
        if body.get("status") != "success":
            kind = str(body.get("errorType") or f"HTTP {resp.status_code}")
            msg = " ".join(str(body.get("error") or "no error message").split())
            raise self._fail(f"{where} refused the query ({kind}): {msg[:300]}")
        return body.get("data")


def _unix(t: datetime) -> str:
    return f"{t.timestamp():.3f}"


def metric_names(client: Client, selector: str, start: datetime, end: datetime) -> set[str]:
    params: dict[str, str | Sequence[str]] = {"start": _unix(start), "end": _unix(end)}
    if selector:
        params["match[]"] = [selector]
    data = client.api("api/v1/label/__name__/values", params)
    if not isinstance(data, list):
        raise DiagError(f"Prometheus at {client.shown}: metric name list is not a list")
    return {n for n in data if isinstance(n, str)}


def _matrix(data: Any, shown: str) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise DiagError(f"Prometheus at {shown}: a range query did not return a matrix")
    out: list[tuple[dict[str, str], list[tuple[float, float]]]] = []
    result = data.get("result") or []
    if not isinstance(result, list) or not all(isinstance(x, dict) for x in result):
        raise DiagError(f"Prometheus at {shown}: a range query's result is not a list of series")
    for series in result:
        metric = series.get("metric")
        labels = {str(k): str(v) for k, v in metric.items()} if isinstance(metric, dict) else {}
        points: list[tuple[float, float]] = []
        for pair in series.get("values") or []:
            try:
                ts, value = float(pair[0]), float(pair[1])
            except (TypeError, ValueError, IndexError, KeyError):
                continue
            if math.isfinite(value):  # NaN/Inf: a stale marker or an empty histogram
                points.append((ts, value))
        out.append((labels, points))
    return out


def _query(name: str, how: str, selector: str, step: int) -> str:
    """A gauge read for its peak takes the highest sample of each step (a step longer
    than the scrape interval would otherwise skip samples, and the KV peak with them);
    counters and queue lengths take the last sample, as a scrape would."""
    by = ", ".join(REPLICA_LABELS)
    if how == _MAX:
        return f"max by ({by}) (max_over_time({name}{selector}[{step}s]))"
    return f"sum by ({by}) ({name}{selector})"


_Key = tuple[str, ...]  # the REPLICA_LABELS values of one replica


def read_fleet(
    src: PromSource,
    start: datetime,
    end: datetime,
    window_s: int,
    env: Mapping[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
) -> Fleet:
    """Every replica the selector names between start and end, as scrapes."""
    selector = check_selector(src.selector)
    step = choose_step(start, end, window_s, src.step_s)
    with Client(src.url, credentials(src.url, env), transport) as client:
        names = metric_names(client, selector, start, end)
        wanted = [
            (key, how, name, scale)
            for key, how, cands, scale in _QUANTITIES
            for name in cands
            if name in names
        ]
        if not any(n.startswith(("vllm:", "sglang:")) for _, _, n, _ in wanted):
            raise DiagError(
                f"Prometheus at {client.shown} has no vLLM or SGLang series "
                f"{'matching ' + selector + ' ' if selector else ''}between "
                f"{start:%Y-%m-%d %H:%M:%S} and {end:%Y-%m-%d %H:%M:%S} UTC"
            )
        # (replica key, quantity) -> (metric name, {ts: value}); the first name in
        # preference order with data for that replica wins.
        series: dict[tuple[_Key, str], tuple[str, dict[float, float]]] = {}
        for key, how, name, scale in wanted:
            params = {
                "query": _query(name, how, selector, step),
                "start": _unix(start),
                "end": _unix(end),
                "step": str(step),
            }
            for labels, points in _matrix(
                client.api("api/v1/query_range", params, post=True), client.shown
            ):
                rk = tuple(labels.get(lb, "") for lb in REPLICA_LABELS)
                if points and (rk, key) not in series:
                    series[(rk, key)] = (name, {t: v * scale for t, v in points})
        replicas = _replicas(series, client.shown)
        calls = client.calls
    if not replicas:
        raise DiagError(
            f"Prometheus at {shown_url(src.url)}: no vLLM or SGLang samples "
            f"{'matching ' + selector + ' ' if selector else ''}between "
            f"{start:%Y-%m-%d %H:%M:%S} and {end:%Y-%m-%d %H:%M:%S} UTC"
        )
    return Fleet(shown_url(src.url), selector, start, end, step, replicas, calls)


def _replicas(
    series: Mapping[tuple[_Key, str], tuple[str, dict[float, float]]], shown: str
) -> tuple[Replica, ...]:
    by_key: dict[_Key, dict[str, tuple[str, dict[float, float]]]] = {}
    for (rk, quantity), named in series.items():
        by_key.setdefault(rk, {})[quantity] = named
    # A target without engine series (node exporter, the store itself) shares
    # process_start_time_seconds with engines but is no replica.
    engines = {
        rk: qs
        for rk, qs in by_key.items()
        if any(n.startswith(("vllm:", "sglang:")) for n, _ in qs.values())
    }
    for rk, qs in by_key.items():
        # process metrics carry no engine label: lend them to the target's engines.
        if rk in engines or "process_start_time_seconds" not in qs:
            continue
        for ek, eqs in engines.items():
            if _same_target(rk, ek) and "process_start_time_seconds" not in eqs:
                eqs["process_start_time_seconds"] = qs["process_start_time_seconds"]
    names = _names(list(engines))
    out: list[Replica] = []
    for rk in sorted(engines, key=lambda k: names[k]):
        qs = engines[rk]
        used = tuple(sorted({n for n, _ in qs.values()}))
        engine = "sglang" if any(n.startswith("sglang:") for n in used) else "vllm"
        stamps = sorted({t for _, pts in qs.values() for t in pts})
        source = f"prometheus/{names[rk]}"
        scrapes = tuple(
            Scrape(
                source=source,
                ts=datetime.fromtimestamp(t, tz=UTC),
                engine=engine,
                values=MappingProxyType(
                    {q: pts[t] for q, (_, pts) in qs.items() if t in pts},
                ),
                # The point's index stands in for a line: evidence cites point N of
                # the replica's series, and distinct points stay distinct.
                lines=MappingProxyType({q: i + 1 for q in qs}),
            )
            for i, t in enumerate(stamps)
        )
        labels = {lb: v for lb, v in zip(REPLICA_LABELS, rk, strict=True) if v}
        out.append(Replica(names[rk], labels, scrapes, used, restarts(scrapes)))
    return tuple(out)


def _same_target(a: _Key, b: _Key) -> bool:
    """Same labels apart from `engine`."""
    i = REPLICA_LABELS.index("engine")
    return a[:i] + a[i + 1 :] == b[:i] + b[i + 1 :]


def _names(keys: Sequence[_Key]) -> dict[_Key, str]:
    """Short unique names: the pod (else instance, else job); only replicas that would
    share a name get the engine index, then the namespace, then every label."""
    lab = {name: i for i, name in enumerate(REPLICA_LABELS)}

    def name(k: _Key, level: int) -> str:
        base = k[lab["pod"]] or k[lab["instance"]] or k[lab["job"]] or "prometheus"
        engine = f"[engine={k[lab['engine']]}]" if k[lab["engine"]] else ""
        spaced = "/".join(p for p in (k[lab["namespace"]], base) if p)
        if level == 4:
            return ",".join(f"{n}={k[i]}" for n, i in lab.items() if k[i]) or "prometheus"
        return (base, base + engine, spaced, spaced + engine)[level]

    level = dict.fromkeys(keys, 0)
    for _ in range(4):
        named = {k: name(k, level[k]) for k in keys}
        seen = Counter(named.values())
        clash = [k for k in keys if seen[named[k]] > 1]
        if not clash:
            return named
        for k in clash:
            level[k] += 1
    named = {k: name(k, level[k]) for k in keys}
    seen = Counter(named.values())
    return {k: f"{n}#{i}" if seen[n] > 1 else n for i, (k, n) in enumerate(named.items())}


def restarts(scrapes: Iterable[Scrape]) -> int:
    """Engine restarts in a replica's series: its process start time moved on, or a
    counter went down (a store without process metrics)."""
    n = 0
    prev: Scrape | None = None
    counters = ("preemptions_total", "request_success_total", "generation_tokens_total")
    for s in scrapes:
        if prev is not None:
            a = prev.values.get("process_start_time_seconds")
            b = s.values.get("process_start_time_seconds")
            moved = a is not None and b is not None and b > a + 1.0
            down = any(s.values.get(c, math.inf) < prev.values.get(c, -math.inf) for c in counters)
            n += moved or down
        prev = s
    return n
