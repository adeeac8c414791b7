"""What the log says about the engine's configuration and KV capacity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import regex

from preemptdiag.model.records import Event, Kind

# Knobs the levers talk about, in vLLM and SGLang spelling.
KNOBS = (
    "max_num_seqs",
    "gpu_memory_utilization",
    "swap_space",
    "max_model_len",
    "max_num_batched_tokens",
    "block_size",
    "enable_chunked_prefill",
    "tensor_parallel_size",
    "kv_cache_dtype",
    "max_running_requests",
    "mem_fraction_static",
    "schedule_conservativeness",
    "chunked_prefill_size",
    "kv_cache_memory_bytes",
)
# A `name: value` / `name=value` pair of an args line (V1's dict, V0's Namespace).
_PAIR = r"""['"]?\b(?P<k>{names})['"]?\s*[:=]\s*['"]?(?P<v>[\w.+\-]+)"""
# One alternation finds every knob on an args line in a single pass.
_KNOB_RX = regex.compile(_PAIR.format(names="|".join(KNOBS)))


def args_text(e: Event) -> str:
    """The args a config line carries (its `args` field), else its whole text."""
    args = e.fields.get("args")
    return args if isinstance(args, str) else e.text


def arg_value(e: Event, name: str) -> str | None:
    """`name`'s value on a config line that is no knob (`api_server_count`,
    `disable_log_stats`), as read_facts reads knobs; None where it is not there."""
    if e.kind is not Kind.CONFIG:
        return None
    m = _arg_rx(name).search(args_text(e))
    return None if m is None else str(m.group("v"))


@cache
def _arg_rx(name: str) -> regex.Pattern[str]:
    return regex.compile(_PAIR.format(names=regex.escape(name)))


@dataclass(frozen=True, slots=True)
class Facts:
    """Configuration and capacity read from start-up lines (last value wins)."""

    knobs: dict[str, str] = field(default_factory=dict)
    knob_lines: dict[str, Event] = field(default_factory=dict)
    kv_tokens: int | None = None
    kv_tokens_line: Event | None = None
    kv_tokens_how: str = ""
    max_concurrency: float | None = None
    concurrency_len: int | None = None
    concurrency_line: Event | None = None

    def knob_int(self, name: str) -> int | None:
        v = self.knobs.get(name)
        try:
            return int(v) if v is not None else None
        except ValueError:
            return None

    def knob_float(self, name: str) -> float | None:
        v = self.knobs.get(name)
        try:
            return float(v) if v is not None else None
        except ValueError:
            return None


def read_facts(events: Sequence[Event]) -> Facts:
    knobs: dict[str, str] = {}
    knob_lines: dict[str, Event] = {}
    kv_tokens = None
    kv_line = None
    how = ""
    blocks: tuple[int, Event] | None = None
    conc = None
    conc_len = None
    conc_line = None
    for e in events:
        f = e.fields
        if e.kind is Kind.CONFIG:
            for m in _KNOB_RX.finditer(args_text(e)):
                k, v = m.group("k"), m.group("v")
                if v not in ("None", "null"):
                    # `--max-model-len auto` prints as -1 (a real 0.32.0): no length yet
                    knobs[k] = "auto" if k == "max_model_len" and v == "-1" else v
                    knob_lines[k] = e
            msl = f.get("max_seq_len")
            if isinstance(msl, int) and "max_model_len" not in knobs:
                knobs["max_model_len"] = str(msl)
                knob_lines["max_model_len"] = e
        elif e.kind is Kind.CONTEXT:
            # The length `--max-model-len auto` settled on (`Auto-fit max_model_len:
            # reduced from 8192 to 3968 ...`): the engine's max_model_len from then on,
            # over the engine's config line before it (`max_seq_len=8192`, the model's).
            fitted = f.get("fitted_max_model_len") or f.get("full_max_model_len")
            if isinstance(fitted, int):
                knobs["max_model_len"] = str(fitted)
                knob_lines["max_model_len"] = e
        elif e.kind is Kind.CAPACITY:
            if isinstance(f.get("kv_tokens"), int):
                kv_tokens, kv_line = int(f["kv_tokens"]), e  # type: ignore[arg-type]
                how = "start-up KV token count"
            gb = f.get("gpu_blocks")
            if isinstance(gb, int):
                blocks = (gb, e)
            if isinstance(f.get("max_concurrency"), float | int):
                conc = float(f["max_concurrency"])  # type: ignore[arg-type]
                conc_line = e
                ml = f.get("max_model_len")
                conc_len = int(ml) if isinstance(ml, int) else None
            for k in ("max_running_requests", "context_len", "chunked_prefill_size"):
                v = f.get(k)
                if isinstance(v, int):
                    knobs[k] = str(v)
                    knob_lines[k] = e
    if kv_tokens is None and blocks is not None and blocks[0] > 0:
        bs = int(knobs.get("block_size", "16")) if knobs.get("block_size", "16").isdigit() else 16
        kv_tokens, kv_line = blocks[0] * bs, blocks[1]
        how = f"# GPU blocks {blocks[0]:,} x block size {bs}"
    return Facts(
        knobs=knobs,
        knob_lines=knob_lines,
        kv_tokens=kv_tokens,
        kv_tokens_line=kv_line,
        kv_tokens_how=how,
        max_concurrency=conc,
        concurrency_len=conc_len,
        concurrency_line=conc_line,
    )
