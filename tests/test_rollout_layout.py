"""The rollout weight layout "replicas" on 8 simulated CPU devices (``tests/conftest.py``).

- ``DeviceLayout.rollout_params`` reaches it from the FSDP training layout by one compiled
  program: no weight split over 'fsdp' afterwards, values bit-identical in float32 and the
  bfloat16 rounding of the train weights with ``mesh.sampling_dtype=bfloat16``;
- a multi-turn rollout (``collect_episodes`` with ``CachedTurnSampler``) sampled from it
  gives the single device's episodes;
- ``distributed.host_view``, the zero-copy path of ``host_local``, assembles a host's array
  from the shards its devices already hold (one process, a sub-mesh standing for a host),
  and declines when those shards are not a whole copy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_rollout import WORDS, ScriptedEnv

from jaxagent.agents.cached import CachedTurnSampler
from jaxagent.agents.chat import ChatFormat
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.envs.base import Task
from jaxagent.errors import ConfigError
from jaxagent.generate import SamplingConfig
from jaxagent.models import ModelConfig, init_model, param_logical_axes
from jaxagent.parallel.distributed import host_view, split_axes
from jaxagent.parallel.layout import DeviceLayout, added_bytes
from jaxagent.parallel.mesh import MeshConfig, make_mesh
from jaxagent.train.tokenizer import build_word_tokenizer


def _layout(mesh, graphdef, params, dtype="param"):
    logical = param_logical_axes(graphdef, params)
    return DeviceLayout(mesh, logical, "replicas", sampling_dtype=dtype)


def _specs(tree) -> list[str]:
    return [str(x.sharding.spec) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def model():
    return init_model(ModelConfig.test(num_layers=2), jax.random.key(0))


@pytest.mark.parametrize("dtype", ["param", "bfloat16"])
def test_replicas_layout_is_one_program_and_exact(model, dtype):
    graphdef, params = model
    layout = _layout(make_mesh(data=2, fsdp=2, tensor=2), graphdef, params, dtype)
    train = layout.params(params)
    assert any("fsdp" in s for s in _specs(train))  # the training layout is FSDP-sharded
    rollout = layout.rollout_params(train)
    again = layout.rollout_params(train)
    assert len(layout._reshards) == 1  # one compiled program, reused
    for spec in _specs(rollout):
        assert "fsdp" not in spec and "data" not in spec, spec
    assert any("tensor" in s for s in _specs(rollout))  # still tensor-parallel
    for x, y, z in zip(jax.tree.leaves(params), jax.tree.leaves(rollout), jax.tree.leaves(again)):
        want = np.asarray(x) if dtype == "param" else np.asarray(x.astype(jnp.bfloat16))
        assert y.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(y), want)  # bit for bit (rounding included)
        np.testing.assert_array_equal(np.asarray(z), want)
        # every chip holds a whole tensor-parallel slice: 'fsdp' and 'data' replicate
        assert len(y.sharding.device_set) == 8
    # the train weights are read, not donated
    assert all(not x.is_deleted() for x in jax.tree.leaves(train))
    # the copy's bytes per chip (the figure the trainer logs), counted from the shards
    d0 = jax.devices()[0]
    held = [s.data.nbytes for x in jax.tree.leaves(rollout) for s in x.addressable_shards]
    on_d0 = [
        s.data.nbytes
        for x in jax.tree.leaves(rollout)
        for s in x.addressable_shards
        if s.device == d0
    ]
    assert added_bytes(rollout, train) == sum(on_d0) == sum(held) // 8  # all of it new
    # fp32: more per chip than the FSDP shard; bf16 at fsdp=2: half of that, as little
    assert (added_bytes(rollout, train) > added_bytes(train, None)) == (dtype == "param")
    hlo = layout.reshard_program(train).as_text()
    assert "all-gather" in hlo  # device to device: the FSDP shards are gathered on the mesh


def test_nothing_to_change_is_no_copy(model):
    graphdef, params = model
    # no fsdp axis: the training layout already is the replicas layout; fp32 stays fp32
    layout = _layout(make_mesh(data=4, tensor=2), graphdef, params)
    train = layout.params(params)
    assert layout.rollout_params(train) is train
    one = DeviceLayout(mesh=None, logical_axes=None)
    assert one.rollout_params(params) is params
    # one device and bfloat16: a cast copy, nothing else
    cast = DeviceLayout(mesh=None, logical_axes=None, sampling_dtype="bfloat16")
    assert {x.dtype for x in jax.tree.leaves(cast.rollout_params(params))} == {
        np.dtype(jnp.bfloat16)
    }


def test_mesh_section_names_the_choices():
    assert MeshConfig(rollout_layout="replicas", sampling_dtype="bfloat16").sampling_dtype
    with pytest.raises(ConfigError, match=r"mesh.rollout_layout='no_fsdp'.*replicas"):
        MeshConfig(rollout_layout="no_fsdp")
    with pytest.raises(ConfigError, match=r"mesh.sampling_dtype='fp16'"):
        MeshConfig(sampling_dtype="fp16")


def test_rollout_from_replicas_equals_one_device():
    tok = build_word_tokenizer(WORDS)
    chat = ChatFormat(tok)
    cfg = ModelConfig.test(vocab_size=len(tok), max_seq_len=128, num_layers=1)
    graphdef, params = init_model(cfg, jax.random.key(0))
    layout = _layout(make_mesh(data=2, fsdp=2, tensor=2), graphdef, params)
    rollout = layout.rollout_params(layout.params(params))
    sampling = SamplingConfig(max_new_tokens=5, temperature=1.0, stop_token_ids=chat.stop_ids)
    budget = Budget(max_turns=3, max_new_tokens=5, max_total_tokens=128)
    spec = RolloutSpec(chat, "one two", budget, InlineRunner(ScriptedEnv))
    tasks = [
        Task(id=str(i), split="train", prompt="", data={"n": 1 + i, "turns": 2 + i % 2})
        for i in range(4)
    ]
    runs = []
    for p in (params, rollout):
        sampler = CachedTurnSampler(graphdef, sampling, 128, pad_id=chat.pad_id)
        eps, _ = collect_episodes(
            sampler, p, tasks, samples_per_task=2, spec=spec, key=jax.random.key(1)
        )
        runs.append(eps)
    one, eight = runs
    assert len(one) == len(eight) == 8
    for a, b in zip(one, eight):
        assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
        # float32 reassociation of tensor-parallel contractions (64 wide, vocabulary ~30)
        np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
    assert sum(ep.num_policy_tokens for ep in one) > 0


def test_host_view_is_zero_copy_on_a_host_complete_layout(model):
    graphdef, params = model
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    layout = _layout(mesh, graphdef, params)
    rollout = layout.rollout_params(layout.params(params))
    host = list(mesh.devices[0].flat)  # "this host": data row 0, 4 devices, a whole copy
    axes = set().union(*(split_axes(x) for x in jax.tree.leaves(rollout)))
    views = [host_view(x, host, axes) for x in jax.tree.leaves(rollout)]
    assert len({v.sharding.mesh for v in views}) == 1  # one local mesh for the sampler
    for x, v in zip(jax.tree.leaves(rollout), views):
        assert set(v.sharding.device_set) == set(host)
        np.testing.assert_array_equal(np.asarray(v), np.asarray(x))
        held = {s.device: s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
        for s in v.addressable_shards:  # the same buffers: no copy
            assert s.data.unsafe_buffer_pointer() == held[s.device]
    assert added_bytes(views, rollout) == 0 < added_bytes(views, None)  # what the trainer logs
    # pure data parallelism: every device a whole copy; a "host" of 2 views its own two
    replicated = DeviceLayout(make_mesh(data=8), param_logical_axes(graphdef, params))
    x = jax.tree.leaves(replicated.params(params))[0]
    v = host_view(x, jax.devices()[2:4])
    assert set(v.sharding.device_set) == set(jax.devices()[2:4])
    np.testing.assert_array_equal(np.asarray(v), np.asarray(x))
    # FSDP over 8 devices: 4 of them hold half of each sharded weight, so no view
    fsdp = DeviceLayout(make_mesh(fsdp=8), param_logical_axes(graphdef, params))
    train = fsdp.params(params)
    split = [x for x in jax.tree.leaves(train) if split_axes(x)]
    assert split and all(host_view(x, jax.devices()[:4]) is None for x in split)
    # a tensor group cut in two by the "host" (devices 0-2 of data row 0): no view
    cut = [x for x in jax.tree.leaves(rollout) if "tensor" in split_axes(x)]
    assert cut and all(host_view(x, host[:3], axes) is None for x in cut)


@pytest.mark.slow
def test_trainer_samples_from_replicas_like_one_device(tmp_path):
    """The trainer on data=2 x fsdp=2 x tensor=2 with ``mesh.rollout_layout=replicas`` runs
    the single device's run (same rollouts, losses and parameters to the float32 bound of
    ``test_mesh_trainer``) and logs its sampling copy; bfloat16 halves that copy (~110 s)."""
    from test_mesh_trainer import _run, assert_same_run

    key = "mem/sampling_weights_gib"
    mesh = ["mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2", "mesh.rollout_layout=replicas"]
    runs = {
        "one": _run(tmp_path, "one"),
        "replicas": _run(tmp_path, "replicas", mesh),
        "bf16": _run(tmp_path, "bf16", [*mesh, "mesh.sampling_dtype=bfloat16"]),
    }
    copies = {
        name: [r[key] for _, r in sorted(records.items()) if key in r]
        for name, (records, _) in runs.items()
    }
    assert copies["one"] == [0.0, 0.0]  # one device, exact: the sampler reads the params
    assert len(copies["replicas"]) == 2 and min(copies["replicas"]) > 0
    assert copies["bf16"] == [c / 2 for c in copies["replicas"]]
    for records, _ in runs.values():
        for r in records.values():
            r.pop(key, None)
    assert_same_run(runs["one"], runs["replicas"], steps=4)
    bf16 = [r for r in runs["bf16"][0].values() if "loss/total" in r]
    assert len(bf16) == 2 and all(np.isfinite(r["loss/total"]) for r in bf16)


WORKER = """
import os, sys
pid, port = int(sys.argv[1]), sys.argv[2]
os.environ["XLA_FLAGS"] = ""
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, numpy as np
from jaxagent.parallel.distributed import DistributedConfig, host_local, start_distributed
start_distributed(DistributedConfig(mode="explicit", coordinator_address=f"localhost:{port}",
                                    num_processes=2, process_id=pid, local_device_count=4))
from jaxagent.models import ModelConfig, init_model, param_logical_axes
from jaxagent.parallel.layout import DeviceLayout, added_bytes
from jaxagent.parallel.mesh import make_mesh

graphdef, params = init_model(ModelConfig.test(num_layers=1), jax.random.key(0))
logical = param_logical_axes(graphdef, params)
local = set(jax.local_devices())
# replicas: each host's 4 devices are fsdp 2 x tensor 2 of one data row: a whole copy
layout = DeviceLayout(make_mesh(data=2, fsdp=2, tensor=2), logical, "replicas")
rollout = layout.rollout_params(layout.params(params))
mine = host_local(rollout, layout.host_shardings(rollout))
for x, g, y in zip(jax.tree.leaves(params), jax.tree.leaves(rollout), jax.tree.leaves(mine)):
    assert set(y.sharding.device_set) == local and y.is_fully_addressable
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    held = {s.device: s.data.unsafe_buffer_pointer() for s in g.addressable_shards}
    assert all(s.data.unsafe_buffer_pointer() == held[s.device] for s in y.addressable_shards)
assert added_bytes(mine, rollout) == 0
print("zero-copy ok")
# FSDP over both hosts: no host holds a whole copy; gathered, placed by host_shardings
train = DeviceLayout(make_mesh(fsdp=8), logical)
sharded = train.params(params)
mine = host_local(sharded, train.host_shardings(sharded))
for x, g, y in zip(jax.tree.leaves(params), jax.tree.leaves(sharded), jax.tree.leaves(mine)):
    assert set(y.sharding.device_set) == local
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
assert added_bytes(mine, sharded) > 0
print("gather ok")
"""


@pytest.mark.slow
def test_two_processes_view_their_replicas_in_place(tmp_path):
    """``host_local`` across 2 CPU processes (gloo) of 4 devices: the replicas layout is
    viewed in place on each host (same buffers), FSDP across hosts takes the gathered path."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(i), str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
        assert "zero-copy ok" in log and "gather ok" in log
