"""The rollout's KV cache is fitted to the chip's free memory: ``rollout.slots: 0`` becomes
the slots that fit, and a setting that cannot fit is refused in one line with the numbers."""

import pytest

from jaxagent.agents.engine import EngineConfig, SlotEngine
from jaxagent.errors import ConfigError
from jaxagent.generate import SamplingConfig
from jaxagent.models import ModelConfig, abstract_graphdef
from jaxagent.train.policy import (
    KV_MEMORY_FRACTION,
    device_free_bytes,
    kv_bytes_per_row,
    make_turn_sampler,
    sized_engine,
    state_reserve_bytes,
)

CFG = ModelConfig.test(num_layers=2)  # 2 kv heads x 16, float32
CAP = 256
ROW = kv_bytes_per_row(CFG, CAP)


def test_row_bytes_follow_the_cache_layout():
    from jaxagent.models import init_cache

    cache = init_cache(CFG, 3, CAP)
    nbytes = sum(x.nbytes for x in (*cache.keys, *cache.values))
    assert nbytes == 3 * ROW


def test_slots_zero_is_sized_to_the_free_memory():
    free = int(10.5 * ROW / KV_MEMORY_FRACTION)  # room for 10 rows
    eng = sized_engine(EngineConfig(), CFG, CAP, streamed=True, rows=512, free_bytes=free)
    assert eng.slots == 10
    # fewer episodes than fit: one slot each
    assert sized_engine(EngineConfig(), CFG, CAP, streamed=True, rows=4, free_bytes=free).slots == 4
    # no limit known (the CPU backend): unchanged
    assert sized_engine(EngineConfig(), CFG, CAP, streamed=True, rows=512).slots == 0
    # the sampler the run builds takes the sized engine
    sampler = make_turn_sampler(
        abstract_graphdef(CFG), SamplingConfig(), CAP, streamed=True, rows=512, free_bytes=free
    )
    assert isinstance(sampler, SlotEngine) and sampler.slots == 10


def test_settings_that_cannot_fit_are_refused_with_the_numbers():
    free = int(10.5 * ROW / KV_MEMORY_FRACTION)
    with pytest.raises(ConfigError) as err:
        sized_engine(EngineConfig(slots=64), CFG, CAP, streamed=True, free_bytes=free)
    text = str(err.value)
    assert "\n" not in text and "rollout.slots=64" in text and "rollout.slots=10" in text, text
    assert f"{64 * ROW / 2**30:.2f} GiB" in text, text
    # lockstep holds every episode at once
    with pytest.raises(ConfigError) as err:
        sized_engine(EngineConfig(engine="lockstep"), CFG, CAP, streamed=False, rows=512,
                     free_bytes=free)  # fmt: skip
    text = str(err.value)
    assert "512 episodes" in text and "rollout.engine=slots" in text, text
    assert f"{512 * ROW / 2**30:.2f} GiB" in text, text
    # not even one row
    with pytest.raises(ConfigError, match="rollout.max_total_tokens"):
        sized_engine(EngineConfig(), CFG, CAP, streamed=True, rows=8, free_bytes=ROW // 2)


def test_free_memory_is_the_smallest_of_the_chips():
    class Chip:
        def __init__(self, limit, used):
            self.stats = {"bytes_limit": limit, "bytes_in_use": used}

        def memory_stats(self):
            return self.stats

    assert device_free_bytes([Chip(100, 30), Chip(100, 50)]) == 50
    assert (
        device_free_bytes([Chip(100, 30), type("Cpu", (), {"memory_stats": lambda s: None})()])
        is None
    )


def test_cpu_reports_no_limit():
    import jax

    if jax.devices()[0].platform == "cpu":
        assert device_free_bytes() is None


def test_the_train_states_moments_are_reserved_before_sizing():
    import jax

    from jaxagent.models import init_model
    from jaxagent.rl.recipes import get_recipe

    _, params = init_model(CFG, jax.random.key(0))
    n = sum(x.size for x in jax.tree.leaves(params))
    full = get_recipe("loop", lora={"rank": 0})
    assert state_reserve_bytes(params, full) == 2 * 4 * n  # Adam's two float32 moments
    assert state_reserve_bytes(params, get_recipe("loop", lora={"rank": 8})) == 0
    assert state_reserve_bytes(params, full, loaded=False) == 3 * 4 * n  # + the weights
    # the sampler sizes its slots from what is left
    free = int(10.5 * ROW / KV_MEMORY_FRACTION)
    sampler = make_turn_sampler(
        abstract_graphdef(CFG),
        SamplingConfig(),
        CAP,
        streamed=True,
        rows=512,
        free_bytes=free + 2 * 4 * n,
        reserve_bytes=state_reserve_bytes(params, full),
    )
    assert sampler.slots == 10
