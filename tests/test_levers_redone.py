"""A reviewer redoes every lever from the report alone: the JSON's arithmetic is
recomputed here from the numbers it prints, and each input it sizes from is found on
the `file:line` the report cites for it. Runs over every sample, the real-engine
recordings and the shared corpus."""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from preemptdiag.cli import main
from preemptdiag.ingest.sources import open_binary, open_source

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "tests" / "fixtures" / "engine" / "vllm-0.32.0"
CORPUS = ROOT.parent / "shared" / "corpus"

INPUTS: list[list[Path]] = [
    [p] for p in sorted((ROOT / "samples").glob("*.log"))
] + [
    [ROOT / "samples/v1_suspected_no_counter.log", *sorted((ROOT / "samples/scrapes").glob("*.prom"))],
    sorted((ROOT / "samples/host_oom_incident").iterdir()),
    sorted((ROOT / "samples/rotated").iterdir()),
    *[[d / "server.log", *sorted(d.glob("metrics-*.prom")), *sorted(d.glob("dmesg-iso.log"))]
      for d in sorted(ENGINE.iterdir()) if (d / "server.log").is_file()],
    *[[p] for p in (sorted(CORPUS.glob("*.log")) if CORPUS.is_dir() else [])],
]  # fmt: skip
NUM = r"(\d[\d,]*(?:\.\d+)?)"


def _n(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def _report(capsys: pytest.CaptureFixture[str], files: list[Path]) -> dict[str, Any]:
    main(["analyze", "--format", "json", "--year", "2026", *map(str, files)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    data: dict[str, Any] = json.loads(out)
    return data


def _cited(report: dict[str, Any], name: str) -> str | None:
    """The text of the line the report cites for a replica fact (read as the tool
    reads it: decompressed, lines split at newlines only)."""
    for rep in report["replicas"]:
        for f in rep["facts"]:
            if f["name"] == name and f["source"]:
                path, _, line = f["source"].rpartition(":")
                with open_binary(open_source(path)) as fh:
                    data = fh.read()
                return data.split(b"\n")[int(line) - 1].decode("utf-8", "replace")
    return None


@pytest.mark.parametrize("files", INPUTS, ids=lambda fs: "+".join(p.name for p in fs))
def test_every_lever_can_be_redone_by_hand(
    capsys: pytest.CaptureFixture[str], files: list[Path]
) -> None:
    report = _report(capsys, files)
    lever = report["lever"]
    math_lines: list[str] = lever["arithmetic"]
    text = "\n".join(math_lines)
    if lever["knob"] is None:
        assert lever["proposed"] is None and lever["apply"] is None
        return
    assert lever["apply"] and lever["rollback"]
    sized = re.search(rf"= floor\({NUM} × {NUM} / {NUM}\) = {NUM}", text)
    if sized:  # the cap from capacity: floor(headroom × KV tokens / live tokens per seq)
        h, kv, live, got = map(_n, sized.groups())
        per_engine = re.search(rf"\(a cap per engine\) = floor\({NUM} / {NUM}\) = {NUM}", text)
        engines = Fraction(1)
        if per_engine:  # `N Engines Aggregated` lines: all the pools, then a cap per engine
            total, engines, each = map(_n, per_engine.groups())
            assert total == got and each == math.floor(total / engines)
            got = each
        assert got == _n(lever["proposed"])
        # The per-seq figure is printed rounded; the exact form redoes without rounding.
        exact = re.search(
            rf"floor\({NUM} × {NUM} running / \({NUM} / 100\) KV usage\) = {NUM}", text
        )
        assert exact is not None
        h2, running_, usage_, got2 = map(_n, exact.groups())
        assert h2 == h and math.floor(h * running_ / (usage_ / 100)) == got2
        assert math.floor(got2 / engines) == got
        assert abs(math.floor(h * kv / live) - got * engines) <= engines
        p95 = re.search(rf"= {NUM} / 100 × {NUM} / {NUM} = {NUM} live tokens", text)
        assert p95 is not None
        usage, kv2, running, live2 = map(_n, p95.groups())
        assert kv2 == kv and live2 == live
        assert abs(usage / 100 * kv / running - live) < Fraction(1, 100)
        cited = _cited(report, "kv_tokens")
        pool = kv / engines
        assert cited is not None and (
            f"{int(pool):,}" in cited or str(int(pool)) in cited or "blocks" in cited
        )
        return
    holds = re.search(r"the error says the KV cache holds (\d+) tokens", text)
    if holds:  # V0: the pool in tokens is the longest context that fits
        assert lever["proposed"] == holds.group(1)
        cited = [e["text"] for e in report["verdict"]["evidence"]]
        assert any(f"stored in KV cache ({holds.group(1)})" in t for t in cited)
        return
    estimate = re.search(r"longest context the KV cache can hold: (\d+) tokens", text)
    if estimate:
        assert lever["proposed"] == estimate.group(1)
        cited = [e["text"] for e in report["verdict"]["evidence"]]
        assert any(f"estimated maximum model length is {estimate.group(1)}" in t for t in cited)
        return
    share = re.search(rf"free {NUM} GiB / total {NUM} GiB = {NUM}", text)
    if share:
        free, total, _ = map(_n, share.groups())
        assert math.floor((free / total - Fraction(2, 100)) * 100) / 100 == float(lever["proposed"])
        return
    host = re.search(
        rf"is {NUM} GiB; {NUM} GiB x 1.25 headroom = {NUM} GiB, rounded up to (\d+) GiB", text
    )
    if host:
        base, base2, _need, up = host.groups()
        assert base == base2 and math.ceil(_n(base) * Fraction(5, 4)) == int(up)
        assert lever["proposed"] == f"{up} GiB"
        return
    step = re.search(rf"{NUM}(?: \(default [^)]*\))? \+ 0\.05 = {NUM}", text)
    if step:
        assert _n(step.group(1)) + Fraction(5, 100) == _n(step.group(2)) == _n(lever["proposed"])
        return
    fit = re.search(rf"0\.8 x {NUM} GiB free = {NUM} GiB", text)
    if fit:
        assert math.floor(_n(fit.group(1)) * Fraction(4, 5)) == int(lever["proposed"].rstrip("GM"))
        return
    mem_frac = re.search(rf"{NUM} ([+-]) 0\.0([45]) = {NUM}", text)
    if mem_frac:  # SGLang's --mem-fraction-static step
        a, sign, step, b = mem_frac.groups()
        delta = Fraction(int(step), 100) * (1 if sign == "+" else -1)
        assert _n(a) + delta == _n(b) == _n(lever["proposed"])
        return
    swap = re.search(
        rf"20% of {NUM} GiB = (\d+) GiB|{NUM} GiB(?: \([^)]*\))? x 2 = {NUM} GiB", text
    )
    if swap:
        if swap.group(1):
            assert max(1, math.floor(_n(swap.group(1)) / 5)) == int(swap.group(2))
        else:
            assert _n(swap.group(3)) * 2 == _n(swap.group(4)) == _n(lever["proposed"])
        return
    if "carry no RSS or limit figure" in text:
        assert lever["proposed"].endswith("x 1.25")
        return
    chunk = re.search(
        rf"floor\({NUM} x {NUM} (GiB|MiB) / {NUM} (GiB|MiB)\) = {NUM}; the largest power "
        rf"of two at or under it: {NUM}",
        text,
    )
    if chunk:  # a runtime OOM's prompt-logprobs chunk bounded to what was free
        rows, free, fu, tried, tu, fit, new = chunk.groups()
        assert fu == tu  # one unit, so the ratio needs no conversion
        assert math.floor(_n(rows) * _n(free) / _n(tried)) == _n(fit)
        p2 = 1 << (int(_n(fit)).bit_length() - 1)
        assert p2 == _n(new) == _n(lever["proposed"])
        return
    fixed = re.search(
        rf"{NUM} GiB \(the cache\)(?: - {NUM} GiB short)? - (\d+) GiB margin \(vLLM's own "
        rf"floor on (?:CUDA|ROCm)\) = {NUM} GiB -> (\d+)G",
        text,
    )
    if fixed:  # vLLM 0.34's extensible cache: its size, less the shortfall and a margin
        cache, short, margin, fit, new = fixed.groups()
        owed = _n(cache) - _n(short or "0") - _n(margin)
        assert abs(owed - _n(fit)) <= Fraction(1, 100)
        assert math.floor(owed) == int(new) and lever["proposed"] == f"{new}G"
        if short:
            oom = re.search(rf"{NUM} GiB tried - {NUM} GiB free = {NUM} GiB short", text)
            assert oom is not None and oom.group(3) == short
            assert abs(_n(oom.group(1)) - _n(oom.group(2)) - _n(short)) <= Fraction(1, 100)
        where = re.search(r"\[([^\]]+):(\d+)\]\): it took", text)
        assert where is not None
        with open_binary(open_source(where.group(1))) as fh:
            line = fh.read().split(b"\n")[int(where.group(2)) - 1].decode()
        assert f"({cache} GiB)" in line
        return
    held = re.search(
        rf"\({NUM} GiB the process held - {NUM} GiB - (\d+) GiB margin\) / {NUM} GiB total = "
        rf"{NUM} -> {NUM}",
        text,
    )
    if held:  # the same, with no size in the log: a budget below what the process held
        in_use, need, margin, total, share, new = map(_n, held.groups())
        assert abs((in_use - need - margin) / total - share) <= Fraction(1, 10_000)
        assert math.floor(share * 100) / 100 == float(new) == float(lever["proposed"])
        return
    halve = re.search(
        r"halve it -> (\d+)|= (\d+)\)? to lower the activation peak|floor\(0\.9 × (\d+)\) = (\d+)",
        text,
    )
    back = re.search(r"step back to 0\.90", text)
    assert halve or back, f"no arithmetic a reviewer could redo: {math_lines}"
