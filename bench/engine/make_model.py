"""Make the tiny random Llama the real-engine harness serves (runs under the engine venv).

There is no model hub here, so the model is made locally: a byte-level BPE
tokenizer trained on the standard library's own .py files, and a LlamaForCausalLM
with random weights. Its shape is chosen so the KV pool in tokens is exact
arithmetic: 2 layers x 2 (K and V) x 2 KV heads x head_dim 32 x 2 bytes (bf16)
= 512 B per token, so `--kv-cache-memory-bytes 16M` is 32,768 tokens.

Usage: python make_model.py [OUT_DIR]   (default $PREEMPTDIAG_ENGINE_MODEL or
~/.cache/preemptdiag/tiny-llama). Deterministic: fixed seed, sorted inputs.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

VOCAB_SIZE = 2048
SEED = 1234
# The tokenizer needs a few MB of text at most; more only costs time on 2 cores.
MAX_TRAIN_BYTES = 8 * 1024 * 1024

DEFAULT_DIR = Path(
    os.environ.get("PREEMPTDIAG_ENGINE_MODEL", "~/.cache/preemptdiag/tiny-llama")
).expanduser()


def training_files() -> list[str]:
    """The stdlib's .py files, sorted so the tokenizer is the same on every run."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        size = path.stat().st_size
        if total + size > MAX_TRAIN_BYTES:
            break
        files.append(str(path))
        total += size
    if not files:
        raise SystemExit(f"no .py files under {stdlib} to train the tokenizer on")
    return files


def make_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(training_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.model_max_length = 8192
    fast.save_pretrained(out)
    return int(tok.get_vocab_size())


def make_model(out: Path, vocab_size: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # Older/newer transformers spell the dtype key differently; vLLM reads either,
    # so make sure the saved config says bf16 whichever the library wrote.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    out = Path(argv[1]).expanduser() if len(argv) > 1 else DEFAULT_DIR
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        print(f"model already at {out}")
        return 0
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer(tmp)
    make_model(tmp, vocab)
    # Rename last, so an interrupted run never leaves a half-made model that the
    # "already there" check above would accept.
    if out.exists():
        raise SystemExit(f"{out} exists but is incomplete; remove it and rerun")
    tmp.rename(out)
    print(f"model written to {out} (vocab {vocab})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
