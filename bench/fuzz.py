"""Mutation and differential fuzzer for `preemptdiag analyze`.

    python -m bench.fuzz --count 20000 --seed 1 [--workers 2] [--diff-every 1]
    python -m bench.fuzz --seed 1 --index 4711 --keep DIR   # replay one input

Inputs start from real logs (samples/, tests/fixtures/engine/, and the shared corpus
at /work/shared/corpus/ or $PREEMPTDIAG_CORPUS when present) and are mutated the
way logs are damaged in the wild: flipped bytes, duplicated, reordered, truncated and
glued lines, NUL runs a crash leaves, numbers past 64 bits, impossible dates, other
encodings, CR/LF mixes, hard wraps, escape codes, and compression wrappers (whole,
truncated or corrupted). Every input also gets planted request text (each shape an
engine or client logs, quoting signal text) and planted secrets, all carrying a
canary word.

Each input is analysed once in all four formats (one run, four `-o` files) and,
every `--diff-every`-th input, four times more as JSON: with `--jobs 2` and
byte-range splits forced on even a tiny file, with stats rollups off, with the stats
lane (and its calm minutes) from the first 4 KiB block, and so again piped to stdin.
Some inputs are analysed with a named or fixed `--tz`, a `--window` of several
minutes or a `--since`/`--until` clock time, every run of them alike (_ways). The
oracle:

- exit code 0, 1 or 2; never 3, never "internal error" or a traceback;
- exit 2 is exactly one `preemptdiag: error: ...` line on stderr;
- no canary (planted prompt text or secret) in any output, stderr included;
- the four JSON reports are identical (same verdict, windows, counts, evidence).

Input i of seed S is built from Random(f"{S}:{i}") alone, so `--index i` replays
it exactly. tests/test_fuzz.py runs a bounded slice of this with a fixed seed.
"""

from __future__ import annotations

import argparse
import bz2
import contextlib
import gzip
import io
import json
import lzma
import multiprocessing
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED_DIRS = (ROOT / "samples", ROOT / "tests" / "fixtures" / "engine")
SHARED_CORPUS = Path(os.environ.get("PREEMPTDIAG_CORPUS", "/work/shared/corpus"))
SEED_SUFFIXES = (".log", ".txt", ".prom", ".gz", ".1", ".2")
FORMATS = (("terminal", "report.txt"), ("markdown", "report.md"), ("json", "report.json"),
           ("sarif", "report.sarif"))  # fmt: skip
PER_INPUT_TIMEOUT_S = 120
_SLICE = 64_000  # bytes of a seed file one input starts from, at most

# Canaries: words planted in request text and secrets. Any of them in any output is
# a leak. They hold no signature literal, so they cannot become evidence on merit.
PROMPT_CANARY = "zqxcanaryprompt"
SECRET_CANARY = "Zqx7Canary9Secret"
CANARIES = (PROMPT_CANARY, SECRET_CANARY)

# Signal text a user can paste into a prompt: it must stay a decoy.
SIGNAL_TEXT = (
    "KV cache pool is full. Retract requests. #retracted_reqs: 40, #new_token_ratio: 0.7",
    "Sequence group 0 is preempted by PreemptionMode.RECOMPUTE mode because there is not "
    "enough KV cache space. total_num_cumulative_preemption=51",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "Out of memory: Killed process 4242 (python3) total-vm:1kB, anon-rss:9000000kB",
)


def _prompt(rng: random.Random) -> str:
    return f"{PROMPT_CANARY} {rng.choice(SIGNAL_TEXT)} {PROMPT_CANARY}"


def _q(text: str, quote: str) -> str:
    return quote + text.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote


# (name, builder): each returns the line(s) an engine or client logs with request text.
def _request_lines(rng: random.Random) -> list[str]:
    p, q = _prompt(rng), rng.choice("'\"")
    stamp = "INFO 06-16 21:24:15 [logger.py:39] "
    sg = "[2026-06-16 21:24:15 TP0] "
    shapes = [
        f"{stamp}Received request cmpl-1: prompt: {_q(p, q)}, params: SamplingParams(n=1)",
        f"{sg}Receive: obj=GenerateReqInput(text={_q(p, q)}, sampling_params={{}}, rid='a1')",
        f"{sg}Finish: obj=GenerateReqInput(rid='a1'), out={{'text': {_q(p, q)}, "
        "'meta_info': {'id': 'a1'}}",
        f"{stamp}request prompt={_q(p, q)} max_tokens=16",
        f"{stamp}request prompt:{_q(p, q)} max_tokens=16",
        f"{stamp}Prompt: {p}",
        f"{stamp}llm.generate(prompt={_q(p, chr(34))}, sampling_params=sp)",
        '{"inputs": ' + _q(p, '"') + ', "parameters": {"max_new_tokens": 16}}',
        '{"text": ' + _q(p, '"') + "}",
        f"{stamp}openai.BadRequestError: Error code: 400 - message={_q(p, q)}",
        f"Prompt after formatting:\n{p}",
        f"{stamp}Request(prompt_text={_q(p, q)}, request_id='r1')",
        # a prompt printed raw across lines: the quote closes on the second one
        f"{stamp}Received request cmpl-2: prompt: {q}{PROMPT_CANARY} first line\n"
        f"{rng.choice(SIGNAL_TEXT)} {PROMPT_CANARY}{q}, params: SamplingParams(n=1)",
    ]
    return rng.choice(shapes).split("\n")


def _secret_tail(rng: random.Random) -> str:
    c = SECRET_CANARY
    return rng.choice(
        [
            f" api_key=sk-proj-{c}0123456789",
            f" Authorization: Bearer {c}abcdef0123456789",
            f" --api-key {c}xyz",
            f" password={c}",
            f" redis://:{c}@cache:6379/0",
            f" hf_{c}0123456789abcdef",
            f" token={c}",
            f" Cookie: session={c}",
        ]
    )


# --- mutations --------------------------------------------------------------------------

Mutation = Callable[[bytes, random.Random], bytes]


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def byte_flips(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 16)):
        i = rng.randrange(len(buf))
        buf[i] = rng.randrange(256) if rng.random() < 0.5 else buf[i] ^ (1 << rng.randrange(8))
    return bytes(buf)


def dup_lines(data: bytes, rng: random.Random) -> bytes:
    ls = _lines(data)
    for _ in range(rng.randrange(1, 8)):
        i = rng.randrange(len(ls))
        ls[i:i] = [ls[i]] * rng.randrange(1, 50)
    return b"\n".join(ls)


def reorder_lines(data: bytes, rng: random.Random) -> bytes:
    ls = _lines(data)
    how = rng.randrange(3)
    if how == 0:
        ls.reverse()
    elif how == 1:
        i = rng.randrange(len(ls))
        j = rng.randrange(i, len(ls) + 1)
        seg = ls[i:j]
        rng.shuffle(seg)
        ls[i:j] = seg
    else:
        rng.shuffle(ls)
    return b"\n".join(ls)


def truncate(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    return data[:i] if rng.random() < 0.7 else data[i:]


def drop_lines(data: bytes, rng: random.Random) -> bytes:
    ls = _lines(data)
    keep = rng.random()
    return b"\n".join(ln for ln in ls if rng.random() < keep)


def glue_lines(data: bytes, rng: random.Random) -> bytes:
    ls = _lines(data)
    share = rng.choice([0.05, 0.3, 1.0])
    out = bytearray()
    for i, ln in enumerate(ls):
        out += ln
        if i < len(ls) - 1:
            out += b"" if rng.random() < share else b"\n"
    return bytes(out)


def nul_runs(data: bytes, rng: random.Random) -> bytes:
    run = b"\x00" * rng.choice([1, 7, 512, 4096, 70000])
    where = rng.choice(["tail", "middle", "head"])
    if where == "tail":
        return data + run
    if where == "head":
        return run + data
    i = rng.randrange(len(data) + 1)
    return data[:i] + run + data[i:]


_NUM = re.compile(rb"\d+(?:\.\d+)?")
_HUGE = [b"99999999999999999999999999999999999999999", b"9223372036854775808", b"0",
         b"-1", b"1e309", b"nan", b"inf", b"18446744073709551616", b"4" * 400, b"00000001",
         b"1,234,567", b"-0.0"]  # fmt: skip


def huge_numbers(data: bytes, rng: random.Random) -> bytes:
    spans = [m.span() for m in _NUM.finditer(data)]
    if not spans:
        return data + b" " + rng.choice(_HUGE)
    out = bytearray(data)
    for s, e in sorted(rng.sample(spans, min(len(spans), rng.randrange(1, 12))), reverse=True):
        out[s:e] = rng.choice(_HUGE)
    return bytes(out)


_DATE = re.compile(rb"(\d{4}-)?\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}")
_BAD_DATES = [b"02-29 12:00:00", b"13-45 25:61:61", b"06-16 17:21:60", b"00-00 00:00:00",
              b"0001-01-01T00:00:00", b"9999-12-31 23:59:59", b"10000-01-01T00:00:00",
              b"2026-02-29 12:00:00", b"2025-06-31T24:00:00", b"99-99 99:99:99"]  # fmt: skip


def bad_dates(data: bytes, rng: random.Random) -> bytes:
    spans = [m.span() for m in _DATE.finditer(data)]
    if not spans:
        return rng.choice(_BAD_DATES) + b" " + data
    out = bytearray(data)
    for s, e in sorted(rng.sample(spans, min(len(spans), rng.randrange(1, 6))), reverse=True):
        out[s:e] = rng.choice(_BAD_DATES)
    return bytes(out)


def encodings(data: bytes, rng: random.Random) -> bytes:
    text = data.decode("utf-8", errors="replace")
    how = rng.randrange(6)
    if how == 0:
        return b"\xef\xbb\xbf" + data  # UTF-8 BOM
    if how == 1:
        return text.encode("utf-16")
    if how == 2:
        return text.encode("latin-1", errors="replace")
    if how == 3:
        return text.encode("utf-16-le")
    if how == 4:  # invalid UTF-8 sprinkled in
        buf = bytearray(data)
        for _ in range(rng.randrange(1, 10)):
            buf[rng.randrange(len(buf) + 1) :][:0] = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80"])
        return bytes(buf)
    return text.replace("e", "\u212a\u00e9").encode()


def line_ends(data: bytes, rng: random.Random) -> bytes:
    how = rng.randrange(4)
    if how == 0:
        return data.replace(b"\n", b"\r")
    if how == 1:
        return data.replace(b"\n", b"\r\n")
    out = bytearray()
    for ln in _lines(data):
        out += ln + rng.choice([b"\n", b"\r", b"\r\n", b"\n\r", b"\r\r\n"])
    return bytes(out)


def hard_wrap(data: bytes, rng: random.Random) -> bytes:
    width = rng.choice([40, 80, 120, 200])
    out = []
    for ln in _lines(data):
        out.extend(ln[i : i + width] for i in range(0, max(len(ln), 1), width))
    return b"\n".join(out)


_ESCAPES = [b"\x1b[31m", b"\x1b[0m", b"\x1b]0;title\x07", b"\x1b]8;;http://x\x1b\\",
            b"\x1b]52;c;Zm9v\x07", b"\x07", b"\x08", b"\x1b[2K", b"#033[2m", b"\x9b31m"]  # fmt: skip


def escapes(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 20)):
        i = rng.randrange(len(buf) + 1)
        buf[i:i] = rng.choice(_ESCAPES)
    return bytes(buf)


_PREFIXES = [b"2025-10-15T00:02:38.756689123Z ", b"0001-01-01T00:00:00+01:00 stdout F ",
             b"[pod/vllm-0/vllm] ", b"> ", b"(EngineCore_DP0 pid=312) ",
             b"Jun  3 08:00:00 gpu-7 kernel: ", b"[12345.678901] ",
             b"\x1b]0;\x1b[31mpwn\x07 "]  # fmt: skip


def wrappers(data: bytes, rng: random.Random) -> bytes:
    how = rng.randrange(3)
    if how == 0:
        p = rng.choice(_PREFIXES)
        if p is _PREFIXES[0] and rng.random() < 0.5:
            # `kubectl logs --timestamps`: each line the nanosecond it was read, on
            # (a rank's copies each its own: session 35)
            ns, out = 0, []
            for ln in _lines(data):
                ns += rng.choice([1, 1_000, 40_000_000, 999_999_999, 61_000_000_000])
                s, f = divmod(ns, 1_000_000_000)
                stamp = f"2025-10-15T{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
                out.append(f"{stamp}.{f:09d}Z ".encode() + ln)
            return b"\n".join(out)
        return b"\n".join(p + ln for ln in _lines(data))
    if how == 1:
        import json

        return b"\n".join(
            json.dumps(
                {
                    "log": ln.decode("utf-8", "replace") + "\n",
                    "stream": "stdout",
                    "time": rng.choice(
                        [
                            "2025-06-03T08:00:00Z",
                            "2025-01-01T00:00:00+ab:cd",
                            "0001-01-01T00:00:00Z",
                        ]
                    ),
                }
            ).encode()
            for ln in _lines(data)
        )
    return b"\n".join(ln + b" [repeated 3x across cluster]" for ln in _lines(data))


def repeat_records(data: bytes, rng: random.Random) -> bytes:
    """Many records glued on one line (the quadratic case)."""
    ls = [ln for ln in _lines(data) if ln.strip()]
    if not ls:
        return data
    rec = rng.choice(ls)
    return data + b"\n" + rec * rng.choice([10, 200, 1000]) + b"\n"


def splice(data: bytes, rng: random.Random, other: bytes) -> bytes:
    a, b = _lines(data), _lines(other)
    i = rng.randrange(len(a) + 1)
    j = rng.randrange(len(b) + 1)
    return b"\n".join(a[:i] + b[j : j + rng.randrange(1, 200)] + a[i:])


MUTATIONS: dict[str, Mutation] = {
    "byte_flips": byte_flips, "dup_lines": dup_lines, "reorder_lines": reorder_lines,
    "truncate": truncate, "drop_lines": drop_lines, "glue_lines": glue_lines,
    "nul_runs": nul_runs, "huge_numbers": huge_numbers, "bad_dates": bad_dates,
    "encodings": encodings, "line_ends": line_ends, "hard_wrap": hard_wrap,
    "escapes": escapes, "wrappers": wrappers, "repeat_records": repeat_records,
}  # fmt: skip
# Byte-level damage goes before the canaries are planted (a flipped quote would turn
# a prompt into something no redactor can know is one); line-level shapes after.
_LATE = ("encodings", "line_ends", "hard_wrap", "glue_lines")


def plant(data: bytes, rng: random.Random) -> bytes:
    ls = _lines(data)
    # Secrets first, then the request lines, each group inserted whole between the
    # original lines (one group must not split another's multi-line prompt).
    groups = [[ln.encode() for ln in _request_lines(rng)] for _ in range(rng.randrange(1, 4))]
    tails = [_secret_tail(rng).encode() for _ in range(rng.randrange(0, 3))]
    for tail in tails:
        if ls:
            ls[rng.randrange(len(ls))] += tail
    for i, group in sorted(((rng.randrange(len(ls) + 1), g) for g in groups), reverse=True):
        ls[i:i] = group
    return b"\n".join(ls)


def compress(data: bytes, rng: random.Random) -> tuple[bytes, str, bool]:
    """A compression wrapper, sometimes damaged: (bytes, file suffix, damaged)."""
    how = rng.randrange(5)
    if how == 0:
        out, suffix = gzip.compress(data, mtime=0), ".gz"
    elif how == 1:
        out, suffix = bz2.compress(data), ".bz2"
    elif how == 2:
        out, suffix = lzma.compress(data), ".xz"
    elif how == 3:
        try:
            from backports import zstd  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            import compression.zstd as zstd  # type: ignore[import-not-found, no-redef, unused-ignore]
        out, suffix = zstd.compress(data), ".zst"
    else:
        out, suffix = gzip.compress(data, mtime=0) + gzip.compress(data[:100], mtime=0), ".gz"
    damage = rng.randrange(3)
    if damage == 1 and len(out) > 20:
        out = out[: rng.randrange(10, len(out))]
    elif damage == 2 and len(out) > 20:
        buf = bytearray(out)
        i = rng.randrange(10, len(buf))
        buf[i] ^= 0xFF
        out = bytes(buf)
        return out, suffix, True
    return out, suffix, False


@dataclass(frozen=True)
class Case:
    index: int
    data: bytes
    suffix: str
    seed_file: str
    mutations: tuple[str, ...]
    ways: tuple[str, ...] = ()  # options every run of it is given (_ways)


def seed_files() -> list[Path]:
    dirs = [*SEED_DIRS, *([SHARED_CORPUS] if SHARED_CORPUS.is_dir() else [])]
    found = {
        p
        for d in dirs
        for p in d.rglob("*")
        if p.is_file() and p.suffix in SEED_SUFFIXES and p.stat().st_size < 2_000_000
    }
    # Ordered by where a file is relative to its folder, repository files first, not by
    # absolute path: input i of seed S must be the same input in every checkout (a
    # worktree under /tmp once sorted the repository's logs after the shared corpus).
    return sorted(found, key=_seed_key)


def _seed_key(p: Path) -> tuple[int, tuple[str, ...]]:
    if p.is_relative_to(ROOT):
        return 0, p.relative_to(ROOT).parts
    return 1, p.relative_to(SHARED_CORPUS).parts if p.is_relative_to(SHARED_CORPUS) else p.parts


def _read_seed(p: Path) -> bytes:
    raw = p.read_bytes()
    return gzip.decompress(raw) if p.suffix == ".gz" else raw


def make_case(seed: int, index: int, seeds: Sequence[Path]) -> Case:
    rng = random.Random(f"{seed}:{index}")
    src = rng.choice(seeds)
    data = _read_seed(src)
    if len(data) > _SLICE:  # a slice of a big one: fuzzing time goes to variety
        i = rng.randrange(len(data) - _SLICE)
        data = data[i : i + _SLICE]
    names = rng.sample(sorted(MUTATIONS), rng.randrange(0, 4))
    if rng.random() < 0.2:
        names.append("splice")
    early = [n for n in names if n not in _LATE]
    late = [n for n in names if n in _LATE]
    for n in early:
        data = (
            splice(data, rng, _read_seed(rng.choice(seeds)))
            if n == "splice"
            else (MUTATIONS[n](data, rng))
        )
    data = plant(data, rng)
    for n in late:
        data = MUTATIONS[n](data, rng)
    suffix = ".log"
    if rng.random() < 0.12:
        data, suffix, damaged = compress(data, rng)
        # A flipped byte in a deflate stream decodes to garbage until the decoder
        # notices: a canary cut out of its request text there is noise, not a leak.
        names.append("compress_damaged" if damaged else "compress")
    name = str(src.relative_to(ROOT)) if src.is_relative_to(ROOT) else str(src)
    return Case(index, data, suffix, name, tuple(names), _ways(seed, index))


# Ways a user may ask for a log, each drawn for some inputs: a named zone (or a fixed
# one), windows of several minutes, a --since/--until clock time (refused, exit 2,
# where the log's span holds it on several dates). The calm minutes of the `lane`
# variant read each of them their own way (timeline/calm.py).
_ZONES = ("Europe/Berlin", "America/New_York", "Asia/Kolkata", "Asia/Kathmandu", "+05:30")
_WINDOWS = ("120", "300", "600", "3600")


def _ways(seed: int, index: int) -> tuple[str, ...]:
    """The options input `index` of `seed` is analysed with (its own Random: the
    input's bytes are what they were before these were drawn)."""
    rng = random.Random(f"{seed}:{index}:ways")
    out: list[str] = []
    if rng.random() < 0.25:
        out += ["--tz", rng.choice(_ZONES)]
    if rng.random() < 0.25:
        out += ["--window", rng.choice(_WINDOWS)]
    for flag in ("--since", "--until"):
        if rng.random() < 0.1:
            out += [flag, f"{rng.randrange(24):02d}:{rng.randrange(60):02d}"]
    return tuple(out)


# --- running one case --------------------------------------------------------------------


@dataclass
class Finding:
    index: int
    cause: str
    detail: str
    seed_file: str
    mutations: tuple[str, ...]
    ways: tuple[str, ...] = ()  # options every run of it is given (_ways)


@dataclass
class Tally:
    inputs: int = 0
    analyses: int = 0
    diffed: int = 0
    exit_codes: Counter[int] = field(default_factory=Counter)
    # exit 2's messages, numbers and paths blanked: what the inputs were refused for
    refusals: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)

    def merge(self, other: Tally) -> None:
        self.inputs += other.inputs
        self.analyses += other.analyses
        self.diffed += other.diffed
        self.exit_codes.update(other.exit_codes)
        self.refusals.update(other.refusals)
        self.findings.extend(other.findings)


class _Timeout(BaseException):
    # Not an Exception: the CLI turns those into exit 3, and an input over the time
    # limit then read as an internal error at _on_alarm (seed 9091 input 28, 37 MB).
    pass


def _on_alarm(_sig: int, _frame: object) -> None:
    raise _Timeout


def _main(argv: list[str]) -> tuple[int, str, str]:
    from preemptdiag.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _variant(name: str, path: Path) -> Iterator[None]:
    """`jobs2`: byte-range splits forced on any file; `nrollup`: stats rollups off;
    `lane`: the stats lane tried from the first block, in 4 KiB blocks, so a small
    input's plain stats lines go its way and its calm minutes stay numbers
    (timeline/calm.py); `stdin`: the file piped (read from its copy, ingest/spool.py),
    with the lane as `lane` has it."""
    import preemptdiag.commands.analyze as analyze_mod
    import preemptdiag.scan.bulk as bulk_mod
    import preemptdiag.scan.parallel as parallel_mod
    import preemptdiag.scan.passes as passes_mod

    saved = (parallel_mod.PARALLEL_MIN_BYTES, analyze_mod._rollup_exact)
    lane = (bulk_mod.AFTER_LINES, passes_mod.BLOCK_BYTES)
    try:
        if name == "jobs2":
            parallel_mod.PARALLEL_MIN_BYTES = 1
        elif name == "nrollup":
            analyze_mod._rollup_exact = lambda _opts: False  # type: ignore[assignment]
        elif name in ("lane", "stdin"):
            bulk_mod.AFTER_LINES, passes_mod.BLOCK_BYTES = 0, 4096
        if name == "stdin":
            with path.open("rb") as f, contextlib.ExitStack() as undo:
                undo.callback(setattr, sys, "stdin", sys.stdin)
                sys.stdin = io.TextIOWrapper(io.BufferedReader(f))  # type: ignore[arg-type]
                yield
        else:
            yield
    finally:
        parallel_mod.PARALLEL_MIN_BYTES, analyze_mod._rollup_exact = saved
        bulk_mod.AFTER_LINES, passes_mod.BLOCK_BYTES = lane


def _leaks(texts: Sequence[str]) -> list[str]:
    return [c for c in CANARIES if any(c in t for t in texts)]


def _classify(code: int, err: str) -> str | None:
    if code == 3 or "internal error" in err:
        m = re.findall(r"^\s*(\w+(?:Error|Exception|Exit|Interrupt)\w*)\b.*$", err, re.M)
        where = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', err)
        loc = f"{Path(where[-1][0]).name}:{where[-1][2]}" if where else "?"
        return f"internal error {m[-1] if m else '?'} at {loc}"
    if re.search(r"^Traceback \(most recent call last\):", err, re.M):
        return "traceback"  # (a quoted log line may say "Traceback" itself)
    if code not in (0, 1, 2):
        return f"exit {code}"
    if code == 2 and (len(err.splitlines()) != 1 or not err.startswith("preemptdiag: error: ")):
        return "exit 2 without one error line"
    return None


def run_case(case: Case, workdir: Path, diff: bool, tally: Tally) -> None:
    path = workdir / f"input{case.suffix}"
    path.write_bytes(case.data)
    # (file time 0, as stdin has none: what dates a clock-only stamp or places a
    # scrape is then the same whether the input is named or piped)
    os.utime(path, (0, 0))
    outs = [workdir / name for _, name in FORMATS]
    for o in outs:
        o.unlink(missing_ok=True)
    base = ["analyze", str(path), "--year", "2026", "--color", "never", *case.ways, "--jobs", "1"]
    argv = [*base, *(a for f, _ in FORMATS for a in ("-f", f))]
    argv += [a for o in outs for a in ("-o", str(o))]

    def finding(cause: str, detail: str) -> None:
        tally.findings.append(Finding(case.index, cause, detail, case.seed_file, case.mutations))

    tally.inputs += 1
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(PER_INPUT_TIMEOUT_S)
    try:
        code, out, err = _main(argv)
        tally.analyses += 1
        tally.exit_codes[code] += 1
        cause = _classify(code, err)
        if cause:
            finding(cause, err[-2000:])
            return
        if code == 2:
            tally.refusals[re.sub(r"\S*input\S*|\d+", "#", err.strip())[:90]] += 1
        texts = [out, err, *(o.read_text(errors="replace") for o in outs if o.exists())]
        if code != 2 and not all(o.exists() for o in outs):
            finding("missing output", err)
        for c in [] if "compress_damaged" in case.mutations else _leaks(texts):
            where = next(t for t in texts if c in t)
            i = where.index(c)
            finding(
                f"leak of {'prompt' if c == PROMPT_CANARY else 'secret'}", where[i - 300 : i + 100]
            )
        if not diff or code == 2:
            return
        tally.diffed += 1
        reference = (workdir / "report.json").read_text()
        for name in ("jobs2", "nrollup", "lane", "stdin"):
            jobs = "2" if name == "jobs2" else "1"
            argv = [*base[:-1], jobs, "-f", "json"]
            with _variant(name, path):
                if name == "stdin":
                    argv[1] = "-"
                vcode, vout, verr = _main(argv)
                if name == "stdin":
                    vout = vout.replace(json.dumps("<stdin>")[1:-1], json.dumps(str(path))[1:-1])
            tally.analyses += 1
            cause = _classify(vcode, verr)
            if cause:
                finding(f"{name}: {cause}", verr[-2000:])
            elif vcode != code or vout != reference:
                finding(f"{name} disagrees with --jobs 1", _first_difference(reference, vout))
    except _Timeout:
        finding("timeout", f"over {PER_INPUT_TIMEOUT_S} s")
    finally:
        signal.alarm(0)


def _first_difference(a: str, b: str) -> str:
    al, bl = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(al, bl, strict=False)):
        if x != y:
            return f"line {i + 1}: {x.strip()[:200]} != {y.strip()[:200]}"
    return f"lengths {len(al)} != {len(bl)}"


def fuzz(seed: int, indices: Sequence[int], diff_every: int = 1,
         log: Callable[[str], None] | None = None) -> Tally:  # fmt: skip
    seeds = seed_files()
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="pdfuzz-") as d, contextlib.chdir(d):
        # (in the temp dir: a config in a parent folder must not leak into the runs)
        work = Path(d)
        for n, i in enumerate(indices):
            case = make_case(seed, i, seeds)
            before = len(tally.findings)
            run_case(case, work, diff_every > 0 and i % diff_every == 0, tally)
            if log:
                for f in tally.findings[before:]:
                    log(f"FINDING seed={seed} index={f.index} cause={f.cause} "
                        f"mutations={','.join(f.mutations)} seed_file={f.seed_file}")  # fmt: skip
                if n and n % 200 == 0:
                    log(f"progress: {n} inputs, {len(tally.findings)} findings")
    return tally


def _worker(args: tuple[int, list[int], int]) -> Tally:
    seed, indices, diff_every = args
    return fuzz(seed, indices, diff_every, log=lambda s: print(s, flush=True))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--start", type=int, default=0, help="first input index")
    ap.add_argument("--index", type=int, help="replay this one input")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--diff-every", type=int, default=1, help="differential every n-th input")
    ap.add_argument("--keep", type=Path, help="with --index: write the input here")
    a = ap.parse_args(argv)
    if a.index is not None:
        case = make_case(a.seed, a.index, seed_files())
        if a.keep:
            a.keep.mkdir(parents=True, exist_ok=True)
            (a.keep / f"input{case.suffix}").write_bytes(case.data)
        print(f"seed file {case.seed_file}, mutations {case.mutations}, {len(case.data)} bytes")
        indices = [a.index]
        a.workers = 1
    else:
        indices = list(range(a.start, a.start + a.count))
    t0 = time.monotonic()
    chunks = [(a.seed, indices[k :: a.workers], a.diff_every) for k in range(a.workers)]
    total = Tally()
    if a.workers == 1:
        total = _worker(chunks[0])
    else:
        # Not multiprocessing.Pool: its workers are daemons, and a daemon may not
        # start the --jobs 2 workers the differential runs need.
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(a.workers, mp_context=ctx) as pool:
            for t in pool.map(_worker, chunks):
                total.merge(t)
    causes = Counter(f.cause for f in total.findings)
    print(
        f"seed {a.seed}: {total.inputs} inputs, {total.analyses} analyses, {total.diffed} "
        f"differential, exit codes {dict(sorted(total.exit_codes.items()))}, "
        f"{len(total.findings)} findings, {len(causes)} distinct causes, "
        f"{time.monotonic() - t0:.0f} s"
    )
    for msg, n in total.refusals.most_common(8):
        print(f"  refused {n:5d}  {msg}")
    for cause, n in causes.most_common():
        first = next(f for f in total.findings if f.cause == cause)
        print(f"  {n:5d}  {cause}  (first: --seed {a.seed} --index {first.index})")
    if a.index is not None:
        for f in total.findings:
            print(f.detail)
    return 1 if total.findings else 0


if __name__ == "__main__":
    sys.exit(main())
