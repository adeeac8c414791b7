"""KV-cache budget arithmetic: how many sequences a KV pool sustains (design.md section 4).

The napkin math from seeds/000: bytes per token = 2 (K and V) x layers x KV heads x head
dim x dtype bytes; KV tokens = pool bytes / bytes per token; sustainable concurrency =
floor(KV tokens / live tokens per request). Every function returns the numbers together
with the arithmetic lines a report prints, so the user can redo the sum by hand.

All sums run on exact fractions, not floats: `floor(0.9 x 116,512 / 2,912.8)` is exactly
36, and float rounding would print 35 for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from preemptdiag.diagnose.models import ModelDims, dtype_bytes, find_model
from preemptdiag.model.errors import DiagError

GIB = 1024**3
DEFAULT_BLOCK_SIZE = 16
DEFAULT_HEADROOM = 0.9


@dataclass(frozen=True, kw_only=True)
class Budget:
    """What a KV pool holds and the --max-num-seqs that keeps requests inside it."""

    kv_tokens: int
    kv_tokens_source: str  # where kv_tokens came from, in words
    bytes_per_token: int | None  # None when KV tokens were given directly
    tokens_per_request: float  # live tokens a finished request holds: prompt + output
    sustainable: int  # floor(kv_tokens / tokens_per_request)
    headroom: float = DEFAULT_HEADROOM
    recommended_max_num_seqs: int  # max(1, floor(headroom x kv_tokens / tokens_per_request))
    arithmetic: tuple[str, ...]


@dataclass(frozen=True)
class BudgetArgs:
    """The options of `preemptdiag budget`, before validation."""

    model: str | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str = "auto"
    pool_gib: float | None = None
    prompt: float | None = None
    output: float | None = None
    prompt_p95: float | None = None
    output_p95: float | None = None
    headroom: float = DEFAULT_HEADROOM
    tensor_parallel: int = 1  # ranks; --pool-gib is then one rank's KV memory


# ---------------------------------------------------------------- number helpers


def _exact(value: float) -> Fraction:
    # Fraction(repr(x)) takes the decimal the user typed (0.9), not its binary
    # approximation (0.9000000000000000222...), so floors land where a human expects.
    if isinstance(value, int):
        return Fraction(value)
    return Fraction(repr(value))


def _num(value: float | Fraction) -> str:
    """Thousands separators; at most two decimals, none when the value is whole."""
    if isinstance(value, int) or (isinstance(value, Fraction) and value.denominator == 1):
        return f"{int(value):,}"
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"
    if abs(float(value)) < 0.01:
        return f"{float(value):.3g}"  # "0" would hide a tiny but nonzero input
    return f"{float(value):,.2f}".rstrip("0").rstrip(".")


def _finite(label: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DiagError(f"{label} must be a number, got {value!r}")


def _positive(label: str, value: float) -> None:
    _finite(label, value)
    if value <= 0:
        raise DiagError(f"{label} must be > 0, got {_num(value)}")


def _headroom_ok(headroom: float) -> None:
    _finite("headroom", headroom)
    if not 0 < headroom <= 1:
        raise DiagError(f"headroom must be in (0, 1], got {headroom}")


# ---------------------------------------------------------------- model table


def bytes_per_token(dims: ModelDims, dtype_bytes: float) -> int:
    """2 (K and V) x layers x KV heads x head dim x dtype bytes, rounded up to a whole byte.

    Rounding up only matters for sub-byte dtypes; it makes the token count err low.
    """
    _positive("dtype bytes", dtype_bytes)
    exact = 2 * dims.layers * dims.kv_heads * dims.head_dim * _exact(dtype_bytes)
    return math.ceil(exact)


def _bytes_per_token_line(dims: ModelDims, dtype_b: float, bpt: int) -> str:
    return (
        f"bytes per token = 2 × {dims.layers:,} layers × {dims.kv_heads:,} KV heads × "
        f"{dims.head_dim:,} head dim × {_num(dtype_b)} B = {bpt:,} B"
    )


def kv_tokens_from_blocks(gpu_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Tokens in a pool of `gpu_blocks` blocks (vLLM's `# GPU blocks: N` start-up line)."""
    _positive("GPU blocks", gpu_blocks)
    _positive("block size", block_size)
    return int(gpu_blocks) * int(block_size)


def kv_tokens_from_gib(kv_gib: float, bytes_per_token: int) -> int:
    """Whole tokens that fit in `kv_gib` GiB at `bytes_per_token` (floor)."""
    _positive("KV cache size (GiB)", kv_gib)
    _positive("bytes per token", bytes_per_token)
    return math.floor(_exact(kv_gib) * GIB / bytes_per_token)


def _at_least_one(raw: int) -> str:
    # A cap of 0 would stop the server; 1 is the least --max-num-seqs can say.
    return ", raised to the minimum of 1" if raw < 1 else ""


def _build_budget(
    kv_tokens: int,
    source: str,
    bpt: int | None,
    prompt_tokens: float,
    output_tokens: float,
    headroom: float,
    lead: Sequence[str],
) -> Budget:
    _finite("prompt tokens", prompt_tokens)
    _finite("output tokens", output_tokens)
    if prompt_tokens < 0 or output_tokens < 0:
        raise DiagError("prompt and output token counts must be >= 0")
    per_request = _exact(prompt_tokens) + _exact(output_tokens)
    if per_request <= 0:
        raise DiagError("tokens per request (prompt + output) must be > 0")
    _headroom_ok(headroom)
    sustainable = math.floor(kv_tokens / per_request)
    raw = math.floor(_exact(headroom) * kv_tokens / per_request)
    recommended = max(1, raw)
    lines = (
        *lead,
        f"sustainable concurrency = floor({kv_tokens:,} / ({_num(prompt_tokens)} + "
        f"{_num(output_tokens)})) = {sustainable:,}",
        f"recommended --max-num-seqs = floor({_num(headroom)} × {kv_tokens:,} / "
        f"{_num(per_request)}) = {raw:,}" + _at_least_one(raw),
    )
    return Budget(
        kv_tokens=kv_tokens,
        kv_tokens_source=source,
        bytes_per_token=bpt,
        tokens_per_request=float(per_request),
        sustainable=sustainable,
        headroom=headroom,
        recommended_max_num_seqs=recommended,
        arithmetic=lines,
    )


def budget_from_dims(
    dims: ModelDims,
    dtype_bytes: float,
    pool_gib: float,
    prompt_tokens: float,
    output_tokens: float,
    headroom: float = DEFAULT_HEADROOM,
    tensor_parallel: int = 1,
) -> Budget:
    """Budget for a pool of `pool_gib` GiB of KV memory on each of `tensor_parallel`
    ranks (vLLM logs "Available KV cache memory" per rank). Tensor parallelism splits
    the KV heads over the ranks, each holding at least one (replicated when there are
    fewer KV heads than ranks), so a token costs each rank its share of the bytes.
    """
    _positive("pool size (GiB)", pool_gib)
    _positive("tensor parallel size", tensor_parallel)
    tp_lines: list[str] = []
    if tensor_parallel > 1:
        per_rank = max(1, math.ceil(dims.kv_heads / tensor_parallel))
        tp_lines.append(
            f"KV heads per rank = max(1, ceil({dims.kv_heads:,} KV heads / {tensor_parallel} "
            f"ranks)) = {per_rank:,} (tensor parallel {tensor_parallel}; --pool-gib is one rank's)"
        )
        dims = replace(dims, kv_heads=per_rank)
    bpt = bytes_per_token(dims, dtype_bytes)
    kv = kv_tokens_from_gib(pool_gib, bpt)
    if kv < 1:
        raise DiagError(f"a {_num(pool_gib)} GiB pool holds no whole token at {bpt:,} B per token")
    lead = []
    if dims.source:
        lead.append(f"model dims ({dims.name}): {dims.source}")
    lead += [
        *tp_lines,
        _bytes_per_token_line(dims, dtype_bytes, bpt),
        f"KV tokens = {_num(pool_gib)} GiB × 1024³ / {bpt:,} B = {kv:,}",
    ]
    source = f"{_num(pool_gib)} GiB / {bpt:,} B per token"
    return _build_budget(kv, source, bpt, prompt_tokens, output_tokens, headroom, lead)


def budget_from_tokens(
    kv_tokens: int,
    prompt_tokens: float,
    output_tokens: float,
    headroom: float = DEFAULT_HEADROOM,
    source: str = "given",
) -> Budget:
    """Budget when the KV token count is known (e.g. vLLM's `GPU KV cache size: N tokens`)."""
    _positive("KV tokens", kv_tokens)
    kv = int(kv_tokens)
    lead = [f"KV tokens = {kv:,} ({source})"]
    return _build_budget(kv, source, None, prompt_tokens, output_tokens, headroom, lead)


def _nearest_rank(sorted_values: Sequence[Fraction], pct: int) -> tuple[Fraction, int]:
    rank = max(1, math.ceil(pct * len(sorted_values) / 100))
    return sorted_values[rank - 1], rank


def max_num_seqs_from_observed(
    kv_tokens: int,
    peaks: Sequence[tuple[float, int]],
    headroom: float = DEFAULT_HEADROOM,
) -> tuple[int, float, tuple[str, ...]]:
    """--max-num-seqs from observed demand: (value, p95 live tokens per seq, arithmetic).

    `peaks` holds (KV usage percent 0-100, running sequences) at peak windows. Live tokens
    per sequence = usage / 100 x KV tokens / running; the p95 of those sizes the cap as
    floor(headroom x KV tokens / p95). Windows with no running sequences or no KV usage
    carry no size and are skipped.
    """
    _positive("KV tokens", kv_tokens)
    _headroom_ok(headroom)
    usable: list[tuple[Fraction, float, int]] = []
    for usage, running in peaks:
        if running > 0 and math.isfinite(usage) and 0 < usage <= 100:
            live = _exact(usage) / 100 * kv_tokens / running
            usable.append((live, usage, running))
    skipped = len(peaks) - len(usable)
    if not usable:
        raise DiagError(
            "no peak window with Running > 0 and KV usage in (0, 100]%: "
            "cannot size --max-num-seqs from observed demand"
        )
    usable.sort(key=lambda t: t[0])
    # p95 by nearest rank (the ceil(0.95 n)-th smallest value, no interpolation): always an
    # observed window, works for one value, and never understates the largest sizes.
    p95, rank = _nearest_rank([t[0] for t in usable], 95)
    _, usage, running = usable[rank - 1]
    raw = math.floor(_exact(headroom) * kv_tokens / p95)
    value = max(1, raw)
    n = len(usable)
    lines = (
        f"live tokens per running seq = KV usage % / 100 × KV tokens / Running, at {n} peak "
        f"window{'s' if n != 1 else ''}"
        + (f" ({skipped} skipped: Running = 0 or no KV usage)" if skipped else ""),
        f"p95 (nearest rank {rank} of {n}) = {_num(usage)} / 100 × {kv_tokens:,} / "
        f"{running:,} = {_num(p95)} live tokens per seq",
        f"--max-num-seqs = floor({_num(headroom)} × {kv_tokens:,} / {_num(p95)}) = {raw:,}"
        + _at_least_one(raw),
        # The printed per-seq figure is rounded; this form has no rounding to redo.
        f"exactly: the KV tokens cancel, floor({_num(headroom)} × {running:,} running / "
        f"({_num(usage)} / 100) KV usage) = {raw:,}",
    )
    return value, float(p95), lines


def max_model_len_for(kv_tokens: int, concurrency: int = 1) -> int:
    """Tokens per request the pool holds with `concurrency` requests at full length.

    Exact floor(kv_tokens / concurrency), not rounded to the 16-token block: vLLM accepts
    any --max-model-len up to the pool's token count, and rounding would only hide tokens.
    """
    _positive("KV tokens", kv_tokens)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise DiagError(f"concurrency must be a whole number >= 1, got {concurrency!r}")
    return int(kv_tokens) // concurrency


# ---------------------------------------------------------------- CLI core


def _choose(label: str, plain: float | None, p95: float | None) -> float:
    if plain is not None and p95 is not None:
        raise DiagError(f"give either --{label} or --{label}-p95, not both")
    value = plain if plain is not None else p95
    if value is None:
        raise DiagError(f"give --{label} or --{label}-p95 ({label} tokens per request)")
    _finite(f"--{label}", value)
    if value < 0:
        raise DiagError(f"--{label} must be >= 0, got {_num(value)}")
    return value


def budget_main(args: BudgetArgs) -> Budget:
    """Validate the option combination of `preemptdiag budget` and compute the budget."""
    given = [v is not None for v in (args.layers, args.kv_heads, args.head_dim)]
    if args.model is not None and any(given):
        raise DiagError("give either --model or all of --layers/--kv-heads/--head-dim, not both")
    if args.model is not None:
        dims = find_model(args.model)
    elif args.layers is not None and args.kv_heads is not None and args.head_dim is not None:
        dims = ModelDims("custom", args.layers, args.kv_heads, args.head_dim)
    else:
        raise DiagError("give either --model or all of --layers/--kv-heads/--head-dim")
    dtype_b = dtype_bytes(args.dtype)
    if args.pool_gib is None:
        raise DiagError("give --pool-gib (KV cache memory in GiB)")
    _finite("pool size", args.pool_gib)
    if args.pool_gib <= 0:
        raise DiagError("pool size must be > 0")
    prompt = _choose("prompt", args.prompt, args.prompt_p95)
    output = _choose("output", args.output, args.output_p95)
    return budget_from_dims(
        dims, dtype_b, args.pool_gib, prompt, output, args.headroom, args.tensor_parallel
    )


def format_budget(b: Budget) -> str:
    """Plain-text report for `preemptdiag budget`."""
    rows = [
        ("KV tokens", f"{b.kv_tokens:,}  ({b.kv_tokens_source})"),
        *([("bytes per token", f"{b.bytes_per_token:,}")] if b.bytes_per_token is not None else []),
        ("tokens per request", _num(b.tokens_per_request)),
        ("sustainable concurrency", f"{b.sustainable:,}"),
        (
            "recommended --max-num-seqs",
            f"{b.recommended_max_num_seqs:,}  (headroom {_num(b.headroom)})",
        ),
    ]
    width = max(len(label) for label, _ in rows)
    out = ["KV cache budget"]
    out += [f"  {label.ljust(width)}  {value}" for label, value in rows]
    out += ["", "Arithmetic"]
    out += [f"  {line}" for line in b.arithmetic]
    if b.sustainable == 0:
        out += [
            "",
            f"Warning: one {_num(b.tokens_per_request)}-token request needs more than the whole "
            f"pool ({b.kv_tokens:,} tokens). Lower --max-model-len / max_tokens to at most "
            f"{b.kv_tokens:,}, or give the KV cache more memory.",
        ]
    return "\n".join(out) + "\n"
