"""The ``model`` and ``tokenizer`` sections of a run config (no JAX import: config stays light)."""

from __future__ import annotations

import dataclasses

from jaxagent.errors import FROZEN, ConfigError, check_choice, check_positive


@dataclasses.dataclass(**FROZEN)
class ModelSection:
    """The policy network. Sizes are static (they set array shapes)."""

    init_from: str = ""  # a local Hugging Face directory to load; "" builds from scratch
    hidden_size: int = 64  # width of the residual stream
    num_layers: int = 2  # decoder blocks
    num_heads: int = 4  # query heads
    num_kv_heads: int = 2  # key/value heads (grouped-query attention)
    intermediate_size: int = 192  # SwiGLU hidden width
    max_seq_len: int = 512  # longest episode (prompt + all turns) in tokens
    rope_theta: float = 10000.0  # rotary base
    tie_embeddings: bool = True  # share input embedding and output projection
    value_head: bool = False  # scalar critic head (PPO)
    # Dtypes apply to fresh and loaded (init_from) models alike. bf16 compute with fp32
    # master weights and fp32 Adam state: param_dtype float32, dtype bfloat16.
    param_dtype: str = "float32"  # parameter storage dtype (the optimiser state follows it)
    dtype: str = "float32"  # activation / matmul dtype (logits, log-probs stay float32)
    kv_cache_dtype: str = ""  # the sampler's KV cache; "" = dtype

    def __post_init__(self):
        for name in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_seq_len",
        ):
            check_positive(f"model.{name}", getattr(self, name))
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"model.hidden_size={self.hidden_size} must be divisible by "
                f"model.num_heads={self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_heads={self.num_heads} must be a multiple of "
                f"model.num_kv_heads={self.num_kv_heads}"
            )
        check_choice("model.param_dtype", self.param_dtype, ("float32", "bfloat16"))
        check_choice("model.dtype", self.dtype, ("float32", "bfloat16"))
        check_choice("model.kv_cache_dtype", self.kv_cache_dtype, ("", "float32", "bfloat16"))


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
