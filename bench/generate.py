"""Write a realistic, deterministic vLLM server log of a chosen size, for benchmarks.

    python bench/generate.py --size 1GiB -o /tmp/bench.log [--seed 0] [--profile sglang-dense]

The log is what a real server with request logging on looks like by volume: most
bytes are `Received request ... prompt: '...'` lines with long prompts, plus uvicorn
access lines and `Added request` lines. Signal lines are rare, as in life: start-up
capacity and config lines, a V0 stats line every 5 s, V0 preemption warnings during
pressure episodes (sampled every 50th preemption, cumulative counter increasing), a
restart into a V1 engine whose stats line comes every 10 s (with `Preemptions: N`
under pressure), and a CUDA OOM traceback followed by engine death near the end.

Some prompts quote signal text mid-line ('is preempted by PreemptionMode', 'CUDA
out of memory', 'GPU KV cache usage: 99%') so the scanner meets decoys, and the
prose vocabulary contains words such as "room", "blocks" or "exception" at a
plausible rate, because real prompts do and a loose prefilter literal pays for it.

Output is byte-identical for a given (size, seed); memory stays flat (streamed).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import BinaryIO

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}

FLUSH_BYTES = 1 << 20
POOL_SIZE = 600

# Words sampled for prompt prose. Ordinary English first; a tail of technical words,
# some of which contain prefilter literals ("room" holds "oom"), at a plausible rate.
_COMMON_TEXT = (
    "the of and to a in is it you that he was for on are with as his they be at one have "
    "this from or had by hot word but what some we can out other were all there when up use "
    "your how said an each she which do their time if will way about many then them write "
    "would like so these her long make thing see him two has look more day could go come did "
    "number sound no most people my over know water than call first who may down side been "
    "now find any new work part take get place made live where after back little only round "
    "man year came show every good me give our under name very through just form sentence "
    "great think say help low line differ turn cause much mean before move right boy old too "
    "same tell does set three want air well also play small end put home read hand port large "
    "spell add even land here must big high such follow act why ask men change went light"
)
_TECH_TEXT = (
    "function return value error request server client response model token user system "
    "assistant answer question data table query python code list string file test deploy "
    "latency service database memory cache queue worker thread process json field schema"
)
_COMMON = tuple(_COMMON_TEXT.split())
_TECH = tuple(_TECH_TEXT.split())
# Real prose words that contain a likely prefilter literal ("room" holds "oom"). English
# text has a few hundred of them per million words; code prompts add "exception".
_LOOSE_HITS = ("room", "classroom", "zoom", "bloom", "blocks", "version", "exception")
LOOSE_HIT_RATE = 0.005  # of technical-word slots, i.e. ~1 word in 2,400

_SYSTEM = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n"
    "You are a helpful assistant. Answer concisely and cite the document when you can."
    "<|eot_id|><|start_header_id|>user<|end_header_id|>\\n\\n"
)
_TAIL = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\\n\\n"

# Signal text users paste into prompts ("why does my server say ..."): decoys.
_DECOYS = (
    "my vllm log says Sequence group 42 is preempted by PreemptionMode.RECOMPUTE mode, "
    "what does that mean",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. How do I fix it",
    "the dashboard shows GPU KV cache usage: 99%, Running: 256 reqs, Waiting: 40 reqs. is that bad",
)

_PARAMS = (
    "SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
    "temperature={t}, top_p=1.0, top_k=-1, min_p=0.0, seed=None, stop=[], stop_token_ids=[], "
    "bad_words=[], include_stop_str_in_output=False, ignore_eos=False, max_tokens={m}, "
    "min_tokens=0, logprobs=None, prompt_logprobs=None, skip_special_tokens=True, "
    "spaces_between_special_tokens=True, truncate_prompt_tokens=None, guided_decoding=None, "
    "extra_args=None)"
)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 100MiB, 1GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str  # already repr-style escaped, as vLLM's RequestLogger prints it
    token_ids: str


def _prose(rng: random.Random, n_words: int) -> str:
    words = rng.choices(_COMMON, k=n_words)
    # ~1 technical word in 12: enough that a 300-word prompt often holds one.
    for i in range(0, n_words, 12):
        loose = rng.random() < LOOSE_HIT_RATE
        words[min(n_words - 1, i + rng.randrange(12))] = rng.choice(_LOOSE_HITS if loose else _TECH)
    out: list[str] = []
    for i in range(0, n_words, 14):
        sentence = " ".join(words[i : i + 14])
        out.append(sentence[:1].upper() + sentence[1:] + ".")
    return " ".join(out)


def _prompt_pool(rng: random.Random, mu: float = 5.3, sigma: float = 0.7) -> list[Prompt]:
    pool: list[Prompt] = []
    for i in range(POOL_SIZE):
        # Long-tailed lengths: most prompts are a few hundred words, some are documents.
        n_words = int(min(4000, rng.lognormvariate(mu, sigma)))
        body = _prose(rng, max(5, n_words))
        if i % 60 == 7:  # ~1.7 % of prompts quote a signal line
            cut = rng.randrange(len(body) // 2 + 1)
            body = body[:cut] + " " + _DECOYS[i % len(_DECOYS)] + " " + body[cut:]
        text = _SYSTEM + body.replace("'", "\\'") + _TAIL
        n_tokens = len(text) // 4
        ids = ", ".join(str(rng.randrange(200, 128000)) for _ in range(min(n_tokens, 1500)))
        pool.append(Prompt(text=text, token_ids=f"[128000, {ids}]"))
    return pool


@dataclass
class Engine:
    """One server run: V0 (v0.6.x, unprefixed) or V1 (v0.12, APIServer/EngineCore)."""

    v1: bool
    version: str
    stats_every: int
    api: str  # process prefix of front-end lines
    core: str  # process prefix of engine-core lines
    cumulative: int = 0  # V0 preemption counter (sampled every 50th in the log)


class Writer:
    def __init__(self, out: BinaryIO, rng: random.Random, start: datetime) -> None:
        self.out = out
        self.rng = rng
        self.now = start
        self.buf: list[str] = []
        self.pending = 0
        self.written = 0

    def ts(self) -> str:
        return self.now.strftime("%m-%d %H:%M:%S")

    def line(self, text: str) -> None:
        self.buf.append(text)
        self.pending += len(text) + 1
        if self.pending >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            data = ("\n".join(self.buf) + "\n").encode()
            self.out.write(data)
            self.written += len(data)
        self.buf.clear()
        self.pending = 0

    @property
    def size(self) -> int:
        return self.written + self.pending


class StampedWriter(Writer):
    """A Writer whose every line has the stamp `kubectl logs --timestamps` (and
    `docker logs -t`) put in front: RFC 3339 in UTC with nanoseconds, the write a few
    ms after the engine's own stamp (from a Random of its own: the lines are the plain
    log's)."""

    def __init__(self, out: BinaryIO, rng: random.Random, start: datetime) -> None:
        super().__init__(out, rng, start)
        self.lag = random.Random(1)
        self.last = (start, 0)

    def line(self, text: str) -> None:
        ns = self.lag.randrange(1_000_000, 40_000_000)
        if self.last[0] == self.now:
            # (the wrapper reads a stream in order: a tick's lines, a thrashing
            # server's ranks' copies among them, each later than the one before)
            ns = max(ns, self.last[1] + self.lag.randrange(1_000, 200_000))
        self.last = (self.now, ns)
        stamp = self.now + timedelta(microseconds=ns // 1000)
        super().line(f"{stamp:%Y-%m-%dT%H:%M:%S}.{stamp.microsecond:06d}{ns % 1000:03d}Z {text}")


def _loc(e: Engine, v0_file: str, v1_file: str) -> str:
    return f"[{v1_file}]" if e.v1 else f"{v0_file}]"


def startup(w: Writer, e: Engine) -> None:
    ts = w.ts()
    if e.v1:
        w.line(f"{e.api}INFO {ts} [api_server.py:1880] vLLM API server version {e.version}")
        w.line(
            f"{e.api}INFO {ts} [utils.py:328] non-default args: {{'model': "
            "'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': 16384, "
            "'gpu_memory_utilization': 0.92, 'max_num_seqs': 256, 'enable_log_requests': True}"
        )
        w.line(
            f"{e.core}INFO {ts} [core.py:93] Initializing a V1 LLM engine (v{e.version}) with "
            "config: model='meta-llama/Llama-3.1-8B-Instruct', dtype=torch.bfloat16, "
            "max_seq_len=16384, tensor_parallel_size=1, pipeline_parallel_size=1, "
            "data_parallel_size=1, quantization=None, enforce_eager=False, "
            "kv_cache_dtype=auto, enable_prefix_caching=True, enable_chunked_prefill=True"
        )
        w.line(
            f"{e.core}INFO {ts} [gpu_model_runner.py:2602] Model loading took 14.9889 GiB "
            "memory and 6.412215 seconds"
        )
        w.line(f"{e.core}INFO {ts} [gpu_worker.py:298] Available KV cache memory: 54.79 GiB")
        w.line(f"{e.core}INFO {ts} [kv_cache_utils.py:1087] GPU KV cache size: 448,848 tokens")
        w.line(
            f"{e.core}INFO {ts} [kv_cache_utils.py:1091] Maximum concurrency for 16,384 "
            "tokens per request: 27.40x"
        )
    else:
        w.line(f"INFO {ts} api_server.py:528] vLLM API server version {e.version}")
        w.line(
            f"INFO {ts} api_server.py:529] args: Namespace(host=None, port=8000, "
            "model='meta-llama/Llama-3.1-8B-Instruct', max_model_len=8192, "
            "gpu_memory_utilization=0.9, swap_space=4, max_num_seqs=256, "
            "disable_log_requests=False, tensor_parallel_size=1)"
        )
        w.line(
            f"INFO {ts} llm_engine.py:237] Initializing an LLM engine (v{e.version}) with "
            "config: model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=8192, "
            "tensor_parallel_size=1, pipeline_parallel_size=1, kv_cache_dtype=auto, "
            "enable_prefix_caching=False, use_cached_outputs=True, "
        )
        w.line(f"INFO {ts} model_runner.py:1067] Loading model weights took 14.9888 GB")
        w.line(f"INFO {ts} gpu_executor.py:122] # GPU blocks: 27021, # CPU blocks: 2048")
        w.line(
            f"INFO {ts} gpu_executor.py:126] Maximum concurrency for 8192 tokens per "
            "request: 52.77x"
        )
    w.line(
        f"{e.api}INFO {ts} {_loc(e, 'launcher.py:19', 'launcher.py:44')} Available routes are:"
        " /v1/completions, /v1/chat/completions, /metrics, /health"
    )


@dataclass
class Load:
    """A slowly wandering load level; pressure episodes push KV usage to ~100 %."""

    running: int = 20
    waiting: int = 0
    kv: float = 30.0
    pressure_left: int = 0  # seconds of the current pressure episode


def _step_load(rng: random.Random, ld: Load) -> None:
    if ld.pressure_left == 0 and rng.random() < 1 / 900:
        ld.pressure_left = rng.randrange(60, 600)
    if ld.pressure_left:
        ld.pressure_left -= 1
        ld.running = min(256, ld.running + rng.randrange(0, 4))
        ld.waiting = min(400, ld.waiting + rng.randrange(0, 3))
        ld.kv = min(100.0, ld.kv + rng.uniform(0.5, 3.0))
    else:
        ld.running = max(1, min(200, ld.running + rng.randrange(-3, 4)))
        ld.waiting = max(0, ld.waiting - rng.randrange(0, 5))
        ld.kv = max(2.0, min(90.0, ld.kv + rng.uniform(-2.0, 1.8)))


def stats_line(w: Writer, e: Engine, ld: Load, interval_preempts: int) -> None:
    rng = w.rng
    gen = ld.running * rng.uniform(9.0, 14.0)
    prompt = rng.uniform(200, 4000) * (3.0 if interval_preempts else 1.0)
    if e.v1:
        pre = f"Preemptions: {interval_preempts}, " if interval_preempts else ""
        w.line(
            f"{e.api}INFO {w.ts()} [loggers.py:236] Engine 000: Avg prompt throughput: "
            f"{prompt:.1f} tokens/s, Avg generation throughput: {gen:.1f} tokens/s, "
            f"Running: {ld.running} reqs, Waiting: {ld.waiting} reqs, {pre}GPU KV cache usage:"
            f" {ld.kv:.1f}%, Prefix cache hit rate: {rng.uniform(5, 40):.1f}%"
        )
    else:
        w.line(
            f"INFO {w.ts()} metrics.py:396] Avg prompt throughput: {prompt:.1f} tokens/s, "
            f"Avg generation throughput: {gen:.1f} tokens/s, Running: {ld.running} reqs, "
            f"Swapped: 0 reqs, Pending: {ld.waiting} reqs, GPU KV cache usage: {ld.kv:.1f}%, "
            "CPU KV cache usage: 0.0%."
        )


def request(w: Writer, e: Engine, pool: list[Prompt]) -> None:
    rng = w.rng
    p = pool[rng.randrange(len(pool))]
    rid = f"chatcmpl-{rng.getrandbits(128):032x}"
    params = _PARAMS.format(t=rng.choice(("0.0", "0.7", "1.0")), m=rng.choice((256, 512, 1024)))
    ts = w.ts()
    if e.v1:
        w.line(
            f"{e.api}INFO {ts} [logger.py:43] Received request {rid}: prompt: '{p.text}', "
            f"params: {params}, prompt_token_ids: {p.token_ids}, prompt_embeds shape: None, "
            "lora_request: None."
        )
        w.line(f"{e.api}INFO {ts} [async_llm.py:379] Added request {rid}.")
    else:
        w.line(
            f"INFO {ts} logger.py:37] Received request {rid}: prompt: '{p.text}', "
            f"params: {params}, prompt_token_ids: {p.token_ids}, lora_request: None, "
            "prompt_adapter_request: None."
        )
        w.line(f"INFO {ts} async_llm_engine.py:208] Added request {rid}.")
    ip = f"10.0.{rng.randrange(256)}.{rng.randrange(256)}:{rng.randrange(30000, 60000)}"
    w.line(f'{e.api}INFO:     {ip} - "POST /v1/chat/completions HTTP/1.1" 200 OK')


def oom_crash(w: Writer, e: Engine) -> None:
    ts = w.ts()
    c = f"{e.core}ERROR {ts} [core.py:710] "
    w.line(f"{e.core}ERROR {ts} [core.py:710] EngineCore encountered a fatal error.")
    w.line(c + "Traceback (most recent call last):")
    for fn, ln, name in (
        ("v1/engine/core.py", 701, "run_engine_core"),
        ("v1/engine/core.py", 728, "run_busy_loop"),
        ("v1/engine/core.py", 754, "_process_engine_step"),
        ("v1/worker/gpu_model_runner.py", 1410, "execute_model"),
        ("torch/nn/modules/module.py", 1773, "_call_impl"),
    ):
        w.line(
            c + f'  File "/usr/local/lib/python3.12/dist-packages/vllm/{fn}", line {ln}, in {name}'
        )
    w.line(
        c + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has"
        " a total capacity of 79.19 GiB of which 1.21 GiB is free. Including non-PyTorch "
        "memory, this process has 77.96 GiB memory in use. Of the allocated memory 75.10 GiB "
        "is allocated by PyTorch, and 1.32 GiB is reserved by PyTorch but unallocated. If "
        "reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    w.line(
        f"{e.api}ERROR {ts} [core_client.py:564] Engine core proc EngineCore_DP0 died "
        "unexpectedly, shutting down client."
    )
    w.line(f"{e.api}ERROR {ts} [async_llm.py:480] AsyncLLM output_handler failed.")
    w.line(
        f"{e.api}vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
        "See stack trace (above) for the root cause."
    )


def run_engine(
    w: Writer, e: Engine, pool: list[Prompt], until: int, rate: tuple[int, int] = (8, 24)
) -> None:
    """Serve until the log reaches `until` bytes, `rate` requests a second."""
    rng = w.rng
    ld = Load()
    startup(w, e)
    interval_preempts = 0
    tick = 0
    while w.size < until:
        w.now += timedelta(seconds=1)
        tick += 1
        _step_load(rng, ld)
        for _ in range(rng.randrange(*rate)):
            request(w, e, pool)
        if tick % 15 == 0:
            w.line(
                f'{e.api}INFO:     10.0.0.5:{rng.randrange(30000, 60000)} - "GET /metrics '
                'HTTP/1.1" 200 OK'
            )
        if ld.kv > 97.0:
            n = rng.randrange(1, 40)
            interval_preempts += n
            if not e.v1:
                # V0 logs only preemption #1, #51, #101, ... with the cumulative counter.
                for k in range(e.cumulative + 1, e.cumulative + n + 1):
                    if k % 50 == 1:
                        w.line(
                            f"WARNING {w.ts()} scheduler.py:1560] Sequence group "
                            f"chatcmpl-{rng.getrandbits(128):032x} is preempted by "
                            "PreemptionMode.RECOMPUTE mode because there is not enough KV "
                            "cache space. This can affect the end-to-end performance. "
                            "Increase gpu_memory_utilization or tensor_parallel_size to "
                            "provide more KV cache memory. "
                            f"total_num_cumulative_preemption={k}"
                        )
                e.cumulative += n
        if tick % e.stats_every == 0:
            stats_line(w, e, ld, interval_preempts)
            interval_preempts = 0


def generate(
    out: BinaryIO, size: int, seed: int = 0, progress: Callable[[int], None] | None = None
) -> int:
    rng = random.Random(seed)
    pool = _prompt_pool(rng)
    w = Writer(out, rng, datetime(2025, 6, 3, 8, 0, 0))
    v0 = Engine(v1=False, version="0.6.3.post1", stats_every=5, api="", core="")
    v1 = Engine(
        v1=True,
        version="0.12.0",
        stats_every=10,
        api="(APIServer pid=1) ",
        core="(EngineCore_DP0 pid=312) ",
    )
    run_engine(w, v0, pool, until=size // 2)
    w.line(f"INFO {w.ts()} launcher.py:57] Shutting down FastAPI HTTP server.")
    w.now += timedelta(minutes=3)  # upgrade and restart
    run_engine(w, v1, pool, until=max(0, size - 4096))
    oom_crash(w, v1)
    w.flush()
    if progress:
        progress(w.written)
    return w.written


def generate_dense(out: BinaryIO, size: int, seed: int = 0) -> int:
    """An SGLang server log with request logging off: nearly every line is a signal
    line (a decode batch line every 0.5 s, a prefill line per arrival wave, and a
    retraction episode every ~2 hours). The per-signal-line cost case: memory and
    time grow with these lines, not with bytes."""
    rng = random.Random(seed)
    w = Writer(out, rng, datetime(2025, 11, 2, 0, 0, 0))
    total = 500_000  # KV token capacity
    tokens, running, queued = 20_000, 10, 0
    while w.size < size:
        w.now += timedelta(milliseconds=500)
        stamp = f"[{w.now:%Y-%m-%d %H:%M:%S} TP0]"
        hot = w.now.hour % 2 == 1 and w.now.minute < 10  # a 10-minute burst, every 2 h
        running = max(1, min(200, running + rng.randint(-3, 5 if hot else 3)))
        tokens = max(1_000, min(total, tokens + rng.randint(-9_000, 12_000 if hot else 8_000)))
        queued = max(0, queued + rng.randint(-2, 4 if hot else 1))
        if rng.random() < 0.1:
            w.line(
                f"{stamp} Prefill batch, #new-seq: {rng.randint(1, 8)}, #new-token: "
                f"{rng.randint(500, 8000)}, #cached-token: {rng.randint(0, 4000)}, token usage: "
                f"{tokens / total:.2f}, #running-req: {running}, #queue-req: {queued}, "
            )
        if hot and tokens >= total * 0.97 and rng.random() < 0.2:
            retracted = rng.randint(1, 4)
            running -= retracted
            tokens = int(total * 0.8)
            w.line(
                f"{stamp} KV cache pool is full. Retract requests. #retracted_reqs: {retracted}, "
                f"#new_token_ratio: 0.7000 -> 0.9000"
            )
        w.line(
            f"{stamp} Decode batch, #running-req: {running}, #token: {tokens}, token usage: "
            f"{tokens / total:.2f}, cuda graph: True, gen throughput (token/s): "
            f"{rng.uniform(100, 3000):.2f}, #queue-req: {queued}, "
        )
    w.flush()
    return w.written


def generate_thrash(
    out: BinaryIO,
    size: int,
    seed: int = 0,
    every_s: float = 5.0,
    ranks: int = 1,
    stamped: bool = False,
) -> int:
    """An SGLang server in a thrash loop all along: a decode batch line every 0.5 s
    (token usage 0.97-0.99), a prefill line one time in ten, and a retraction every
    ~`every_s` seconds, printed by each of `ranks` TP ranks (with several, one rank's
    copy now and then after the next line: ranks print to one stream). Every minute
    of it is an incident's minute: memory there follows the busy minutes. `stamped`:
    each line with a kubectl --timestamps stamp in front (StampedWriter)."""
    rng = random.Random(seed)
    w = (StampedWriter if stamped else Writer)(out, rng, datetime(2025, 11, 2, 0, 0, 0))
    late: list[str] = []
    while w.size < size:
        w.now += timedelta(milliseconds=500)
        at = f"{w.now:%Y-%m-%d %H:%M:%S}"
        lines = []
        if rng.random() < 0.1:
            lines.append(
                f"[{at} TP0] Prefill batch, #new-seq: 3, #new-token: {rng.randint(500, 8000)}, "
                f"#cached-token: 10, token usage: 0.97, #running-req: 40, "
                f"#queue-req: {rng.randint(5, 50)}, "
            )
        if rng.random() < 0.5 / every_s:
            n = rng.randint(1, 4)
            copies = [
                f"[{at} TP{r}] KV cache pool is full. Retract requests. #retracted_reqs: {n}, "
                f"#new_token_ratio: 0.7000 -> 0.9000"
                for r in range(ranks)
            ]
            if ranks > 1 and rng.random() < 0.2:
                late.append(copies.pop())
            lines.extend(copies)
        lines.append(
            f"[{at} TP0] Decode batch, #running-req: {rng.randint(30, 60)}, "
            f"#token: {rng.randint(400000, 500000)}, token usage: 0.9{rng.randint(7, 9)}, "
            f"cuda graph: True, gen throughput (token/s): {rng.uniform(100, 3000):.2f}, "
            f"#queue-req: {rng.randint(5, 50)}, "
        )
        lines, late = late + lines, []
        for line in lines:
            w.line(line)
    w.flush()
    return w.written


def generate_thrash_ranks(out: BinaryIO, size: int, seed: int = 0) -> int:
    """generate_thrash retracting every ~1 s, printed by 8 ranks."""
    return generate_thrash(out, size, seed, every_s=1.0, ranks=8)


def generate_thrash_ranks_stamped(out: BinaryIO, size: int, seed: int = 0) -> int:
    """generate_thrash_ranks as `kubectl logs --timestamps` gives it: each rank's copy of
    a retraction stamped with a nanosecond of its own."""
    return generate_thrash(out, size, seed, every_s=1.0, ranks=8, stamped=True)


def thrash_bytes(days: float, every_s: float = 5.0, ranks: int = 1) -> int:
    """About the `size` for which generate_thrash writes `days` days (its mean line
    lengths: decode ~162 bytes, prefill ~150, retraction ~126)."""
    ticks = days * 86_400 * 2
    return int(ticks * (162 + 0.1 * 150 + 0.5 / every_s * ranks * 126))


def _v1_engine() -> Engine:
    return Engine(
        v1=True,
        version="0.12.0",
        stats_every=STATS_EVERY_S,
        api="(APIServer pid=1) ",
        core="(EngineCore_DP0 pid=312) ",
    )


def generate_requests(out: BinaryIO, size: int, seed: int = 0) -> int:
    """A busy V1 chat server with request logging on, the production shape before
    vLLM turned it off by default: short chat prompts (median ~45 words) at 20-60
    requests a second, each a `Received request ... prompt: '...'` line, an `Added
    request` line and a uvicorn access line, a stats line every 10 s. Many short
    lines a GiB (line numbering) and many prompts holding a loose literal (prefilter)."""
    rng = random.Random(seed)
    pool = _prompt_pool(rng, mu=3.8, sigma=0.8)
    w = Writer(out, rng, datetime(2025, 6, 3, 8, 0, 0))
    run_engine(w, _v1_engine(), pool, until=size, rate=(20, 60))
    w.flush()
    return w.written


STATS_EVERY_S = 10  # vLLM's default stats interval
STATS_LINE_BYTES = 240  # a V1 stats line's mean length here, newline included


def generate_stats(
    out: BinaryIO,
    size: int,
    seed: int = 0,
    busy: bool = False,
    v0: bool = False,
    stamped: bool = False,
    pinned: bool = False,
) -> int:
    """A healthy V1 server with request logging off, as a long-running one prints:
    its start-up lines, then one stats line every 10 s and nothing else: `size` //
    240 of them (a stats line is ~240 bytes; `span_bytes(days)` gives the size of
    exactly that many days: 1 day 8,640 lines, ~2 MB; 30 days 259,200, ~62 MB). The
    per-signal-line cost over a long span: lines grow with time, not traffic.

    `busy`: a server at its --max-num-seqs cap the whole time instead, requests
    waiting on every line, KV well below the pool and nothing preempted (every window
    queueing): the same lines, none of them a healthy minute's. `v0`: a V0 server's
    (0.6.x: `INFO MM-DD HH:MM:SS metrics.py:396] ...`, no process name), at V1's
    interval. `stamped`: each line with a kubectl --timestamps stamp in front
    (StampedWriter): as many lines, ~31 bytes more each. `pinned`: a server at its cap
    with its KV pool at 90-100 % the whole time and requests always waiting, as a V1
    server under steady load prints it (no preemption shown: V1's stats lines print
    none): windows at the 95 % pressure threshold are suspected preemption (PD107),
    the others queueing, in runs of a few minutes."""
    rng = random.Random(seed)
    w = (StampedWriter if stamped else Writer)(out, rng, datetime(2025, 6, 3, 0, 0, 0))
    e = (
        Engine(v1=False, version="0.6.3.post1", stats_every=5, api="", core="")
        if v0
        else _v1_engine()
    )
    startup(w, e)
    at_cap = busy or pinned
    ld = Load(running=64 if at_cap else 12, waiting=8 if at_cap else 0, kv=95.0 if pinned else 20.0)
    for _ in range(size // STATS_LINE_BYTES):
        w.now += timedelta(seconds=STATS_EVERY_S)
        if pinned:
            ld.waiting = max(1, min(40, ld.waiting + rng.randrange(-3, 4)))
            ld.kv = max(90.0, min(100.0, ld.kv + rng.uniform(-1.0, 1.0)))
            stats_line(w, e, ld, 0)
            continue
        if busy or (v0 and w.now.hour % 2):
            # At the cap: Running stays put, the queue wanders but never empties.
            ld.waiting = max(1, min(40, ld.waiting + rng.randrange(-3, 4)))
        else:
            # Healthy: the load wanders well below the pool, the queue stays empty.
            ld.running = max(1, min(60, ld.running + rng.randrange(-3, 4)))
            ld.waiting = 0
        ld.kv = max(2.0, min(70.0, ld.kv + rng.uniform(-2.0, 2.0)))
        stats_line(w, e, ld, 0)
    w.flush()
    return w.written


def generate_stamped(out: BinaryIO, size: int, seed: int = 0) -> int:
    """generate_stats as `kubectl logs --timestamps` gives it."""
    return generate_stats(out, size, seed, stamped=True)


def generate_busy(out: BinaryIO, size: int, seed: int = 0) -> int:
    """generate_stats of a server queueing the whole time (busy)."""
    return generate_stats(out, size, seed, busy=True)


def generate_pinned(out: BinaryIO, size: int, seed: int = 0) -> int:
    """generate_stats of a server with its KV pool pinned and a queue the whole time."""
    return generate_stats(out, size, seed, pinned=True)


def generate_v0_stats(out: BinaryIO, size: int, seed: int = 0) -> int:
    """generate_stats of a V0 server, quiet for an hour, then queueing for an hour."""
    return generate_stats(out, size, seed, v0=True)


def span_bytes(days: float) -> int:
    """The `size` for which generate_stats writes `days` days of stats lines."""
    return int(days * 86_400 / STATS_EVERY_S) * STATS_LINE_BYTES


PROFILES = {
    "vllm": generate,
    "sglang-dense": generate_dense,
    "vllm-stats": generate_stats,
    "vllm-stats-kubectl": generate_stamped,
    "vllm-stats-busy": generate_busy,
    "vllm-stats-pinned": generate_pinned,
    "vllm-v0-stats": generate_v0_stats,
    "vllm-requests": generate_requests,
    "sglang-thrash": generate_thrash,
    "sglang-thrash-ranks": generate_thrash_ranks,
    "sglang-thrash-ranks-kubectl": generate_thrash_ranks_stamped,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=parse_size, default=parse_size("100MiB"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="vllm")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    with args.output.open("wb") as f:
        n = PROFILES[args.profile](f, args.size, args.seed)
    print(f"wrote {n} bytes to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
