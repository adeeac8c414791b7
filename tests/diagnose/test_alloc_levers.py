"""The runtime CUDA OOM lever when the dying engine core names its trigger: one
request's prompt logprobs over a long prompt (diagnose/alloc_levers.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from builders import analyze_lines

# vLLM 0.32 start-up and failure lines. DUMP was printed by vLLM 0.32.0's own
# dump_input.prepare_object_to_dump on a real SchedulerOutput (two new requests, the
# second with prompt_logprobs=1); the others follow the 0.32 source's wording.
ARGS = (
    "(APIServer pid=7) INFO 12-02 01:00:00 [api_utils.py:286] non-default args: "
    "{{'model': '/models/llama-3.1-8b', 'max_model_len': 8192, 'gpu_memory_utilization': {util}}}"
)
CHUNK = (
    "(APIServer pid=7) INFO 12-02 01:00:01 [scheduler.py:308] Chunked prefill is enabled "
    "with max_num_batched_tokens={mbt}."
)
STATS = (
    "(APIServer pid=7) INFO 12-02 01:09:{s:02d} [loggers.py:259] Engine 000: Avg prompt "
    "throughput: 410.0 tokens/s, Avg generation throughput: 95.0 tokens/s, Running: 6 reqs, "
    "Waiting: 0 reqs, GPU KV cache usage: 3.1%, Prefix cache hit rate: 0.0%"
)
DUMP = """(EngineCore pid=4242) ERROR 12-02 01:10:07 [dump_input.py:79] Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[NewRequestData(req_id=chatcmpl-77aa,prompt_token_ids_len=312,prefill_token_ids_len=None,mm_features=[],sampling_params=SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.7, watermarking=None, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], stop_token_ids=[], bad_words=[], thinking_token_budget=None, include_stop_str_in_output=False, ignore_eos=False, max_tokens=256, min_tokens=0, logprobs=None, prompt_logprobs=None, skip_special_tokens=True, spaces_between_special_tokens=True, structured_outputs=None, extra_args=None),block_ids=([4],),num_computed_tokens=0,lora_request=None,prompt_embeds_shape=None), NewRequestData(req_id=cmpl-4db1df93397441569bf85d1143e15c55-0,prompt_token_ids_len=4186,prefill_token_ids_len=None,mm_features=[],sampling_params=SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.0, watermarking=None, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], stop_token_ids=[], bad_words=[], thinking_token_budget=None, include_stop_str_in_output=False, ignore_eos=False, max_tokens=1, min_tokens=0, logprobs=None, prompt_logprobs=1, skip_special_tokens=True, spaces_between_special_tokens=True, structured_outputs=None, extra_args=None),block_ids=([1, 2, 3],),num_computed_tokens=0,lora_request=None,prompt_embeds_shape=None)], scheduled_cached_reqs=CachedRequestData(req_ids=[],resumed_req_ids=set(),new_token_ids_lens=[],all_token_ids_lens={},new_block_ids=[],num_computed_tokens=[],num_output_tokens=[]), num_scheduled_tokens={chatcmpl-77aa: 312, cmpl-4db1df93397441569bf85d1143e15c55-0: 4186}, total_num_scheduled_tokens=4498, scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, finished_req_ids=[], free_encoder_mm_hashes=[], scheduled_encoder_input_stats=null, preempted_req_ids=null, has_structured_output_requests=false, pending_structured_output_tokens=false, num_invalid_spec_tokens=null, kv_connector_metadata=null, has_sync_kv_loads=false, aux_output_connector_metadata=null, ec_connector_metadata=null, ec_manager_metadata=null, new_block_ids_to_zero=null, kv_cache_block_copies=null, kv_connector_block_state=null, num_spec_tokens_to_schedule=0, num_common_prefix_blocks=[])"""
OOM = (
    "(EngineCore pid=4242) ERROR 12-02 01:10:07 [core.py:1110] torch.OutOfMemoryError: CUDA "
    "out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of 79.19 GiB of "
    "which {free} is free. Including non-PyTorch memory, this process has 77.96 GiB memory "
    "in use."
)


def _log(util: str = "0.95", mbt: int = 8192, dump: str = DUMP, tried: str = "2.00 GiB",
         free: str = "1.21 GiB") -> list[str]:  # fmt: skip
    return [
        ARGS.format(util=util),
        CHUNK.format(mbt=mbt),
        *(STATS.format(s=s) for s in (7, 17, 27, 37, 47, 57)),
        dump,
        OOM.format(tried=tried, free=free),
    ]


def _lever(capsys: Any, tmp_path: Path, lines: list[str]) -> dict[str, Any]:
    code, report = analyze_lines(capsys, tmp_path, lines)
    assert code == 1 and report["verdict"]["class"] == "allocation_failure"
    lever: dict[str, Any] = report["lever"]
    return lever


def test_prompt_logprobs_trigger_bounds_the_chunk(capsys: Any, tmp_path: Path) -> None:
    lever = _lever(capsys, tmp_path, _log())
    assert (lever["knob"], lever["current"], lever["proposed"]) == (
        "--max-num-batched-tokens", "8192", "2048",
    )  # fmt: skip
    math = lever["arithmetic"]
    log = tmp_path / "built.log"
    assert math[0].startswith(
        f"trigger: request cmpl-4db1df93397441569bf85d1143e15c55-0 asked for prompt logprobs "
        f"over a 4,186-token prompt [{log}:9]; its scheduled chunk was 4,186 tokens"
    )
    assert math[1] == (
        f"the allocation that failed: 2.00 GiB tried - 1.21 GiB free = 0.79 GiB short [{log}:10]"
    )
    # floor(4186 x 1.21 / 2.00) = floor(2532.53) = 2532 -> 2048
    assert math[2] == (
        "tokens whose logits fit what was free: floor(4,186 x 1.21 GiB / 2.00 GiB) = 2,532; "
        "the largest power of two at or under it: 2,048"
    )
    assert math[3] == (
        "a 2,048-token chunk needs 2,048 / 4,186 x 2.00 GiB = 0.98 GiB <= 1.21 GiB free; "
        f"current budget: 8,192 [{log}:2]"
    )
    assert "4,186 prompt tokens" in lever["rationale"]
    assert "--max-num-batched-tokens 2048" in lever["apply"]
    assert "--max-num-batched-tokens 8192" in lever["rollback"]


def test_without_prompt_logprobs_the_memory_fraction_steps_back(
    capsys: Any, tmp_path: Path
) -> None:
    lines = _log(dump=DUMP.replace("prompt_logprobs=1", "prompt_logprobs=None"))
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["current"], lever["proposed"]) == (
        "--gpu-memory-utilization", "0.95", "0.90",
    )  # fmt: skip
    math = lever["arithmetic"]
    assert not any("trigger" in m for m in math)
    # 0.79 GiB short; 0.05 x 79.19 GiB = 3.96 GiB freed by the step back
    assert math[1] == "the allocation that failed: 2.00 GiB tried - 1.21 GiB free = 0.79 GiB short"
    assert math[2] == "0.05 x 79.19 GiB total = 3.96 GiB freed for activations (enough)"


@pytest.mark.parametrize(
    ("why", "overrides"),
    [
        # 120 MiB free: floor(4186 x 120 / 2048) = 245 tokens, too small a chunk to be useful
        ("too little free", {"free": "120.00 MiB"}),
        # the budget is already at or under the power of two that fits
        ("budget already small", {"mbt": 2048}),
    ],
)
def test_chunk_lever_stands_down(
    capsys: Any, tmp_path: Path, why: str, overrides: dict[str, Any]
) -> None:
    lever = _lever(capsys, tmp_path, _log(**overrides))
    assert lever["knob"] == "--gpu-memory-utilization", why


def test_budget_not_in_the_log_is_not_shown_as_current(capsys: Any, tmp_path: Path) -> None:
    lines = [ln for ln in _log() if "Chunked prefill" not in ln]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["current"], lever["proposed"]) == (
        "--max-num-batched-tokens", None, "2048",
    )  # fmt: skip
    assert lever["arithmetic"][3].endswith("current budget: not in the log")


# vLLM 0.34.0 start-up on CUDA with its extensible KV cache (on by default there): the
# failure's hint says how the cache was sized. The wordings are 0.34.0's released
# source (kv_cache_planning.py, _more_kv_cache_memory_hint; core.py:1757 logs the
# traceback); no real run here (the CPU build stops at 0.32.0).
ARGS_034 = (
    "(APIServer pid=7) INFO 11-20 14:02:50 [startup.py:96] non-default args: "
    "{{'model': '/models/llama-3.1-70b', 'max_model_len': 32768{more}}}"
)
NO_CACHE_034 = (
    "(EngineCore pid=4310) ERROR 11-20 14:03:07 [core.py:1757] ValueError: No available "
    "memory for the cache blocks. {hint} See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)
ALL_TAKEN = (
    "The extensible KV cache already takes all device memory left after the model and its "
    "activations; decrease `max_model_len` or `max_num_seqs`, or the model needs a device "
    "with more memory."
)
CAPPED = (
    "The KV cache gets what is left after the model and its activations within "
    "`gpu_memory_utilization`=0.85; increase it (with the extensible KV cache it defaults to "
    "1.0) or decrease `max_model_len` or `max_num_seqs`."
)
AFTER_WARMUP = (
    "(EngineCore pid=4310) ERROR 11-20 14:03:07 [core.py:1757] ValueError: Cannot auto-fit "
    "max_model_len: not enough GPU memory available to serve even a single token. CUDA graph "
    "capture and warmup left no memory for the KV cache. Increase `gpu_memory_utilization`, "
    "reduce the memory CUDA graphs take (fewer or smaller capture sizes in the compilation "
    "config), or use more GPUs."
)


def test_extensible_cache_given_all_memory_halves_max_num_seqs(capsys: Any, tmp_path: Path) -> None:
    lines = [ARGS_034.format(more=", 'max_num_seqs': 512"), NO_CACHE_034.format(hint=ALL_TAKEN)]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["current"], lever["proposed"]) == ("--max-num-seqs", "512", "256")
    assert lever["arithmetic"] == [
        "the error says the extensible KV cache (vLLM 0.34) already had all the device memory "
        "left after the model, its activations and warmup: a higher gpu_memory_utilization "
        "cannot add any",
        "max_num_seqs 512 / 2 = 256: the activation peak and the CUDA graphs warmup measured "
        "grow with it",
    ]
    assert lever["do_not"].startswith("do not raise --gpu-memory-utilization")


def test_extensible_cache_without_max_num_seqs_in_the_log_names_the_defaults(
    capsys: Any, tmp_path: Path
) -> None:
    lines = [ARGS_034.format(more=""), NO_CACHE_034.format(hint=ALL_TAKEN)]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["current"], lever["proposed"]) == ("--max-num-seqs", None, "128")
    assert lever["arithmetic"][1] == (
        "max_num_seqs is not in the log: 256 assumed (default_max_num_seqs; vLLM 0.34's own is "
        "256, 1024 on a GPU of 70 GiB or more) / 2 = 128: the activation peak and the CUDA "
        "graphs warmup measured grow with it"
    )


def test_extensible_cache_capped_by_the_fraction_lifts_the_cap(capsys: Any, tmp_path: Path) -> None:
    lines = [
        ARGS_034.format(more=", 'gpu_memory_utilization': 0.85"),
        NO_CACHE_034.format(hint=CAPPED),
    ]
    lever = _lever(capsys, tmp_path, lines)
    # not the old +0.05 step (0.90), which keeps the cache capped
    assert (lever["knob"], lever["current"], lever["proposed"]) == (
        "--gpu-memory-utilization", "0.85", "1.0",
    )  # fmt: skip
    assert lever["arithmetic"][0] == (
        "the error says the KV cache got what was left within gpu_memory_utilization=0.85: "
        "0.15 of the device's memory was held out of it"
    )


@pytest.mark.parametrize(
    ("more", "want"),
    [
        (", 'gpu_memory_utilization': 0.9", ("--gpu-memory-utilization", "0.9", "1.0")),
        # no fraction in the log: the mode's 1.0, so the graphs must shrink
        ("", ("--max-num-seqs", None, "128")),
    ],
)
def test_extensible_cache_left_nothing_after_warmup(
    capsys: Any, tmp_path: Path, more: str, want: tuple[str, str | None, str]
) -> None:
    lever = _lever(capsys, tmp_path, [ARGS_034.format(more=more), AFTER_WARMUP])
    assert (lever["knob"], lever["current"], lever["proposed"]) == want


def test_older_no_cache_memory_still_steps_the_fraction(capsys: Any, tmp_path: Path) -> None:
    # 0.32's wording (no extensible KV cache): the small step from 0.90 stays
    lines = [
        ARGS_034.format(more=""),
        NO_CACHE_034.format(
            hint="Try increasing `gpu_memory_utilization` when initializing the engine."
        ),
    ]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["current"], lever["proposed"]) == (
        "--gpu-memory-utilization", None, "0.95",
    )  # fmt: skip


BANNER = (
    "(APIServer pid=7) INFO 11-20 14:02:50 [startup.py:18] vLLM server version {v}, serving "
    "model /models/llama-3.1-70b"
)
OLD_HINT = (
    "Try increasing `gpu_memory_utilization` when initializing the engine (this flag also "
    "controls CPU memory reservation on the CPU backend, despite its name)."
)


@pytest.mark.parametrize(
    ("banner", "first"),
    [
        # 0.92 since 0.32 (a real 0.32.0's own error says so): the step is capped
        (
            [BANNER.format(v="0.34.0")],
            "0.92 (vLLM 0.34.0's default 0.92, assumed: not in the log) + 0.05 = 0.97, "
            "capped at 0.95",
        ),
        (
            [BANNER.format(v="0.32.0")],
            "0.92 (vLLM 0.32.0's default 0.92, assumed: not in the log) + 0.05 = 0.97, "
            "capped at 0.95",
        ),
        # no version in the log (or an older one): the 0.90 of older releases
        (
            [],
            "0.90 (default 0.90, assumed: not in the log) + 0.05 = 0.95 (a small step, capped at 0.95)",
        ),
        (
            [BANNER.format(v="0.10.1")],
            "0.90 (default 0.90, assumed: not in the log) + 0.05 = 0.95 (a small step, capped at 0.95)",
        ),
    ],
)
def test_the_assumed_memory_fraction_is_the_engine_versions_default(
    capsys: Any, tmp_path: Path, banner: list[str], first: str
) -> None:
    lines = [*banner, ARGS_034.format(more=""), NO_CACHE_034.format(hint=OLD_HINT)]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["current"], lever["proposed"]) == (
        "--gpu-memory-utilization", None, "0.95",
    )  # fmt: skip
    assert lever["arithmetic"][0] == first


def test_extensible_cache_halves_the_configured_default_max_num_seqs(
    capsys: Any, tmp_path: Path
) -> None:
    # A fleet whose engines run 1024 by default says so once, in the thresholds.
    (tmp_path / "preemptdiag.toml").write_text("[thresholds]\ndefault_max_num_seqs = 1024\n")
    log = tmp_path / "built.log"
    log.write_text(
        "\n".join([ARGS_034.format(more=""), NO_CACHE_034.format(hint=ALL_TAKEN)]) + "\n"
    )
    from preemptdiag.cli import main

    code = main(
        ["analyze", "--format", "json", "--config", str(tmp_path / "preemptdiag.toml"), str(log)]
    )
    lever = json.loads(capsys.readouterr().out)["lever"]
    assert code == 1
    assert (lever["knob"], lever["current"], lever["proposed"]) == ("--max-num-seqs", None, "512")
    assert lever["arithmetic"][1].startswith(
        "max_num_seqs is not in the log: 1024 assumed (default_max_num_seqs; vLLM 0.34's own"
    )


BARE_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 3 has a "
    "total capacity of 184.00 GiB of which 2.21 GiB is free. Including non-PyTorch memory, "
    "this process has 181.77 GiB memory in use."
)


def test_a_lever_for_a_log_that_names_no_engine_says_whose_flag_it_is(
    capsys: Any, tmp_path: Path
) -> None:
    # A lone traceback line (an SGLang decode worker's, in the shared corpus): the flag
    # is vLLM's, and the report says so and names SGLang's.
    lever = _lever(capsys, tmp_path, [BARE_OOM])
    assert lever["knob"] == "--max-num-batched-tokens"
    assert lever["rationale"].endswith(
        "; the log does not say which engine printed it: --max-num-batched-tokens is vLLM's "
        "flag (on SGLang: --chunked-prefill-size)"
    )


def test_a_vllm_log_gets_no_engine_caveat(capsys: Any, tmp_path: Path) -> None:
    lever = _lever(capsys, tmp_path, [BANNER.format(v="0.32.0"), BARE_OOM])
    assert lever["knob"] == "--max-num-batched-tokens"
    assert "does not say which engine" not in lever["rationale"]


@pytest.mark.parametrize("util", ["0.95", "0.98"])
def test_a_start_up_failure_at_a_high_fraction_shrinks_the_activation_peak(
    capsys: Any, tmp_path: Path, util: str
) -> None:
    # The +0.05 step stops at 0.95: from there it proposed 0.95 again (or lower), a
    # lever that changes nothing.
    lines = [
        ARGS_034.format(more=f", 'gpu_memory_utilization': {util}"),
        CHUNK.format(mbt=8192),
        NO_CACHE_034.format(hint=OLD_HINT),
    ]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["current"], lever["proposed"]) == (
        "--max-num-batched-tokens", "8192", "4096",
    )  # fmt: skip
    assert lever["arithmetic"] == [
        f"gpu_memory_utilization is already {util} (the step's cap is 0.95): the profiled "
        "activation peak is what left no room for KV blocks",
        "halve the per-step token budget (8192 / 2 = 4096) to lower the activation peak",
    ]


# A runtime CUDA OOM under vLLM 0.34's extensible KV cache (on by default on CUDA and
# ROCm). That cache takes all memory warmup left beyond the activation peak it
# measured, and torch 2.14's allocator is then capped ("N allowed;"). The sizing lines
# are 0.34.0's released source (extensible_kv_cache.py:536, 693); the OOM is torch
# 2.14.0's message (its libc10_cuda.so); no real run here (no GPU).
EXTENDED = (
    "(Worker pid=4388) INFO 11-20 14:03:07 [extensible_kv_cache.py:536] Extended KV cache to "
    "18815 blocks (64.31 GiB)."
)
AFTER_WARMUP_034 = (
    "(Worker pid=4388) INFO 11-20 14:03:06 [extensible_kv_cache.py:693] Memory after warmup: "
    "66.12 GiB free, 0.5 GiB committed to the KV cache, 1.83 GiB kept for transient "
    "activations (1.83 GiB allocated at peak, 1.2 GiB of torch reservation growth); 18815 KV "
    "cache blocks (64.31 GiB) fit within the requested 79.19 GiB. Torch may reserve up to 6.4 "
    "GiB."
)
DISABLED = (
    "(EngineCore pid=4310) WARNING 11-20 14:03:01 [abstract.py:175] Disabling the extensible "
    "KV cache: the worker does not support it. The KV cache will be sized from profiling "
    "estimates instead of measured memory."
)
OOM_214 = (
    "(EngineCore pid=4310) ERROR 11-20 15:10:07 [core.py:1110] torch.OutOfMemoryError: CUDA "
    "out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
    "which {free} is free. Including non-PyTorch memory, this process has 77.96 GiB memory in "
    "use. 76.70 GiB allowed; Of the allocated memory 75.10 GiB is allocated by PyTorch, and "
    "1.32 GiB is reserved by PyTorch but unallocated."
)
START_034 = [
    BANNER.format(v="0.34.0"),
    ARGS_034.format(more=""),
    CHUNK.format(mbt=8192),
]
# Serving: the start got past warmup (an OOM before that is warmup's own).
SERVING_034 = [STATS.replace("12-02 01:09:", "11-20 15:09:").format(s=s) for s in (17, 27)]
EXTENSIBLE_FIRST = (
    "vLLM 0.34.0 sized the KV cache from the memory measured after warmup (the log shows "
    "`Extended KV cache to 18815 blocks (64.31 GiB)` [{log}:{n}]): it took all the device "
    "left beyond the activation peak warmup saw and a margin"
)


def test_extensible_cache_runtime_oom_fixes_the_kv_size_below_the_cache(
    capsys: Any, tmp_path: Path
) -> None:
    # Not the old levers: a smaller token budget lowers the peak warmup measures, and the
    # cache grows into what it frees; a 0.90 "step back" is no step from 1.0's cache.
    lines = [*START_034, EXTENDED, OOM_214.format(free="1.21 GiB")]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["current"], lever["proposed"]) == (
        "--kv-cache-memory-bytes", None, "62G",
    )  # fmt: skip
    assert lever["arithmetic"] == [
        EXTENSIBLE_FIRST.format(log=tmp_path / "built.log", n=4),
        "the allocation that failed: 2.00 GiB tried - 1.21 GiB free = 0.79 GiB short",
        # 64.31 - 0.79 - 1 = 62.52 -> 62 (the flag's G takes whole GiB)
        "64.31 GiB (the cache) - 0.79 GiB short - 1 GiB margin (vLLM's own floor on CUDA) = 62.52 "
        "GiB -> 62G (whole GiB, rounded down): 2.31 GiB more stays free for what warmup did "
        "not measure",
    ]
    assert lever["verify"] == (
        "no CUDA OOM under the same load; the engine logs `reserved 62.00 GiB memory for KV "
        "Cache as specified by kv_cache_memory_bytes`"
    )
    assert lever["do_not"].startswith("do not lower --max-num-batched-tokens or --max-num-seqs")
    assert "--kv-cache-memory-bytes 62G" in lever["apply"]
    assert lever["rollback"].startswith(
        "restore the launch command without --kv-cache-memory-bytes (its default)"
    )


def test_extensible_cache_size_read_from_the_memory_after_warmup_line(
    capsys: Any, tmp_path: Path
) -> None:
    lines = [*START_034, AFTER_WARMUP_034, OOM_214.format(free="1.21 GiB")]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["proposed"]) == ("--kv-cache-memory-bytes", "62G")
    log = tmp_path / "built.log"
    assert lever["arithmetic"][0] == (
        "vLLM 0.34.0 sized the KV cache from the memory measured after warmup (the log shows "
        "`Memory after warmup: ... 18815 KV cache blocks (64.31 GiB) fit ...` "
        f"[{log}:4]): it took all the device left beyond the 1.83 GiB warmup kept for "
        f"transient activations [{log}:4] and a margin"
    )


def test_extensible_cache_oom_the_device_had_room_for_frees_the_margin(
    capsys: Any, tmp_path: Path
) -> None:
    # 2.00 GiB tried with 2.50 GiB free: the cap vLLM put on torch's allocator refused
    # it. A fixed KV size turns the extensible cache, and its cap, off.
    lines = [*START_034, EXTENDED, OOM_214.format(free="2.50 GiB")]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["proposed"]) == ("--kv-cache-memory-bytes", "63G")
    assert lever["arithmetic"][1:] == [
        "the allocation that failed: 2.00 GiB tried with 2.50 GiB free on the device: "
        "fragmentation or a cap on torch's allocator refused it, not the device",
        "64.31 GiB (the cache) - 1 GiB margin (vLLM's own floor on CUDA) = 63.31 GiB -> 63G (whole "
        "GiB, rounded down): 1.31 GiB more stays free for what warmup did not measure",
    ]


def test_extensible_cache_without_its_size_lowers_the_cap_below_what_was_held(
    capsys: Any, tmp_path: Path
) -> None:
    # The release says the cache was extensible; no sizing line says how large. The
    # process held 77.96 GiB when it failed: (77.96 - 0.79 - 1) / 79.19 = 0.9619 -> 0.96.
    lines = [*START_034, *SERVING_034, OOM_214.format(free="1.21 GiB")]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["current"], lever["proposed"]) == (
        "--gpu-memory-utilization", None, "0.96",
    )  # fmt: skip
    assert lever["arithmetic"][0].startswith(
        "vLLM 0.34.0 sized the KV cache from the memory measured after warmup (its default "
        "on CUDA and ROCm)"
    )
    assert lever["arithmetic"][2] == (
        "(77.96 GiB the process held - 0.79 GiB - 1 GiB margin) / 79.19 GiB total = 0.9619 "
        "-> 0.96, rounded down, from 1.00 (the mode's default: not in the log): a budget "
        "that far below what the process held when it failed is taken from the cache (the "
        "next run's `Extended KV cache` line shows how much)"
    )


def test_extensible_cache_oom_without_figures_steps_the_cap(capsys: Any, tmp_path: Path) -> None:
    bare = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    lines = [*START_034, *SERVING_034, bare]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["proposed"]) == ("--gpu-memory-utilization", "0.95")
    assert lever["arithmetic"][1:] == [
        "the error carries no device total: 1.00 (the mode's default: not in the log) - 0.05 = 0.95"
    ]


@pytest.mark.parametrize(
    ("why", "lines"),
    [
        ("cache disabled", [*START_034, DISABLED]),
        (
            "a KV size of its own",
            [BANNER.format(v="0.34.0"), ARGS_034.format(more=", 'kv_cache_memory_bytes': 60000000000"), CHUNK.format(mbt=8192)],
        ),
        (
            "turned off",
            [BANNER.format(v="0.34.0"), ARGS_034.format(more=", 'enable_extensible_kv_cache': False"), CHUNK.format(mbt=8192)],
        ),
        # an earlier start grew the cache; the restart that failed sized its own
        (
            "restarted with a KV size",
            [
                *START_034,
                EXTENDED,
                ARGS_034.format(more=", 'kv_cache_memory_bytes': 60000000000").replace(
                    "14:02:50", "15:00:00"
                ),
            ],
        ),
        ("older release", [BANNER.format(v="0.33.0"), ARGS_034.format(more=""), CHUNK.format(mbt=8192)]),
    ],
)  # fmt: skip
def test_a_kv_cache_sized_the_old_way_keeps_the_old_runtime_lever(
    capsys: Any, tmp_path: Path, why: str, lines: list[str]
) -> None:
    lever = _lever(capsys, tmp_path, [*lines, *SERVING_034, OOM_214.format(free="1.21 GiB")])
    assert (lever["knob"], lever["proposed"]) == ("--max-num-batched-tokens", "4096"), why


def test_an_oom_the_device_had_room_for_claims_no_negative_shortfall(
    capsys: Any, tmp_path: Path
) -> None:
    lines = _log(dump=DUMP.replace("prompt_logprobs=1", "prompt_logprobs=None"), free="2.50 GiB")
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["proposed"]) == ("--gpu-memory-utilization", "0.90")
    assert lever["arithmetic"][1:] == [
        "the allocation that failed: 2.00 GiB tried with 2.50 GiB free on the device: "
        "fragmentation or a cap on torch's allocator refused it, not the device"
    ]


@pytest.mark.parametrize(
    "lines",
    [
        START_034,
        # a restart: the earlier start's sizing line is not this start's
        [*START_034, EXTENDED, *SERVING_034, ARGS_034.format(more="").replace("14:02:50", "15:20:00")],
    ],
    ids=["first start", "restart"],
)  # fmt: skip
def test_an_oom_in_warmup_keeps_the_smaller_token_budget(
    capsys: Any, tmp_path: Path, lines: list[str]
) -> None:
    # Before the cache is sized, warmup runs steps of max_num_batched_tokens: a smaller
    # budget is the lever there, extensible cache or not.
    oom = OOM_214.format(free="1.21 GiB").replace("15:10:07", "15:30:00")
    lever = _lever(capsys, tmp_path, [*lines, oom])
    assert (lever["knob"], lever["proposed"]) == ("--max-num-batched-tokens", "4096")


def test_each_rank_sizes_its_own_cache_and_the_failed_ranks_size_counts(
    capsys: Any, tmp_path: Path
) -> None:
    # Tensor parallel: each worker prints its own sizing line; TP0's comes last, but
    # TP1 failed, so its 64.31 GiB is the size to cut: 64.31 - 0.79 - 1 = 62.52 -> 62G
    # (TP0's 61.31 would give 59G).
    tp = EXTENDED.replace("(Worker pid=4388)", "(Worker_TP{r} pid=438{r})")
    lines = [
        *START_034,
        tp.format(r=1),
        tp.format(r=0).replace("18815 blocks (64.31 GiB)", "17937 blocks (61.31 GiB)"),
        OOM_214.format(free="1.21 GiB").replace("(EngineCore pid=4310)", "(Worker_TP1 pid=4381)"),
    ]
    lever = _lever(capsys, tmp_path, lines)
    assert (lever["knob"], lever["proposed"]) == ("--kv-cache-memory-bytes", "62G")
    assert "`Extended KV cache to 18815 blocks (64.31 GiB)`" in lever["arithmetic"][0]


def test_on_rocm_the_margin_is_vllms_rocm_floor(capsys: Any, tmp_path: Path) -> None:
    # vLLM keeps 3 GiB on ROCm (kernel scratch is mapped outside the allocator):
    # 64.31 - 0.79 - 3 = 60.52 -> 60G.
    hip = OOM_214.format(free="1.21 GiB").replace("CUDA out of memory", "HIP out of memory")
    lever = _lever(capsys, tmp_path, [*START_034, EXTENDED, hip])
    assert (lever["knob"], lever["proposed"]) == ("--kv-cache-memory-bytes", "60G")
    assert lever["arithmetic"][2].startswith(
        "64.31 GiB (the cache) - 0.79 GiB short - 3 GiB margin (vLLM's own floor on ROCm) = "
        "60.52 GiB -> 60G"
    )
    assert lever["verify"].startswith("no HIP OOM under the same load")
