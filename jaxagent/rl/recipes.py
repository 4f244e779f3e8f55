"""Named RL recipes: one typed, validated config that selects advantages, loss, KL and optimiser.

``get_recipe("loop")`` returns the LOOP defaults; ``get_recipe("grpo", kl_beta=0.0)`` overrides
fields. All fields are static for jit (they pick branches and shapes); the update step is
rebuilt when a config changes.

Where the defaults come from (and where sources differ):

- ``ppo``: classic RLHF PPO with a critic and GAE (Ouyang et al. 2022; Ziegler et al. 2019):
  per-token k1 KL penalty in the reward (beta 0.05, TRL's default), clip 0.2, value clip 0.2,
  gamma 1, lambda 0.95, advantage whitening, 4 epochs.
- ``grpo``: DeepSeekMath 2402.03300: group-normalised advantages, clip 0.2, k3 KL *in the loss*
  with beta 0.04, sequence-mean of token-means, one policy update per batch (mu = 1). The
  paper writes std without saying population or sample; we default to population (numpy's
  convention; TRL uses torch's sample std: set ``std_mode="sample"`` to match it).
- ``dr_grpo``: 2503.20783: no std division, loss summed over tokens and divided by a constant
  (the generation budget), no KL.
- ``dapo``: 2503.14476: clip-higher (eps_low 0.2, eps_high 0.28), token-mean over the batch,
  no KL, group-normalised advantages. (Dynamic sampling, over-long filtering and the soft
  length penalty are data-side and belong to the trainer.)
- ``loop``: LOOP 2502.01600 and its public code: K = 6 samples per task, leave-one-out
  advantages without std normalisation, per-token ratio, eps = 0.1, 2 epochs over each batch
  in minibatches of 32 trajectories, no KL, no reference model, no critic, AdamW with a
  constant learning rate, gradient clipping at 1, samples with |A| < 0.01 dropped, LoRA
  r = 16 / alpha = 32 (set ``lora_rank=0`` for full fine-tuning). The paper writes the
  symmetric clip ``[1 - eps, 1 + eps]``; the public code clips the ratio from below at
  ``1 / (1 + eps)`` (``clip_lower="reciprocal"``); we follow the paper by default.
  The paper's aggregation is a per-trajectory token mean averaged over trajectories.
- ``rloo``: 2402.14740: REINFORCE (no ratio, no clip) with the leave-one-out baseline at the
  sequence level: the sequence log-prob (sum over tokens), normalised by the number of
  sequences; K = 4; k1 KL in the reward is the paper's RLHF setting, off here (no reference).
- ``reinforce``: vanilla REINFORCE with a batch-mean baseline (group of the whole batch is
  selected by the trainer via group ids; here: group-normalised without std).
- ``rft``: rejection-sampling fine-tuning (2308.01825): keep samples with reward >= 1, then
  SFT (token-mean cross-entropy).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from jaxagent.rl.advantages import _STD_MODES
from jaxagent.rl.kl import KL_ESTIMATORS
from jaxagent.rl.losses import AGGREGATIONS, CLIP_LOWERS, RATIO_LEVELS

ADVANTAGE_MODES = ("gae", "group_normalized", "leave_one_out", "given")
POLICY_LOSSES = ("ppo", "reinforce", "sft")
KL_MODES = ("none", "loss", "reward")


@dataclass(frozen=True, slots=True, kw_only=True)
class RLConfig:
    """Everything the update step needs to know about the algorithm. All fields are static."""

    name: str = "custom"  # recipe name, for logs
    # --- advantages (computed by ``compute_advantages`` before the update)
    advantage: str = "leave_one_out"  # one of ADVANTAGE_MODES; "given" = use batch.advantages
    std_mode: str = "none"  # group std convention: population | sample | none
    adv_eps: float = 1e-6  # added to the group std
    whiten_advantages: bool = False  # batch whitening after the estimator
    drop_advantage_below: float = 0.0  # drop samples with |A| below this from the loss (0: keep all)
    group_size: int = 1  # samples per task (K); the trainer samples this many
    discount: float = 1.0  # GAE gamma
    gae_lambda: float = 0.95  # GAE lambda
    # --- policy loss
    policy_loss: str = "ppo"  # ppo | reinforce | sft
    ratio_level: str = "token"  # token | turn | trajectory
    clip_eps_low: float = 0.2  # ratio lower bound 1 - eps_low (or 1 / (1 + eps_low))
    clip_eps_high: float = 0.2  # ratio upper bound 1 + eps_high
    clip_lower: str = "subtract"  # subtract | reciprocal
    aggregation: str = "seq_mean_token_mean"  # token_mean | seq_mean_token_mean | seq_sum_norm
    norm_constant: float = 1.0  # seq_sum_norm divisor per sequence (Dr.GRPO: generation budget)
    # --- KL to a reference policy
    kl_mode: str = "none"  # none | loss | reward
    kl_estimator: str = "k3"  # k1 | k2 | k3
    kl_beta: float = 0.0  # KL coefficient
    # --- critic and entropy
    use_critic: bool = False  # PPO value loss on the model's value output
    value_coef: float = 0.5  # weight of the value loss
    value_clip_eps: Optional[float] = None  # PPO value clipping (None: off)
    entropy_coef: float = 0.0  # entropy bonus weight (subtracted from the loss)
    # --- RFT
    rft_reward_threshold: float = 1.0  # keep samples with reward >= this (policy_loss="sft")
    rft_filter: bool = False  # apply the RFT filter to the SFT loss
    # --- schedule of one update
    num_epochs: int = 1  # passes over each batch
    minibatch_size: int = 32  # trajectories per optimiser step
    microbatch_size: int = 0  # trajectories per gradient-accumulation step (0: = minibatch)
    shuffle: bool = True  # reshuffle trajectories before each epoch
    # --- optimiser (AdamW, constant LR after optional warm-up)
    learning_rate: float = 1e-6
    warmup_steps: int = 0
    weight_decay: float = 0.0
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: Optional[float] = 1.0  # global-norm clipping (None: off)
    # --- LoRA (0: full fine-tuning)
    lora_rank: int = 0
    lora_alpha: float = 32.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __post_init__(self) -> None:
        choices = {
            "advantage": ADVANTAGE_MODES,
            "std_mode": _STD_MODES,
            "policy_loss": POLICY_LOSSES,
            "ratio_level": RATIO_LEVELS,
            "clip_lower": CLIP_LOWERS,
            "aggregation": AGGREGATIONS,
            "kl_mode": KL_MODES,
            "kl_estimator": KL_ESTIMATORS,
        }
        for field, allowed in choices.items():
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"RLConfig.{field}={value!r} is not valid; choose one of {allowed}")
        positive_ints = ("group_size", "num_epochs", "minibatch_size")
        for field in positive_ints:
            if getattr(self, field) < 1:
                raise ValueError(f"RLConfig.{field}={getattr(self, field)} must be >= 1")
        if self.microbatch_size < 0 or (
            self.microbatch_size and self.minibatch_size % self.microbatch_size
        ):
            raise ValueError(
                f"RLConfig.microbatch_size={self.microbatch_size} must be 0 or divide "
                f"minibatch_size={self.minibatch_size}"
            )
        for field in ("clip_eps_low", "clip_eps_high"):
            if not 0.0 < getattr(self, field) < 10.0:
                raise ValueError(f"RLConfig.{field}={getattr(self, field)} must be in (0, 10)")
        if self.clip_lower == "subtract" and self.clip_eps_low >= 1.0:
            raise ValueError(
                f"RLConfig.clip_eps_low={self.clip_eps_low} >= 1 makes the lower bound <= 0; "
                "use a smaller value or clip_lower='reciprocal'"
            )
        if self.kl_mode != "none" and self.kl_beta <= 0:
            raise ValueError(f"RLConfig.kl_mode={self.kl_mode!r} needs kl_beta > 0 (got {self.kl_beta})")
        if self.advantage == "gae" and not self.use_critic:
            raise ValueError("RLConfig.advantage='gae' needs use_critic=True (GAE bootstraps on values)")
        if self.learning_rate <= 0 or self.norm_constant <= 0:
            raise ValueError("RLConfig.learning_rate and norm_constant must be > 0")
        if self.lora_rank < 0:
            raise ValueError(f"RLConfig.lora_rank={self.lora_rank} must be >= 0 (0 = off)")
        if not 0.0 <= self.discount <= 1.0 or not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError("RLConfig.discount and gae_lambda must be in [0, 1]")

    @property
    def needs_reference(self) -> bool:
        """True when the recipe needs reference-policy log-probs (a second model copy)."""
        return self.kl_mode != "none"

    @property
    def microbatch(self) -> int:
        """Trajectories per gradient-accumulation step."""
        return self.microbatch_size or self.minibatch_size

    def replace(self, **changes) -> "RLConfig":
        return dataclasses.replace(self, **changes)


_RECIPES: dict[str, RLConfig] = {}


def register_recipe(config: RLConfig) -> RLConfig:
    """Add a named recipe; raises on a duplicate name."""
    if config.name in _RECIPES:
        raise ValueError(f"recipe {config.name!r} is already registered")
    _RECIPES[config.name] = config
    return config


def recipe_names() -> tuple[str, ...]:
    return tuple(sorted(_RECIPES))


def get_recipe(name: str, **overrides) -> RLConfig:
    """The typed config of a named recipe, with optional field overrides.

    Raises:
      KeyError naming the known recipes when ``name`` is unknown; TypeError for an unknown
      field; ValueError for an invalid value.
    """
    if name not in _RECIPES:
        raise KeyError(f"unknown RL recipe {name!r}; known recipes: {', '.join(recipe_names())}")
    base = _RECIPES[name]
    unknown = set(overrides) - {f.name for f in dataclasses.fields(RLConfig)}
    if unknown:
        raise TypeError(f"unknown RLConfig field(s) {sorted(unknown)} for recipe {name!r}")
    return dataclasses.replace(base, **overrides) if overrides else base


register_recipe(RLConfig(
    name="ppo", advantage="gae", use_critic=True, discount=1.0, gae_lambda=0.95,
    whiten_advantages=True, policy_loss="ppo", clip_eps_low=0.2, clip_eps_high=0.2,
    aggregation="token_mean", kl_mode="reward", kl_estimator="k1", kl_beta=0.05,
    value_coef=0.1, value_clip_eps=0.2, num_epochs=4, group_size=1, learning_rate=1e-6,
))
register_recipe(RLConfig(
    name="grpo", advantage="group_normalized", std_mode="population", group_size=64,
    policy_loss="ppo", clip_eps_low=0.2, clip_eps_high=0.2, aggregation="seq_mean_token_mean",
    kl_mode="loss", kl_estimator="k3", kl_beta=0.04, num_epochs=1, learning_rate=1e-6,
))
register_recipe(RLConfig(
    name="dr_grpo", advantage="group_normalized", std_mode="none", group_size=8,
    policy_loss="ppo", clip_eps_low=0.2, clip_eps_high=0.2, aggregation="seq_sum_norm",
    norm_constant=3000.0, kl_mode="none", num_epochs=1, learning_rate=1e-6,
))
register_recipe(RLConfig(
    name="dapo", advantage="group_normalized", std_mode="population", group_size=16,
    policy_loss="ppo", clip_eps_low=0.2, clip_eps_high=0.28, aggregation="token_mean",
    kl_mode="none", num_epochs=1, learning_rate=1e-6, weight_decay=0.1,
))
register_recipe(RLConfig(
    name="loop", advantage="leave_one_out", std_mode="none", group_size=6,
    drop_advantage_below=0.01, policy_loss="ppo", ratio_level="token", clip_eps_low=0.1,
    clip_eps_high=0.1, clip_lower="subtract", aggregation="seq_mean_token_mean", kl_mode="none",
    num_epochs=2, minibatch_size=32, learning_rate=5e-6, max_grad_norm=1.0, lora_rank=16,
    lora_alpha=32.0,
))
register_recipe(RLConfig(
    name="rloo", advantage="leave_one_out", std_mode="none", group_size=4,
    policy_loss="reinforce", aggregation="seq_sum_norm", norm_constant=1.0, kl_mode="none",
    num_epochs=1, learning_rate=1e-6,
))
register_recipe(RLConfig(
    name="reinforce", advantage="group_normalized", std_mode="none", group_size=1,
    policy_loss="reinforce", aggregation="seq_mean_token_mean", kl_mode="none", num_epochs=1,
    learning_rate=1e-6,
))
register_recipe(RLConfig(
    name="rft", advantage="given", policy_loss="sft", rft_filter=True, rft_reward_threshold=1.0,
    aggregation="token_mean", kl_mode="none", num_epochs=1, learning_rate=1e-5,
))
