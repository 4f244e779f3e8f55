"""Rollout overlapped with the update: bounded-staleness asynchronous RL that stays exact.

With ``overlap.staleness = k >= 1`` the batch of iteration ``i`` is sampled by the policy of
iteration ``max(0, i - k)`` (the weights after that many updates), so while the learner updates
on batch ``i`` a producer thread is already collecting batch ``i + 1`` (up to ``i + k``) with
weights it has. Rollout (environment waits, decode) and update (the learner's forward and
backward) then run at the same time, on the same devices (colocated) or on two disjoint sets
(disaggregated, ``overlap.sampler_devices``: the weights are copied device to device to the
sampler's own mesh after each update); the staleness of every token is exactly ``min(i, k)``
versions, recorded per token (``Episode.versions``).

This is the one-step-off-policy schedule of NeMo-RL and verl's "one step overlap" (k = 1) and
AReaL's bounded staleness (Fu et al. 2025, arXiv 2505.24298, Sec. 4: at most k versions
between the sampling and the training policy), in its deterministic form: which weights
sample which batch is fixed by the schedule, never by timing, and every batch is built
with the synchronous run's keys and task order, so two runs with the same seed give the same
episodes, metrics and parameters bit for bit, whatever order environment replies arrive in.
Its off-policy gap is corrected in the loss (``rl.loss.off_policy``).

Partial rollouts (``overlap.partial_rollouts``, AReaL's interruptible generation, Fu et al.
2025, Sec. 4): the learner hands the producer every new version as soon as it exists, and an
episode still running when it arrives continues from its next turn on it (its context
prefilled again under the new weights, ``jaxagent.agents.rollout.collect_episodes``'
``refresh``; the slot engine first lets the turns on the device end), its tokens keeping the
versions that sampled them: fresher tokens, each with its own version's exact log-prob. When
the switch happens depends on timing, so a run with partial rollouts is not bit-for-bit
reproducible (the default keeps that).

Collection lanes (``overlap.lanes``): one producer collects the batches one after another, so
the wall time between two updates is at least one collection however large k is. With L lanes
(each its own sampler and environment pool; batch ``i`` always lane ``i % L``'s) the
collection of batch ``i + 1`` starts as soon as version ``i + 1 - k`` exists, while batch ``i``
is still out: at k = 1 and two lanes, an iteration takes max(update, (collect + update) / 2)
instead of max(update, collect). The schedule, keys and versions are those of one lane, so
the run is the same bit for bit (in worlds whose episodes depend on the task only: a pool
seeds an environment's own randomness from its per-environment episode count, which a
second pool counts separately).

Lossless resume: a checkpoint taken after iteration ``n`` holds, beside the state, the
batches ``n .. n + k - 1`` that were sampled with weights older than ``n`` (which the
checkpoint does not hold); the producer finishes them before the save, so a run killed at any
point and resumed continues exactly, skipping and repeating no task. They are saved as what
they are, arrays (an orbax item beside the state) and numbers (the JSON meta:
``jaxagent.train.collect.pending_items``), never as pickled objects: a run directory from
elsewhere is data, and resuming it runs no code of its.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Optional

from jaxagent.errors import FROZEN, ConfigError, check_positive

__all__ = ["OverlapSection", "Pipeline", "Produced", "staleness_metrics"]


@dataclasses.dataclass(**FROZEN)
class OverlapSection:
    """Rollout overlapped with the update (``overlap.<field>`` in a config)."""

    # k: the batch of iteration i is sampled by the policy of iteration max(0, i - k) and
    # collected while earlier updates run; 0 = synchronous (collect, then update).
    staleness: int = 0
    # Disaggregated: the last N devices sample (a data-parallel mesh of replicas of their
    # own) and the update's mesh covers the others; the weights go from one to the other by
    # a device-to-device copy after each update. 0: colocated (both on the same devices).
    sampler_devices: int = 0
    # Episodes in flight across a weight update continue on the new weights from their next
    # turn (tokens keep their own versions); gives up bit-for-bit reproducibility.
    partial_rollouts: bool = False
    # Collections in flight at once, each with its own sampler (KV cache) and environment
    # pool: batch i goes to lane i % lanes. One lane collects the batches one after another,
    # so an iteration never takes less than one collection; with k + 1 lanes the collection
    # of batch i + 1 starts as soon as its weights exist, while batch i is still out (at
    # k = 1: (collect + update) / 2 an iteration when the collection is the longer).
    lanes: int = 1

    def __post_init__(self):
        check_positive("overlap.staleness", self.staleness, allow_zero=True)
        check_positive("overlap.sampler_devices", self.sampler_devices, allow_zero=True)
        if self.sampler_devices and not self.staleness:
            raise ConfigError(
                f"overlap.sampler_devices={self.sampler_devices} with overlap.staleness=0: "
                "separate rollout devices would idle while the update runs; set "
                "overlap.staleness >= 1 (or sampler_devices=0)"
            )
        check_positive("overlap.lanes", self.lanes)
        if self.lanes > 1 and self.lanes > self.staleness + 1:
            raise ConfigError(
                f"overlap.lanes={self.lanes} with overlap.staleness={self.staleness}: at most "
                "k + 1 batches can be collected at once (batch i waits for the weights of "
                f"version i - k); set overlap.lanes <= {self.staleness + 1}"
            )
        if self.lanes > 1 and self.partial_rollouts:
            raise ConfigError(
                f"overlap.lanes={self.lanes} with overlap.partial_rollouts=true: partial "
                "rollouts run one collection at a time; set overlap.lanes=1"
            )
        if self.partial_rollouts and not self.staleness:
            raise ConfigError(
                "overlap.partial_rollouts=true with overlap.staleness=0: a synchronous rollout "
                "never runs across a weight update; set overlap.staleness >= 1"
            )


@dataclasses.dataclass
class Produced:
    """One batch from the producer: iteration ``index``, sampled with policy ``version``."""

    index: int
    version: int
    payload: Any  # what the produce function returned (host data: ``collect.Collected``)
    sampler_wait_s: float = 0.0  # the producer waited this long for the version's weights
    collect_s: float = 0.0


class Pipeline:
    """The producer thread and the hand-over of weights and batches.

    Args:
      produce: ``produce(index, version, params, refresh, lane) -> payload`` (host data:
        episodes, packed batch); runs on lane ``lane``'s thread while holding that lane's
        lock (``env_lock`` is lane 0's). ``refresh`` (partial rollouts; else None):
        ``refresh(version)`` -> the newest published weights newer than ``version`` and not
        newer than the batch's own iteration, or None.
      start, stop: the iterations to produce (``range(start, stop)``).
      staleness: k >= 1.
      buffered: ``{index: Produced}`` restored from a checkpoint (those are not produced
        again).
      lanes: producer threads; batch ``i`` is lane ``i % lanes``'s, each lane takes its
        batches in order. Which lane (so which sampler and pool) collects a batch is fixed by
        its index, never by timing.
    """

    def __init__(
        self,
        produce: Callable[[int, int, Any], Any],
        start: int,
        stop: int,
        staleness: int,
        buffered: Optional[dict[int, Produced]] = None,
        partial: bool = False,
        lanes: int = 1,
    ):
        if staleness < 1:
            raise ValueError(f"Pipeline needs staleness >= 1, got {staleness}")
        if not 1 <= lanes <= staleness + 1:
            raise ValueError(f"Pipeline needs 1 <= lanes <= staleness + 1, got {lanes}")
        self._produce, self.k, self.partial = produce, staleness, partial
        self.start, self.stop = start, stop
        self._cond = threading.Condition(threading.RLock())
        self._weights: dict[int, Any] = {}  # version -> sampling params
        self._done: dict[int, Produced] = dict(buffered or {})
        self._produced: set[int] = set(self._done)  # every batch made (taken ones too)
        self._error: Optional[BaseException] = None
        self._closing = False
        # Lane 0's environments and sampler are the evaluation's too: one user at a time.
        self._locks = [threading.Lock() for _ in range(lanes)]
        self.env_lock = self._locks[0]
        self._threads = [
            threading.Thread(
                target=self._run, args=(lane, lanes), name=f"rollout-lane-{lane}", daemon=True
            )
            for lane in range(lanes)
        ]
        for thread in self._threads:
            thread.start()

    def version_of(self, index: int) -> int:
        """The policy version batch ``index`` samples with: ``max(0, index - k)``, and never
        older than the weights the pipeline starts from (a resumed run whose checkpoint holds
        no batches, e.g. one trained synchronously until then, samples them with its own)."""
        return max(self.start, index - self.k)

    def _starts_a_batch(self, version: int) -> bool:
        return any(
            self.version_of(j) == version and j not in self._produced
            for j in range(max(self.start, version), min(self.stop, version + self.k + 1))
        )

    def needs(self, version: int) -> bool:
        """True when a batch still to be produced samples with ``version``'s weights (with
        partial rollouts: every version a batch still to be produced may switch to)."""
        with self._cond:
            if self.partial:
                return any(j not in self._produced for j in range(version, self.stop))
            return self._starts_a_batch(version)

    def publish(self, version: int, params: Any) -> None:
        """Hand the producer the sampling weights of ``version`` (a copy it may keep)."""
        with self._cond:
            self._weights[version] = params
            self._cond.notify_all()

    def take(self, index: int) -> tuple[Produced, float, int]:
        """Batch ``index`` (blocking): ``(produced, seconds waited, batches ready beyond it)``."""
        t0 = time.perf_counter()
        with self._cond:
            while index not in self._done:
                self._raise_if_failed()
                self._cond.wait(0.5)
            item = self._done.pop(index)
            ahead = sum(j > index for j in self._done)
        return item, time.perf_counter() - t0, ahead

    def pending(self, done: int) -> dict[int, Produced]:
        """The batches ``done .. done + k - 1`` (those sampled with weights older than
        ``done``), waiting for the ones still being collected: what a checkpoint taken after
        iteration ``done`` must hold."""
        want = [j for j in range(done, min(done + self.k, self.stop))]
        with self._cond:
            while not all(j in self._done for j in want):
                self._raise_if_failed()
                self._cond.wait(0.5)
            return {j: self._done[j] for j in want}

    def close(self) -> None:
        """Stop after the batches being collected (the threads are daemons: a crash never
        hangs)."""
        with self._cond:
            self._closing = True
            self._weights.clear()
            self._cond.notify_all()

    def _refresher(self, index: int):
        def refresh(version: int):
            with self._cond:
                newer = [w for w in self._weights if version < w <= index]
                return None if not newer else (self._weights[max(newer)], max(newer))

        return refresh

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(
                f"the rollout producer failed: {type(self._error).__name__}: {self._error}"
            ) from self._error

    def _run(self, lane: int, lanes: int) -> None:
        try:
            for j in range(self.start, self.stop):
                if j % lanes != lane:
                    continue
                with self._cond:
                    if j in self._produced:
                        continue
                    v = self.version_of(j)
                    t0 = time.perf_counter()
                    while v not in self._weights and not self._closing:
                        self._cond.wait(0.5)
                    if self._closing:
                        return
                    params = self._weights[v]
                waited = time.perf_counter() - t0
                t1 = time.perf_counter()
                refresh = self._refresher(j) if self.partial else None
                with self._locks[lane]:
                    payload = self._produce(j, v, params, refresh, lane)
                item = Produced(j, v, payload, waited, time.perf_counter() - t1)
                params = None
                with self._cond:
                    self._done[j] = item
                    self._produced.add(j)
                    newest = max(self._weights, default=None)
                    for old in [w for w in self._weights if not self._starts_a_batch(w)]:
                        if not (self.partial and old == newest):  # a switch may still come
                            self._weights.pop(old)  # no later batch samples with them
                    self._cond.notify_all()
        except BaseException as err:  # re-raised on the learner's thread by take()
            with self._cond:
                self._error = err
                self._cond.notify_all()


def staleness_metrics(episodes, iteration: int, staleness: int) -> dict:
    """How many updates old the policy that sampled each trained token was, read from the
    tokens' recorded versions (``Episode.versions``): mean, max and the share of tokens at
    each staleness ``0 .. k``; ``async/stale_dropped`` counts episodes older than ``k``
    (none under the bounded schedule: a nonzero count is a bookkeeping error)."""
    counts = [0] * (staleness + 1)
    total = dropped = 0
    worst = 0
    for ep in episodes:
        ages = [iteration - v for v in ep.versions if v >= 0]
        if ages and max(ages) > staleness:
            dropped += 1
        for a in ages:
            counts[min(a, staleness)] += 1
            worst = max(worst, a)
        total += len(ages)
    m = {
        "async/staleness_mean": sum(i * c for i, c in enumerate(counts)) / max(total, 1),
        "async/staleness_max": worst,
        "async/stale_dropped": dropped,
    }
    for i, c in enumerate(counts):
        m[f"async/staleness_frac/{i}"] = c / max(total, 1)
    return m
