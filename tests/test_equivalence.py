"""The fast path extracts exactly what a plain line-by-line reference path extracts.

scan_fast reads large blocks and runs regexes only on the lines the prefilter picks;
scan_reference reads line by line and runs every regex on every line. Any difference
in hits or line counts is a bug in the block reader, the prefilter or a signature.

A hard-wrapped record is rejoined with the next physical line; the fast path holds a
block's last line until the next block's first line arrives, so block boundaries
change nothing (tested at 4 KiB blocks). A --jobs byte range reads the first line
of the next range for the same reason, so splitting changes nothing either (tested
with a split at every page).
"""

from __future__ import annotations

import gzip
import random
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import BinaryIO

import pytest
from builders import bench_module

import preemptdiag.scan.passes as passes_mod
from preemptdiag.ingest.sources import open_source
from preemptdiag.scan.lines import normalise, starts_record
from preemptdiag.scan.matcher import Matcher, ScanResult
from preemptdiag.scan.parallel import RANGES_PER_JOB, merge, scan_parallel
from preemptdiag.scan.passes import scan_fast, scan_reference
from preemptdiag.scan.prefilter import iter_blocks, split_ranges
from preemptdiag.scan.signatures import Signature, load

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted(
    p for p in (ROOT / "samples").rglob("*") if p.is_file() and p.suffix in (".log", ".txt")
)
CORPUS = ROOT.parent / "shared" / "corpus"
CORPUS_LOGS = sorted(CORPUS.glob("*.log")) if CORPUS.is_dir() else []

PAGE = 4096  # the small block size, and the page the adversarial log is cut into
SIGS = load()
MATCHER = Matcher(SIGS)


def _summary(r: ScanResult) -> list[tuple[int, str]]:
    return [(h.line, h.sig) for h in r.hits]


def _assert_same_hits(a: ScanResult, b: ScanResult) -> None:
    # Whole Hit records: line, sig, fields, text, timestamps, proc, repeat, pod and
    # anything added later. The (line, sig) summary first gives a readable diff.
    assert _summary(a) == _summary(b)
    assert a.hits == b.hits
    assert a.lines_read == b.lines_read
    assert a.bytes_read == b.bytes_read
    assert a.recognised == b.recognised


def _assert_same(fast: ScanResult, ref: ScanResult) -> None:
    _assert_same_hits(fast, ref)
    # Decoys are judged on candidate lines only, so both paths see the same ones.
    assert fast.skipped["decoy in request text"] == ref.skipped["decoy in request text"]
    # A regex that matches a line holding none of its prefilter literals would be
    # invisible to the fast path: that is a signature bug, not a scanner one.
    assert ref.skipped["prefilter miss"] == 0


def _both(path: Path) -> tuple[ScanResult, ScanResult]:
    src = open_source(str(path))
    return scan_fast(src, MATCHER), scan_reference(src, MATCHER)


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make scan_fast read PAGE-sized blocks; returns the sizes of the blocks it read.

    iter_blocks binds its default block size at definition time, so patching
    DEFAULT_BLOCK_SIZE would change nothing; the name scan.py calls is replaced.
    """
    sizes: list[int] = []

    def blocks(
        f: BinaryIO, block_size: int = PAGE, byte_range: tuple[int, int] | None = None
    ) -> Iterator[tuple[bytearray, int, int]]:
        for block, size, offset in iter_blocks(f, block_size=PAGE, byte_range=byte_range):
            sizes.append(size)
            yield block, size, offset

    monkeypatch.setattr(passes_mod, "iter_blocks", blocks)
    return sizes


# --- a deterministic adversarial log -------------------------------------------------


def _v0_stats(r: random.Random, ts: str) -> str:
    return (
        f"INFO {ts} metrics.py:396] Avg prompt throughput: {r.uniform(0, 4000):.1f} tokens/s, "
        f"Avg generation throughput: {r.uniform(0, 3000):.1f} tokens/s, Running: "
        f"{r.randrange(256)} reqs, Swapped: {r.randrange(4)} reqs, Pending: {r.randrange(99)} "
        f"reqs, GPU KV cache usage: {r.uniform(0, 100):.1f}%, CPU KV cache usage: 0.0%."
    )


def _v1_stats(r: random.Random, ts: str) -> str:
    pre = f"Preemptions: {r.randrange(1, 60)}, " if r.random() < 0.3 else ""
    return (
        f"(APIServer pid=1) INFO {ts} [loggers.py:123] Engine 000: Avg prompt throughput: "
        f"{r.uniform(0, 4000):.1f} tokens/s, Avg generation throughput: {r.uniform(0, 3000):.1f}"
        f" tokens/s, Running: {r.randrange(256)} reqs, Waiting: {r.randrange(99)} reqs, {pre}"
        f"GPU KV cache usage: {r.uniform(0, 100):.1f}%, Prefix cache hit rate: "
        f"{r.uniform(0, 60):.1f}%"
    )


def _v0_preempt(r: random.Random, ts: str) -> str:
    return (
        f"WARNING {ts} scheduler.py:1560] Sequence group chatcmpl-{r.getrandbits(64):016x} is "
        "preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache "
        "space. This can affect the end-to-end performance. Increase gpu_memory_utilization "
        f"or tensor_parallel_size to provide more KV cache memory. "
        f"total_num_cumulative_preemption={r.randrange(1, 5000)}"
    )


def _decoy(r: random.Random, ts: str) -> str:
    quoted = r.choice(
        (
            "my log says Sequence group 42 is preempted by PreemptionMode.RECOMPUTE mode",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "GPU KV cache usage: 99.0%, Running: 256 reqs, Waiting: 40 reqs",
            "Killed process 4242 (python3) total-vm:1kB, anon-rss:2kB",
        )
    )
    return (
        f"INFO {ts} logger.py:37] Received request chatcmpl-{r.getrandbits(64):016x}: prompt: "
        f"'Why does the room have {r.randrange(9)} blocks? {quoted}, what now?', params: "
        "SamplingParams(n=1, temperature=0.7), prompt_token_ids: [128000, 5, 6], lora_request: None."
    )


def _cuda_oom(r: random.Random, ts: str) -> str:
    return (
        f"(EngineCore_DP0 pid=312) ERROR {ts} [core.py:710] torch.OutOfMemoryError: CUDA out "
        f"of memory. Tried to allocate {r.uniform(0.1, 9):.2f} GiB. GPU 0 has a total capacity "
        f"of 79.19 GiB of which {r.uniform(0, 2):.2f} GiB is free. Including non-PyTorch memory,"
        " this process has 77.96 GiB memory in use."
    )


def _sglang(r: random.Random, ts: str) -> str:
    return (
        f"[2025-06-03 {ts[6:]} TP{r.randrange(4)}] Decode batch. #running-req: {r.randrange(300)},"
        f" #token: {r.randrange(10**6)}, token usage: {r.random():.2f}, gen throughput "
        f"(token/s): {r.uniform(0, 5000):.2f}, #queue-req: {r.randrange(50)}, "
    )


def _dmesg(r: random.Random, _ts: str) -> str:
    return (
        f"[{r.uniform(100, 99999):.6f}] Out of memory: Killed process {r.randrange(2, 99999)} "
        f"(python3) total-vm:{r.randrange(10**8)}kB, anon-rss:{r.randrange(10**8)}kB, "
        "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:2048kB oom_score_adj:0"
    )


def _noise(r: random.Random, ts: str) -> str:
    return r.choice(
        (
            f'INFO:     10.0.0.{r.randrange(256)}:{r.randrange(30000, 60000)} - "GET /metrics '
            'HTTP/1.1" 200 OK',
            f"INFO {ts} async_llm_engine.py:208] Added request chatcmpl-{r.getrandbits(64):x}.",
            "Processed prompts:  42%|####2     | 42/100 [00:03<00:04, 13.1it/s]",
            f"DEBUG {ts} worker.py:12] freed {r.randrange(99)} blocks from the bloom room",
            "Traceback (most recent call last):",
            "",
        )
    )


_MAKERS = (_v0_stats, _v1_stats, _v0_preempt, _decoy, _cuda_oom, _sglang, _dmesg, _noise)
_EXAMPLES = tuple(ex.line for s in SIGS for ex in s.matches)


def _decorate(r: random.Random, line: str) -> str:
    """Wrap one record the way collectors and terminals do."""
    roll = r.random()
    if roll < 0.1:
        line = line.replace("INFO", "\x1b[32mINFO\x1b[0m", 1).replace(
            "WARNING", "\x1b[33mWARNING\x1b[0m", 1
        )
    elif roll < 0.15:
        line = f"#033[2m#033[36m(raylet)#033[0m {line}"
    elif roll < 0.25:
        line = f"2025-06-03T08:{r.randrange(60):02d}:{r.randrange(60):02d}.{r.randrange(10**9):09d}Z {line}"
    elif roll < 0.3:
        line = f"[pod/vllm-{r.randrange(3)}/vllm] {line}"
    elif roll < 0.33:
        line = f"> {line}"
    return line


def _unit(r: random.Random, t: int, wrapped: bool) -> bytes:
    """One record (one or two physical lines), always ending in a line end."""
    ts = f"06-03 {t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}"
    line = _decorate(r, r.choice(_EXAMPLES) if r.random() < 0.3 else r.choice(_MAKERS)(r, ts))
    roll = r.random()
    if roll < 0.08:  # glued: the collector dropped the newline between two records
        line += _decorate(r, r.choice(_MAKERS)(r, ts))
    elif roll < 0.14 and wrapped and len(line) > 120:
        # Hard-wrapped paste (fixed terminal width), as in `docker logs` copied by hand.
        cut = r.randrange(80, 120)
        line = line[:cut] + "\n" + line[cut:]
    data = line.encode()
    if r.random() < 0.02:
        data = data.replace(b" ", b" \xff\xfe ", 1)  # invalid UTF-8 inside a record
    end = b"\r\n" if r.random() < 0.15 else b"\n"
    return data.replace(b"\n", end) + end


def adversarial_log(seed: int, pages: int, wrapped: bool) -> bytes:
    """`pages` pages of exactly PAGE bytes, each ending in a newline.

    A record never spans two pages, so a PAGE-sized block reader sees every wrapped
    record whole (see the module docstring); filler lines pad each page.
    """
    r = random.Random(seed)
    out: list[bytes] = []
    t = 8 * 3600
    for _ in range(pages):
        page: list[bytes] = []
        used = 0
        while True:
            u = _unit(r, t, wrapped)
            t += r.randrange(0, 3)
            if used + len(u) > PAGE - 1:
                break
            page.append(u)
            used += len(u)
        rest = PAGE - used
        page.append(b"." * (rest - 1) + b"\n")
        out.append(b"".join(page))
    return b"".join(out)


def _bench_generator() -> ModuleType:
    return bench_module("generate")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("equivalence")
    out: dict[str, Path] = {}
    bench = d / "bench.log"
    with bench.open("wb") as f:
        _bench_generator().generate(f, 3 << 20, seed=7)
    out["bench"] = bench
    data = adversarial_log(seed=11, pages=256, wrapped=True)
    out["adversarial"] = d / "adversarial.log"
    out["adversarial"].write_bytes(data)
    out["gzip"] = d / "adversarial.log.gz"
    out["gzip"].write_bytes(gzip.compress(data, mtime=0))
    # Old-Mac line ends: every \r is a line break (length-preserving, so pages stay whole).
    out["cr_only"] = d / "cr_only.log"
    out["cr_only"].write_bytes(data.replace(b"\n", b"\r"))
    out["unwrapped"] = d / "unwrapped.log"
    out["unwrapped"].write_bytes(adversarial_log(seed=13, pages=256, wrapped=False))
    return out


# --- samples, corpus, generated logs ---------------------------------------------------


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: str(p.relative_to(ROOT / "samples")))
def test_samples(path: Path) -> None:
    _assert_same(*_both(path))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: str(p.relative_to(ROOT / "samples")))
def test_samples_small_blocks(path: Path, small_blocks: list[int]) -> None:
    src = open_source(str(path))
    _assert_same(scan_fast(src, MATCHER), scan_reference(src, MATCHER))
    size = path.stat().st_size
    # Blocks end on a line end, so a block may fall short of PAGE by one line.
    assert len(small_blocks) >= size // PAGE


def test_samples_are_found() -> None:
    # Guards the glob above: an empty list would make the tests above vacuous.
    names = {p.name for p in SAMPLES}
    assert {"v0_thrash_loop.log", "sglang_thrash.log", "dmesg.log", "unrecognised.txt"} <= names
    assert not any(p.suffix == ".prom" for p in SAMPLES)


@pytest.mark.parametrize("path", CORPUS_LOGS, ids=lambda p: p.name)
def test_shared_corpus(path: Path) -> None:
    _assert_same(*_both(path))


@pytest.mark.parametrize("name", ["bench", "adversarial", "gzip", "cr_only", "unwrapped"])
def test_generated(logs: dict[str, Path], name: str) -> None:
    fast, ref = _both(logs[name])
    _assert_same(fast, ref)
    # Not vacuous: the generated logs carry many signals of many kinds.
    assert len(fast.hits) >= (15 if name == "bench" else 1000)
    assert len({h.sig for h in fast.hits}) >= (5 if name == "bench" else 60)


@pytest.mark.parametrize("name", ["adversarial", "gzip", "cr_only"])
def test_generated_small_blocks(logs: dict[str, Path], name: str, small_blocks: list[int]) -> None:
    src = open_source(str(logs[name]))
    fast = scan_fast(src, MATCHER)
    # Every block is exactly one page: the reader really cut at every page end.
    assert small_blocks == [PAGE] * 256
    _assert_same(fast, scan_reference(src, MATCHER))


def test_adversarial_log_has_what_it_claims(logs: dict[str, Path]) -> None:
    data = logs["adversarial"].read_bytes()
    assert len(data) == 256 * PAGE
    assert all(data[i - 1 : i] == b"\n" for i in range(PAGE, len(data) + 1, PAGE))
    for needle in (b"\r\n", b"\x1b[32m", b"#033[", b"\xff\xfe", b"prompt: '", b"[pod/", b"\n> "):
        assert needle in data, needle
    fast = scan_fast(open_source(str(logs["adversarial"])), MATCHER)
    # Glued records: two hits on one physical line.
    lines = [h.line for h in fast.hits]
    assert len(lines) > len(set(lines))
    # Hard-wrapped records: a V1 stats hit whose text was rejoined across a line end.
    raw = data.split(b"\n")
    rejoined = [
        h for h in fast.hits if h.sig == "vllm.v1.stats" and b"Running" not in raw[h.line - 1]
    ]
    assert rejoined


def _assert_same_scan(par: ScanResult, one: ScanResult) -> None:
    # Both are fast-path scans, so even the skipped counters agree.
    _assert_same_hits(par, one)
    assert par.skipped == one.skipped


def test_jobs_two_matches_one_process(logs: dict[str, Path]) -> None:
    for name in ("bench", "adversarial"):
        path = logs[name]
        assert len(split_ranges(path, 2 * RANGES_PER_JOB)) == 2 * RANGES_PER_JOB
        src = open_source(str(path))
        tasks = [(0, r) for r in split_ranges(path, 2 * RANGES_PER_JOB)]
        (par,) = scan_parallel([src], tasks, MATCHER, 2).values()
        _assert_same_scan(par, scan_fast(src, MATCHER))


def test_split_at_every_record_start_matches_one_pass(tmp_path: Path) -> None:
    # Records are hard-wrapped at random: with a split at every record start, each
    # range holds whole records, and a worker rejoins exactly what one pass does.
    data = adversarial_log(seed=17, pages=16, wrapped=True)
    path = tmp_path / "wrapped.log"
    path.write_bytes(data)
    src = open_source(str(path))
    # --jobs splits only where a record starts (prefilter.split_ranges): a worker
    # may look back inside its own range for the first pieces of a wrapped record.
    lines = data.split(b"\n")
    offsets = [0]
    for ln in lines[:-1]:
        offsets.append(offsets[-1] + len(ln) + 1)
    starts = [0] + [
        o
        for o, ln in zip(offsets[1:], lines[1:], strict=True)
        if ln and starts_record(ln.decode("utf-8", "replace").rstrip("\r"))
    ]
    ranges = list(zip(starts, [*starts[1:], len(data)], strict=True))
    one = scan_fast(src, MATCHER)
    _assert_same_scan(merge(src.name, [scan_fast(src, MATCHER, byte_range=r) for r in ranges]), one)
    # Not vacuous: scanned as separate files (no look past their end), lines lose
    # the records wrapped onto the next line.
    alone = []
    every = [0] + [i + 1 for i, b in enumerate(data[:-1]) if b == 10]
    for i, (lo, hi) in enumerate(zip(every, [*every[1:], len(data)], strict=True)):
        part = tmp_path / f"line{i}.log"
        part.write_bytes(data[lo:hi])
        alone.append(scan_fast(open_source(str(part)), MATCHER))
    # (a count would not do: a piece alone can also match what the whole record hides,
    # as signature examples come and go in the generated log)
    kept = {(h.line, h.sig) for h in merge(src.name, alone).hits}
    assert {(h.line, h.sig) for h in one.hits} - kept


# --- found while writing these tests ---------------------------------------------------


# The prefix of a record cut short (column-truncated capture, hard wrap) or the
# suffix left after one: if a signature's regex still matches, one of its literals
# must still be there, or the fast path drops what the reference path would see.
@pytest.mark.parametrize("sig", SIGS, ids=lambda s: s.id)
def test_match_implies_a_literal(sig: Signature) -> None:
    misses = []
    for ex in sig.matches:
        n = len(ex.line)
        for text in {ex.line[:i] for i in range(n)} | {ex.line[i:] for i in range(1, n)}:
            if not sig.prefilter_hit(text) and any(
                True for _ in sig.finditer(normalise(text).text)
            ):
                misses.append(text)
    assert misses == []


def test_prefill_line_cut_before_running_req_is_found(tmp_path: Path) -> None:
    # Was a prefilter miss: sglang.stats.prefill's only literal was the optional
    # "#running-req", so the fast path never looked at this line.
    path = tmp_path / "cut.log"
    path.write_text(
        "[2024-12-01 08:00:00 TP0] Prefill batch. #new-seq: 2, #new-token: 640, "
        "#cached-token: 12, cache hit rate: 1.84%, token usage: 0.05, #running-r\n"
    )
    fast, ref = _both(path)
    assert _summary(fast) == [(1, "sglang.stats.prefill")]
    assert fast.hits[0].fields["new_seq"] == 2
    assert fast.hits[0].fields["running"] is None
    _assert_same(fast, ref)


def test_record_wrapped_onto_an_unterminated_last_line(tmp_path: Path) -> None:
    # Found while writing these tests: a block's last line once missed its wrapped
    # continuation in the next block (here, an unterminated last line).
    path = tmp_path / "pasted.log"
    path.write_text(
        "INFO 10-14 17:02:48 [loggers.py:123] Engine 000: Avg prompt throughput: 1386.0 "
        "tokens/s, Avg generation throug\n"
        "hput: 852.1 tokens/s, Running: 38 reqs, Waiting: 0 reqs, GPU KV cache usage: 89.8%, "
        "Prefix cache hit rate: 42.4%"
    )
    fast, ref = _both(path)
    assert [(h.line, h.sig) for h in ref.hits] == [(1, "vllm.v1.stats")]
    _assert_same(fast, ref)


def test_truncated_gzip(tmp_path: Path) -> None:
    # Both paths keep every line decompressed before the damage, the partial last one
    # included, and count the truncation once.
    whole = gzip.compress(adversarial_log(seed=17, pages=64, wrapped=True), mtime=0)
    path = tmp_path / "cut.log.gz"
    path.write_bytes(whole[: len(whole) // 2])
    kept = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(whole[: len(whole) // 2])
    fast, ref = _both(path)
    assert fast.lines_read == kept.count(b"\n") + 1  # the cut-off last line counts
    assert fast.bytes_read == len(kept)
    assert fast.skipped["truncated gzip: input ended early"] == 1
    assert ref.skipped["truncated gzip: input ended early"] == 1
    _assert_same(fast, ref)
