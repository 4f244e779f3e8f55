"""The ``rl`` section of a run config: a recipe name plus typed sections over its preset.

The sections are derived from ``jaxagent.rl.config``'s (``jaxagent.sections.derive``) (advantage, loss, kl, critic, optim, lora, update):
each YAML key defaults to ``null`` = "the recipe preset's value"; ``RLSection.build`` applies
the preset first, then every key that was set. ``rl.data`` is the data side over episodes
(``jaxagent.train.dapo``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

from jaxagent.errors import FROZEN, ConfigError, check_choice, check_positive, check_prob
from jaxagent.rl import config as _rl
from jaxagent.sections import derive


def _preset(cls: type, doc: str) -> type:
    """The YAML schema of one ``jaxagent.rl.config`` section: its fields, each ``None`` by
    default = "the recipe preset's value"; the values are validated by the section itself
    when the recipe is applied (``RLSection.build``)."""
    name = f"{cls.__name__[:-6]}Fields"
    key = "rl." + {v: k for k, v in _rl.SECTIONS.items()}[cls]
    return derive(cls, key=key, name=name, module=__name__, doc=doc, optional=True)


AdvantageFields = _preset(
    _rl.AdvantageConfig,
    "rl.advantage: estimator, filters, truncation (jaxagent.rl.config.AdvantageConfig).",
)
LossFields = _preset(_rl.LossConfig, "rl.loss: policy surrogate, clipping, aggregation.")
KLFields = _preset(_rl.KLConfig, "rl.kl: KL to the reference policy.")
CriticFields = _preset(_rl.CriticConfig, "rl.critic: the value loss.")
OptimFields = _preset(_rl.OptimConfig, "rl.optim: AdamW, clipping, warm-up.")
LoraFields = _preset(_rl.LoraConfig, "rl.lora: low-rank adapters (rank 0: off).")
UpdateFields = _preset(_rl.UpdateConfig, "rl.update: epochs, minibatches, microbatches.")


@dataclasses.dataclass(**FROZEN)
class RLDataSection:
    """Data-side sample selection and reward shaping over episodes (``jaxagent.train.dapo``),
    off by default; ``configs/dapo_code.yaml`` turns on DAPO's (arXiv 2503.14476)."""

    # Dynamic sampling: drop groups whose rewards are all equal (no learning signal), sample
    # more tasks and refill the batch to rollout.tasks_per_iteration groups, at most
    # max_sampling_rounds collection rounds per iteration (then train on what was kept).
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 10
    # Over-long filtering: episodes that hit a length limit (a budget cut, or a turn that
    # ended at rollout.max_new_tokens without a stop token) carry no loss.
    overlong_filter: bool = False
    # Soft over-long punishment: reward += factor * R_length(policy tokens) with R_length 0 up
    # to L_max - L_cache, falling linearly to -1 at L_max, -1 beyond (paper Eq. 13).
    overlong_penalty: float = 0.0  # the factor (0: off; DAPO: 1.0)
    overlong_max_len: int = 0  # L_max in policy tokens; 0 = max_turns * max_new_tokens
    overlong_cache_len: int = 4096  # L_cache (DAPO: 4096 of L_max 20480)
    # The learner batch's length is rounded up to a multiple of this (at most the model's
    # context less rollout.max_new_tokens). Each new length compiles the update again, so
    # coarser buckets trade some padding for fewer compiles.
    length_multiple: int = 32
    # "multiple": lengths in steps of length_multiple (up to max_len / length_multiple
    # programs); "pow2": powers of two from length_multiple (log2 of that: a few compiles
    # of a large model for at most 2x padding, as TPU serving stacks bucket prompts).
    length_buckets: str = "multiple"

    def __post_init__(self):
        check_choice("rl.data.length_buckets", self.length_buckets, ("multiple", "pow2"))
        check_positive("rl.data.max_sampling_rounds", self.max_sampling_rounds)
        check_positive("rl.data.length_multiple", self.length_multiple)
        check_positive("rl.data.overlong_penalty", self.overlong_penalty, allow_zero=True)
        check_positive("rl.data.overlong_max_len", self.overlong_max_len, allow_zero=True)
        check_positive("rl.data.overlong_cache_len", self.overlong_cache_len, allow_zero=True)
        if self.overlong_penalty and not self.overlong_cache_len:
            raise ConfigError(
                "rl.data.overlong_penalty > 0 needs rl.data.overlong_cache_len > 0 "
                "(the length over which the penalty falls to -1)"
            )


@dataclasses.dataclass(**FROZEN)
class RLSection:
    """The RL recipe (``jaxagent.rl.recipes``) and the fields that change its preset.

    ``recipe`` selects a preset of every section; a key set here (``rl.loss.clip_eps_high:
    0.28``, ``rl.optim.learning_rate: 1e-3``) replaces that one field of the preset, and a
    key left unset (``null``) keeps the preset's value, whichever recipe is chosen and in
    whatever order the YAML and the overrides name them. The group size is not here: it is
    ``rollout.samples_per_task`` (0 there = the recipe's K). ``lr_schedule`` decays the
    learning rate over the run's ``train.iterations`` (the recipe's own optimiser is constant
    after warm-up).
    """

    recipe: str = "loop"  # loop, grpo, dr_grpo, dapo, ppo, rloo, reinforce, rft
    advantage: AdvantageFields = dataclasses.field(default_factory=AdvantageFields)
    loss: LossFields = dataclasses.field(default_factory=LossFields)
    kl: KLFields = dataclasses.field(default_factory=KLFields)
    critic: CriticFields = dataclasses.field(default_factory=CriticFields)
    optim: OptimFields = dataclasses.field(default_factory=OptimFields)
    lora: LoraFields = dataclasses.field(default_factory=LoraFields)
    update: UpdateFields = dataclasses.field(default_factory=UpdateFields)
    data: RLDataSection = dataclasses.field(default_factory=RLDataSection)
    lr_schedule: str = "constant"  # after the recipe's warm-up: constant, linear or cosine decay
    lr_final_ratio: float = 0.1  # decayed schedules end at this fraction of the peak LR

    def __post_init__(self):
        # the recipe and the set fields are validated when the run's RLConfig is built, once
        # (``Config.__post_init__``)
        check_choice("rl.lr_schedule", self.lr_schedule, ("constant", "linear", "cosine"))
        check_prob("rl.lr_final_ratio", self.lr_final_ratio)

    def set_fields(self) -> Dict[str, Dict[str, Any]]:
        """``{section: {field: value}}`` of the keys set here (not None)."""
        out: Dict[str, Dict[str, Any]] = {}
        for section in _rl.SECTIONS:
            given = getattr(self, section)
            changes = {
                f.name: getattr(given, f.name)
                for f in dataclasses.fields(given)
                if getattr(given, f.name) is not None
            }
            if changes:
                out[section] = changes
        return out

    def build(self):
        """The recipe's ``RLConfig`` with the fields set here applied over its preset."""
        from jaxagent.rl import recipes

        check_choice("rl.recipe", self.recipe, recipes.recipe_names())
        try:
            return recipes.get_recipe(self.recipe, **self.set_fields())
        except ValueError as err:
            raise ConfigError(f"rl.{err} (recipe {self.recipe!r})") from None
