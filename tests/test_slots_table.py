"""The slot table (``jaxagent.agents.slots``): one KV-slot scheduler, two clients.

- A context that diverges from what a slot's cache holds rewinds the slot to the common
  prefix and prefills only the rest; the turn it samples is the turn a fresh slot samples
  from the whole context (same key, row and turn), token for token.
- ``stop`` keeps part of a turn: a next context that continues from the kept tokens reuses
  them all.
- Nothing else drives ``SlotSampler``'s programs: the rollout engine and the server's backend
  are the table's clients (the engine = lock-step and server = engine equalities live in
  tests/test_engine.py and tests/test_serve.py).
"""

import ast
import pathlib

import jax
import numpy as np
import pytest

from jaxagent.agents.slots import SlotTable
from jaxagent.generate import SamplingConfig
from jaxagent.generate.slots import SlotSampler
from jaxagent.models import ModelConfig, init_model

ROOT = pathlib.Path(__file__).resolve().parents[1] / "jaxagent"


@pytest.fixture(scope="module")
def program():
    cfg = ModelConfig.test(vocab_size=48, max_seq_len=128)
    graphdef, params = init_model(cfg, jax.random.key(0))
    sampling = SamplingConfig(max_new_tokens=5, temperature=1.0, stop_token_ids=(47,))
    return SlotSampler(graphdef, sampling, 2, 64, decode_steps=3), params


def _turn(table: SlotTable, slot: int, context, turn: int = 0):
    table.on_reply(slot, context, row=7, turn=turn)
    cached = table.admit()[slot]
    reads = []
    while table.decoding:
        table.decode()
        reads += table.harvest()
    (read,) = reads
    return cached, read


def test_a_divergent_context_rewinds_to_the_common_prefix_and_samples_the_fresh_turn(program):
    dev, params = program
    key = jax.random.key(3)
    first = list(range(1, 13))
    edited = first[:7] + [30, 31, 32]
    table = SlotTable(dev, params, key=key)
    assert _turn(table, 0, first)[0] == 0
    cached, read = _turn(table, 0, edited, turn=1)
    assert cached == 7  # only the edited tail was prefilled
    fresh_cached, fresh = _turn(SlotTable(dev, params, key=key), 1, edited, turn=1)
    assert fresh_cached == 0
    assert read.tokens == fresh.tokens
    np.testing.assert_allclose(read.logprobs, fresh.logprobs, atol=1e-4)


def test_a_stopped_turn_keeps_its_kept_tokens_for_the_next_context(program):
    dev, params = program
    table = SlotTable(dev, params, key=jax.random.key(4))
    context = list(range(2, 10))
    table.on_reply(0, context, row=0, turn=0)
    table.admit()
    table.decode()
    (read,) = table.harvest(every=True)  # read while under way (3 of 5 steps run)
    kept = read.tokens[:2]
    table.stop(0, kept)
    assert table.held[0] == (context + kept)[: len(table.held[0])]
    assert len(table.held[0]) >= len(context) + 1
    cached, _ = _turn(table, 0, context + kept + [40], turn=1)
    assert cached == len(context) + len(kept)


def test_switching_weights_waits_for_the_turns_and_admits_every_slot_fresh(program):
    dev, params = program
    table = SlotTable(dev, params, key=jax.random.key(5))
    table.on_reply(0, [1, 2, 3, 4], row=0, turn=0)
    table.admit()
    table.decode()
    done = []
    table.switch_weights(params, 1, lambda: done.append(True))
    if table.decoding:  # the turn under way keeps the old weights
        assert table.version == 0 and not done
    while table.decoding:
        table.decode()
        table.harvest()
    table.on_reply(0, [1, 2, 3, 4, 5, 6], row=0, turn=1)
    assert table.admit() == {0: 0} and table.version == 1 and done


def test_no_second_slot_scheduler():
    """Only the table (and the device programs themselves) call ``admit`` / ``decode`` with
    a pool's parameters and state: a second host loop over the pool fails here."""
    calls = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("agents/slots.py",) or rel.startswith("generate/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("admit", "decode")
                and len(node.args) >= 3
            ):
                calls.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}")
    assert calls == []
