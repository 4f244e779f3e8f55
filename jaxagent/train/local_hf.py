"""A local Hugging Face model directory built here, standing in for a downloaded checkpoint.

No weights can be downloaded on this machine, so tests and examples build what a user would
download: ``build_local_hf_dir(path, corpus)`` writes a Qwen2-architecture
``Qwen2ForCausalLM`` with random weights (``transformers`` + PyTorch, saved as safetensors
with its ``config.json``) and a byte-level BPE tokenizer trained on ``corpus`` with the
project's ChatML template with tools (``jaxagent.train.tokenizer.CHATML_TEMPLATE``), saved by
``save_pretrained``. ``model.init_from=<path>`` then loads it exactly as it would a real
Qwen2.5 directory: tokenizer and template from the directory, weights through ``load_hf``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable

from jaxagent.train.tokenizer import build_chatml_tokenizer


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalModelSpec:
    """Sizes of the random Qwen2 model (tiny by default: tests run on CPUs)."""

    hidden_size: int = 32
    num_layers: int = 1
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 64
    max_position_embeddings: int = 512
    vocab_size: int = 1024  # BPE vocabulary to train (the model's rows: the tokenizer's size)
    seed: int = 0


def build_local_hf_dir(
    path: str | Path, corpus: Iterable[str], spec: LocalModelSpec = LocalModelSpec()
) -> Path:
    """Write a random-weight Qwen2 model and a ChatML BPE tokenizer to ``path``; returns it."""
    import torch
    import transformers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_chatml_tokenizer(corpus, spec.vocab_size)
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(spec.seed)
    model = transformers.Qwen2ForCausalLM(config).eval()
    model.save_pretrained(str(path), safe_serialization=True)
    tokenizer.save_pretrained(str(path))
    return path
