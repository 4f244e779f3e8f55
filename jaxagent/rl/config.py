"""The typed sections of an RL algorithm, and the name -> function tables they select from.

``RLConfig`` is a tree of frozen sections, each owning one concern:

    advantage  how sequence / token advantages are estimated (``ADVANTAGE_ESTIMATORS``),
               which samples are kept, and what a truncated episode means
    loss       the policy surrogate (``POLICY_LOSSES``), ratio level, clipping, aggregation,
               the off-policy correction (``OFF_POLICY_CORRECTIONS``)
    kl         the KL to a reference policy (in the loss or in the reward)
    critic     the value loss of a model with a value head
    optim      AdamW, gradient clipping, warm-up
    lora       low-rank adapters (rank 0: full fine-tuning)
    update     epochs, minibatches and microbatches of one update

Adding an advantage estimator or a policy loss is one pure function (``rl/advantages.py``,
``rl/losses.py``) and one entry in a table of ``rl/tables.py``; a recipe is a preset of these sections
(``rl/recipes.py``). All fields are static for jit (they pick branches and shapes).

Validation errors name the dotted key (``loss.clip_eps_low=1.5 must be ...``), so the run
config can prefix ``rl.`` and point at the YAML key to change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from jaxagent.rl import advantages as adv_lib
from jaxagent.rl import losses as loss_lib
from jaxagent.rl.kl import KL_ESTIMATORS

# The tables the sections validate against.
from jaxagent.rl.tables import ADVANTAGE_ESTIMATORS, OFF_POLICY_CORRECTIONS, POLICY_LOSSES

_DC = dict(frozen=True, kw_only=True, slots=True)


class RLConfigError(ValueError):
    """An RL config value is invalid; the message starts with the dotted key."""


def _choice(key: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise RLConfigError(f"{key}={value!r} is not valid; choose one of {list(allowed)}")


def _at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise RLConfigError(f"{key}={value!r} must be >= {low}")


KL_MODES = ("none", "loss", "reward")
MOMENTS_DTYPES = ("param", "float32")
LORA_DTYPES = ("float32", "param")
TRUNCATED_MODES = ("keep", "drop")
MISMATCH_MODES = ("free", "full", "none")


# ----------------------------------------------------------------------------- sections


@dataclass(**_DC)
class AdvantageConfig:
    """Advantages, sample filters and truncation (computed before the update)."""

    estimator: str = "leave_one_out"  # a key of ADVANTAGE_ESTIMATORS
    std_mode: str = "none"  # group std convention of group_normalized: population | sample | none
    eps: float = 1e-6  # added to the group std
    whiten: bool = False  # batch whitening after the estimator
    drop_below: float = 0.0  # samples with |A| below this carry no loss (0: keep all)
    discount: float = 1.0  # gamma: GAE's, and GiGPO's step returns (its paper: 0.95)
    gae_lambda: float = 0.95  # GAE lambda
    # A truncated episode (step or token budget): "keep" trains on it as it is (critic-free:
    # a failure with the reward it got; GAE: bootstraps on the critic's value at the cut),
    # "drop" gives it no loss and leaves it out of the group / batch baselines.
    truncated: str = "keep"
    filter_reward: bool = False  # keep only samples with reward >= min_reward (RFT)
    min_reward: float = 1.0
    step_weight: float = 1.0  # GiGPO's omega: weight of the step-level (anchor-state) term

    def __post_init__(self):
        _choice("advantage.estimator", self.estimator, ADVANTAGE_ESTIMATORS)
        _choice("advantage.std_mode", self.std_mode, adv_lib._STD_MODES)
        _choice("advantage.truncated", self.truncated, TRUNCATED_MODES)
        _at_least("advantage.drop_below", self.drop_below, 0.0)
        _at_least("advantage.eps", self.eps, 0.0)
        _at_least("advantage.step_weight", self.step_weight, 0.0)
        for key in ("discount", "gae_lambda"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise RLConfigError(f"advantage.{key}={getattr(self, key)!r} must be in [0, 1]")


@dataclass(**_DC)
class LossConfig:
    """The policy surrogate and how per-token losses are reduced."""

    policy: str = "ppo"  # a key of POLICY_LOSSES
    ratio_level: str = "token"  # token | turn | trajectory
    clip_eps_low: float = 0.2  # ratio lower bound 1 - eps_low (or 1 / (1 + eps_low))
    clip_eps_high: float = 0.2  # ratio upper bound 1 + eps_high
    clip_lower: str = "subtract"  # subtract | reciprocal
    aggregation: str = "seq_mean_token_mean"  # token_mean | seq_mean_token_mean | seq_sum_norm
    norm_constant: float = 1.0  # seq_sum_norm divisor per sequence (Dr.GRPO: generation budget)
    entropy_coef: float = 0.0  # entropy bonus weight (subtracted from the loss)
    # Off-policy correction (a key of OFF_POLICY_CORRECTIONS) for tokens sampled by a policy
    # pi_behav other than the learner's pi_prox at the start of the update (stale weights of
    # asynchronous training, bfloat16 sampling weights): "none" clips the ratio against the
    # behaviour log-probs (LOOP's on-policy path); "decoupled" (decoupled PPO), "tis"
    # (truncated importance sampling) and "icepop" (mask tokens with an extreme ratio) clip
    # against pi_prox and weight each token by a function of pi_prox / pi_behav.
    off_policy: str = "none"
    tis_cap: float = 2.0  # tis: the weight's truncation C, min(pi_prox / pi_behav, C)
    decoupled_cap: float = 0.0  # decoupled: drop tokens with pi_prox / pi_behav above (0: off)
    icepop_low: float = 0.5  # icepop: tokens with pi_prox / pi_behav outside [low, high]
    icepop_high: float = 2.0  # carry no loss

    def __post_init__(self):
        _choice("loss.policy", self.policy, POLICY_LOSSES)
        _choice("loss.off_policy", self.off_policy, OFF_POLICY_CORRECTIONS)
        if self.off_policy != "none" and not POLICY_LOSSES[self.policy].on_policy:
            raise RLConfigError(
                f"loss.off_policy={self.off_policy!r} with loss.policy={self.policy!r}: the "
                "loss reads no behaviour log-probs, so there is nothing to correct; set "
                "loss.off_policy='none'"
            )
        if not self.tis_cap >= 1.0:
            raise RLConfigError(
                f"loss.tis_cap={self.tis_cap!r} must be >= 1 (a cap below 1 shrinks every "
                "on-policy token's weight); e.g. 2"
            )
        if not (self.decoupled_cap == 0.0 or self.decoupled_cap >= 1.0):
            raise RLConfigError(
                f"loss.decoupled_cap={self.decoupled_cap!r} must be 0 (off) or >= 1 (a cap "
                "below 1 drops on-policy tokens)"
            )
        if not 0.0 <= self.icepop_low <= 1.0 <= self.icepop_high:
            raise RLConfigError(
                f"loss.icepop_low={self.icepop_low!r}, loss.icepop_high={self.icepop_high!r}: "
                "need 0 <= icepop_low <= 1 <= icepop_high (on-policy tokens, ratio 1, must be "
                "kept); e.g. 0.5 and 2"
            )
        _choice("loss.ratio_level", self.ratio_level, loss_lib.RATIO_LEVELS)
        _choice("loss.clip_lower", self.clip_lower, loss_lib.CLIP_LOWERS)
        _choice("loss.aggregation", self.aggregation, loss_lib.AGGREGATIONS)
        for key in ("clip_eps_low", "clip_eps_high"):
            if not 0.0 < getattr(self, key) < 10.0:
                raise RLConfigError(f"loss.{key}={getattr(self, key)!r} must be in (0, 10)")
        if self.clip_lower == "subtract" and self.clip_eps_low >= 1.0:
            raise RLConfigError(
                f"loss.clip_eps_low={self.clip_eps_low} >= 1 makes the lower bound <= 0; use a "
                "smaller value or loss.clip_lower='reciprocal'"
            )
        if self.norm_constant <= 0:
            raise RLConfigError(f"loss.norm_constant={self.norm_constant!r} must be > 0")


@dataclass(**_DC)
class KLConfig:
    """KL to a frozen reference policy (a second model copy unless the batch brings it)."""

    mode: str = "none"  # none | loss (GRPO) | reward (RLHF PPO: per-token penalty)
    estimator: str = "k3"  # k1 | k2 | k3
    beta: float = 0.0  # coefficient

    def __post_init__(self):
        _choice("kl.mode", self.mode, KL_MODES)
        _choice("kl.estimator", self.estimator, KL_ESTIMATORS)
        if self.mode != "none" and self.beta <= 0:
            raise RLConfigError(
                f"kl.beta={self.beta!r} must be > 0 with kl.mode={self.mode!r} "
                "(or set kl.mode='none')"
            )


@dataclass(**_DC)
class CriticConfig:
    """PPO's value loss on the model's value head."""

    enabled: bool = False
    value_coef: float = 0.5  # weight of the value loss
    value_clip_eps: float = 0.0  # PPO value clipping range (0: off)

    def __post_init__(self):
        _at_least("critic.value_coef", self.value_coef, 0.0)
        _at_least("critic.value_clip_eps", self.value_clip_eps, 0.0)


@dataclass(**_DC)
class OptimConfig:
    """AdamW with global-norm clipping, constant after an optional linear warm-up."""

    learning_rate: float = 1e-6
    warmup_steps: int = 0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0  # global-norm clipping (0: off)
    # Adam's two moments: in the parameters' dtype ("param"), or in float32 for any
    # parameter dtype ("float32": with bfloat16 parameters, b2 = 0.999 rounds to 1 and
    # nu's (1 - b2) g^2 increments round away; the update is cast back to the parameters'
    # dtype). Costs 8 bytes a trained parameter instead of 4 under bfloat16.
    moments_dtype: str = "param"

    def __post_init__(self):
        _choice("optim.moments_dtype", self.moments_dtype, MOMENTS_DTYPES)
        if self.learning_rate <= 0:
            raise RLConfigError(f"optim.learning_rate={self.learning_rate!r} must be > 0")
        for key in ("warmup_steps", "weight_decay", "eps", "max_grad_norm"):
            _at_least(f"optim.{key}", getattr(self, key), 0)
        for key in ("b1", "b2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise RLConfigError(f"optim.{key}={getattr(self, key)!r} must be in [0, 1)")


@dataclass(**_DC)
class LoraConfig:
    """Low-rank adapters on the named projections (rank 0: full fine-tuning)."""

    rank: int = 0
    alpha: float = 32.0
    targets: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    # The adapters' dtype: float32 over any base (a bfloat16 adapter's small updates round
    # away), or "param" for the base's own dtype. The merge computes the delta in float32
    # either way (jaxagent.rl.lora.merge_lora).
    dtype: str = "float32"

    def __post_init__(self):
        _at_least("lora.rank", self.rank, 0)
        _choice("lora.dtype", self.dtype, LORA_DTYPES)
        if self.rank and not self.targets:
            raise RLConfigError(
                "lora.targets is empty with lora.rank > 0; name projections "
                "(e.g. ['q_proj', 'v_proj']) or set lora.rank=0"
            )


@dataclass(**_DC)
class UpdateConfig:
    """The schedule of one update: epochs over the batch, minibatches, microbatches."""

    num_epochs: int = 1  # passes over each batch
    minibatch_size: int = 32  # trajectories per optimiser step
    microbatch_size: int = 0  # trajectories per gradient-accumulation step (0: = minibatch)
    shuffle: bool = True  # reshuffle trajectories before each epoch
    # skip the rest of an iteration's optimiser steps once a minibatch's approximate
    # KL(old || new) exceeds this (LOOP / PPO target_kl; jaxagent.rl.guards); 0 = off
    kl_stop: float = 0.0
    # Two passes per optimiser step: the first measures the loss and the gradient norm, the
    # second recomputes the gradients and applies the optimiser to each one as the backward
    # pass produces it, so the whole gradient tree is never in memory (exact: the same
    # gradients, clip and guards). Costs one more forward + backward per step; needs
    # microbatch_size = minibatch_size (accumulation keeps every gradient).
    fused_optimizer: bool = False
    # Recompute each block in the backward pass instead of storing its activations (the
    # trainer's learner pass): memory for one more forward. A small model on CPU is faster
    # without it (benchmarks/learner_step.py), where activations fit anyway.
    remat: bool = True
    # The sampler-vs-learner mismatch (mismatch/* metrics: log pi_learner - log pi_behav
    # before the first optimiser step). "free": from the first minibatch's own forward pass
    # (no extra compute; over its loss tokens: the whole batch's with one minibatch, else a
    # random 1 / n_minibatches of the rows); "full": one extra no-grad forward over every
    # sampled token of the batch (measured +20% and +31% of benchmarks/learner_step.py's
    # LOOP update on a busy 2-core CPU); "none". An off-policy correction (loss.off_policy)
    # runs that forward anyway (its pi_prox) and measures the whole batch.
    measure_mismatch: str = "free"

    def __post_init__(self):
        _at_least("update.num_epochs", self.num_epochs, 1)
        _choice("update.measure_mismatch", self.measure_mismatch, MISMATCH_MODES)
        if self.fused_optimizer and self.microbatch != self.minibatch_size:
            raise RLConfigError(
                f"update.fused_optimizer=true with update.microbatch_size={self.microbatch_size} "
                f"< minibatch_size={self.minibatch_size}: gradient accumulation keeps every "
                "gradient, which the fused step avoids; set microbatch_size=0 or "
                "fused_optimizer=false"
            )
        if not self.kl_stop >= 0:
            raise RLConfigError(
                f"update.kl_stop={self.kl_stop!r} must be >= 0 (0 turns the KL stop off; "
                "LOOP uses about 0.01-0.05)"
            )
        _at_least("update.minibatch_size", self.minibatch_size, 1)
        if self.microbatch_size < 0 or (
            self.microbatch_size and self.minibatch_size % self.microbatch_size
        ):
            raise RLConfigError(
                f"update.microbatch_size={self.microbatch_size} must be 0 or divide "
                f"update.minibatch_size={self.minibatch_size}"
            )

    @property
    def microbatch(self) -> int:
        """Trajectories per gradient-accumulation step."""
        return self.microbatch_size or self.minibatch_size


SECTIONS: dict[str, type] = {
    "advantage": AdvantageConfig,
    "loss": LossConfig,
    "kl": KLConfig,
    "critic": CriticConfig,
    "optim": OptimConfig,
    "lora": LoraConfig,
    "update": UpdateConfig,
}


@dataclass(**_DC)
class RLConfig:
    """Everything the update step needs to know about the algorithm. All fields are static."""

    name: str = "custom"  # recipe name, for logs
    advantage: AdvantageConfig = dataclasses.field(default_factory=AdvantageConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    kl: KLConfig = dataclasses.field(default_factory=KLConfig)
    critic: CriticConfig = dataclasses.field(default_factory=CriticConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    update: UpdateConfig = dataclasses.field(default_factory=UpdateConfig)

    def __post_init__(self):
        for key, cls in SECTIONS.items():
            if not isinstance(getattr(self, key), cls):
                raise RLConfigError(
                    f"{key} must be a {cls.__name__}, got {type(getattr(self, key)).__name__}"
                )
        if ADVANTAGE_ESTIMATORS[self.advantage.estimator].needs_critic and not self.critic.enabled:
            raise RLConfigError(
                f"advantage.estimator={self.advantage.estimator!r} needs critic.enabled=true "
                "(it bootstraps on values); enable the critic or pick a critic-free estimator"
            )
        if self.update.fused_optimizer and self.lora.rank:
            raise RLConfigError(
                f"update.fused_optimizer=true with lora.rank={self.lora.rank}: the fused step "
                "is for full fine-tuning (LoRA's adapter gradients are small already); set "
                "lora.rank=0 or fused_optimizer=false"
            )

    @property
    def needs_reference(self) -> bool:
        """True when the recipe needs reference-policy log-probs (a second model copy)."""
        return self.kl.mode != "none"

    @property
    def needs_turns(self) -> bool:
        """True when the estimator reads per-turn data (``TokenBatch.turn_rewards`` and
        ``anchor_ids``: pack the batch with ``max_turns``)."""
        return ADVANTAGE_ESTIMATORS[self.advantage.estimator].needs_turns

    @property
    def on_policy_sampling(self) -> bool:
        """True when the maths assumes tokens sampled from the policy's own distribution
        (temperature 1, no top-k / top-p): ratio or REINFORCE losses, and KL estimates from
        the behaviour log-probs."""
        return POLICY_LOSSES[self.loss.policy].on_policy or self.kl.mode != "none"

    def override(self, **sections: Any) -> "RLConfig":
        """A copy with section fields changed: ``cfg.override(loss={"clip_eps_high": 0.28},
        update={"minibatch_size": 8})``. A dict changes the named fields of the section (the
        others keep this config's values); a section instance replaces it whole.

        Raises:
          RLConfigError naming ``section.field`` for an unknown section or field, or a bad value.
        """
        changes = {}
        for key, value in sections.items():
            if key == "name":
                changes["name"] = value
                continue
            if key not in SECTIONS:
                raise RLConfigError(
                    f"unknown RLConfig section {key!r}; sections: {['name', *SECTIONS]}"
                )
            if isinstance(value, SECTIONS[key]):
                changes[key] = value
                continue
            current = getattr(self, key)
            names = {f.name for f in dataclasses.fields(current)}
            unknown = sorted(set(value) - names)
            if unknown:
                raise RLConfigError(
                    f"unknown field(s) {[f'{key}.{u}' for u in unknown]}; {key} has {sorted(names)}"
                )
            fixed = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
            changes[key] = dataclasses.replace(current, **fixed)
        return dataclasses.replace(self, **changes)

    def replace(self, **changes) -> "RLConfig":
        return dataclasses.replace(self, **changes)
