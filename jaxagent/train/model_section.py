"""The ``model`` and ``tokenizer`` sections of a run config.

``model`` is ``jaxagent.models.ModelConfig`` less what the run derives from the tokenizer
(``vocab_size`` and the bos / eos / pad ids) and from the width (``head_dim = hidden_size //
num_heads``), with a small from-scratch preset as defaults, plus where to load the weights
from (``init_from``). ``jaxagent.train.policy.model_config`` builds the ``ModelConfig`` back.
"""

from __future__ import annotations

import dataclasses

from jaxagent.errors import FROZEN, ConfigError, check_choice, check_positive
from jaxagent.models.blockwise import KERNELS
from jaxagent.models.config import ModelConfig
from jaxagent.sections import derive

# What the run derives (``derived_model_fields``), never set in YAML.
DERIVED_MODEL_FIELDS = ("vocab_size", "head_dim", "bos_token_id", "eos_token_id", "pad_token_id")


def derived_model_fields(section, tokenizer=None) -> dict:
    """The ``ModelConfig`` fields the run derives: the head width from the section, the
    vocabulary and special ids from the tokenizer (placeholders without one, to validate)."""
    return dict(
        vocab_size=len(tokenizer) if tokenizer is not None else 1,
        head_dim=max(1, section.hidden_size // max(1, section.num_heads)),
        bos_token_id=getattr(tokenizer, "bos_token_id", None),
        eos_token_id=getattr(tokenizer, "eos_token_id", None),
        pad_token_id=getattr(tokenizer, "pad_token_id", None),
    )


def _check_model(section) -> None:
    # head_dim = hidden_size // num_heads is the run's derivation (a loaded model keeps its own)
    check_positive("model.num_heads", section.num_heads)
    if section.hidden_size % section.num_heads:
        raise ConfigError(
            f"model.hidden_size={section.hidden_size} must be divisible by "
            f"model.num_heads={section.num_heads}"
        )
    check_choice("model.param_dtype", section.param_dtype, ("float32", "bfloat16"))
    check_choice("model.dtype", section.dtype, ("float32", "bfloat16"))
    check_choice("model.kv_cache_dtype", section.kv_cache_dtype, ("", "float32", "bfloat16"))
    # blockwise (every backend), splash (TPU), cudnn (NVIDIA GPU), auto (by platform)
    check_choice("model.attention", section.attention, KERNELS)


ModelSection = derive(
    ModelConfig,
    key="model",
    name="ModelSection",
    module=__name__,
    doc="The policy network (``jaxagent.models.ModelConfig``). Sizes are static (array shapes); "
    "dtypes apply to fresh and loaded (init_from) models alike: bf16 compute with fp32 master "
    "weights and fp32 Adam state is param_dtype float32, dtype bfloat16.",
    drop=DERIVED_MODEL_FIELDS,
    # the from-scratch preset every shipped config starts from
    defaults=dict(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=192,
        max_seq_len=512,
        tie_embeddings=True,
    ),
    extra=[("init_from", str, "")],  # a local Hugging Face directory; "" builds from scratch
    check=_check_model,
    probe=lambda s: {"ModelConfig": derived_model_fields(s)},
)


@dataclasses.dataclass(**FROZEN)
class TokenizerSection:
    """The tokenizer: loaded with the model (``model.init_from``) or trained from scratch."""

    kind: str = "word"  # "word": the env's closed vocabulary; "bpe": byte-level BPE on a corpus
    # ("chatml": the BPE with ChatML's template, tools and <tool_call> calls, train/tokenizer.py)
    vocab_size: int = 512  # byte-level BPE vocabulary size when trained from scratch
    num_corpus_demos: int = 400  # expert demonstrations added to the BPE corpus

    def __post_init__(self):
        check_choice("tokenizer.kind", self.kind, ("word", "bpe", "chatml"))
        if self.vocab_size < 300:
            raise ConfigError(
                f"tokenizer.vocab_size={self.vocab_size} must be >= 300 "
                "(256 byte symbols + special tokens + merges)"
            )
        check_positive("tokenizer.num_corpus_demos", self.num_corpus_demos, allow_zero=True)
