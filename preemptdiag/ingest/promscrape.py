"""Prometheus `/metrics` scrapes as inputs: the counter V1 logs never print.

A file is one scrape (`curl -s :8000/metrics > t1.prom`) or several concatenated
ones, each preceded by a timestamp line (`# scrape_time: 2025-08-19T18:34:30Z`, or a
bare `date -u`/`date -Is`/`date +%s` line from a shell loop) or carrying the
exposition format's per-sample millisecond timestamps. The exposition itself is
parsed by prometheus_client's parser; this module only cuts the file into scrapes
and turns metric names of each engine generation into one set of quantities.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from preemptdiag.model.errors import DiagError
from preemptdiag.model.timeparse import in_range


def _families(text: str) -> Iterable[Any]:
    # Imported on first use: prometheus_client costs ~40 ms at start-up, and most
    # runs have no scrape among their inputs.
    from prometheus_client.parser import text_string_to_metric_families

    return text_string_to_metric_families(text)


# (quantity, how label sets combine, candidate names in order of preference, scale).
# The first candidate present wins, so a build exposing both a deprecated and its
# replacement name (vLLM ~v0.9.2-v0.11 has gpu_ and kv_cache_usage_perc) is not
# counted twice. Usage gauges are fractions 0-1; the scale makes them percent.
_SUM, _MAX = "sum", "max"
_QUANTITIES: tuple[tuple[str, str, tuple[str, ...], float], ...] = (
    (
        "preemptions_total",
        _SUM,
        (
            "vllm:num_preemptions_total",
            "vllm:num_preemptions",  # declared without _total and exposed untyped
            "sglang:num_retracted_requests_total",  # >= v0.5.7
            "sglang:total_retracted_reqs",  # v0.4.10 - v0.5.2, a gauge
            "sglang:total_retracted_reqs_total",  # the same if typed as a counter
        ),
        1.0,
    ),
    (
        "kv_usage_perc",
        _MAX,  # the fullest engine is the one that preempts
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
        100.0,
    ),
    ("cpu_kv_usage_perc", _MAX, ("vllm:cpu_cache_usage_perc",), 100.0),
    ("running", _SUM, ("vllm:num_requests_running", "sglang:num_running_reqs"), 1.0),
    ("waiting", _SUM, ("vllm:num_requests_waiting", "sglang:num_queue_reqs"), 1.0),
    ("swapped", _SUM, ("vllm:num_requests_swapped",), 1.0),
    ("prompt_tokens_total", _SUM, ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"), 1.0),
    (
        "generation_tokens_total",
        _SUM,
        ("vllm:generation_tokens_total", "sglang:generation_tokens_total"),
        1.0,
    ),
    (
        "request_success_total",
        _SUM,
        # SGLang counts num_requests_total when a request finishes.
        ("vllm:request_success_total", "sglang:num_requests_total"),
        1.0,
    ),
    # Restarts reset counters; a changed start time says so even when a counter
    # has already climbed past its old value.
    ("process_start_time_seconds", _MAX, ("process_start_time_seconds",), 1.0),
)

# (prefix of the value keys, histogram base names, quantiles to estimate).
_HISTOGRAMS: tuple[tuple[str, tuple[str, ...], tuple[float, ...]], ...] = (
    (
        "e2e",
        ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
        (0.5, 0.95),
    ),
    (
        "ttft",
        ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
        (0.95,),
    ),
)

# Lines that stamp the scrape that follows them. Comments are ignored by the
# parser anyway; bare date lines would not parse, so they are cut out first.
_TS_COMMENT = re.compile(
    r"#\s*(?:scrape[_ -]?time|scraped[_ -]at|timestamp|time|date)\s*[:=]\s*(?P<ts>\S.*?)\s*",
    re.IGNORECASE,
)
_TS_BARE = re.compile(
    r"(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?\s?(?:Z|UTC|[+-]\d\d:?\d\d)?"
    r"|\d{10}(?:\.\d+)?|\d{13}"
    r"|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun),? [^#{}=]*\d\d:\d\d:\d\d[^#{}=]*)"
)
_COUNTERS = (
    "preemptions_total",
    "request_success_total",
    "prompt_tokens_total",
    "generation_tokens_total",
)
_HELP_TYPE = re.compile(r"# (?:HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]*(?:\s|$)")
# A sample line opens with a metric name and then a label set or a space; a log
# line (a timestamp, "INFO", a bracket) fails this before the parser is imported.
_SAMPLE_START = re.compile(
    r"[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?[ \t]+"
    r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|Inf|NaN)(?:[ \t]+-?\d+)?[ \t]*"
)
_SNIFF_LINES = 50


@dataclass(frozen=True)
class Scrape:
    """One /metrics scrape reduced to engine-independent quantities.

    `values` holds only what the scrape exposed: a missing key means the metric was
    absent (older/newer build), not zero.
    """

    source: str
    ts: datetime | None
    engine: str  # "vllm" | "sglang" | "unknown"
    values: Mapping[str, float] = field(hash=False)
    # quantity -> line of the file holding the sample it was read from (evidence cites it)
    lines: Mapping[str, int] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class _Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    ts: float | None  # unix seconds


def looks_like_prometheus(first_chunk: bytes) -> bool:
    """True when the head of an input is text exposition rather than a log."""
    text = first_chunk.decode("utf-8", errors="replace").lstrip("\ufeff")
    lines = text.splitlines()
    if len(lines) > 1 and not text.endswith(("\n", "\r")):
        lines = lines[:-1]  # the chunk may have cut its last line in half
    body = [s for s in (ln.strip() for ln in lines) if s and _marker_text(s) is None]
    body = body[:_SNIFF_LINES]
    if not body:
        return False
    if _HELP_TYPE.match(body[0]):
        return True
    # No HELP/TYPE (hand-trimmed or `grep vllm: metrics`): every line must parse, and
    # more than one sample keeps a stray `word 5` line from passing as a scrape.
    if not _SAMPLE_START.fullmatch(body[0]):
        return False
    try:
        n = sum(len(fam.samples) for fam in _families("\n".join(body)))
    except Exception:  # the parser raises assorted types on non-exposition text
        return False
    return n > 1


# SGLang's per-step gauge of retracted requests, exported beside its retraction counter.
_SGLANG_RETRACTING = "sglang:num_retracted_reqs"


def parse_scrapes(text: str, source: str, default_ts: datetime | None) -> list[Scrape]:
    """Split a file into scrapes and reduce each one. `default_ts` (the file's mtime)
    stamps scrapes that carry no timestamp of their own."""
    scrapes: list[Scrape] = []
    for first_line, marker_ts, block in _blocks(text, source):
        samples = _parse_block(block, source, first_line)
        where = _sample_lines(block, first_line)
        for gi, group in enumerate(_split_repeats(samples)):
            stamps = [s.ts for s in group if s.ts is not None]
            # A sample's own timestamp (ms) past any real time reads as none.
            ts: datetime | None = _from_epoch(max(stamps)) if stamps else None
            ts = ts or marker_ts or default_ts
            scrape = _reduce(group, source, ts)
            used = _used_names(group)
            if "preemptions_total" not in used and any(s.name == _SGLANG_RETRACTING for s in group):
                # SGLang's labelled retraction counter has no sample until the first
                # retraction; the gauge beside it says this release has one: it is 0 (a
                # real 0.5.23 counted 22, and 17 were lost with the first scrape's 0).
                scrape = replace(scrape, values={**scrape.values, "preemptions_total": 0.0})
                used["preemptions_total"] = _SGLANG_RETRACTING
            lines = {
                key: where[name][min(gi, len(where[name]) - 1)]
                for key, name in used.items()
                if where.get(name)
            }
            scrapes.append(replace(scrape, lines=lines))
    return scrapes


def _sample_lines(block: str, first_line: int) -> dict[str, list[int]]:
    """Metric name -> the lines of the block where a sample of it starts a series
    (one per repeat of the scrape in the block)."""
    out: dict[str, list[int]] = {}
    last: str | None = None
    for i, raw in enumerate(block.splitlines()):
        line = raw.strip()
        if not line or line.startswith("#"):
            last = None
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name != last:
            out.setdefault(name, []).append(first_line + i)
        last = name
    return out


def _used_names(samples: Sequence[_Sample]) -> dict[str, str]:
    """Quantity -> the metric name _reduce read it from."""
    present = {s.name for s in samples}
    out: dict[str, str] = {}
    for key, _how, names, _scale in _QUANTITIES:
        name = next((n for n in names if n in present), None)
        if name is not None:
            out[key] = name
    return out


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile on cumulative (upper bound, count) buckets:
    linear interpolation inside the bucket holding the rank; None where PromQL
    gives NaN (no +Inf bucket, no observations)."""
    if not 0.0 <= q <= 1.0 or len(buckets) < 2:
        return None
    bs = sorted(buckets)
    if not math.isinf(bs[-1][0]):
        return None
    # Scrapes taken mid-update can be non-monotonic; PromQL evens them out too.
    mono: list[tuple[float, float]] = []
    top = 0.0
    for le, c in bs:
        top = max(top, c)
        mono.append((le, top))
    observations = mono[-1][1]
    if observations == 0:
        return None
    rank = q * observations
    b = next((i for i in range(len(mono) - 1) if mono[i][1] >= rank), len(mono) - 1)
    if b == len(mono) - 1:
        return mono[-2][0]
    if b == 0 and mono[0][0] <= 0:
        return mono[0][0]
    start, end, count = 0.0, mono[b][0], mono[b][1]
    if b > 0:
        start = mono[b - 1][0]
        count -= mono[b - 1][1]
        rank -= mono[b - 1][1]
    return start + (end - start) * (rank / count)


# -- internals ---------------------------------------------------------------------


def _from_epoch(secs: float) -> datetime | None:
    try:
        return in_range(datetime.fromtimestamp(secs, tz=UTC))
    except (ValueError, OverflowError, OSError):
        return None


def _marker_text(line: str) -> str | None:
    m = _TS_COMMENT.fullmatch(line) or _TS_BARE.fullmatch(line)
    return m.group("ts") if m else None


def _parse_marker(text: str, source: str, lineno: int) -> datetime:
    try:
        if text.replace(".", "", 1).isdigit():
            secs = float(text) / (1000.0 if len(text) == 13 else 1.0)
            return datetime.fromtimestamp(secs, tz=UTC)
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            from dateutil import parser as dateutil_parser  # ~15 ms; rare stamps only

            with warnings.catch_warnings():
                # dateutil only warns on a zone name it does not know (PDT, CEST)
                # and returns a naive time, which would silently shift the scrape.
                warnings.simplefilter("error")
                dt = dateutil_parser.parse(text)
        dt = dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
        if in_range(dt) is None:  # year 9999: a window's end would overflow
            raise ValueError(text)
    except (ValueError, ArithmeticError, OSError, Warning):  # decimal.InvalidOperation too
        raise DiagError(
            f"{source}:{lineno}: cannot read scrape timestamp {text[:60]!r}; "
            "use ISO-8601 (2025-08-19T18:34:30Z) or `date -u`"
        ) from None
    return dt


def _blocks(text: str, source: str) -> list[tuple[int, datetime | None, str]]:
    """Cut at timestamp lines: (first line number, stamp, exposition text)."""
    lines = text.lstrip("\ufeff").splitlines()
    out: list[tuple[int, datetime | None, str]] = []
    start = 1
    stamp: datetime | None = None
    buf: list[str] = []
    for i, line in enumerate(lines, start=1):
        ts_text = _marker_text(line.strip())
        if ts_text is None:
            buf.append(line)
            continue
        if any(ln.strip() for ln in buf):
            out.append((start, stamp, "\n".join(buf)))
        start, stamp, buf = i + 1, _parse_marker(ts_text, source, i), []
    if any(ln.strip() for ln in buf):
        out.append((start, stamp, "\n".join(buf)))
    return out


def _parse_block(block: str, source: str, first_line: int) -> list[_Sample]:
    try:
        families = list(_families(block))
    except Exception:  # the library raises bare ValueError/IndexError on bad text
        lines = block.splitlines()
        bad = _first_bad_line(lines)
        # The line is named, not quoted: it may be a piece of a multi-line prompt
        # that no redactor can tell from the line alone.
        raise DiagError(
            f"{source}:{first_line + bad - 1}: not valid Prometheus text exposition "
            "(a sample line is `name{labels} value [timestamp]`)"
        ) from None
    out: list[_Sample] = []
    for fam in families:
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue  # creation times of counters/histograms, not values
            try:
                ts = float(s.timestamp) if s.timestamp is not None else None
                value = float(s.value)
            except OverflowError:  # an integer literal past any float (10^400)
                raise DiagError(
                    f"{source}: sample {s.name} has a value or timestamp too large for a "
                    "number; not a real scrape"
                ) from None
            out.append(_Sample(s.name, tuple(sorted(s.labels.items())), value, ts))
    return out


def _parses(text: str) -> bool:
    try:
        for _ in _families(text):
            pass
    except Exception:
        return False
    return True


def _first_bad_line(lines: Sequence[str]) -> int:
    """1-based line the parser chokes on (its errors do not say). The parser streams
    line by line, so a prefix fails exactly when it contains that line: bisect."""
    lo, hi = 1, len(lines)
    while lo < hi:
        mid = (lo + hi) // 2
        if _parses("\n".join(lines[:mid])):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _split_repeats(samples: Sequence[_Sample]) -> list[list[_Sample]]:
    """Concatenated scrapes without separators: a series seen again starts the next
    scrape (one exposition never repeats a series)."""
    groups: list[list[_Sample]] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for s in samples:
        key = (s.name, s.labels)
        if not groups or key in seen:
            groups.append([])
            seen = set()
        groups[-1].append(s)
        seen.add(key)
    return groups


def _reduce(samples: Sequence[_Sample], source: str, ts: datetime | None) -> Scrape:
    by_name: dict[str, list[_Sample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    values: dict[str, float] = {}
    chosen: dict[str, str] = {}
    for key, how, names, scale in _QUANTITIES:
        name = next((n for n in names if n in by_name), None)
        if name is None:
            continue
        chosen[key] = name
        vals = [s.value for s in by_name[name]]
        values[key] = (sum(vals) if how == _SUM else max(vals)) * scale
    peak = _peak_running(by_name, chosen)
    if peak is not None:
        values["peak_running"] = peak
    for prefix, bases, qs in _HISTOGRAMS:
        base = next((b for b in bases if f"{b}_bucket" in by_name), None)
        if base is None:
            continue
        if f"{base}_count" in by_name:
            values[f"{prefix}_count"] = sum(s.value for s in by_name[f"{base}_count"])
        if f"{base}_sum" in by_name:
            values[f"{prefix}_sum"] = sum(s.value for s in by_name[f"{base}_sum"])
        # Aggregate like histogram_quantile(q, sum by (le) (...)): engines and models
        # pooled into one distribution.
        pooled: dict[float, float] = {}
        for s in by_name[f"{base}_bucket"]:
            le = dict(s.labels).get("le")
            if le is None:
                continue
            try:
                bound = float(le)
            except ValueError:
                continue
            pooled[bound] = pooled.get(bound, 0.0) + s.value
        for q in qs:
            est = histogram_quantile(q, list(pooled.items()))
            if est is not None:
                values[f"{prefix}_p{round(q * 100)}"] = est
    return Scrape(source=source, ts=ts, engine=_engine(by_name), values=MappingProxyType(values))


def _peak_running(by_name: Mapping[str, list[_Sample]], chosen: Mapping[str, str]) -> float | None:
    """With several engines in one scrape (data parallel: `engine="0"`, `engine="1"`),
    the running requests of the fullest one (the fewest, on a tie): KV usage is that
    engine's maximum but Running the engines' sum, and the two together would size a
    sequence N times too small. None with one engine (Running is its own)."""
    kv, run = chosen.get("kv_usage_perc"), chosen.get("running")
    if kv is None or run is None or len(by_name[kv]) < 2:
        return None
    running = {s.labels: s.value for s in by_name[run]}
    top = max(s.value for s in by_name[kv])
    at_top = [running[s.labels] for s in by_name[kv] if s.value == top and s.labels in running]
    return min(at_top) if at_top else None


def _engine(names: Iterable[str]) -> str:
    vllm = sglang = 0
    for n in names:
        vllm += n.startswith("vllm:")
        sglang += n.startswith("sglang:")
    if not vllm and not sglang:
        return "unknown"
    return "vllm" if vllm >= sglang else "sglang"
