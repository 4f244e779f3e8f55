"""The sampler's KV cache split over rows and KV heads on a data x tensor mesh.

With the parameters tensor-parallel (heads over 'tensor') and the rows over 'data', each device
should hold only its rows' keys and values of its own KV heads, and sample exactly what one
device samples (eight simulated CPU devices, see conftest)."""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxagent.generate import Sampler, SamplingConfig
from jaxagent.generate.sampler import _row_sharding, _shard_cache_rows
from jaxagent.generate.slots import SlotSampler
from jaxagent.models import ModelConfig, init_model, param_logical_axes
from jaxagent.models.api import model_config
from jaxagent.models.cache import init_cache
from jaxagent.parallel.mesh import make_mesh, param_shardings

ROWS = 8


def _model(scan_layers=False):
    # GQA 4:2, so the KV heads divide a tensor axis of 2
    cfg = ModelConfig.test(num_layers=2, num_heads=4, num_kv_heads=2, scan_layers=scan_layers)
    return init_model(cfg, jax.random.key(0))


def _sharded(graphdef, params, data=4, tensor=2):
    mesh = make_mesh(data=data, tensor=tensor)
    sh = param_shardings(params, param_logical_axes(graphdef, params), mesh)
    return jax.device_put(params, sh)


def _cache_specs(cache):
    """Each buffer's spec, padded with None to its rank (JAX trims trailing Nones)."""
    bufs = (*jax.tree.leaves(cache.keys), *jax.tree.leaves(cache.values))
    return [(*x.sharding.spec, *[None] * (x.ndim - len(x.sharding.spec))) for x in bufs]


@pytest.mark.parametrize("scan_layers", [False, True])
def test_cache_is_split_over_rows_and_heads(scan_layers):
    graphdef, params = _model(scan_layers)
    sharded = _sharded(graphdef, params)
    assert sharded["embed"].sharding.spec == P("tensor", None)  # vocab over tensor
    rows = _row_sharding(sharded, ROWS)
    mc = model_config(graphdef)
    cache = jax.jit(lambda: _shard_cache_rows(init_cache(mc, ROWS, 64), rows))()
    lead = (None,) if scan_layers else ()
    for spec in _cache_specs(cache):
        assert spec[: len(lead) + 2] == (*lead, "data", "tensor"), spec
    k = jax.tree.leaves(cache.keys)[0]
    # each device: 2 of the 8 rows, 1 of the 2 KV heads
    assert k.sharding.shard_shape(k.shape)[len(lead) : len(lead) + 2] == (2, 1)
    assert cache.lengths.sharding.spec == P("data")
    # a tensor axis that does not divide the KV heads leaves them whole (rows still split)
    mesh = make_mesh(data=2, tensor=4)
    rows4 = NamedSharding(mesh, P("data"))
    odd = jax.jit(lambda: _shard_cache_rows(init_cache(mc, ROWS, 64), rows4))()
    for spec in _cache_specs(odd):
        assert spec[len(lead) : len(lead) + 2] == ("data", None), spec


def test_sampling_on_rows_x_heads_equals_one_device():
    """The lock-step Sampler and a SlotSampler admit + decode, from parameters
    split data=4 x tensor=2 (cache rows over data, KV heads over tensor): the single device's
    tokens, log-probs equal up to float32 reassociation of the split contractions."""
    graphdef, params = _model()
    sharded = _sharded(graphdef, params)
    cfg = SamplingConfig.create(max_new_tokens=10, temperature=1.0, stop_token_ids=(3,))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(4, 128, size=int(n)).tolist() for n in rng.integers(3, 11, ROWS)]
    outs = []
    for p in (params, sharded):
        s = Sampler(graphdef)
        a = s(p, prompts, cfg, jax.random.key(1))
        slots = SlotSampler(graphdef, cfg, ROWS, 64, decode_steps=32)
        st = slots.init(p)
        fused = slots.prepare(p)
        st = slots.admit(
            p, fused, st, list(range(ROWS)), prompts, [True] * ROWS, jax.random.key(3),
            list(range(ROWS)), [0] * ROWS,
        )  # fmt: skip
        st = slots.decode(p, fused, st)
        if p is sharded:
            for cache in (a.cache, st.cache):
                for spec in _cache_specs(cache):
                    assert spec[:2] == ("data", "tensor"), spec
        outs.append(jax.device_get((a.tokens, a.logprobs, st.tokens, st.logprobs)))
    one, split = outs
    for i in (0, 2):  # tokens
        np.testing.assert_array_equal(split[i], one[i])
    for i in (1, 3):  # log-probs: vocabulary 128, contractions of width 64 split in two
        np.testing.assert_allclose(split[i], one[i], atol=1e-5)


def test_pod_plan_rollout_compiles_the_slot_programs(monkeypatch):
    """benchmarks/pod_plan.py --phase rollout on the 8 CPU devices with a tiny model: the
    pool is laid out rows x heads by the sampler's own init, both SlotSampler programs
    compile, and the decode step's KV bytes are one device's share of every slot's cache."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    sys.modules.pop("pod_plan", None)
    import pod_plan

    monkeypatch.setitem(pod_plan.MODELS, "tiny", (128, 64, 2, 4, 2, 16, 96, True, True, 1e4))
    argv = ["--cpu-devices", "8", "--phase", "rollout", "--episodes", "16", "--tokens", "256"]
    args = pod_plan._args([*argv, "--tensor", "2", "--new-tokens", "16", "--prefill-chunk", "64"])
    args.model = "tiny"
    r = pod_plan.rollout_plan(args)
    assert r["mesh"] == "data=4,fsdp=1,tensor=2"
    assert "('data', 'tensor', None, None)" in r["layout"]["kv_cache"]
    # every slot admitted at once: 4 a data shard, each prefilled on its own shard
    assert r["admit_rows"] == 16 and r["admit_rows_per_shard"] == 4
    assert set(r["programs"]) == {"admit", "decode"}
    assert all(p["peak_gib_per_chip"] is not None for p in r["programs"].values())
    # keys + values, 2 layers, 4 of 16 rows, 1 of 2 KV heads, 256 slots of head_dim 16, bf16
    assert r["decode_kv_bytes_per_step"] == 2 * 2 * 4 * 1 * 256 * 16 * 2


def test_uneven_admits_on_split_rows_equal_one_device():
    """Admits that reach some data shards and not others, with a prompt shared by two slots
    of one shard (prefilled once) and a later chunk appended to running slots: each admitted
    slot is prefilled on the shard that holds it, and the pool ends as one device's."""
    graphdef, params = _model()
    sharded = _sharded(graphdef, params)
    cfg = SamplingConfig.create(max_new_tokens=6, temperature=1.0, stop_token_ids=(3,))
    rng = np.random.default_rng(1)
    prompt = lambda n: rng.integers(4, 128, size=n).tolist()  # noqa: E731
    shared = prompt(7)
    calls = [  # (slots, chunks, fresh): 2 slots a shard (8 rows over data=4)
        ([0, 1, 5], [shared, shared, prompt(9)], [True] * 3),  # shards 0 and 2 only
        ([2, 3, 4, 6, 7], [prompt(int(n)) for n in rng.integers(3, 12, 5)], [True] * 5),
        ([1, 6], [prompt(4), prompt(5)], [False, False]),  # observations appended
    ]
    outs = []
    for p in (params, sharded):
        slots = SlotSampler(graphdef, cfg, ROWS, 64, decode_steps=32)
        assert slots.shards(p) == (4 if p is sharded else 1)
        st, fused = slots.init(p), slots.prepare(p)
        for turn, (ids, chunks, fresh) in enumerate(calls):
            st = slots.admit(
                p, fused, st, ids, chunks, fresh, jax.random.key(3), ids, [turn] * len(ids)
            )
            st = slots.decode(p, fused, st)
        outs.append(jax.device_get((st.tokens, st.logprobs, st.cache.lengths)))
    one, split = outs
    np.testing.assert_array_equal(split[0], one[0])
    np.testing.assert_array_equal(split[2], one[2])
    np.testing.assert_allclose(split[1], one[1], atol=1e-5)
    # slots 0 and 1 drew from their own streams after one shared prefill of the prompt
    assert slots.prefilled_tokens == 7 + 9 + int(sum(len(c) for c in calls[1][1])) + 4 + 5


def test_admit_prefills_a_shards_rows_on_that_shard(monkeypatch):
    """The compiled admit's per-device temporaries for 4 rows on each of 4 data shards equal
    those of 4 rows on one shard: no device gathers or prefills another shard's slots (with
    the rows replicated, each device prefilled all 16: 3.4x the temporaries)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    sys.modules.pop("pod_plan", None)
    import pod_plan

    monkeypatch.setitem(pod_plan.MODELS, "tiny", (128, 64, 2, 4, 2, 16, 96, True, True, 1e4))
    temp = {}
    for devices, mesh, slots in (("8", "4,1,2", 16), ("2", "1,1,2", 4)):
        argv = ["--cpu-devices", devices, "--mesh", mesh, "--phase", "rollout"]
        argv += ["--episodes", str(slots), "--tokens", "256", "--new-tokens", "16"]
        args = pod_plan._args([*argv, "--prefill-chunk", "64"])
        args.model = "tiny"
        r = pod_plan.rollout_plan(args)
        assert r["admit_rows_per_shard"] == 4
        temp[mesh] = r["programs"]["admit"]["temp_bytes"]
    assert temp["4,1,2"] <= 1.1 * temp["1,1,2"], temp
