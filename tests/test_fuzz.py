"""Property-based tests: no input crashes the tool, and the scan paths agree on all of it.

Inputs are arbitrary bytes and mixes of what real logs are made of: signature example
lines (whole or cut), wrapper prefixes, ANSI codes, \\r, NUL, invalid UTF-8, numbers
at the edges. Example counts are bounded so the whole file runs in CI in ~20 s.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
from builders import bench_module, scan_garbage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import preemptdiag.scan.matcher as scan_mod
import preemptdiag.scan.passes as passes_mod
from preemptdiag.cli import main
from preemptdiag.ingest.promscrape import looks_like_prometheus
from preemptdiag.ingest.sources import SNIFF_BYTES, Source
from preemptdiag.model.records import Hit
from preemptdiag.render.redact import Redactor
from preemptdiag.scan.lines import normalise
from preemptdiag.scan.matcher import Matcher, ScanResult
from preemptdiag.scan.passes import scan_fast, scan_reference
from preemptdiag.scan.prefilter import LineFinder, iter_blocks
from preemptdiag.scan.signatures import Signature, load

ROOT = Path(__file__).resolve().parents[1]
SIGS = load()
MATCHER = Matcher(SIGS)
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EXAMPLES = sorted(
    {ex.line for s in SIGS for ex in s.matches} | {ln for s in SIGS for ln in s.no_matches}
)
FRAGMENTS = [
    "\n", "\r", "\r\n", "\n\n", "\t", " ", "\x1b[31m", "\x1b[0m", "\x1b[", "#033[2m", "\x00",
    "INFO 06-16 21:24:15 ", "WARNING 13-45 99:99:99 ", "ERROR 02-30 23:59:60 [core.py:1] ",
    "2025-10-15T00:02:38.756689123Z ", "2025-02-30T25:61:61+99:99 stdout F ",
    "[2025-06-03 08:00:00 TP0] ", "[2025-06-03 08:00:00 DP1 PP0 TP7] ", "[08:00:00] ",
    "[Tue Jun  3 08:00:00 2025] ", "[12345.678901] ", "Jun  3 08:00:00 gpu-7 kernel: ",
    "2025-06-03 08:00:00 | ", "[pod/vllm-0/vllm] ", '{"log":"', '\\n","stream":"stdout",',
    '"time":"2025-06-03T08:00:00Z"}', "> ", "> > ", "(VllmWorkerProcess pid=12) ",
    "(EngineCore_DP0 pid=312, ip=10.0.0.1) ", " [repeated 3x across cluster]",
    "[repeated 99999999999999999999x across cluster]", "Received request x: prompt: '",
    "'", '"', '"content": "', "prompt_token_ids: [1, 2", "is preempted by ",
    "PreemptionMode.RECOMPUTE mode", "total_num_cumulative_preemption=", "#running-req: ",
    "Avg prompt throughput: ", " tokens/s, ", "Running: ", " reqs, Waiting: ", " reqs, ",
    "GPU KV cache usage: ", "%", "token usage: ", "CUDA out of memory. Tried to allocate ",
    " GiB", " MiB", " bytes", "Out of memory: Killed process ", "anon-rss:", "kB",
    "Exited (137)", "OOMKilled", "# GPU blocks: ", "GPU KV cache size: ", " tokens",
    "0", "1", "-1", "007", "1.5", "1,234", ",", "1,,", ".5", "99999999999999999999",
    "1e309", "nan", "inf", "\u212a", "\ufffd", "é",
]  # fmt: skip
FRAGMENT_BYTES = [f.encode() for f in FRAGMENTS] + [
    b"\xff",
    b"\xfe\xff",
    b"\xc3",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\x1f\x8b",
    b"\x1f\x8b\x08\x00",
]
EXAMPLE_BYTES = [e.encode() for e in EXAMPLES]

_TEXT_PIECE = st.one_of(
    st.sampled_from(FRAGMENTS),
    st.sampled_from(EXAMPLES),
    st.tuples(st.sampled_from(EXAMPLES), st.integers(0, 400)).map(lambda t: t[0][: t[1]]),
    st.tuples(st.sampled_from(EXAMPLES), st.integers(0, 400)).map(lambda t: t[0][t[1] :]),
    st.text(max_size=6),
)
_BYTE_PIECE = st.one_of(
    st.sampled_from(FRAGMENT_BYTES),
    st.sampled_from(EXAMPLE_BYTES),
    st.tuples(st.sampled_from(EXAMPLE_BYTES), st.integers(0, 400)).map(lambda t: t[0][: t[1]]),
    st.tuples(st.sampled_from(EXAMPLE_BYTES), st.integers(0, 400)).map(lambda t: t[0][t[1] :]),
    # a hard-wrapped record: the line end falls anywhere inside it
    st.tuples(st.sampled_from(EXAMPLE_BYTES), st.integers(0, 400)).map(
        lambda t: t[0][: t[1]] + b"\n" + t[0][t[1] :]
    ),
    st.binary(max_size=6),
)
# Lines of pieces, each ended by one of the line ends seen in the wild ("" glues two).
_LINES = st.lists(
    st.tuples(
        st.lists(_BYTE_PIECE, max_size=5).map(b"".join),
        st.sampled_from([b"\n", b"\n", b"\r\n", b"\r", b""]),
    ),
    max_size=12,
).map(lambda lines: b"".join(body + end for body, end in lines))
LOG_TEXT = st.one_of(st.text(max_size=300), st.lists(_TEXT_PIECE, max_size=30).map("".join))
LOG_BYTES = st.one_of(
    st.binary(max_size=400), st.lists(_BYTE_PIECE, max_size=40).map(b"".join), _LINES
)


@pytest.fixture(scope="module", autouse=True)
def _one_prefilter_per_literal_set() -> Iterator[None]:
    # scan_fast builds its LineFinder per input, and a Hyperscan database costs ~20 ms
    # to compile: more than the scan of a fuzz input. The finder is immutable once
    # built, so sharing one per literal set changes no answer, only the run time.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scan_mod, "LineFinder", functools.cache(LineFinder))
        yield


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _expected_lines(data: bytes) -> int:
    if b"\n" not in data[:SNIFF_BYTES] and data[:SNIFF_BYTES].count(b"\r") > 1:
        data = re.sub(rb"\r(?!\n)", b"\n", data)  # old-Mac line ends; \r\n stays one
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


# --- (a) the CLI on anything -------------------------------------------------------------


def test_zone_offset_of_a_day_is_not_a_crash(workdir: Path) -> None:
    # Found by fuzzing: an RFC 3339 offset of 24:00 or more once raised ValueError.
    path = workdir / "offset.log"
    path.write_bytes(b"2025-06-03T08:00:00+24:00 Exited (137)\n")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["analyze", "--format", "json", str(path)])
    assert "Traceback" not in err.getvalue()
    assert code in (0, 1)


@FUZZ
@given(LOG_BYTES)
def test_cli_never_crashes(workdir: Path, data: bytes) -> None:
    path = workdir / "input.log"
    path.write_bytes(data)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["analyze", "--format", "json", str(path)])
    assert code in (0, 1, 2), err.getvalue()
    assert "Traceback" not in err.getvalue()
    if code == 2:
        # Input errors are one line (binary file, corrupt gzip).
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith("preemptdiag: error: "), lines
        return
    report = json.loads(out.getvalue())
    assert report["scan"]["files"] == [str(path)]
    if data[:2] == b"\x1f\x8b":
        return  # a gzip member that happened to decompress: its size is not len(data)
    if looks_like_prometheus(data[:SNIFF_BYTES]):
        assert report["scan"]["lines_read"] == 0
    else:
        assert report["scan"]["lines_read"] == _expected_lines(data)
        assert report["scan"]["bytes_read"] == len(data)


# --- (b) fast path == reference path ----------------------------------------------------


def _is_subsequence(small: list[Hit], big: list[Hit]) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


def _source(path: Path, size: int, cr_only: bool) -> Source:
    # Built directly, not via open_source: the scanners must agree on inputs that the
    # binary sniffing would refuse, too.
    return Source(
        name=path.name, path=path, codec=None, mtime=None, head=b"", size=size, cr_only=cr_only
    )


@FUZZ
@given(LOG_BYTES, st.booleans())
def test_fast_path_equals_reference(workdir: Path, data: bytes, cr_only: bool) -> None:
    path = workdir / "scan.log"
    path.write_bytes(data)
    src = _source(path, len(data), cr_only)
    fast = scan_fast(src, MATCHER)
    ref = scan_reference(src, MATCHER)
    # Whole Hit records: line, sig, fields, text, timestamps, proc, repeat, pod, ...
    assert fast.hits == ref.hits
    assert fast.recognised == ref.recognised
    assert fast.lines_read == ref.lines_read
    assert fast.bytes_read == ref.bytes_read == len(data)


@FUZZ
@given(LOG_BYTES, st.booleans())
def test_the_scan_makes_no_reference_cycles(workdir: Path, data: bytes, cr_only: bool) -> None:
    # analyze scans with the cyclic collector paused: a cycle per odd line would pile up.
    path = workdir / "scan.log"
    path.write_bytes(data)
    assert scan_garbage(_source(path, len(data), cr_only), MATCHER) == 0


@FUZZ
@given(LOG_BYTES, st.integers(1, 64))
def test_tiny_blocks_change_nothing(workdir: Path, data: bytes, block_size: int) -> None:
    # A block's last line waits for the next block's first line (hard-wrap join), so
    # block size must not change, move, drop or invent any hit.
    path = workdir / "blocks.log"
    path.write_bytes(data)
    src = _source(path, len(data), False)
    whole = scan_fast(src, MATCHER)

    def blocks(
        f: BinaryIO, _default: int = 0, byte_range: tuple[int, int] | None = None
    ) -> Iterator[tuple[bytearray, int, int]]:
        return iter_blocks(f, block_size=block_size, byte_range=byte_range)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(passes_mod, "iter_blocks", blocks)
        tiny = scan_fast(src, MATCHER)
    assert tiny.lines_read == whole.lines_read
    assert tiny.bytes_read == whole.bytes_read
    assert tiny.hits == whole.hits


# --- (c) signatures and line normalisation on any text -----------------------------------


@FUZZ
@given(LOG_TEXT)
def test_signatures_and_normalise_never_raise(text: str) -> None:
    line = normalise(text)
    assert "\r" not in line.text
    for sig in SIGS:
        for candidate in (text, line.text):
            for m in sig.finditer(candidate):
                try:
                    fields = sig.extract(m)
                except ValueError as exc:
                    # Only numbers past 64 bits are refused (the scan counts the line).
                    assert "out of range" in str(exc), exc
                    continue
                assert set(sig.fields) <= set(fields)


@FUZZ
@given(LOG_TEXT, st.one_of(st.none(), LOG_TEXT))
def test_matcher_never_raises(raw: str, nxt: str | None) -> None:
    result = ScanResult(source="fuzz")
    # Physical lines hold no \n; the matcher sees one line and its successor.
    raw, nxt = raw.replace("\n", " "), None if nxt is None else nxt.replace("\n", " ")
    MATCHER.match("fuzz", 7, raw, lambda k: nxt if k == 0 else None, result)
    for h in result.hits:
        assert h.line == 7
        assert h.repeat >= 1
        assert len(h.text) <= scan_mod.MAX_EVIDENCE_CHARS + len(" …")


def _re_compatible(sig: Signature) -> bool:
    # Hypothesis builds strings from `re` syntax; the `regex`-only patterns (repeated
    # group names, variable-width look-behind) are left to the tests above.
    try:
        re.compile(sig.pattern)
    except re.error:
        return False
    return True


_GENERATED = st.sampled_from([s for s in SIGS if _re_compatible(s)]).flatmap(
    lambda s: st.tuples(st.just(s), st.from_regex(s.pattern))
)


@FUZZ
@given(_GENERATED)
def test_text_a_pattern_matches_extracts_and_holds_a_literal(case: tuple[Signature, str]) -> None:
    sig, text = case
    for m in sig.finditer(text):
        try:
            sig.extract(m)  # the converters accept whatever the groups can capture...
        except ValueError as exc:
            # ...except numbers past 64 bits, refused (the scan counts the line).
            assert "out of range" in str(exc), exc
        # The prefilter runs first: a match without a literal is never seen.
        assert sig.prefilter_hit(text), (sig.id, text)


# --- (d) the redactor -------------------------------------------------------------------

_SECRETS = st.sampled_from(
    [
        "prompt: '", 'prompt: "', "'", '"', "\\", "Authorization: Bearer ", "api_key=",
        "x-api-key: ", "--api-key ", "password=", "https://user:", "@host/", "sk-proj-",
        "A" * 24, "hf_" + "x" * 34, "eyJabcdef.eyJabcdef.", '"messages": [', "]", "[REDACTED:",
        "user@example.com", "oom-kill@1000.service",
    ]
)  # fmt: skip
REDACT_TEXT = st.one_of(
    LOG_TEXT, st.lists(st.one_of(_TEXT_PIECE, _SECRETS), max_size=30).map("".join)
)


@FUZZ
@given(REDACT_TEXT)
def test_redactor_never_raises(text: str) -> None:
    assert Redactor(enabled=False)(text) == text
    once = Redactor()(text)
    assert Redactor()(once) == once


# --- (e) bench/fuzz.py, bounded: mutated real logs, four formats, five ways -------------

FUZZ_SEED = 20261  # fixed, so a CI failure replays: python -m bench.fuzz --seed S --index I
FUZZ_INPUTS = 36


def test_mutated_real_logs_never_crash_leak_or_disagree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CI slice of the fuzzer (the long run: python -m bench.fuzz --count 20000):
    every input analysed in all four formats and, as JSON, with --jobs 2 and forced
    byte-range splits, with rollups off, with the stats lane and its calm minutes from
    the first 4 KiB block, and piped (so, some inputs with a named zone, windows of
    several minutes or --since/--until: fuzz._ways). No internal error, no traceback, exit 2 only as one
    error line, no planted prompt text or secret in any output, and the four reports
    identical."""
    fuzz = bench_module("fuzz")
    # The repository's logs only: the same inputs here and on CI's clean clone.
    monkeypatch.setattr(fuzz, "SHARED_CORPUS", ROOT / "no-shared-corpus")
    tally = fuzz.fuzz(FUZZ_SEED, range(FUZZ_INPUTS), diff_every=1)
    assert tally.inputs == FUZZ_INPUTS
    assert tally.diffed > FUZZ_INPUTS // 2
    found = [
        f"--seed {FUZZ_SEED} --index {f.index}: {f.cause} ({f.seed_file}, {f.mutations})"
        for f in tally.findings
    ]
    assert not found, "\n".join(found) + "\n" + tally.findings[0].detail
