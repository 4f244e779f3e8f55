"""The multi-turn rollout driver: the one bridge from the host environments to the policy.

``collect_episodes`` runs many episodes at once (K samples per task, sharing a group id) of a
turn policy (``jaxagent.agents.turn_policy.TurnPolicy``: the LM samplers, scripted experts,
wrappers). Every round, all episodes that wait for the policy are served in one batched call,
whatever turn they are on; the sampler appends each row's new observation chunk to that row's
context (its KV cache, for the cached sampler) instead of re-encoding history. The driver records
token-in/token-out episodes (``jaxagent.agents.episode``): the exact ids the policy saw and
produced, the loss mask (1 on sampled tokens only), the sampler's log-probs, per-turn reward
terms and a termination reason. Text is decoded only for the environment.

Budgets: ``max_turns`` policy turns, ``max_new_tokens`` per turn (enforced by the sampler) and
``max_total_tokens`` per episode; an exhausted budget is a truncation labelled
``step_budget``. A first prompt that leaves no room for one turn ends its episode before any
turn as ``Termination.PROMPT_OVERFLOW`` (failure mode ``prompt_overflow``): a configuration
problem (``jaxagent.train.coverage.check_prompt_budget`` refuses it at start-up), kept out of
the gradient and counted in the reports. An environment failure ends that episode with
``Termination.ENV_ERROR``; the episode is kept (never dropped) and excluded from the gradient
by the batch builder.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional, Protocol, Sequence

import jax

from jaxagent.agents.episode import Episode, Turn
from jaxagent.agents.runner import EnvRunner
from jaxagent.pool.steps import EnvReply
from jaxagent.agents.chat import Chat, observation_after
from jaxagent.agents.turn_policy import TurnPolicy
from jaxagent.envs.base import (
    FailureMode,
    Task,
    Termination,
    truncate_observation,
)


@dataclasses.dataclass(frozen=True)
class Budget:
    """Episode budgets."""

    max_turns: int = 6  # policy turns
    max_new_tokens: int = 32  # tokens per policy turn (the sampler's setting)
    max_total_tokens: int = 512  # prompt + all turns + observations
    max_observation_chars: int = 0  # longer observations are cut with a visible marker; 0 = off

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if f.name != "max_observation_chars" and getattr(self, f.name) <= 0:
                raise ValueError(f"Budget.{f.name}={getattr(self, f.name)} must be > 0")
        if 0 < self.max_observation_chars < 64 or self.max_observation_chars < 0:
            raise ValueError(
                f"Budget.max_observation_chars={self.max_observation_chars} must be 0 (off) or "
                ">= 64 (room for the truncation marker)"
            )


@dataclasses.dataclass
class RolloutStats:
    """Where the time went and how much was produced."""

    generate_s: float = 0.0  # in the policy's calls (the engine: device calls and reads)
    env_s: float = 0.0  # waiting for environments with nothing else to do
    policy_tokens: int = 0
    rounds: int = 0  # policy calls (the engine: decode calls)
    wall_s: float = 0.0  # the whole rollout (the engine; 0 for the lock-step driver)
    # The engine's decode accounting (0 for the lock-step driver):
    decode_steps: int = 0  # decode steps run
    row_steps: int = 0  # decode steps x KV rows (slots)
    busy_steps: int = 0  # of those, row-steps of rows generating a turn
    kv_bytes: float = 0.0  # KV-cache bytes the decode steps read (every slot's capacity)
    env_row_s: float = 0.0  # episode-seconds waiting for an environment's answer
    device_row_s: float = 0.0  # episode-seconds with a chunk ready, waiting for the device


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """Everything but the policy that defines how episodes run."""

    chat: Chat  # renders prompts and observation chunks to token ids; decodes actions
    system_prompt: str  # the system message of every episode
    budget: Budget  # turn and token budgets
    runner: EnvRunner  # reaches the environments (one slot per episode)


Refresh = Callable[[int], Optional[tuple[Any, int]]]


class Driver(Protocol):
    """An episode loop: runs every (task, sample) episode to completion, building the
    episodes with this module's functions (``open_episode``, ``record_turn``,
    ``close_turn``). Two exist: ``LockStep`` (rounds: every waiting episode served by one
    batched policy call, every environment stepped before the next) and
    ``jaxagent.agents.engine.SlotEngine`` (continuous batching over KV slots); a policy
    names its own (``TurnPolicy.driver``) and ``collect_episodes`` runs it. Arguments and
    result are ``collect_episodes``'."""

    def drive(
        self,
        params: Any,
        tasks: Sequence[Task],
        *,
        samples_per_task: int,
        spec: RolloutSpec,
        key: jax.Array,
        group_offset: int = 0,
        on_round: Optional[Callable[[int, int], None]] = None,
        version: int = 0,
        refresh: Optional[Refresh] = None,
    ) -> tuple[list[Episode], RolloutStats]: ...


def _end_from_reply(ep: Episode, turn: Turn, reply: EnvReply) -> None:
    """End ``ep`` on a final reply. An environment failure (``reply.error``: the runners set it
    both for failures they catch and for those the environment reports itself) ends it as
    ``ENV_ERROR`` with no reward, so the batch builder gives it no loss and the report leaves
    it out of the policy's success."""
    info = reply.info
    ep.info = info
    if reply.error is not None:
        turn.reward = 0.0
        ep.finish(Termination.ENV_ERROR, FailureMode.ENV_ERROR, error=reply.error)
        return
    fm = info.get("failure_mode")
    if info.get("truncated", False):
        ep.finish(
            Termination.TRUNCATED,
            fm or FailureMode.STEP_BUDGET,
            success=bool(info.get("success", False)),
        )
    else:
        ep.finish(Termination.TERMINATED, fm, success=bool(info.get("success", False)))


def collect_episodes(
    policy: TurnPolicy,
    params: Any,
    tasks: Sequence[Task],
    *,
    samples_per_task: int,
    spec: RolloutSpec,
    key: jax.Array,
    group_offset: int = 0,
    on_round: Optional[Callable[[int, int], None]] = None,
    version: int = 0,
    refresh: Optional[Callable[[int], Optional[tuple[Any, int]]]] = None,
) -> tuple[list[Episode], RolloutStats]:
    """Run ``samples_per_task`` episodes of every task to completion.

    Args:
      policy: the turn policy (one row per episode).
      params: the policy parameters passed to it.
      tasks: the tasks; episode ``i * samples_per_task + k`` is sample ``k`` of task ``i``.
      samples_per_task: K, the group size.
      spec: the chat format, system prompt, budgets and environment runner.
      key: PRNG key for sampling.
      group_offset: added to group ids (distinct groups across calls).
      on_round: optional callback ``(finished, total)`` after each round (progress bars).
      version: the policy version of ``params`` (updates they have seen), recorded with
        every sampled token (``Episode.versions``).
      refresh: partial rollouts: ``refresh(version)`` -> ``(params, version)`` of newer
        weights, or None, asked before every turn after the first. With newer weights every
        episode still running continues from its next turn on them, its whole context
        prefilled again (``rebase``: the KV the old weights wrote is not the new policy's),
        so each token's log-prob is exactly its own version's; tokens keep the version that
        sampled them. The slot engine, whose turns of different episodes overlap, asks it
        between decode calls and switches once the turns on the device have ended
        (``SlotEngine.drive``).

    Returns:
      (episodes in input order, one per (task, sample); none is ever dropped), stats. The
      policy's per-episode device state (the cached sampler's KV cache) is freed before the
      return (``turn_policy.release``): every episode has ended, nothing continues them.

    The episodes run in the policy's own loop (``TurnPolicy.driver``: the slot engine,
    continuous batching over KV slots) or in ``LockStep`` rounds.
    """
    driver = policy.driver or LockStep(policy)
    try:
        return driver.drive(
            params,
            tasks,
            samples_per_task=samples_per_task,
            spec=spec,
            key=key,
            group_offset=group_offset,
            on_round=on_round,
            version=version,
            refresh=refresh,
        )
    finally:
        policy.release()


def open_episode(ep: Episode, reply: EnvReply, spec: RolloutSpec) -> list[int]:
    """Begin ``ep`` from its reset ``reply``: its prompt ids (appended to the episode), or []
    when the episode ended before any turn (a failed environment; a prompt over budget)."""
    if reply.error is not None:
        ep.finish(Termination.ENV_ERROR, FailureMode.ENV_ERROR, error=reply.error)
        return []
    ep.first_observation = _cut(reply.observation, spec.budget)
    ids = spec.chat.prompt(spec.system_prompt, ep.first_observation, task=ep.task)
    if len(ids) + spec.budget.max_new_tokens > spec.budget.max_total_tokens:
        # Not a truncation: no turn was sampled and nothing is to bootstrap. The prompt is
        # not kept (it may not fit a learner row); its length is.
        ep.info = {"prompt_tokens": len(ids)}
        ep.finish(Termination.PROMPT_OVERFLOW, FailureMode.PROMPT_OVERFLOW)
        return []
    ep.append(ids, sampled=False)
    return ids


def record_turn(
    ep: Episode, tokens: list[int], logprobs: list[float], version: int = 0, masks=None
) -> None:
    """Append the policy's turn (sampled ids, their log-probs and the policy ``version``
    that sampled them) to ``ep``."""
    ep.append(
        tokens, sampled=True, logprobs=logprobs, turn=len(ep.turns), version=version, masks=masks
    )


def close_turn(
    ep: Episode,
    action: str,
    num_tokens: int,
    stopped: bool,
    reply: EnvReply,
    spec: RolloutSpec,
) -> Optional[list[int]]:
    """Record the environment's ``reply`` to the turn just sampled: the episode ends (a final
    reply, an environment failure, the turn or token budget) and None is returned, or the
    observation's chunk of ids is appended to ``ep`` and returned for the policy to read."""
    budget = spec.budget
    turn = Turn(
        action=action,
        observation="" if reply.done else _cut(reply.observation, budget),
        reward=float(reply.reward),
        reward_terms=dict(reply.info.get("reward_terms", {}) or {}),
        failure_mode=reply.info.get("failure_mode"),
        num_action_tokens=num_tokens,
        hit_token_limit=not stopped,
        dangerous=list(reply.info.get("dangerous") or ()),
    )
    ep.turns.append(turn)
    if reply.error is not None or reply.done:
        _end_from_reply(ep, turn, reply)
        return None
    if len(ep.turns) >= budget.max_turns:
        ep.info = reply.info
        ep.finish(Termination.TRUNCATED, FailureMode.STEP_BUDGET)
        return None
    chunk = observation_after(spec.chat, action, turn.observation)
    if len(ep.tokens) + len(chunk) + budget.max_new_tokens > budget.max_total_tokens:
        ep.info = reply.info
        ep.finish(Termination.TRUNCATED, FailureMode.STEP_BUDGET)
        return None
    turn.num_observation_tokens = len(chunk)
    ep.append(chunk, sampled=False)
    return chunk


def _cut(text: str, budget: Budget) -> str:
    limit = budget.max_observation_chars
    return truncate_observation(text, limit) if limit else text


def new_episodes(tasks: Sequence[Task], samples_per_task: int, group_offset: int) -> list[Episode]:
    """One episode per (task, sample), in the drivers' order (episode ``i * K + k``)."""
    return [
        Episode(task=t, group=group_offset + i)
        for i, t in enumerate(tasks)
        for _ in range(samples_per_task)
    ]


class LockStep:
    """The ``Driver`` of rounds: every episode waiting for ``policy`` is served by one
    batched call (``TurnPolicy.start`` / ``resume``), whatever turn it is on, and every
    environment steps before the next round."""

    def __init__(self, policy: TurnPolicy):
        self.policy = policy

    def drive(
        self,
        params: Any,
        tasks: Sequence[Task],
        *,
        samples_per_task: int,
        spec: RolloutSpec,
        key: jax.Array,
        group_offset: int = 0,
        on_round: Optional[Callable[[int, int], None]] = None,
        version: int = 0,
        refresh: Optional[Refresh] = None,
    ) -> tuple[list[Episode], RolloutStats]:
        policy, stats = self.policy, RolloutStats()
        chat, runner = spec.chat, spec.runner
        eps = new_episodes(tasks, samples_per_task, group_offset)
        slots = list(range(len(eps)))
        t0 = time.perf_counter()
        replies = runner.reset(slots, [ep.task for ep in eps])
        stats.env_s += time.perf_counter() - t0
        prompts = [open_episode(ep, reply, spec) or [0] for ep, reply in zip(eps, replies)]

        # One key for the whole rollout: the policies draw per (episode, turn) (the LM samplers'
        # row and turn streams), so what a turn samples does not depend on the round serving it.
        t0 = time.perf_counter()
        out = policy.start(
            params,
            prompts,
            key,
            tasks=[ep.task for ep in eps],
            observations=[None if ep.done else ep.first_observation for ep in eps],
        )
        stats.generate_s += time.perf_counter() - t0
        stats.rounds += 1
        while True:
            active = [i for i, ep in enumerate(eps) if not ep.done]
            for i in active:
                masks = None if out.masks is None else out.masks[i]
                record_turn(eps[i], out.tokens[i], out.logprobs[i], version, masks)
                stats.policy_tokens += len(out.tokens[i])
            actions = [chat.decode(out.tokens[i]) for i in active]
            t0 = time.perf_counter()
            replies = runner.step([slots[i] for i in active], actions) if active else []
            stats.env_s += time.perf_counter() - t0
            chunks: list[Optional[list[int]]] = [None] * len(eps)
            texts: list[Optional[str]] = [None] * len(eps)
            for i, action, reply in zip(active, actions, replies):
                chunk = close_turn(eps[i], action, len(out.tokens[i]), out.stopped[i], reply, spec)
                if chunk is not None:
                    chunks[i], texts[i] = chunk, eps[i].turns[-1].observation
            if on_round is not None:
                on_round(sum(ep.done for ep in eps), len(eps))
            if all(ep.done for ep in eps):
                break
            newer = refresh(version) if refresh is not None else None
            if newer is not None:  # partial rollouts: the next turns on the newer weights
                params, version = newer
                policy.rebase()
                chunks = [None if c is None else list(eps[i].tokens) for i, c in enumerate(chunks)]
            t0 = time.perf_counter()
            out = policy.resume(params, chunks, key, observations=texts)
            stats.generate_s += time.perf_counter() - t0
            stats.rounds += 1
        return eps, stats
