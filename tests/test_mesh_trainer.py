"""The trainer on a mesh of 8 simulated CPU devices equals the single-device trainer.

A shrunken quickstart run (1 layer, 4 tasks x 4 samples, 2 iterations of 2 optimiser steps
each) runs once on one device and once per mesh layout: all three axes at once
(``mesh.data=2 mesh.fsdp=2 mesh.tensor=2``, in CI) and the two-axis layouts
(``mesh.data=4 mesh.fsdp=2``; ``mesh.data=2 mesh.tensor=4``, slow). Sampled tokens, rewards
and success must be identical
(the rollout of iteration 2 samples from the updated, already layout-dependent parameters),
the losses and gradient norms equal to float32 reassociation, and the final parameters
equal within the bound derived below. A separate test samples a multi-turn rollout from
mesh-sharded parameters (KV cache split over batch rows) and compares the tokens.

Why Adam with ``eps=1`` here: Adam's step ``lr * m / (sqrt(v) + eps)`` with the default
eps 1e-8 is a sign function of near-zero gradient entries, so reduction-order noise of
1e-9 in such an entry flips a whole ``lr`` step (test_parallel compares SGD for the same
reason). With eps = 1 >> |g| the step is ``~lr * g``: smooth, Lipschitz in g with constant
<= lr, so the parameters inherit the gradients' float32 bound (the brief's "SGD for sharding
equality", in the trainer's own optimiser).
"""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.train.checkpoint import restore_params_only
from jaxagent.train.config import load_config
from jaxagent.train.metrics_log import read_jsonl

QS = str(Path(__file__).resolve().parent.parent / "configs/quickstart.yaml")

TINY = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.intermediate_size=64",
    "model.max_seq_len=128",
    "env.options.num_train=40",
    "env.options.num_test=16",
    "rollout.tasks_per_iteration=4",
    "rollout.samples_per_task=4",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=8",
    "rl.recipe=ppo",  # a critic: nonzero gradients although the untrained policy never succeeds
    "model.value_head=true",
    "rl.update.minibatch_size=8",
    "rl.update.num_epochs=1",
    "rl.optim.learning_rate=0.01",
    "rl.optim.eps=1.0",
    "sft.enabled=false",
    "eval.num_tasks=16",
    "eval.every=0",
    "eval.val_tasks=0",
    "train.iterations=2",
    "train.checkpoint_every=0",
    "train.progress=none",
    "train.tensorboard=false",
    "train.plot=false",
]
NONDETERMINISTIC = ("time/", "tokens/per_s", "env_health/", "sampler/recompiles", "roofline/")
# Keys compared to the float32 bound rather than exactly: sums over the batch's tokens.
# mismatch/: the learner's first pass vs the sampler, float rounding on any layout
FLOAT_KEYS = ("loss/", "optim/grad_norm", "entropy/", "kl/", "ratio/", "clip/", "adv/", "mismatch/")


def _run(tmp_path, name, overrides=()):
    from jaxagent.train.trainer import Trainer

    out = tmp_path / name
    cfg = load_config(QS, TINY + [f"train.out_dir={out}", *overrides])
    Trainer(cfg, echo=lambda s: None).run()
    records = {}
    for r in read_jsonl(out / "metrics.jsonl"):
        records.setdefault(r["step"], {}).update(
            {k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)}
        )
    state, _, _ = restore_params_only(out / "checkpoints")
    return records, state["params"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("single"), "single")


def _compare(single, sharded):
    (m1, _), (m8, _) = single, sharded
    assert m1.keys() == m8.keys() and len(m1) == 3  # before RL, iterations 1 and 2
    assert_same_run(single, sharded, steps=4)


def assert_same_run(reference, other, steps: int):
    """Same rollouts (exact), losses to float32 reassociation, parameters within the bound
    below after ``steps`` optimiser steps; ``reference`` / ``other``: (records, params)."""
    (m1, p1), (m8, p8) = reference, other
    grad_norm = max(m1[s].get("optim/grad_norm", 0.0) for s in m1)
    assert grad_norm > 0
    for step in m1:
        for k, v in m1[step].items():
            if k == "sampler/devices":  # the layout's, by design
                continue
            if isinstance(v, float) and k.startswith(FLOAT_KEYS):
                np.testing.assert_allclose(m8[step][k], v, rtol=2e-5, atol=1e-6, err_msg=k)
            else:  # tokens, rewards, success, batch shape: the same rollouts
                assert m8[step][k] == v, (step, k, v, m8[step][k])
    # Parameter bound. A weight gradient sums over the batch's 16 x 128 token positions plus
    # the contractions of the one layer's forward/backward chain (hidden 32, heads x
    # head_dim 32, intermediate 64, attention over 128 slots, head 32, vocabulary ~100):
    # a float32 reassociation moves it by at most n_terms * eps32 * |g|, |g| <= grad_norm.
    # Each of the optimiser steps (4 here: 2 iterations x 2 minibatches) moves a parameter by <= lr times that (eps = 1), plus
    # the float32 rounding of p + step on each side (2 eps32 |p|), and the second iteration
    # starts from the already-different parameters (x2 again for the propagated difference).
    eps32 = float(np.finfo(np.float32).eps)
    n_terms = 16 * 128 + (32 + 32 + 64 + 128) + 32 + 128
    lr = 0.01
    moved = 0.0
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        atol = 2 * steps * (lr * n_terms * eps32 * grad_norm + 2 * eps32 * np.abs(a).max())
        np.testing.assert_allclose(b, a, rtol=0, atol=atol)
        moved = max(moved, float(np.abs(a).max()))
    assert moved > 0


def test_mesh_data2_fsdp2_tensor2_matches_single_device(single, tmp_path, capsys):
    # every axis at once in the default suite (CI): batch rows, parameter shards and
    # tensor-parallel heads / MLP columns; the two-axis layouts below run nightly
    _compare(single, _run(tmp_path, "d2f2t2", ["mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2"]))
    # eval restores the checkpoint onto the run's own mesh (each device its shards, no
    # whole copy on one device) and scores what the trainer scored
    from jaxagent.cli.main import main
    from jaxagent.train.session import load_policy

    out = tmp_path / "d2f2t2"
    params = load_policy(out).params
    kernels = [x for x in jax.tree.leaves(params) if x.ndim == 2]
    assert all(len(x.sharding.device_set) == 8 for x in kernels)
    assert any(x.addressable_shards[0].data.size < x.size for x in kernels)  # really split
    assert main(["eval", str(QS), *TINY, "--checkpoint", str(out)]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    last = [r for r in read_jsonl(out / "metrics.jsonl") if "eval/success" in r][-1]
    assert got["success"] == last["eval/success"]


@pytest.mark.slow  # ~2 min each here at load 1 (nightly: scripts/nightly.sh)
def test_mesh_data4_fsdp2_matches_single_device(single, tmp_path):
    _compare(single, _run(tmp_path, "d4f2", ["mesh.data=4", "mesh.fsdp=2"]))


@pytest.mark.slow
def test_mesh_data2_tensor4_matches_single_device(single, tmp_path):
    _compare(single, _run(tmp_path, "d2t4", ["mesh.data=2", "mesh.tensor=4"]))


def test_mesh_rollout_same_tokens_as_one_device():
    """A two-turn rollout of 8 rows sampled from parameters sharded data=4 x fsdp=2 (KV cache
    split over rows: each device holds 2 rows) gives exactly the single-device tokens."""
    from jaxagent.generate import Sampler, SamplingConfig
    from jaxagent.models import ModelConfig, init_model
    from jaxagent.parallel.layout import DeviceLayout
    from jaxagent.parallel.mesh import make_mesh
    from jaxagent.models import param_logical_axes

    graphdef, params = init_model(ModelConfig.test(num_layers=2), jax.random.key(0))
    mesh = make_mesh(data=4, fsdp=2)
    layout = DeviceLayout(mesh, param_logical_axes(graphdef, params))
    sharded = layout.params(params)
    assert "fsdp" in str(sharded["layer_0"]["mlp"]["up_proj"].sharding.spec)
    cfg = SamplingConfig.create(max_new_tokens=12, temperature=1.0, stop_token_ids=(3,))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(4, 128, size=int(n)).tolist() for n in rng.integers(3, 11, 8)]
    obs = [rng.integers(4, 128, size=int(n)).tolist() for n in rng.integers(1, 6, 8)]
    outs = []
    for p in (params, sharded):
        s = Sampler(graphdef)
        a = s(p, prompts, cfg, jax.random.key(1))
        b = s(p, obs, cfg, jax.random.key(2), cache=a.cache)
        if p is sharded:  # each device holds its own rows' keys and values
            spec = b.cache.keys[0].sharding.spec
            assert spec[0] == ("data", "fsdp"), spec
        outs.append(jax.device_get((a.tokens, a.logprobs, b.tokens, b.logprobs)))
    (t1, l1, u1, k1), (t8, l8, u8, k8) = outs
    np.testing.assert_array_equal(t8, t1)
    np.testing.assert_array_equal(u8, u1)
    # log-probs: a vocabulary of 128 and the 64-wide contractions, float32 reassociation
    np.testing.assert_allclose(l8, l1, atol=1e-5)
    np.testing.assert_allclose(k8, k1, atol=1e-5)
    assert dataclasses.is_dataclass(layout) and jnp.asarray(t1).size == 8 * 12


def test_mesh_config_errors_name_the_field():
    from jaxagent.models import ModelConfig, init_model
    from jaxagent.errors import ConfigError
    from jaxagent.parallel.layout import DeviceLayout
    from jaxagent.train.run import rows_multiple

    with pytest.raises(ConfigError, match=r"mesh.fsdp=0"):
        load_config(QS, ["mesh.fsdp=0"])
    with pytest.raises(ConfigError, match=r"mesh.tensor=-1"):
        load_config(QS, ["mesh.tensor=-1"])
    graphdef, params = init_model(ModelConfig.test(num_layers=1), jax.random.key(0))
    cfg = load_config(QS, ["mesh.data=-1", "mesh.fsdp=3"])
    with pytest.raises(ConfigError, match="does not fit 8 devices"):
        DeviceLayout.build(cfg.mesh, graphdef, params)
    # minibatch 32 rows split over 8 devices is fine; 4 rows is not
    bad = load_config(QS, ["mesh.data=8", "rl.update.minibatch_size=4"])
    layout = DeviceLayout.build(bad.mesh, graphdef, params)
    assert rows_multiple(load_config(QS, ["mesh.data=8"]), layout.batch_devices) == 32
    with pytest.raises(ConfigError, match="rl.update.minibatch_size=4"):
        rows_multiple(bad, layout.batch_devices)
    assert DeviceLayout.build(load_config(QS).mesh, graphdef, params).mesh is None


def test_sft_runs_on_the_mesh_like_one_device(tmp_path):
    # The warm-start trains the born-sharded parameters where they are: the step is
    # partitioned like its inputs, the result stays split over the mesh, the loss is the
    # single device's up to float32 reassociation
    from jaxagent.train.trainer import Trainer

    losses = {}
    for name, extra in (("one", []), ("mesh", ["mesh.data=2", "mesh.fsdp=4"])):
        cfg = load_config(
            QS,
            TINY
            + [f"train.out_dir={tmp_path / name}", "sft.enabled=true", "sft.steps=4"]
            + ["sft.num_demos=8", "sft.batch_size=4", *extra],
        )
        trainer = Trainer(cfg, echo=lambda s: None)
        try:
            params, m = trainer.sft(trainer.take_initial_params())
        finally:
            trainer.close()
        losses[name] = m["sft/loss"]
        if extra:
            kernels = [x for x in jax.tree.leaves(params) if x.ndim == 2]
            assert all(len(x.sharding.device_set) == 8 for x in kernels)
            assert any(x.addressable_shards[0].data.size < x.size for x in kernels)
    np.testing.assert_allclose(losses["mesh"], losses["one"], rtol=1e-4)
