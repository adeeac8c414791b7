from __future__ import annotations

import dataclasses
import math

import pytest

from preemptdiag.diagnose.budget import (
    Budget,
    BudgetArgs,
    budget_from_dims,
    budget_from_tokens,
    budget_main,
    bytes_per_token,
    format_budget,
    kv_tokens_from_blocks,
    kv_tokens_from_gib,
    max_model_len_for,
    max_num_seqs_from_observed,
)
from preemptdiag.diagnose.models import ModelDims, dtype_bytes, find_model, load_models
from preemptdiag.model.errors import DiagError

LLAMA_8B = ModelDims("Llama-3.1-8B", 32, 8, 128)

SEED_LINES = (
    "bytes per token = 2 × 32 layers × 8 KV heads × 128 head dim × 2 B = 131,072 B",
    "KV tokens = 24 GiB × 1024³ / 131,072 B = 196,608",
    "sustainable concurrency = floor(196,608 / (2,000 + 1,500)) = 56",
    "recommended --max-num-seqs = floor(0.9 × 196,608 / 3,500) = 50",
)


def seed_args(**changes: object) -> BudgetArgs:
    base = BudgetArgs(model="llama-3.1-8b", dtype="fp16", pool_gib=24, prompt=2000, output=1500)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the seed's napkin math


def test_seed_example_reproduces_exactly() -> None:
    b = budget_from_dims(LLAMA_8B, dtype_bytes("fp16"), 24, 2000, 1500)
    assert b.bytes_per_token == 131_072
    assert b.kv_tokens == 196_608
    assert b.kv_tokens_source == "24 GiB / 131,072 B per token"
    assert b.tokens_per_request == 3500.0
    assert b.sustainable == 56
    assert b.headroom == 0.9
    assert b.recommended_max_num_seqs == 50
    # ModelDims without a source adds no provenance line: the four steps are the whole story
    assert b.arithmetic == SEED_LINES


def test_seed_example_through_cli_core_with_model_name() -> None:
    b = budget_main(seed_args())
    assert (b.kv_tokens, b.sustainable, b.recommended_max_num_seqs) == (196_608, 56, 50)
    assert b.arithmetic[0].startswith("model dims (Llama-3.1-8B): meta-llama/Llama-3.1-8B config")
    assert b.arithmetic[1:] == SEED_LINES


def test_seed_example_through_cli_core_with_explicit_dims_and_p95_options() -> None:
    args = BudgetArgs(
        layers=32, kv_heads=8, head_dim=128, dtype="bf16", pool_gib=24.0,
        prompt_p95=2000, output_p95=1500,
    )  # fmt: skip
    b = budget_main(args)
    assert b.arithmetic == SEED_LINES
    assert b.recommended_max_num_seqs == 50


def test_format_budget_shows_numbers_and_arithmetic() -> None:
    text = format_budget(budget_main(seed_args()))
    assert "KV tokens                   196,608  (24 GiB / 131,072 B per token)\n" in text
    assert "  bytes per token             131,072\n" in text
    assert "  sustainable concurrency     56\n" in text
    assert "  recommended --max-num-seqs  50  (headroom 0.9)\n" in text
    for line in SEED_LINES:
        assert f"  {line}\n" in text
    assert "Warning" not in text


# ---------------------------------------------------------------- building blocks


@pytest.mark.parametrize(
    ("dims", "dtype", "expected"),
    [
        (LLAMA_8B, "fp16", 131_072),
        (LLAMA_8B, "fp8_e4m3", 65_536),
        (LLAMA_8B, "fp32", 262_144),
        (ModelDims("Llama-2-7b", 32, 32, 128), "auto", 524_288),
        (ModelDims("Qwen2.5-7B", 28, 4, 128), "bf16", 57_344),
        (ModelDims("gemma-2-9b", 42, 8, 256), "fp16", 344_064),
    ],
)
def test_bytes_per_token(dims: ModelDims, dtype: str, expected: int) -> None:
    assert bytes_per_token(dims, dtype_bytes(dtype)) == expected


def test_bytes_per_token_rounds_sub_byte_dtypes_up() -> None:
    # 2 x 1 x 1 x 3 x 0.5 = 3 exactly; 2 x 1 x 1 x 3 x 0.25 = 1.5 -> 2 (err toward fewer tokens)
    assert bytes_per_token(ModelDims("t", 1, 1, 3), 0.5) == 3
    assert bytes_per_token(ModelDims("t", 1, 1, 3), 0.25) == 2


def test_blocks_to_tokens() -> None:
    assert kv_tokens_from_blocks(7282) == 116_512
    assert kv_tokens_from_blocks(7282, block_size=32) == 233_024
    with pytest.raises(DiagError, match="GPU blocks must be > 0"):
        kv_tokens_from_blocks(0)


def test_gib_to_tokens_floors() -> None:
    assert kv_tokens_from_gib(24, 131_072) == 196_608
    assert kv_tokens_from_gib(1, 100_000) == 10_737  # 1,073,741,824 / 100,000 = 10,737.4
    # 0.1 GiB taken as the decimal the user typed: 107,374,182.4 B / 1 B
    assert kv_tokens_from_gib(0.1, 1) == 107_374_182
    with pytest.raises(DiagError, match="KV cache size"):
        kv_tokens_from_gib(-1, 131_072)


def test_budget_from_tokens() -> None:
    b = budget_from_tokens(116_512, 2000, 1500, source="GPU KV cache size line")
    assert b.bytes_per_token is None
    assert b.kv_tokens_source == "GPU KV cache size line"
    assert b.sustainable == 33  # 116,512 / 3,500 = 33.29
    assert b.recommended_max_num_seqs == 29  # 0.9 x 116,512 / 3,500 = 29.96
    assert b.arithmetic == (
        "KV tokens = 116,512 (GPU KV cache size line)",
        "sustainable concurrency = floor(116,512 / (2,000 + 1,500)) = 33",
        "recommended --max-num-seqs = floor(0.9 × 116,512 / 3,500) = 29",
    )
    assert "bytes per token" not in format_budget(b)


def test_fractional_token_counts_and_custom_headroom() -> None:
    b = budget_from_tokens(10_000, 1000.5, 499.25, headroom=0.5)
    assert b.tokens_per_request == 1499.75
    assert b.sustainable == 6  # 10,000 / 1,499.75 = 6.67
    assert b.recommended_max_num_seqs == 3  # 5,000 / 1,499.75 = 3.33
    assert b.arithmetic[-2] == "sustainable concurrency = floor(10,000 / (1,000.5 + 499.25)) = 6"
    assert b.arithmetic[-1] == "recommended --max-num-seqs = floor(0.5 × 10,000 / 1,499.75) = 3"


def test_request_larger_than_pool_recommends_one_and_warns() -> None:
    b = budget_from_tokens(2000, 3000, 500)
    assert b.sustainable == 0
    assert b.recommended_max_num_seqs == 1
    assert b.arithmetic[-1] == (
        "recommended --max-num-seqs = floor(0.9 × 2,000 / 3,500) = 0, raised to the minimum of 1"
    )
    text = format_budget(b)
    assert "Warning: one 3,500-token request needs more than the whole pool (2,000 tokens)" in text
    assert "at most 2,000" in text


def test_budget_is_frozen() -> None:
    b = budget_from_tokens(1000, 10, 10)
    assert isinstance(b, Budget)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.kv_tokens = 5  # type: ignore[misc]


def test_max_model_len_for() -> None:
    assert max_model_len_for(116_512) == 116_512
    assert max_model_len_for(116_512, 3) == 38_837  # exact floor, not a multiple of 16
    with pytest.raises(DiagError, match="concurrency must be a whole number >= 1"):
        max_model_len_for(116_512, 0)


# ---------------------------------------------------------------- observed demand


def test_observed_demand_hand_computed() -> None:
    # live tokens per seq: 0.98 x 116,512 / 40 = 2,854.544; 0.5 x 116,512 / 20 = 2,912.8;
    # 1.0 x 116,512 / 64 = 1,820.5; the Running = 0 window is skipped.
    # p95 by nearest rank of 3 values = rank ceil(2.85) = 3 = the largest, 2,912.8.
    # floor(0.9 x 116,512 / 2,912.8) = floor(36.0) = 36.
    peaks = [(98.0, 40), (50.0, 20), (100.0, 64), (90.0, 0)]
    value, p95, lines = max_num_seqs_from_observed(116_512, peaks)
    assert value == 36
    assert p95 == pytest.approx(2912.8)
    assert lines == (
        "live tokens per running seq = KV usage % / 100 × KV tokens / Running, at 3 peak "
        "windows (1 skipped: Running = 0 or no KV usage)",
        "p95 (nearest rank 3 of 3) = 50 / 100 × 116,512 / 20 = 2,912.8 live tokens per seq",
        "--max-num-seqs = floor(0.9 × 116,512 / 2,912.8) = 36",
        "exactly: the KV tokens cancel, floor(0.9 × 20 running / (50 / 100) KV usage) = 36",
    )


def test_observed_demand_is_exact_where_floats_round_down() -> None:
    # 0.9 x 100,003 / (0.75 x 100,003 / 10) is exactly 12; float arithmetic gives 11.999...
    assert math.floor(0.9 * 100_003 / (75.0 / 100 * 100_003 / 10)) == 11
    value, _, _ = max_num_seqs_from_observed(100_003, [(75.0, 10)])
    assert value == 12


def test_observed_p95_is_nearest_rank_not_max_or_interpolated() -> None:
    # 20 windows, usage 5%..100% at Running = 10: live = usage x 100; rank ceil(19.0) = 19
    peaks = [(float(p), 10) for p in range(5, 101, 5)]
    value, p95, lines = max_num_seqs_from_observed(100_000, peaks, headroom=1.0)
    assert p95 == 9500.0
    assert value == 10  # floor(100,000 / 9,500) = 10.5 -> 10
    assert (
        lines[1]
        == "p95 (nearest rank 19 of 20) = 95 / 100 × 100,000 / 10 = 9,500 live tokens per seq"
    )


def test_observed_single_window_uses_it() -> None:
    value, p95, lines = max_num_seqs_from_observed(196_608, [(100.0, 64)])
    assert p95 == 3072.0
    assert value == 57  # floor(0.9 x 196,608 / 3,072) = floor(57.6)
    assert lines[0].endswith("at 1 peak window")


def test_observed_needs_a_usable_window() -> None:
    with pytest.raises(DiagError, match="no peak window with Running > 0"):
        max_num_seqs_from_observed(116_512, [(90.0, 0), (0.0, 12)])
    with pytest.raises(DiagError, match="no peak window"):
        max_num_seqs_from_observed(116_512, [])


# ---------------------------------------------------------------- model table


@pytest.mark.parametrize(
    ("name", "layers", "kv_heads", "head_dim"),
    [
        ("Llama-3.1-8B", 32, 8, 128),
        ("Llama-3.1-70B", 80, 8, 128),
        ("Mistral-7B-v0.1", 32, 8, 128),
        ("Qwen2.5-7B", 28, 4, 128),
        ("Qwen2.5-72B", 80, 8, 128),
        ("Llama-2-7b", 32, 32, 128),
        ("Mixtral-8x7B", 32, 8, 128),
        ("gemma-2-9b", 42, 8, 256),
    ],
)
def test_model_table_values(name: str, layers: int, kv_heads: int, head_dim: int) -> None:
    dims = load_models()[name]
    assert (dims.layers, dims.kv_heads, dims.head_dim) == (layers, kv_heads, head_dim)


def test_every_model_names_its_config_source() -> None:
    models = load_models()
    assert len(models) >= 8
    for dims in models.values():
        assert "config.json" in dims.source, dims.name
        assert f"num_hidden_layers={dims.layers}" in dims.source, dims.name
        assert f"num_key_value_heads={dims.kv_heads}" in dims.source, dims.name
        assert f"{dims.head_dim}" in dims.source, dims.name


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("llama-3.1-8b", "Llama-3.1-8B"),
        ("LLAMA-3.1-8B", "Llama-3.1-8B"),
        ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", "Llama-3.1-70B"),
        ("meta-llama/Llama-2-7b-chat-hf", "Llama-2-7b"),
        ("google/gemma-2-9b-it", "gemma-2-9b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "Mixtral-8x7B"),
        ("mistralai/Mistral-7B-Instruct-v0.1", "Mistral-7B-v0.1"),
        ("  Qwen/Qwen2.5-7B-Instruct ", "Qwen2.5-7B"),
    ],
)
def test_find_model(query: str, expected: str) -> None:
    assert find_model(query).name == expected


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(DiagError) as err:
        find_model("llama-3.1-9b")
    msg = err.value.message
    assert msg.startswith("unknown model 'llama-3.1-9b': did you mean Llama-3.1-8B")
    assert "--layers/--kv-heads/--head-dim" in msg
    assert "\n" not in msg


def test_unknown_model_far_from_everything_lists_known() -> None:
    with pytest.raises(DiagError, match=r"unknown model 'zzz': known: .*Llama-3.1-8B"):
        find_model("zzz")


# ---------------------------------------------------------------- dtypes and validation


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("fp16", 2), ("BF16", 2), ("auto", 2), ("bfloat16", 2),
        ("fp8", 1), ("fp8_e4m3", 1), ("fp8_e5m2", 1), ("int8", 1),
        ("fp32", 4),
    ],
)  # fmt: skip
def test_dtype_bytes(name: str, size: int) -> None:
    assert dtype_bytes(name) == size


def test_unknown_dtype() -> None:
    with pytest.raises(DiagError, match=r"unknown dtype 'fp4': use one of auto, fp16, .*fp32"):
        dtype_bytes("fp4")
    with pytest.raises(DiagError, match="unknown dtype 'int4'"):
        budget_main(seed_args(dtype="int4"))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"layers": 32}, "give either --model or all of --layers/--kv-heads/--head-dim, not both"),
        (
            {"model": None, "layers": 32, "kv_heads": 8},
            "give either --model or all of --layers/--kv-heads/--head-dim",
        ),
        ({"model": None}, "give either --model or all of --layers/--kv-heads/--head-dim"),
        (
            {"model": None, "layers": 0, "kv_heads": 8, "head_dim": 128},
            "layers must be a whole number > 0, got 0",
        ),
        ({"pool_gib": None}, "give --pool-gib (KV cache memory in GiB)"),
        ({"pool_gib": 0}, "pool size must be > 0"),
        ({"pool_gib": -4.0}, "pool size must be > 0"),
        ({"pool_gib": float("nan")}, "pool size must be a number, got nan"),
        ({"prompt_p95": 2500}, "give either --prompt or --prompt-p95, not both"),
        ({"output": None}, "give --output or --output-p95 (output tokens per request)"),
        ({"output": -1}, "--output must be >= 0, got -1"),
        ({"prompt": 0, "output": 0}, "tokens per request (prompt + output) must be > 0"),
        ({"headroom": 0.0}, "headroom must be in (0, 1], got 0.0"),
        ({"headroom": 1.5}, "headroom must be in (0, 1], got 1.5"),
        ({"pool_gib": 1e-9}, "a 1e-09 GiB pool holds no whole token at 131,072 B per token"),
    ],
)
def test_budget_main_validation(changes: dict[str, object], message: str) -> None:
    with pytest.raises(DiagError) as err:
        budget_main(seed_args(**changes))
    assert err.value.message == message


def test_headroom_one_equals_sustainable() -> None:
    b = budget_main(seed_args(headroom=1.0))
    assert b.recommended_max_num_seqs == b.sustainable == 56


def test_tensor_parallel_splits_the_kv_heads_over_the_ranks() -> None:
    b4 = budget_main(
        BudgetArgs(model="llama-3.1-8b", pool_gib=24, prompt=2000, output=1500, tensor_parallel=4)
    )
    b1 = budget_main(BudgetArgs(model="llama-3.1-8b", pool_gib=24, prompt=2000, output=1500))
    # 8 KV heads over 4 ranks: 2 each, a quarter of the bytes per token on each rank.
    assert b4.bytes_per_token * 4 == b1.bytes_per_token
    assert any("ceil(8 KV heads / 4 ranks)) = 2" in line for line in b4.arithmetic)
    # More ranks than KV heads: each rank still holds one head (replicated).
    b16 = budget_main(
        BudgetArgs(model="llama-3.1-8b", pool_gib=24, prompt=2000, output=1500, tensor_parallel=16)
    )
    assert b16.bytes_per_token * 8 == b1.bytes_per_token
