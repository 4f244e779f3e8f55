"""The continuous-batching rollout engine: episodes flow through a fixed pool of KV slots.

``collect_episodes`` with a ``SlotEngine`` runs this loop instead of lock-step rounds:

- episodes wait in a queue and are admitted into free slots (admission control: at most
  ``slots`` episodes in flight, each holding its slot, and so its cache row, for its life);
  their environments are reset at once;
- whatever the environments have answered is prefilled into its slots (``SlotSampler.admit``:
  the prompt, or the observation chunk on top of the cached history) with no barrier between
  episodes: a slow tool call holds back only its own episode;
- the device runs at most ``decode_steps`` decode steps of every slot with a turn under way
  (``SlotSampler.decode``) and returns; rows whose turn ended leave the batch, their actions
  go to the environments at once (``send``), the other rows keep decoding on the next call;
- the host blocks on the environments only when the device has nothing to do.

Episode records are built by the lock-step driver's own functions (``open_episode``,
``record_turn``, ``close_turn``): token-in/token-out ids, masks, log-probs, budgets and
termination labels are the same. Each turn draws from the random stream of its (episode,
turn) (``jaxagent.generate.slots``), so with the same key the engine samples exactly what the
lock-step driver samples, whatever order the environments answer in.

Environment runners that can stream (``PoolRunner``: ``submit_reset`` / ``submit_step`` /
``poll``) overlap environment work with decoding; any other runner is called synchronously
at submission (``InlineRunner``: instantaneous worlds).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import time
from typing import Any, Callable, Optional, Sequence

import jax

from jaxagent.agents.cached import CachedTurnSampler
from jaxagent.agents.episode import Episode
from jaxagent.agents.rollout import (
    RolloutSpec,
    RolloutStats,
    close_turn,
    new_episodes,
    open_episode,
    record_turn,
)
from jaxagent.buckets import bucket
from jaxagent.envs.base import Task
from jaxagent.errors import ConfigError
from jaxagent.generate import SamplingConfig
from jaxagent.generate.slots import SlotSampler

ENGINES = ("auto", "lockstep", "slots")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Which episode loop samples the policy.

    ``engine``: "slots", continuous batching over KV slots (``SlotEngine``), or "lockstep",
    rounds in which every waiting episode is served by one batched call and every
    environment steps before the next (``collect_episodes``' own loop). Both sample the
    same tokens for the same key. "auto": slots when the environments run in a pool that
    answers asynchronously (the engine decodes while they work), lock-step when they are
    called inline (nothing to overlap; on this project's 2-core CPU the lock-step driver's
    fewer, larger calls are faster there: ``benchmarks/rollout_engine.py``).
    """

    engine: str = "auto"
    slots: int = 0  # episodes in flight (KV cache rows); 0 = every episode of a rollout
    decode_steps: int = 16  # decode steps per device call (how long a finished turn waits)
    # Slots prefilled per data shard a device call at most (0: every slot whose chunk is
    # ready); the rest wait for the next call. A chip prefills its own shard's slots only
    # (SlotSampler.admit), so this bounds each chip's prefill temporaries
    # (benchmarks/pod_plan.py --phase rollout --admit-rows).
    max_admit: int = 0
    # Decode every turn constrained to a schema-valid call of the task's tools (in the chat's
    # call syntax) or an answer (``jaxagent.agents.constrained``); the learner takes its
    # log-probs under the same masks.
    constrained_tool_calls: bool = False

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ConfigError(f"EngineConfig.engine={self.engine!r} must be one of {list(ENGINES)}")
        if not isinstance(self.slots, int) or self.slots < 0:
            raise ConfigError(
                f"EngineConfig.slots={self.slots!r} must be an int >= 0 (0 = one per episode)"
            )
        if not isinstance(self.decode_steps, int) or self.decode_steps < 1:
            raise ConfigError(f"EngineConfig.decode_steps={self.decode_steps!r} must be >= 1")
        if not isinstance(self.max_admit, int) or self.max_admit < 0:
            raise ConfigError(
                f"EngineConfig.max_admit={self.max_admit!r} must be an int >= 0 (0 = no cap)"
            )

    def resolved(self, streamed: bool) -> str:
        """ "slots" or "lockstep": ``engine`` with "auto" decided by whether the environments
        answer asynchronously (``streamed``)."""
        if self.engine != "auto":
            return self.engine
        return "slots" if streamed else "lockstep"


class SlotEngine(CachedTurnSampler):
    """The LM policy with a continuous-batching episode loop (see the module docstring).

    ``collect_episodes`` runs its episodes through ``drive``. Wrapped by a training-free
    method (which needs ``start`` / ``resume``) it samples as the cached lock-step sampler
    it extends.

    Args:
      graphdef: the model graphdef.
      sampling: static sampling settings.
      max_len: the longest row (an episode's whole context).
      pad_id: token id for padding.
      slots: episodes in flight at most (KV cache rows); 0: one per episode of the call.
      decode_steps: decode steps per device call at most (how long a finished turn can wait
        for the host).
      max_admit: slots prefilled per data shard a device call at most (0: all that are ready).
    """

    continuous = True

    def __init__(
        self,
        graphdef,
        sampling: SamplingConfig,
        max_len: int,
        pad_id: int = 0,
        *,
        slots: int = 0,
        decode_steps: int = 16,
        max_admit: int = 0,
    ):
        super().__init__(graphdef, sampling, max_len, pad_id=pad_id)
        self.max_admit = max_admit
        if slots < 0 or decode_steps < 1:
            raise ValueError(
                f"SlotEngine: slots={slots} must be >= 0 (0 = one per episode) and "
                f"decode_steps={decode_steps} >= 1"
            )
        self.slots, self.decode_steps, self.pad_id = slots, decode_steps, pad_id
        self._devices: dict[tuple[int, int], SlotSampler] = {}
        self._state = None

    @property
    def recompiles(self) -> int:
        return super().recompiles + sum(d.num_compiles for d in self._devices.values())

    @property
    def prefilled_tokens(self) -> int:
        own = sum(d.prefilled_tokens for d in self._devices.values())
        return self._sampler.prefilled_tokens + own

    def release(self) -> None:
        super().release()
        state, self._state = self._state, None
        if state is not None:
            for x in jax.tree.leaves(state):
                if isinstance(x, jax.Array) and not x.is_deleted():
                    x.delete()

    def device(self, slots: int, capacity: int) -> SlotSampler:
        """The slot sampler of ``slots`` rows of ``capacity`` tokens (kept: its programs are
        compiled once)."""
        if (slots, capacity) not in self._devices:
            self._devices[(slots, capacity)] = SlotSampler(
                self._sampler.graphdef,
                self.sampling,
                slots,
                capacity,
                pad_id=self.pad_id,
                decode_steps=self.decode_steps,
            )
        return self._devices[(slots, capacity)]

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
        refresh: Optional[Callable[[int], Optional[tuple[Any, int]]]] = None,
    ) -> tuple[list[Episode], RolloutStats]:
        """Run every (task, sample) episode to completion (``collect_episodes``' contract).

        ``refresh`` (partial rollouts): asked between decode calls; once it gives newer
        ``(params, version)``, no turn is admitted until the turns on the device have ended,
        then every running episode continues on the new weights from its next turn, its whole
        context prefilled again under them (as AReaL's interruptible generation recomputes
        the cache), with its turn numbers, so its random streams, unchanged. A turn is
        sampled by one version; tokens keep the version that sampled them."""
        if spec.budget.max_new_tokens != self.sampling.max_new_tokens:
            raise ValueError(
                f"Budget.max_new_tokens={spec.budget.max_new_tokens} differs from the "
                f"sampler's {self.sampling.max_new_tokens}"
            )
        eps = new_episodes(tasks, samples_per_task, group_offset)
        stats = RolloutStats()
        if not eps:
            return eps, stats
        n_slots = min(self.slots or len(eps), len(eps))
        need = min(spec.budget.max_total_tokens, self.max_len)
        capacity = min(bucket(need, multiple=64), self._sampler.config.max_seq_len)
        dev = self.device(n_slots, capacity)
        self.release()
        state = dev.init(params)
        fused = dev.prepare(params)
        self._state = (state, fused)
        per_shard = n_slots // dev.shards(params)
        env = _Streamed(spec.runner)
        t_start = time.perf_counter()
        gstarts = [-1] * len(eps)
        if self.grammar is not None:
            gstarts = self.grammar.starts([ep.task for ep in eps])
        table = self.grammar.table.device_table() if max(gstarts) >= 0 else None

        queue = collections.deque(range(len(eps)))
        free = list(range(n_slots))  # a heap: the lowest free slot first
        episode_in: dict[int, int] = {}  # slot -> episode index
        opened: set[int] = set()  # slots whose episode has had its reset reply
        ready: dict[int, list[int]] = {}  # slot -> chunk to prefill
        decoding: set[int] = set()  # slots with a turn on the device
        turn_out: dict[int, tuple[int, bool]] = {}  # slot -> (tokens, stopped) of the turn
        actions: dict[int, str] = {}
        waiting = 0  # environment calls outstanding
        finished = 0
        since: dict[int, float] = {}  # slot -> when its env call was sent / its chunk ready
        newer = None  # partial rollouts: published weights waiting for the device to drain
        stale: set[int] = set()  # slots whose cache the previous weights wrote

        def end(slot: int) -> None:
            nonlocal finished
            finished += 1
            del episode_in[slot]
            opened.discard(slot)
            heapq.heappush(free, slot)
            if on_round is not None:
                on_round(finished, len(eps))

        while finished < len(eps):
            if queue and free:
                admitted = []
                while queue and free:
                    slot = heapq.heappop(free)
                    episode_in[slot] = queue.popleft()
                    admitted.append(slot)
                env.reset(admitted, [eps[episode_in[s]].task for s in admitted])
                waiting += len(admitted)
                since.update((s, time.perf_counter()) for s in admitted)
            idle = not ready and not decoding
            t0 = time.perf_counter()
            replies = env.poll(None if idle and waiting else 0.0)
            if idle:
                stats.env_s += time.perf_counter() - t0
            now = time.perf_counter()
            for slot, reply in replies:
                waiting -= 1
                stats.env_row_s += now - since[slot]
                since[slot] = now
                ep = eps[episode_in[slot]]
                if slot not in opened:
                    opened.add(slot)
                    ids = open_episode(ep, reply, spec)
                    if ids:
                        ready[slot] = ids
                    else:
                        end(slot)
                    continue
                n_tok, stopped = turn_out.pop(slot)
                chunk = close_turn(ep, actions.pop(slot), n_tok, stopped, reply, spec)
                if chunk is None:
                    end(slot)
                else:  # a cache the previous weights wrote: the whole context again
                    ready[slot] = list(ep.tokens) if slot in stale else chunk
            if refresh is not None and newer is None:
                newer = refresh(version)
            if newer is not None and not decoding:  # drained: switch the weights
                (params, version), newer = newer, None
                fused = dev.prepare(params)
                self._state = (state, fused)
                stale = set(episode_in)
                for s in ready:  # its whole context, with the chunk close_turn appended
                    if eps[episode_in[s]].turns:
                        ready[s] = list(eps[episode_in[s]].tokens)
            if not ready and not decoding:
                continue
            t0 = time.perf_counter()
            if ready and newer is None:
                slots = _first_per_shard(sorted(ready), self.max_admit, per_shard)
                stats.device_row_s += sum(t0 - since[s] for s in slots)
                state = dev.admit(
                    params,
                    fused,
                    state,
                    slots,
                    [ready[s] for s in slots],
                    [len(eps[episode_in[s]].turns) == 0 or s in stale for s in slots],
                    key,
                    [self.row_offset + episode_in[s] for s in slots],
                    [len(eps[episode_in[s]].turns) for s in slots],
                    None if table is None else (table, [gstarts[episode_in[s]] for s in slots]),
                )
                decoding.update(slots)
                for s in slots:
                    del ready[s]
                stale.difference_update(slots)
            # Every slot with a turn on the device ends it within max_new_tokens more tokens.
            longest = max(len(eps[episode_in[s]].tokens) for s in decoding)
            state = dev.decode(
                params,
                fused,
                state,
                longest + self.sampling.max_new_tokens,
                active=sorted(decoding),
                table=table,
            )
            self._state = (state, fused)
            stats.rounds += 1
            pending, done, num = jax.device_get(
                (state.pending, state.finished, state.num_generated)
            )
            over = sorted(s for s in decoding if done[s] and not pending[s])
            if over:
                tokens, logprobs, gstates = jax.device_get(
                    (state.tokens, state.logprobs, state.gstates)
                )
            stats.generate_s += time.perf_counter() - t0
            for slot in over:
                decoding.discard(slot)
                k = int(num[slot])
                toks = [int(t) for t in tokens[slot, :k]]
                ep = eps[episode_in[slot]]
                masks = (
                    None if table is None else self.grammar.table.masks(gstates[slot, :k].tolist())
                )
                record_turn(ep, toks, [float(x) for x in logprobs[slot, :k]], version, masks)
                stats.policy_tokens += k
                turn_out[slot] = (k, bool(k and toks[-1] in self.sampling.stop_token_ids))
                actions[slot] = spec.chat.decode(toks)
            if over:
                env.step(over, [actions[s] for s in over])
                waiting += len(over)
                since.update((s, time.perf_counter()) for s in over)
        steps, row_steps, busy = jax.device_get((state.steps, state.row_steps, state.busy_steps))
        stats.decode_steps, stats.row_steps, stats.busy_steps = (
            int(steps),
            int(row_steps),
            int(busy),
        )
        # KV bytes a decoded row reads: its slot's whole capacity (an upper bound: with a
        # window narrower than the capacity, attention reads only the window).
        cache_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.cache))
        stats.kv_bytes = float(stats.row_steps) * cache_bytes / n_slots
        stats.wall_s = time.perf_counter() - t_start
        return eps, stats


class _Streamed:
    """A runner seen as a stream: ``reset`` / ``step`` submit, ``poll`` returns (slot, reply)
    pairs as they come. Runners with ``submit_reset`` / ``submit_step`` / ``poll`` stream
    natively; any other runner is called synchronously at submission."""

    def __init__(self, runner):
        self.runner = runner
        self.native = all(
            callable(getattr(runner, m, None)) for m in ("submit_reset", "submit_step", "poll")
        )
        self._ready: list = []

    def reset(self, slots: list[int], tasks: list[Task]) -> None:
        if self.native:
            self.runner.submit_reset(slots, tasks)
        else:
            self._ready.extend(zip(slots, self.runner.reset(slots, tasks)))

    def step(self, slots: list[int], actions: list[str]) -> None:
        if self.native:
            self.runner.submit_step(slots, actions)
        else:
            self._ready.extend(zip(slots, self.runner.step(slots, actions)))

    def poll(self, timeout: Optional[float]) -> list:
        if self.native:
            return self.runner.poll(timeout)
        out, self._ready = self._ready, []
        return out


def slot_occupancy(stats: RolloutStats) -> float:
    """The share of decoded rows that were generating a turn (1: no slot idled)."""
    return stats.busy_steps / stats.row_steps if stats.row_steps else float("nan")


def _first_per_shard(slots: list[int], cap: int, per_shard: int) -> list[int]:
    """The first ``cap`` of ``slots`` on each data shard (slot s on shard s // per_shard);
    all of them when ``cap`` is 0."""
    if not cap:
        return slots
    taken: collections.Counter = collections.Counter()
    out = []
    for s in slots:
        if taken[s // per_shard] < cap:
            taken[s // per_shard] += 1
            out.append(s)
    return out
