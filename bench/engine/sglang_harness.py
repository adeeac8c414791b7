"""Real-engine recordings of SGLang 0.5.23 on the CPU (tiny random Llama, no GPU).

A small, separate runner (the vLLM one is harness.py). Per scenario it starts
`python -m sglang.launch_server` from its own venv, waits for /health, drives it with
bench/engine/load.py's client, scrapes /metrics every 10 s, stops the server (SIGINT
to its process group) and writes, under bench/engine/out/sglang/<name>/:

  server.log         stdout+stderr of the server, unedited
  scrapes/NNN-<phase>.prom   first line `# scraped_at: <UTC ISO Z>`, then the body
  client.json        load.py's counts
  ground_truth.json  from SGLang's own /metrics counters and the client (plus the
                     engine's own log lines counted, labelled as such), never from
                     preemptdiag

    python3 bench/engine/sglang_harness.py --install        # make the venv (see below)
    python3 bench/engine/sglang_harness.py --list
    python3 bench/engine/sglang_harness.py healthy retract  # run, out/sglang/<name>/
    python3 bench/engine/sglang_harness.py --record healthy retract  # + copy fixtures

Why a shim: PyPI's sgl-kernel / sglang-kernel wheels are CUDA builds (their .so files
need libtorch_cuda.so) and the index has no CPU build and no sdist, but sglang 0.5.23's
CPU path (SGLANG_USE_CPU_ENGINE=1) imports two helpers from sgl_kernel at module load
(`assign_req_to_token_pool_cpu`, `copy_all_layer_kv_cache_cpu`). --install writes a
tiny `sgl_kernel` package into the venv (SHIM_SOURCE below) that implements those two
in plain torch with the semantics of sglang's own triton kernels; every other name is a
stub that raises when called, and torch.ops.sgl_kernel stays empty, so sglang's
`_is_intel_amx_backend_available()` is False and its layers take their forward_native
paths. Likewise PyPI's torchvision 0.28.0 is a CUDA build whose _C.so cannot load
against CPU torch; sglang only needs `torchvision.transforms` at import, so --install
wraps torchvision's two op-registration imports in a try. The scheduler, memory pool,
retraction, logging and metrics are SGLang's own, unmodified.

Runs only while no vLLM server runs on the machine (2 cores, shared): before each
start it waits (30 s polls) while `pgrep -f "vllm serve|vllm_launch|EngineCore"` finds
one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The vLLM harness's own helpers (it is standard library only): one copy of each.
from harness import Load, Scrape, free_port, parse_metrics, say, utc_iso, write_json

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SGLANG_VERSION = "0.5.23"
VENV = Path(
    os.environ.get("PREEMPTDIAG_SGLANG_VENV")
    or Path.home() / ".cache" / "preemptdiag" / f"sglang-{SGLANG_VERSION}"
)
VENV_PY = VENV / "bin" / "python"
MODEL_DIR = Path(
    os.environ.get("PREEMPTDIAG_ENGINE_MODEL")
    or Path.home() / ".cache" / "preemptdiag" / "tiny-llama"
)
MODEL_NAME = "tiny-llama"
OUT = HERE / "out" / "sglang"
FIXTURES = REPO / "tests" / "fixtures" / "engine" / f"sglang-{SGLANG_VERSION}"
HEALTH_TIMEOUT_S = float(os.environ.get("PREEMPTDIAG_ENGINE_HEALTH_TIMEOUT", "480"))
SCRAPE_INTERVAL_S = 10.0
STOP_GRACE_S = 60.0
VLLM_PATTERN = "vllm serve|vllm_launch|EngineCore"
VLLM_WAIT_MAX_S = float(os.environ.get("PREEMPTDIAG_SGLANG_VLLM_WAIT", "3600"))

# Flags every scenario gets. torch_native attention: the CPU alternative intel_amx
# needs AMX and the native sgl_kernel CPU build; --disable-cuda-graph is a no-op on the
# CPU but documents intent (it prints a deprecation warning, which is kept).
COMMON_FLAGS = (
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--disable-cuda-graph",
    "--enable-metrics",
)


# ------------------------------------------------------------------- install

SHIM_SOURCE = '''"""preemptdiag CPU shim for `sgl_kernel` (NOT the real package).

Written by bench/engine/sglang_harness.py --install. PyPI's sglang-kernel / sgl-kernel
wheels are CUDA builds (they need libtorch_cuda.so) and no CPU build or sdist is on the
index, while sglang 0.5.23's CPU path (SGLANG_USE_CPU_ENGINE=1) imports a few CPU
helpers from sgl_kernel at module load. This shim provides those helpers in plain
torch and nothing else; every other name resolves to a stub that raises when called,
so a code path that really needs a native kernel fails loudly. torch.ops.sgl_kernel
stays empty, so sglang's `_is_intel_amx_backend_available()` is False and its layers
use their forward_native paths.
"""
import ctypes

import torch  # noqa: F401

__version__ = "0.0.0+preemptdiag.cpushim"
SHIM = True


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    # Semantics of sglang.srt.mem_cache.allocation.assign_req_to_token_pool (triton).
    off = 0
    for row, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = e - s
        if n > 0:
            req_to_token[row, s:e] = out_cache_loc[off:off + n].to(req_to_token.dtype)
        off += n


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    # Semantics of copy_all_layer_kv_cache_tiled (triton): per buffer, row src -> tgt,
    # `stride` bytes a row; reads every source first, so it is safe in place.
    src = src_loc.tolist()
    tgt = tgt_loc.tolist()
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        saved = [ctypes.string_at(base + s * stride, stride) for s in src]
        for t, buf in zip(tgt, saved):
            ctypes.memmove(base + t * stride, buf, stride)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name}: not available in the preemptdiag CPU shim")

    _missing.__name__ = name
    return _missing
'''

TORCHVISION_OLD = """from torchvision import (
    _autograd_registrations,
    _meta_registrations,
    datasets,"""
TORCHVISION_NEW = """# preemptdiag patch: the PyPI torchvision _C.so is a CUDA build (needs libtorch_cuda.so)
# and cannot load against the CPU torch here; skip the op registrations that need it.
try:
    from torchvision import _autograd_registrations, _meta_registrations  # noqa: F401
except RuntimeError:
    pass
from torchvision import (
    datasets,"""

# sglang 0.5.23's Requires-Dist minus the CUDA-only packages (flashinfer, cutlass-dsl,
# deep-ep/-gemm, flash-mla, flash-attn-4, tilelang, quack, humming, nvshmem, cuda-python,
# torch_memory_saver, sglang-kernel) and the multimodal extras (timm, torchaudio,
# torchcodec), with torch pinned to the local CPU build.
DEPS = (
    "aiohttp",
    "anthropic",
    "blobfile==3.0.0",
    "build",
    "compressed-tensors==0.18.0",
    "datasets",
    "distro",
    "easydict",
    "einops",
    "fastapi",
    "gguf",
    "interegular",
    "IPython",
    "llguidance<2.0.0,>=1.7.6",
    "mistral_common>=1.11.5",
    "msgspec",
    "ninja",
    "numba==0.65.1",
    "numpy",
    "nvidia-ml-py",
    "openai==2.8.0",
    "openai-harmony==0.0.4",
    "orjson",
    "outlines==0.1.11",
    "packaging",
    "partial_json_parser",
    "pillow",
    "prometheus-client>=0.20.0",
    "psutil",
    "pybase64",
    "pydantic",
    "python-dateutil<3",
    "python-multipart",
    "pyzmq>=25.1.2",
    "regex",
    "requests",
    "scipy",
    "sentencepiece==0.2.1",
    "setproctitle",
    "soundfile==0.13.1",
    "tiktoken",
    "tokenizers==0.23.2",
    "transformers==5.19.0",
    "uvicorn>=0.51",
    "uvloop",
    "watchfiles",
    "xgrammar==0.2.7",
    "xxhash",
    "zstandard",
    "apache-tvm-ffi==0.1.11",
    "httpx",
    "triton",
)


def install() -> None:
    py = shutil.which("python3.11") or sys.executable
    if not VENV_PY.exists():
        subprocess.run([py, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV_PY), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0+cpu"], check=True)  # /opt/wheels via find-links
    subprocess.run([*pip, "--no-deps", f"sglang=={SGLANG_VERSION}"], check=True)
    subprocess.run([*pip, *DEPS, "torch==2.13.0+cpu"], check=True)
    subprocess.run([*pip, "--no-deps", "torchvision==0.28.0"], check=True)
    site = Path(
        subprocess.run(
            [str(VENV_PY), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    tv = site / "torchvision" / "__init__.py"
    text = tv.read_text()
    if TORCHVISION_OLD in text:
        tv.write_text(text.replace(TORCHVISION_OLD, TORCHVISION_NEW))
    shim = site / "sgl_kernel"
    shim.mkdir(exist_ok=True)
    (shim / "__init__.py").write_text(SHIM_SOURCE)
    check_venv()
    say(f"venv ready: {VENV}")


def check_venv() -> None:
    probe = (
        "import torch, torchvision.transforms, sglang, sgl_kernel, httpx;"
        "assert getattr(sgl_kernel, 'SHIM', False);"
        "print(torch.__version__, sglang.__version__)"
    )
    r = subprocess.run(
        [str(VENV_PY), "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"},
    )
    if r.returncode != 0:
        raise SystemExit(f"venv {VENV} not usable (run --install):\n{r.stderr[-2000:]}")


# ------------------------------------------------------------------ scenarios


@dataclass
class Scenario:
    name: str
    summary: str
    expected: str
    flags: tuple[str, ...]
    load: Load
    idle_s: float = 10.0
    env: dict[str, str] = field(default_factory=dict)


SCENARIOS = (
    Scenario(
        "healthy",
        "16,384-token pool, closed loop of 2, 64+128 tokens a request, 60 s",
        "healthy",
        ("--max-total-tokens", "16384"),
        Load(
            mode="closed",
            count=100_000,
            duration_s=60,
            concurrency=2,
            max_in_flight=1200,
            drain_s=60,
            max_tokens=128,
        ),
    ),
    Scenario(
        "retract",
        "4,096-token pool, open loop 3 req/s, 64+512 tokens a request, 120 s then cancel",
        "retraction (any class with retractions; the run measures how many)",
        ("--max-total-tokens", "4096"),
        Load(
            mode="open", count=100_000, duration_s=120, rate=3.0, max_in_flight=1200, max_tokens=512
        ),
        idle_s=15.0,
    ),
    Scenario(
        "startup_mem_fraction",
        "--mem-fraction-static 1e-05, no --max-total-tokens: the KV pool cannot be sized",
        "allocation_failure (start-up)",
        ("--mem-fraction-static", "0.00001"),
        Load(mode="closed", count=1, duration_s=1, max_tokens=1),  # never sent: start-up fails
    ),
)
BY_NAME = {s.name: s for s in SCENARIOS}


# ------------------------------------------------------------------- helpers


def vllm_running() -> list[str]:
    r = subprocess.run(["pgrep", "-af", VLLM_PATTERN], capture_output=True, text=True)
    me = str(os.getpid())
    return [ln for ln in r.stdout.splitlines() if ln and ln.split()[0] != me]


def wait_vllm_free() -> float:
    t0 = time.monotonic()
    while True:
        busy = vllm_running()
        if not busy:
            # The vLLM harness leaves only seconds between its scenarios: free twice,
            # 20 s apart, before starting.
            time.sleep(20)
            busy = vllm_running()
            if not busy:
                return round(time.monotonic() - t0, 1)
        if time.monotonic() - t0 > VLLM_WAIT_MAX_S:
            raise SystemExit(
                f"a vLLM server is still running after {VLLM_WAIT_MAX_S:.0f} s: {busy[:2]}"
            )
        say(f"vLLM running ({busy[0][:100]}), waiting 30 s")
        time.sleep(30)


class Server:
    def __init__(self, sc: Scenario, outdir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.cmd = [
            str(VENV_PY),
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(MODEL_DIR),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *COMMON_FLAGS,
            *sc.flags,
        ]
        self.env_extra = {"TZ": "UTC", "SGLANG_USE_CPU_ENGINE": "1", **sc.env}
        self.log = open(outdir / "server.log", "wb")  # noqa: SIM115
        self.started = time.time()
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env_extra},
            start_new_session=True,
            cwd=str(outdir),
        )

    def wait_health(self, timeout: float) -> str:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return "exited"
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(self.base + "/health", timeout=5, trust_env=False)
                if r.status_code == 200:
                    return "up"
            time.sleep(2)
        return "timeout"

    def stop(self) -> dict[str, Any]:
        info: dict[str, Any] = {"stop_requested_at": utc_iso()}
        pgid = self.proc.pid
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGINT)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                info["killed"] = True
        # Leftover children in the group (scheduler, detokenizer): give them the grace
        # period, then SIGKILL the group.
        t0 = time.monotonic()
        while group_alive(pgid) and time.monotonic() - t0 < STOP_GRACE_S:
            time.sleep(1)
        if group_alive(pgid):
            info["group_killed"] = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)
        info["exit_code"] = self.proc.returncode
        info["stopped_at"] = utc_iso()
        self.log.close()
        return info


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ----------------------------------------------------------------- load + scrape


def load_client(sc: Scenario, base: str, outdir: Path) -> Any:
    sys.path.insert(0, str(HERE))
    import load  # bench/engine/load.py

    argv = [
        f"--url={base}",
        f"--model={MODEL_NAME}",
        *sc.load.argv(),
        f"--out={outdir / 'client.json'}",
    ]
    client = load.Client(load.parse_args(argv))
    # SGLang reserves the full max_new_tokens for an `ignore_eos` request at admission
    # (schedule_policy.py: ratio 1.0 if ignore_eos), so an ignore_eos load can never make
    # it retract. These requests drop ignore_eos and set min_tokens = max_tokens: the
    # length is still exact arithmetic, and admission uses new_token_ratio.
    post = client.http.post

    async def exact_len_post(url: str, json: dict[str, Any], **kw: Any) -> Any:
        body = dict(json)
        body.pop("ignore_eos", None)
        body["min_tokens"] = body["max_tokens"]
        return await post(url, json=body, **kw)

    client.http.post = exact_len_post  # type: ignore[method-assign]
    return client


class VllmOverlap(Exception):
    """A vLLM server started while this scenario ran."""


class Scraper:
    def __init__(self, base: str, outdir: Path) -> None:
        self.base = base
        self.dir = outdir / "scrapes"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.scrapes: list[Scrape] = []
        self.vllm_seen: list[str] = []

    async def scrape(self, http: Any, phase: str) -> None:
        try:
            r = await http.get(self.base + "/metrics", timeout=20)
        except Exception as exc:
            say(f"scrape {phase}: {type(exc).__name__}")
            return
        at = utc_iso()
        if r.status_code != 200:
            say(f"scrape {phase}: HTTP {r.status_code}")
            return
        path = self.dir / f"{len(self.scrapes) + 1:03d}-{phase}.prom"
        path.write_bytes(f"# scraped_at: {at}\n".encode() + r.content)
        self.scrapes.append(Scrape(path, phase, at, parse_metrics(r.text)))


async def drive(sc: Scenario, srv: Server, outdir: Path) -> tuple[dict[str, Any], Scraper]:
    import httpx

    scraper = Scraper(srv.base, outdir)
    client = load_client(sc, srv.base, outdir)
    async with httpx.AsyncClient(trust_env=False) as http:
        await scraper.scrape(http, "before")
        task = asyncio.create_task(client.run())
        while True:
            done, _ = await asyncio.wait({task}, timeout=SCRAPE_INTERVAL_S)
            if done:
                break
            await scraper.scrape(http, "during")
            if busy := vllm_running():
                # Another engine on the same 2 cores: the run is not clean. Stop it
                # (the caller reruns the scenario once the machine is free).
                scraper.vllm_seen.append(f"{utc_iso()} {busy[0][:120]}")
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise VllmOverlap(scraper.vllm_seen[0])
        result = task.result()
        t_idle = time.monotonic() + sc.idle_s
        while time.monotonic() < t_idle:
            await asyncio.sleep(min(5.0, max(0.0, t_idle - time.monotonic())))
            await scraper.scrape(http, "idle")
        await scraper.scrape(http, "after")
    write_json(outdir / "client.json", result)
    return result, scraper


# ---------------------------------------------------------------- ground truth

_RETRACT = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")


def log_facts(log: str) -> dict[str, Any]:
    lines = log.splitlines()
    retract = [int(m.group(1)) for ln in lines if (m := _RETRACT.search(ln))]
    pick = lambda pat: next((ln for ln in lines if pat in ln), None)  # noqa: E731
    errors = [ln for ln in lines if re.search(r"\b[A-Z][A-Za-z]*Error\b: ", ln)][:12]
    return {
        "engine_log_retract_lines": len(retract),
        "engine_log_retracted_reqs_sum": sum(retract),
        "engine_log_decode_batch_lines": sum("Decode batch," in ln for ln in lines),
        "engine_log_prefill_batch_lines": sum("Prefill batch," in ln for ln in lines),
        "max_total_num_tokens_line": pick("max_total_num_tokens="),
        "kv_cache_allocated_line": pick("KV Cache is allocated."),
        "error_lines": errors,
    }


def metric_truth(scrapes: list[Scrape]) -> dict[str, Any]:
    if not scrapes:
        return {"scrapes": 0}
    first, last = scrapes[0], scrapes[-1]

    def delta(name: str) -> dict[str, Any]:
        a, b = first.total(name), last.total(name)
        # A labelled prometheus_client Counter has no sample until its first inc():
        # absent means 0 here.
        a0, b0 = a or 0.0, b or 0.0
        return {"first": a, "last": b, "delta": b0 - a0}

    def peak(name: str) -> float | None:
        vals = [v for s in scrapes if (v := s.peak(name)) is not None]
        return max(vals) if vals else None

    return {
        "scrapes": len(scrapes),
        "sglang:num_retracted_requests_total": delta("sglang:num_retracted_requests_total"),
        "sglang:num_retracted_input_tokens_total": delta("sglang:num_retracted_input_tokens_total"),
        "sglang:num_retracted_output_tokens_total": delta(
            "sglang:num_retracted_output_tokens_total"
        ),
        "sglang:num_requests_total": delta("sglang:num_requests_total"),
        "sglang:e2e_request_latency_seconds_count": delta(
            "sglang:e2e_request_latency_seconds_count"
        ),
        "sglang:generation_tokens_total": delta("sglang:generation_tokens_total"),
        "sglang:prompt_tokens_total": delta("sglang:prompt_tokens_total"),
        "max_sglang:token_usage": peak("sglang:token_usage"),
        "max_sglang:num_used_tokens": peak("sglang:num_used_tokens"),
        "max_sglang:num_running_reqs": peak("sglang:num_running_reqs"),
        "max_sglang:num_queue_reqs": peak("sglang:num_queue_reqs"),
        "max_sglang:num_retracted_reqs": peak("sglang:num_retracted_reqs"),
        "max_sglang:new_token_ratio": peak("sglang:new_token_ratio"),
        "sglang:max_total_num_tokens": last.peak("sglang:max_total_num_tokens"),
    }


def pick_fixture_scrapes(scrapes: list[Scrape]) -> list[tuple[str, Scrape]]:
    if not scrapes:
        return []
    mid = [s for s in scrapes[1:-1] if s.phase in ("during", "idle")]
    chosen = [("1-before", scrapes[0])]
    if mid:
        best = max(
            mid,
            key=lambda s: (
                s.peak("sglang:token_usage") or 0.0,
                s.peak("sglang:num_queue_reqs") or 0.0,
            ),
        )
        chosen.append(("2-during", best))
    chosen.append(("3-after", scrapes[-1]))
    return chosen


# ------------------------------------------------------------------------ run


def run_scenario(sc: Scenario, tries: int = 6) -> dict[str, Any]:
    for attempt in range(1, tries + 1):
        try:
            truth = run_once(sc)
        except VllmOverlap as exc:
            say(f"{sc.name}: vLLM started during the run ({exc}); discarded, retrying")
            continue
        truth["attempt"] = attempt
        write_json(OUT / sc.name / "ground_truth.json", truth)
        return truth
    raise SystemExit(f"{sc.name}: no clean run in {tries} tries (vLLM kept starting)")


def run_once(sc: Scenario) -> dict[str, Any]:
    outdir = OUT / sc.name
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    waited = wait_vllm_free()
    say(f"{sc.name}: starting sglang ({sc.summary})")
    t0 = time.monotonic()
    srv = Server(sc, outdir)
    truth: dict[str, Any] = {
        "scenario": sc.name,
        "summary": sc.summary,
        "expected_class": sc.expected,
        "engine": f"sglang {SGLANG_VERSION} (CPU, SGLANG_USE_CPU_ENGINE=1, sgl_kernel CPU shim; see sglang_harness.py)",
        "model": "tiny-llama (bench/engine/make_model.py)",
        "server_flags": [*COMMON_FLAGS, *sc.flags],
        "server_env": srv.env_extra,
        "command": " ".join(srv.cmd),
        "load": {k: v for k, v in vars(sc.load).items()},
        "waited_for_vllm_s": waited,
        "started_at": utc_iso(srv.started),
    }
    client: dict[str, Any] = {}
    scrapes: list[Scrape] = []
    try:
        state = srv.wait_health(HEALTH_TIMEOUT_S)
        truth["startup_result"] = state
        truth["startup_seconds"] = round(time.monotonic() - t0, 1)
        say(f"{sc.name}: {state} after {truth['startup_seconds']} s")
        if state == "up":
            if busy := vllm_running():
                raise VllmOverlap(busy[0][:120])
            client, scraper = asyncio.run(drive(sc, srv, outdir))
            scrapes = scraper.scrapes
    finally:
        truth.update(srv.stop())
    log = (outdir / "server.log").read_text("utf-8", "replace")
    truth["wall_seconds"] = round(time.monotonic() - t0, 1)
    truth["client"] = {
        k: client.get(k)
        for k in (
            "sent",
            "completed",
            "failed",
            "cancelled",
            "dropped_at_cap",
            "completion_tokens",
            "max_in_flight_seen",
            "latency_p50_s",
            "latency_p95_s",
            "latency_max_s",
            "errors",
        )
    }
    truth["metrics"] = metric_truth(scrapes)
    truth.update(log_facts(log))
    truth["server_log_bytes"] = len(log.encode())
    write_json(outdir / "ground_truth.json", truth)
    m = truth["metrics"]
    say(
        f"{sc.name}: done, completed {client.get('completed')}, retracted "
        f"{m.get('sglang:num_retracted_requests_total', {}).get('delta')}, log retract lines "
        f"{truth['engine_log_retract_lines']}, exit {truth.get('exit_code')}"
    )
    return truth


def record(name: str) -> None:
    src, dst = OUT / name, FIXTURES / name
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for fname in ("server.log", "ground_truth.json", "client.json"):
        if (src / fname).exists():
            shutil.copy2(src / fname, dst / fname)
    scrapes = [
        Scrape(p, p.stem.split("-", 1)[1], "", parse_metrics(p.read_text()))
        for p in sorted((src / "scrapes").glob("*.prom"))
    ]
    for label, s in pick_fixture_scrapes(scrapes):
        shutil.copy2(s.path, dst / f"metrics-{label}.prom")
    say(f"recorded {dst.relative_to(REPO)}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("scenarios", nargs="*")
    p.add_argument("--install", action="store_true", help="make/repair the venv, then exit")
    p.add_argument("--list", action="store_true")
    p.add_argument("--record", action="store_true", help="copy fixtures into tests/fixtures/")
    a = p.parse_args(argv)
    if a.install:
        install()
        return 0
    if a.list:
        for s in SCENARIOS:
            print(f"{s.name:10} {' '.join(s.flags):28} {s.summary}")
        return 0
    # SIGTERM -> SystemExit, so `finally` stops the server's process group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = a.scenarios or [s.name for s in SCENARIOS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"unknown scenario(s): {unknown}")
    if Path(sys.prefix).resolve() != VENV.resolve():
        check_venv()
        os.execv(str(VENV_PY), [str(VENV_PY), __file__, *argv])
    if not (MODEL_DIR / "config.json").exists():
        raise SystemExit(f"no model at {MODEL_DIR} (bench/engine/make_model.py)")
    for n in names:
        run_scenario(BY_NAME[n])
        if a.record:
            record(n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
