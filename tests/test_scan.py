"""scan.py's shortcuts: each must give the answer the slow path gives."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import scan_garbage

import preemptdiag.scan.passes as passes_mod
from preemptdiag.ingest.sources import open_source
from preemptdiag.scan.matcher import DECOY, Matcher, ScanResult
from preemptdiag.scan.passes import scan_fast, scan_reference
from preemptdiag.scan.signatures import load

MATCHER = Matcher(load())
PREEMPT = (
    "WARNING 11-04 16:03:10 scheduler.py:1560] Sequence group 42 is preempted by "
    "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
    "total_num_cumulative_preemption=51"
)
REQUEST = "INFO 11-04 16:03:10 logger.py:37] Received request chatcmpl-1: prompt: '"


def _first_literal(line: bytes) -> int:
    hits = [line.find(lit) for lit in MATCHER.finder().literals]
    return min(i for i in hits if i >= 0)


@pytest.mark.parametrize(
    ("line", "decoy"),
    [
        # A prompt quoting a preemption warning: skipped before decoding.
        (REQUEST + PREEMPT + "'", True),
        # The warning itself: never a decoy, whatever follows it.
        (PREEMPT + " prompt: 'x'", False),
        # No marker at all.
        (PREEMPT, False),
        # The marker sits too close before the literal to rule out a longer literal
        # starting ahead of it: "look closer" (the decoded path decides).
        ("prompt: reempt", False),
    ],
)
def test_decoy_only_on_raw_bytes(line: str, decoy: bool) -> None:
    raw = line.encode()
    assert MATCHER.decoy_only(raw, 0, len(raw), _first_literal(raw)) is decoy
    # The decoded path agrees wherever the shortcut answers yes.
    result = ScanResult(source="t")
    MATCHER.match("t", 1, line, lambda: None, result)
    if decoy:
        assert result.hits == [] and result.skipped[DECOY] == 1


def test_decoy_shortcut_counts_like_the_reference(tmp_path: Path) -> None:
    path = tmp_path / "mixed.log"
    lines = [PREEMPT, REQUEST + PREEMPT + "'", REQUEST + "why is my GPU OOM?'", PREEMPT]
    path.write_text("\n".join(lines) + "\n")
    src = open_source(str(path))
    fast, ref = scan_fast(src, MATCHER), scan_reference(src, MATCHER)
    assert [(h.line, h.sig) for h in fast.hits] == [
        (1, "vllm.v0.preemption"),
        (4, "vllm.v0.preemption"),
    ]
    assert fast.hits == ref.hits
    assert fast.skipped[DECOY] == ref.skipped[DECOY] == 2


_REPO = Path(__file__).resolve().parents[1]
# Every log the project ships (samples, fixtures, goldens' inputs): the shapes users
# bring. (Fuzzed inputs: tests/test_fuzz.py.)
_SHIPPED = sorted(
    p
    for d in ("samples", "tests/fixtures")
    for p in (_REPO / d).rglob("*")
    if p.is_file() and not p.name.endswith((".json", ".toml", ".md", ".yaml", ".yml"))
)


def test_the_scan_makes_no_reference_cycles_on_any_shipped_log() -> None:
    assert len(_SHIPPED) > 50
    left = {p.name: n for p in _SHIPPED if (n := scan_garbage(open_source(str(p)), MATCHER))}
    assert left == {}


def test_a_scan_that_made_cycles_would_be_seen(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The check above can fail: every cycle a scan leaves behind is counted."""
    log = tmp_path / "cycles.log"
    log.write_text((PREEMPT + "\n") * 5)
    real = passes_mod.scan_fast

    made = []

    def cyclic(*args: object, **kwargs: object) -> ScanResult:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        # once, though scan_fast may call itself (another pass) through the module
        while len(made) < 5:
            a: list[object] = []
            a.append(a)
            made.append(id(a))
        return result

    monkeypatch.setattr(passes_mod, "scan_fast", cyclic)
    assert scan_garbage(open_source(str(log)), MATCHER) == 5
