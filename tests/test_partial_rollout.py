"""Partial rollouts: episodes in flight across a weight update continue on the new weights.

The lock-step driver asks ``refresh`` before every turn, the slot engine between decode calls
(switching once the turns on the device have ended); given newer weights, every running
episode's next turns are sampled by them (its context prefilled again under them), tokens keep
the version that sampled them, and each token's recorded log-prob is its own version's
teacher-forced log-prob (fp32, 1e-4): the importance ratios stay exact.
"""

import jax
import numpy as np

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.cached import CachedTurnSampler
from jaxagent.agents.engine import SlotEngine
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.generate import SamplingConfig
from jaxagent.models import init_model
from jaxagent.train.policy import make_logprob_fn

from test_rollout import ScriptedEnv, _tasks, setup  # noqa: F401  (fixture)


def _world(fixture):
    """The scripted world's rollout pieces and a second set of weights (version 1)."""
    _, chat, graphdef, params, cfg = fixture
    _, newer = init_model(cfg, jax.random.key(7))
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0, stop_token_ids=chat.stop_ids)
    budget = Budget(max_turns=4, max_new_tokens=6, max_total_tokens=200)
    spec = RolloutSpec(chat, "one two", budget, InlineRunner(ScriptedEnv))
    return chat, graphdef, params, newer, sampling, spec


def test_episodes_switch_weights_between_turns_and_stay_exact(setup):  # noqa: F811
    chat, graphdef, params, newer, sampling, spec = _world(setup)
    asked = []

    def refresh(version):  # version 1 is published after the first turn
        asked.append(version)
        return (newer, 1) if version == 0 else None

    eps, _ = collect_episodes(
        CachedTurnSampler(graphdef, sampling, 256, chat.pad_id),
        params,
        _tasks(),
        samples_per_task=2,
        spec=spec,
        key=jax.random.key(1),
        refresh=refresh,
    )
    assert asked[0] == 0 and set(asked[1:]) <= {1}
    for ep in eps:  # turn 0 on the old weights, every later turn on the new ones
        for t, v in zip(ep.turn_ids, ep.versions):
            assert v == (-1 if t < 0 else int(t > 0))
    _assert_exact_per_version(eps, chat, graphdef, params, newer)


def test_slot_engine_switches_weights_once_its_turns_end(setup):  # noqa: F811
    chat, graphdef, params, newer, sampling, spec = _world(setup)
    asked = []

    def refresh(version):  # version 1 is published at the engine's third question
        asked.append(version)
        return (newer, 1) if version == 0 and len(asked) >= 3 else None

    # 3 slots for 6 episodes: episodes start on either side of the switch, and the slots
    # are mid-turn when it is published (the engine drains them first)
    engine = SlotEngine(graphdef, sampling, 256, chat.pad_id, slots=3, decode_steps=2)
    eps, _ = collect_episodes(
        engine,
        params,
        _tasks(),
        samples_per_task=3,
        spec=spec,
        key=jax.random.key(1),
        refresh=refresh,
    )
    assert asked[:3] == [0, 0, 0] and set(asked[3:]) <= {1}
    for ep in eps:  # one version a turn, never back to the old weights
        turns = {}
        for t, v in zip(ep.turn_ids, ep.versions):
            if t >= 0:
                turns.setdefault(t, set()).add(v)
        assert all(len(vs) == 1 for vs in turns.values())
        seq = [min(turns[t]) for t in sorted(turns)]
        assert seq == sorted(seq)
    _assert_exact_per_version(eps, chat, graphdef, params, newer)
    assert engine._state is None


def _assert_exact_per_version(eps, chat, graphdef, params, newer):
    mixed = [ep for ep in eps if {0, 1} <= set(ep.versions)]
    assert mixed  # episodes that ran across the update
    batch = pack_episodes(eps, pad_id=chat.pad_id, max_len=256, length_multiple=16)
    learner = make_logprob_fn(graphdef)
    rows = (batch.tokens, batch.positions, batch.segment_ids)
    by_version = [np.asarray(learner(p, *rows)[0]) for p in (params, newer)]
    versions = np.full(batch.tokens.shape, -1)
    for r, ep in enumerate(eps):
        versions[r, : len(ep.versions)] = ep.versions
    for v in (0, 1):
        m = versions == v
        assert m.sum() > 10
        np.testing.assert_allclose(by_version[v][m], batch.old_logprobs[m], atol=1e-4, rtol=0)
    # the other version's log-probs are far off: the check above tells the weights apart
    m = versions == 1
    assert np.abs(by_version[0][m] - batch.old_logprobs[m]).max() > 0.1
