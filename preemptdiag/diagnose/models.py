"""The model table (models.toml): the config.json numbers that size a model's KV cache,
found by the names people type, and the bytes of each KV dtype."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from preemptdiag.model.errors import DiagError

_MODELS_FILE = Path(__file__).parent / "models.toml"

# vLLM's --kv-cache-dtype and --dtype spellings plus the short names people type.
# "auto" means "the model's dtype", which is 16-bit for every model in models.toml.
_DTYPE_BYTES: dict[str, int] = {
    "auto": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "fp32": 4,
    "float32": 4,
    "float": 4,
}

# Name parts that mark a fine-tuned variant of the same architecture: the KV shape is the
# base model's, so "meta-llama/Llama-3.1-8B-Instruct" should find "Llama-3.1-8B".
_VARIANT_WORDS = frozenset({"instruct", "chat", "it", "hf", "base"})


@dataclass(frozen=True)
class ModelDims:
    """The three numbers of a model's config.json that size its KV cache."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    source: str = ""

    def __post_init__(self) -> None:
        for label, value in (
            ("layers", self.layers),
            ("KV heads", self.kv_heads),
            ("head dim", self.head_dim),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise DiagError(f"{label} must be a whole number > 0, got {value!r}")


@cache
def _model_table() -> tuple[tuple[ModelDims, tuple[str, ...]], ...]:
    with _MODELS_FILE.open("rb") as f:
        data = tomllib.load(f)
    return _parse_models(data)


def _parse_models(data: Mapping[str, object]) -> tuple[tuple[ModelDims, tuple[str, ...]], ...]:
    # A malformed table is a packaging bug, not a user error: ValueError, not DiagError.
    entries = data.get("model")
    if not isinstance(entries, list):
        raise ValueError("models.toml: expected [[model]] entries")
    out: list[tuple[ModelDims, tuple[str, ...]]] = []
    seen: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict):
            raise ValueError(f"models.toml: entry is not a table: {entry!r}")
        name = entry.get("name")
        source = entry.get("source")
        aliases = entry.get("aliases", [])
        nums = [entry.get(k) for k in ("layers", "kv_heads", "head_dim")]
        if not isinstance(name, str) or not isinstance(source, str) or not source:
            raise ValueError(f"models.toml: entry needs a name and a source: {entry!r}")
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise ValueError(f"models.toml: {name}: aliases must be a list of strings")
        layers, kv_heads, head_dim = nums
        if not (
            isinstance(layers, int) and isinstance(kv_heads, int) and isinstance(head_dim, int)
        ):
            raise ValueError(f"models.toml: {name}: layers/kv_heads/head_dim must be integers")
        keys = tuple(str(a) for a in [name, *aliases])
        for key in keys:
            if key.lower() in seen:
                raise ValueError(f"models.toml: {key!r} is listed twice")
            seen.add(key.lower())
        dims = ModelDims(name, layers, kv_heads, head_dim, source)
        out.append((dims, keys[1:]))
    return tuple(out)


def load_models() -> dict[str, ModelDims]:
    """The packaged model table, keyed by canonical name (aliases are not keys)."""
    return {dims.name: dims for dims, _ in _model_table()}


def _lookup_keys() -> dict[str, ModelDims]:
    keys: dict[str, ModelDims] = {}
    for dims, aliases in _model_table():
        for key in (dims.name, *aliases):
            keys[key.lower()] = dims
    return keys


def _normalise(name: str) -> str:
    # Drop an "org/" prefix and fine-tune words; what remains names the architecture.
    base = name.strip().lower().rsplit("/", 1)[-1]
    return "-".join(p for p in base.split("-") if p not in _VARIANT_WORDS)


def find_model(name: str) -> ModelDims:
    """Look a model up by name, ignoring case, an `org/` prefix and -Instruct/-chat/-it."""
    keys = _lookup_keys()
    wanted = name.strip().lower()
    for candidate in (wanted, wanted.rsplit("/", 1)[-1], _normalise(name)):
        if candidate in keys:
            return keys[candidate]
    canonical = {dims.name.lower(): dims.name for dims in keys.values()}
    close = difflib.get_close_matches(_normalise(name), list(canonical), n=3, cutoff=0.6)
    hint = (
        "did you mean " + ", ".join(canonical[c] for c in close) + "?"
        if close
        else "known: " + ", ".join(sorted(canonical.values(), key=str.lower))
    )
    raise DiagError(
        f"unknown model {name!r}: {hint} (or give --layers/--kv-heads/--head-dim from its "
        "config.json)"
    )


# ---------------------------------------------------------------- the arithmetic


def dtype_bytes(name: str) -> int:
    """Bytes per KV element for a dtype name (vLLM's --kv-cache-dtype / --dtype spellings)."""
    key = name.strip().lower()
    if key not in _DTYPE_BYTES:
        raise DiagError(f"unknown dtype {name!r}: use one of {', '.join(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[key]
