"""Full fine-tuning of bfloat16 weights: why it is refused and what the refusal points to.

An Adam step moves a weight by about the learning rate; a bfloat16 weight's half-ulp is
2^-9 of its size, so at the recipes' rates (1e-6 .. 1e-5) the rounded sum is the old weight
for almost every entry. The run config refuses it in one line and names the master-copy fix
(float32 weights, bfloat16 compute)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxagent.errors import ConfigError
from jaxagent.models import ModelConfig, apply_model, init_model, token_logprobs
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import make_optimizer
from jaxagent.train.config import load_config


def _moved_fraction(param_dtype: str, steps: int = 10, lr: float = 1e-5) -> float:
    """Share of weight entries that differ from the start after ``steps`` AdamW steps of a
    next-token loss (bfloat16 compute either way)."""
    cfg = ModelConfig.test(num_layers=1, param_dtype=param_dtype, dtype="bfloat16")
    graphdef, params = init_model(cfg, jax.random.key(0))
    tx = make_optimizer(get_recipe("loop", lora={"rank": 0}, optim={"learning_rate": lr}))
    tokens = jax.random.randint(jax.random.key(1), (4, 16), 0, cfg.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(16), (4, 16))
    seg = jnp.ones_like(tokens)

    def loss(p):
        logits = apply_model(graphdef, p, tokens, pos, seg).logits
        return -jnp.mean(token_logprobs(logits, tokens)[:, 1:])

    @jax.jit
    def step(p, s):
        g = jax.grad(loss)(p)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    p, s = params, tx.init(params)
    for _ in range(steps):
        p, s = step(p, s)
    a, b = jax.tree.leaves(params), jax.tree.leaves(p)
    moved = sum(int(np.sum(np.asarray(x != y))) for x, y in zip(a, b))
    return moved / sum(x.size for x in a)


def test_bfloat16_weights_barely_move_float32_weights_do():
    # The evidence for the refusal below (the figures of the config check's docstring).
    bf16, fp32 = _moved_fraction("bfloat16"), _moved_fraction("float32")
    print(f"entries moved in 10 steps at 1e-5: bfloat16 {bf16:.3f}, float32 {fp32:.3f}")
    assert fp32 > 0.8 and bf16 < fp32 / 4, (bf16, fp32)


def test_config_refuses_bfloat16_full_fine_tuning_naming_the_fix():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["model.param_dtype=bfloat16", "rl.lora.rank=0"])
    text = str(err.value)
    assert "\n" not in text
    for needle in ("model.param_dtype=bfloat16", "rl.lora.rank=0", "model.param_dtype=float32"):
        assert needle in text, text


def test_config_accepts_the_fixes():
    # the master copy (float32 weights, bfloat16 compute), LoRA over bfloat16, no training
    load_config(None, ["model.param_dtype=float32", "model.dtype=bfloat16", "rl.lora.rank=0"])
    load_config(None, ["model.param_dtype=bfloat16", "rl.lora.rank=8"])
    load_config(None, ["model.param_dtype=bfloat16", "rl.lora.rank=0", "train.iterations=0"])
