"""timeline.knobs: a replica's configuration and KV capacity from its start-up lines."""

from __future__ import annotations

from builders import make_event

from preemptdiag.model.records import Kind
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
