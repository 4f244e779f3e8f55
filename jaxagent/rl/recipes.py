"""Named RL recipes: presets of the typed sections of ``jaxagent.rl.config.RLConfig``.

``get_recipe("loop")`` returns the LOOP defaults; ``get_recipe("grpo", kl={"beta": 0.1},
update={"minibatch_size": 8})`` changes fields of a section (the others keep the preset's
values). A recipe also supplies the default group size K (``default_samples_per_task``): the
run config's ``rollout.samples_per_task`` is the one field a user sets to change it (0 there
means the recipe's K). All fields are static for jit; the update step is rebuilt when a config
changes.

Where the defaults come from (and where sources differ). Every recipe keeps truncated episodes
(``advantage.truncated="keep"``: a failure with the reward it got; with a critic, GAE
bootstraps at the cut); ``"drop"`` gives them no loss and leaves them out of the baselines.

- ``ppo``: classic RLHF PPO with a critic and GAE (Ouyang et al. 2022; Ziegler et al. 2019):
  per-token k1 KL penalty in the reward (beta 0.05, TRL's default), clip 0.2, value clip 0.2,
  gamma 1, lambda 0.95, advantage whitening, 4 epochs.
- ``grpo``: DeepSeekMath 2402.03300: group-normalised advantages, clip 0.2, k3 KL *in the loss*
  with beta 0.04, sequence-mean of token-means, one policy update per batch (mu = 1). The
  paper writes std without saying population or sample; we default to population (numpy's
  convention; TRL uses torch's sample std: set ``advantage.std_mode="sample"`` to match it).
- ``dr_grpo``: 2503.20783: no std division, loss summed over tokens and divided by a constant
  (the generation budget), no KL.
- ``dapo``: 2503.14476: clip-higher (eps_low 0.2, eps_high 0.28), token-mean over the batch,
  no KL, group-normalised advantages, K = 16. (Dynamic sampling, over-long filtering and the
  soft length penalty are data-side: ``jaxagent.train.dapo`` and the run config's ``rl.data``.)
- ``loop``: LOOP 2502.01600 and its public code: K = 6 samples per task, leave-one-out
  advantages without std normalisation, per-token ratio, eps = 0.1, 2 epochs over each batch
  in minibatches of 32 trajectories, no KL, no reference model, no critic, AdamW with a
  constant learning rate, gradient clipping at 1, samples with |A| < 0.01 dropped, LoRA
  r = 16 / alpha = 32 (set ``lora.rank=0`` for full fine-tuning). The paper writes the
  symmetric clip ``[1 - eps, 1 + eps]``; the public code clips the ratio from below at
  ``1 / (1 + eps)`` (``loss.clip_lower="reciprocal"``); we follow the paper by default.
  The paper's aggregation is a per-trajectory token mean averaged over trajectories.
- ``rloo``: 2402.14740: REINFORCE (no ratio, no clip) with the leave-one-out baseline at the
  sequence level: the sequence log-prob (sum over tokens), normalised by the number of
  sequences; K = 4; k1 KL in the reward is the paper's RLHF setting, off here (no reference).
- ``reinforce``: vanilla REINFORCE with a batch-mean baseline (``advantage.estimator=
  "batch_mean"``: the mean reward of the whole batch, so one sample per task learns), K = 1.
- ``rft``: rejection-sampling fine-tuning (2308.01825): keep samples with reward >= 1, then
  SFT (token-mean cross-entropy).
- ``sft``: supervised fine-tuning on demonstrations (the trainer's warm-start,
  ``jaxagent.train.sft``): token-mean cross-entropy over the batch's loss mask (actions 1,
  other tokens ``sft.observation_weight``), one optimiser step per batch in given order,
  AdamW (weight decay 0.01, clipping at 1) with a warm-up + stable + decay schedule
  (``make_optimizer(..., schedule="wsd")``); ``sft_config`` fills it from the ``sft:`` section.
- ``gigpo``: GiGPO 2505.10978 and verl-agent's ``gigpo`` settings: GRPO's clipped loss with
  group-in-group advantages, the episode-level group-normalised reward plus (omega = 1) each
  turn's discounted return (gamma = 0.95) normalised among the task's turns taken from the
  same anchor state; group size N = 8, k3 KL in the loss with beta 0.01, clip 0.2. F_norm is
  the std (the paper's default; ``advantage.std_mode="none"`` is its mean-only variant). We
  take the population std as ``grpo`` does; verl-agent uses torch's sample std
  (``advantage.std_mode="sample"``). Its episode mean is over trajectories, as in the paper
  (verl-agent can also average over every step row).
"""

from __future__ import annotations

from typing import Any

from jaxagent.rl.config import (
    AdvantageConfig,
    CriticConfig,
    KLConfig,
    LoraConfig,
    LossConfig,
    OptimConfig,
    RLConfig,
    UpdateConfig,
)


class Recipe:
    """A named preset: the ``RLConfig`` and the default group size K."""

    __slots__ = ("config", "samples_per_task")

    def __init__(self, config: RLConfig, samples_per_task: int):
        if samples_per_task < 1:
            raise ValueError(
                f"recipe {config.name!r}: samples_per_task={samples_per_task} must be >= 1"
            )
        self.config, self.samples_per_task = config, samples_per_task


_RECIPES: dict[str, Recipe] = {}


def register_recipe(config: RLConfig, samples_per_task: int = 1) -> RLConfig:
    """Add a named recipe with its default group size K; raises on a duplicate name."""
    if config.name in _RECIPES:
        raise ValueError(f"recipe {config.name!r} is already registered")
    _RECIPES[config.name] = Recipe(config, samples_per_task)
    return config


def recipe_names() -> tuple[str, ...]:
    return tuple(sorted(_RECIPES))


def _recipe(name: str) -> Recipe:
    if name not in _RECIPES:
        raise KeyError(f"unknown RL recipe {name!r}; known recipes: {', '.join(recipe_names())}")
    return _RECIPES[name]


def default_samples_per_task(name: str) -> int:
    """The recipe's group size K (samples per task)."""
    return _recipe(name).samples_per_task


def get_recipe(name: str, **sections: Any) -> RLConfig:
    """The typed config of a named recipe, with optional section changes
    (``RLConfig.override``: ``get_recipe("loop", lora={"rank": 0})``).

    Raises:
      KeyError naming the known recipes when ``name`` is unknown; ``RLConfigError`` (a
      ValueError) naming ``section.field`` for an unknown field or an invalid value.
    """
    base = _recipe(name).config
    return base.override(**sections) if sections else base


register_recipe(
    RLConfig(
        name="ppo",
        advantage=AdvantageConfig(estimator="gae", discount=1.0, gae_lambda=0.95, whiten=True),
        loss=LossConfig(
            policy="ppo", clip_eps_low=0.2, clip_eps_high=0.2, aggregation="token_mean"
        ),
        kl=KLConfig(mode="reward", estimator="k1", beta=0.05),
        critic=CriticConfig(enabled=True, value_coef=0.1, value_clip_eps=0.2),
        optim=OptimConfig(learning_rate=1e-6),
        update=UpdateConfig(num_epochs=4),
    ),
    samples_per_task=1,
)
register_recipe(
    RLConfig(
        name="grpo",
        advantage=AdvantageConfig(estimator="group_normalized", std_mode="population"),
        loss=LossConfig(
            policy="ppo", clip_eps_low=0.2, clip_eps_high=0.2, aggregation="seq_mean_token_mean"
        ),
        kl=KLConfig(mode="loss", estimator="k3", beta=0.04),
        optim=OptimConfig(learning_rate=1e-6),
        update=UpdateConfig(num_epochs=1),
    ),
    samples_per_task=64,
)
register_recipe(
    RLConfig(
        name="dr_grpo",
        advantage=AdvantageConfig(estimator="group_normalized", std_mode="none"),
        loss=LossConfig(
            policy="ppo",
            clip_eps_low=0.2,
            clip_eps_high=0.2,
            aggregation="seq_sum_norm",
            norm_constant=3000.0,
        ),
        optim=OptimConfig(learning_rate=1e-6),
        update=UpdateConfig(num_epochs=1),
    ),
    samples_per_task=8,
)
register_recipe(
    RLConfig(
        name="dapo",
        advantage=AdvantageConfig(estimator="group_normalized", std_mode="population"),
        loss=LossConfig(
            policy="ppo", clip_eps_low=0.2, clip_eps_high=0.28, aggregation="token_mean"
        ),
        optim=OptimConfig(learning_rate=1e-6, weight_decay=0.1),
        update=UpdateConfig(num_epochs=1),
    ),
    samples_per_task=16,
)
register_recipe(
    RLConfig(
        name="loop",
        advantage=AdvantageConfig(estimator="leave_one_out", std_mode="none", drop_below=0.01),
        loss=LossConfig(
            policy="ppo",
            ratio_level="token",
            clip_eps_low=0.1,
            clip_eps_high=0.1,
            clip_lower="subtract",
            aggregation="seq_mean_token_mean",
        ),
        optim=OptimConfig(learning_rate=5e-6, max_grad_norm=1.0),
        lora=LoraConfig(rank=16, alpha=32.0),
        update=UpdateConfig(num_epochs=2, minibatch_size=32),
    ),
    samples_per_task=6,
)
register_recipe(
    RLConfig(
        name="rloo",
        advantage=AdvantageConfig(estimator="leave_one_out", std_mode="none"),
        loss=LossConfig(policy="reinforce", aggregation="seq_sum_norm", norm_constant=1.0),
        optim=OptimConfig(learning_rate=1e-6),
        update=UpdateConfig(num_epochs=1),
    ),
    samples_per_task=4,
)
register_recipe(
    RLConfig(
        name="reinforce",
        advantage=AdvantageConfig(estimator="batch_mean"),
        loss=LossConfig(policy="reinforce", aggregation="seq_mean_token_mean"),
        optim=OptimConfig(learning_rate=1e-6),
        update=UpdateConfig(num_epochs=1),
    ),
    samples_per_task=1,
)
register_recipe(
    RLConfig(
        name="rft",
        advantage=AdvantageConfig(estimator="given", filter_reward=True, min_reward=1.0),
        loss=LossConfig(policy="sft", aggregation="token_mean"),
        optim=OptimConfig(learning_rate=1e-5),
        update=UpdateConfig(num_epochs=1),
    ),
    samples_per_task=1,
)
register_recipe(
    RLConfig(
        name="gigpo",
        advantage=AdvantageConfig(
            estimator="gigpo", std_mode="population", discount=0.95, step_weight=1.0
        ),
        loss=LossConfig(
            policy="ppo", clip_eps_low=0.2, clip_eps_high=0.2, aggregation="seq_mean_token_mean"
        ),
        kl=KLConfig(mode="loss", estimator="k3", beta=0.01),
        optim=OptimConfig(learning_rate=1e-6),
        update=UpdateConfig(num_epochs=1),
    ),
    samples_per_task=8,
)
register_recipe(
    RLConfig(
        name="sft",
        advantage=AdvantageConfig(estimator="given"),
        loss=LossConfig(policy="sft", aggregation="token_mean"),
        optim=OptimConfig(learning_rate=3e-3, weight_decay=0.01, max_grad_norm=1.0),
        update=UpdateConfig(num_epochs=1, shuffle=False),
    ),
    samples_per_task=1,
)


def sft_config(
    learning_rate: float, steps: int, batch_size: int, microbatch_size: int = 0
) -> RLConfig:
    """The ``sft`` recipe for ``steps`` optimiser steps of ``batch_size`` rows, gradients
    summed over microbatches of ``microbatch_size`` rows (0: the whole batch), with a linear
    warm-up over 5% of the steps (schedule: ``make_optimizer(config, "wsd", steps)``)."""
    return get_recipe(
        "sft",
        optim={"learning_rate": learning_rate, "warmup_steps": max(1, steps // 20)},
        update={"minibatch_size": batch_size, "microbatch_size": microbatch_size},
    )
