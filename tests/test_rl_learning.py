"""Smoke tests that learn: every recipe family (GRPO, LOOP, REINFORCE) raises a rule reward
from a tiny random policy, each with its own group size (REINFORCE: one sample per task).

The reward is the fraction of completion tokens equal to a target token (about 1 / vocab for
the random policy). Each iteration samples K completions per prompt with jaxagent's sampler,
packs a TokenBatch (loss only on the sampled tokens) and runs one update step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.generate import Sampler, SamplingConfig
from jaxagent.models import ModelConfig, init_model
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import TrainState
from jaxagent.rl.update import make_update_step
from jaxagent.rl.model_fns import model_apply_fn
from jaxagent.types import TokenBatch

VOCAB, TARGET, PROMPT, NEW, TASKS, K = 32, 5, 4, 8, 4, 8


def pack(prompts, out, groups):
    """Prompt [B, P] + sampled completion [B, N] -> TokenBatch [B, P + N]."""
    gen = jnp.arange(NEW)[None, :] < out.lengths[:, None]
    reward = jnp.sum((out.tokens == TARGET) * gen, axis=1) / NEW
    return TokenBatch.from_completions(
        prompts, out.tokens, out.logprobs, out.lengths, reward, groups
    )


def train(recipe, iterations, *, singletons=False, **overrides):
    """``singletons``: every row is its own task (group size 1, REINFORCE's K)."""
    graphdef, params = init_model(
        ModelConfig.test(vocab_size=VOCAB, num_layers=1), jax.random.key(0)
    )
    config = get_recipe(recipe, update={"minibatch_size": TASKS * K}, **overrides)
    ref = params if config.needs_reference else None
    state = TrainState.create(
        jax.tree.map(jnp.copy, params), config, jax.random.key(1), ref_params=ref
    )
    update = make_update_step(config, model_apply_fn(graphdef))
    sampler = Sampler(graphdef)
    sampling = SamplingConfig(max_new_tokens=NEW)
    prompts = jax.random.randint(jax.random.key(2), (TASKS, PROMPT), 0, VOCAB)
    prompts = jnp.repeat(prompts, K, axis=0)  # [TASKS * K, PROMPT], K samples per task
    key = jax.random.key(3)
    rewards = []
    for _ in range(iterations):
        key, k = jax.random.split(key)
        out = sampler(state.model_params(), np.asarray(prompts).tolist(), sampling, k)
        groups = jnp.arange(TASKS * K) if singletons else jnp.repeat(jnp.arange(TASKS), K)
        batch = pack(prompts, out, groups)
        rewards.append(float(batch.rewards.mean()))
        state, metrics = update(state, batch)
        assert np.isfinite(float(metrics["loss/total"]))
    return rewards


@pytest.mark.parametrize(
    "recipe,overrides",
    [
        ("grpo", dict(optim={"learning_rate": 2e-3})),
        ("loop", dict(optim={"learning_rate": 2e-3}, lora={"rank": 0})),
        # Group size 1: a group baseline would make every advantage r - r = 0; the batch-mean
        # baseline learns.
        ("reinforce", dict(optim={"learning_rate": 2e-3}, singletons=True)),
    ],
)
def test_rl_raises_rule_reward(recipe, overrides):
    rewards = train(recipe, 24, **overrides)
    start, end = np.mean(rewards[:3]), np.mean(rewards[-5:])
    print(recipe, [round(r, 3) for r in rewards])
    assert start < 0.15
    assert end > start + 0.3, rewards
