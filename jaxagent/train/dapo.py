"""DAPO's data side, as plain functions over episodes (Yu et al. 2025, arXiv 2503.14476).

The learner side of DAPO (clip-higher, token-mean loss) is the ``dapo`` recipe; this module
is what happens between collecting episodes and packing the learner batch, switched on by
the run config's ``rl.data`` (``configs/dapo_code.yaml`` sets the paper's values):

- dynamic sampling (Sec. 3.2): a group whose rewards are all equal has zero group-normalised
  advantage and teaches nothing, so it is dropped and more tasks are sampled until the batch
  again holds ``tasks_per_iteration`` groups, for at most ``max_sampling_rounds`` rounds
  (the paper samples until full; the cap keeps a hopeless batch from looping forever, and
  what was kept is trained on, the missing rows padded with no loss);
- over-long filtering (Sec. 3.4): an episode cut at the length limit carries no loss (its
  reward says nothing about the answer it was not allowed to finish); the row weight is
  written by the packer (``jaxagent.agents.batch.row_weights``, the one place rows drop);
- soft over-long punishment (Sec. 3.4, Eq. 13): a length penalty added to the reward, zero
  up to ``L_max - L_cache`` policy tokens, falling linearly to -1 at ``L_max``.

Groups are judged on the environment's reward (the paper filters on accuracy), before the
length penalty is added.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxagent.agents.batch import informative_group_ids, is_overlong
from jaxagent.agents.episode import Episode


def informative_groups(episodes: Sequence[Episode]) -> list[list[Episode]]:
    """The groups (in first-seen order) whose rewards are not all equal.

    Episodes whose environment failed carry no loss and do not count; a group with fewer
    than two other episodes has no spread and is dropped.
    """
    informative = informative_group_ids(episodes)
    groups: dict[int, list[Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group, []).append(ep)
    return [members for g, members in groups.items() if g in informative]


@dataclasses.dataclass
class DynamicSample:
    """What ``dynamic_sample`` returns."""

    episodes: list[Episode]  # the kept groups' episodes, at most ``target_groups`` groups
    first_round: list[Episode]  # every episode of round 0 (unfiltered: train statistics)
    stats: list  # the collector's stats of every round
    rounds: int  # collection rounds run
    kept_groups: int  # groups in ``episodes``
    sampled_groups: int  # groups sampled over all rounds

    @classmethod
    def one_round(cls, episodes: list[Episode], stats) -> "DynamicSample":
        """One collection round kept whole (dynamic sampling off)."""
        groups = len({ep.group for ep in episodes})
        return cls(list(episodes), list(episodes), [stats], 1, groups, groups)

    def total_stats(self):
        """Every round's stats (times, tokens, decode rounds) summed into a new record."""
        fields = dataclasses.fields(self.stats[0])
        sums = {f.name: sum(getattr(st, f.name) for st in self.stats) for f in fields}
        return dataclasses.replace(self.stats[0], **sums)

    def metrics(self) -> dict:
        return {
            "data/sampling_rounds": self.rounds,
            "data/kept_groups": self.kept_groups,
            "data/sampled_groups": self.sampled_groups,
        }


def dynamic_sample(
    collect: Callable[[int], tuple[list[Episode], object]], target_groups: int, max_rounds: int
) -> DynamicSample:
    """Collect rounds until ``target_groups`` informative groups are kept or ``max_rounds``
    rounds have run; keep the first ``target_groups`` of them.

    Args:
      collect: ``collect(round) -> (episodes, stats)``; round 0 is the iteration's own tasks,
        later rounds fresh ones (the caller chooses them, e.g. ``refill_tasks``).
      target_groups: groups the batch holds (``rollout.tasks_per_iteration``).
      max_rounds: the cap on rounds (>= 1).
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds={max_rounds} must be >= 1")
    kept: list[list[Episode]] = []
    stats, first, sampled, rounds = [], [], 0, 0
    while rounds < max_rounds and len(kept) < target_groups:
        eps, st = collect(rounds)
        if rounds == 0:
            first = list(eps)
        stats.append(st)
        sampled += len({ep.group for ep in eps})
        kept.extend(informative_groups(eps))
        rounds += 1
    kept = kept[:target_groups]
    return DynamicSample([ep for g in kept for ep in g], first, stats, rounds, len(kept), sampled)


def refill_tasks(tasks: Sequence, count: int, seed: int, iteration: int, round_: int) -> list:
    """``count`` tasks for refill round ``round_`` of ``iteration``: a deterministic draw from
    ``tasks`` (the same for the same seed, iteration and round, so a resumed run repeats it),
    without replacement when the split is large enough."""
    rng = np.random.default_rng([seed, 6, iteration, round_])
    idx = rng.choice(len(tasks), size=count, replace=count > len(tasks))
    return [tasks[i] for i in idx]


def overlong_keep(episodes: Sequence[Episode]) -> np.ndarray:
    """Over-long filtering: [N] float32, 0 for over-long episodes (no loss), else 1."""
    return np.asarray([0.0 if is_overlong(ep) else 1.0 for ep in episodes], np.float32)


def overlong_penalty(length: int, max_len: int, cache_len: int) -> float:
    """DAPO's soft over-long punishment R_length(y) (Eq. 13) for ``|y| = length``:

    0                                    if |y| <= L_max - L_cache
    ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
    -1                                   if |y| > L_max
    """
    if cache_len <= 0:
        raise ValueError(f"cache_len={cache_len} must be > 0")
    start = max_len - cache_len
    if length <= start:
        return 0.0
    if length <= max_len:
        return (start - length) / cache_len
    return -1.0


def overlong_penalties(
    episodes: Sequence[Episode], max_len: int, cache_len: int, factor: float = 1.0
) -> np.ndarray:
    """[N] float32 ``factor * R_length(policy tokens)`` to add to each episode's reward."""
    return np.asarray(
        [factor * overlong_penalty(ep.num_policy_tokens, max_len, cache_len) for ep in episodes],
        np.float32,
    )


def shape_batch(batch, episodes: Sequence[Episode], data, default_max_len: int):
    """Apply the soft over-long punishment of ``data`` (the run config's ``rl.data``) to a
    numpy ``TokenBatch`` packed from ``episodes`` (rows in that order), and measure the
    over-long share (the filter itself is the packer's row weight: ``RowDrops.overlong``).

    Returns:
      (batch, metrics): the batch with ``rewards`` shaped.
    """
    n = len(episodes)
    metrics = {}
    if data.overlong_filter:
        keep = overlong_keep(episodes)
        metrics["data/overlong_frac"] = float(1.0 - keep.mean()) if n else 0.0
    if data.overlong_penalty:
        pen = overlong_penalties(
            episodes,
            data.overlong_max_len or default_max_len,
            data.overlong_cache_len,
            data.overlong_penalty,
        )
        rewards = np.array(batch.rewards, copy=True)
        rewards[:n] += pen
        batch = batch.replace(rewards=rewards)
        metrics["data/overlong_penalty"] = float(pen.mean()) if n else 0.0
    return batch, metrics
