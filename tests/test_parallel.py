"""Sharded update on 8 simulated CPU devices equals the single-device update."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxagent.models import ModelConfig, abstract_graphdef, param_logical_axes
from jaxagent.parallel.distributed import DistributedConfig, start_distributed
from jaxagent.parallel.mesh import (
    MeshConfig,
    batch_shardings,
    logical_to_spec,
    make_mesh,
    state_shardings,
)
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import TrainState, make_optimizer
from jaxagent.rl.update import make_update_step
from test_rl_common import assert_trees_close_f32, copy_tree, on_policy_batch, tiny_model


def test_mesh_config_and_specs():
    assert jax.device_count() == 8
    mesh = make_mesh(data=4, fsdp=2)
    assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "tensor": 1}
    assert dict(make_mesh(MeshConfig(data=-1, fsdp=2, tensor=2)).shape) == {
        "data": 2,
        "fsdp": 2,
        "tensor": 2,
    }
    with pytest.raises(ValueError, match="does not fit 8 devices"):
        make_mesh(data=3)
    with pytest.raises(ValueError, match="mesh.fsdp=0"):
        MeshConfig(fsdp=0)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    assert logical_to_spec(("embed", "mlp"), (64, 96), mesh) == P("fsdp", "tensor")
    # 'vocab' 127 is not divisible by tensor=2: replicated instead of failing.
    assert logical_to_spec(("vocab", "embed"), (127, 64), mesh) == P(None, "fsdp")
    assert start_distributed(DistributedConfig()) is False


@pytest.mark.parametrize(
    "shape",
    [
        dict(data=4, fsdp=2),
        dict(data=8),
        # Tensor parallelism reorders the reductions inside matmuls; Adam turns the tiny gradient
        # differences of near-zero gradient entries into sign-like steps (~2e-5 apart after two
        # steps), so this case compares SGD updates (the gradients themselves). Kept out of the
        # default run; `pytest -m slow` runs it.
        pytest.param(dict(data=2, fsdp=2, tensor=2), marks=pytest.mark.slow),
    ],
)
def test_sharded_update_equals_single_device(shape):
    apply_fn, params = tiny_model(num_layers=1)
    config = get_recipe(
        "loop",
        lora={"rank": 0},
        optim={"learning_rate": 1e-3},
        update={"minibatch_size": 8, "microbatch_size": 4, "num_epochs": 1},
        advantage={"drop_below": 0.0},
    )
    batch = on_policy_batch(apply_fn, params, batch_size=16)
    tx = optax.sgd(1e-2) if shape.get("tensor", 1) > 1 else make_optimizer(config)

    single = TrainState.create(copy_tree(params), config, jax.random.key(7), optimizer=tx)
    single, m1 = make_update_step(config, apply_fn, tx)(single, batch)

    mesh = make_mesh(**shape)
    state = TrainState.create(copy_tree(params), config, jax.random.key(7), optimizer=tx)
    logical = param_logical_axes(abstract_graphdef(ModelConfig.test(num_layers=1)), params)
    st_sh = state_shardings(state, mesh, logical, tx)
    b_sh = batch_shardings(mesh, batch)
    state = jax.device_put(state, st_sh)
    sharded_batch = jax.device_put(batch, b_sh)
    update = make_update_step(
        config, apply_fn, tx, mesh=mesh, state_sharding=st_sh, batch_sharding=b_sh
    )
    state, m8 = update(state, sharded_batch)

    # Parameters really are sharded (fsdp splits 'embed'), and the result matches.
    if shape.get("fsdp", 1) > 1:
        assert "fsdp" in str(state.params["layer_0"]["mlp"]["up_proj"].sharding.spec)
        assert len(state.params["layer_0"]["mlp"]["up_proj"].addressable_shards) == 8
    # Robust across machines: SGD's step is the gradient itself, and Adam's moments are
    # smooth in it (mu = 0.1 g, nu = 0.001 g^2). Adam's parameters are not: a near-zero
    # gradient entry becomes a step of about +-lr, whose sign reduction-order noise flips.
    # The float32 bound counts, to first order, the 16 x 12 token positions a weight gradient
    # sums over plus the contractions along the one layer's forward/backward chain (hidden 64,
    # heads x head_dim 64, intermediate 96, attention over 12, the head's 64 and vocabulary
    # 128), x2 for nu's squared gradient (as in test_rl_vocab_head's mesh test).
    n_terms = 2 * (16 * 12 + (64 + 64 + 96 + 12) + 64 + 128)
    if shape.get("tensor", 1) > 1:
        # SGD steps, read back as p1 - p0: besides the reduction order of the step (n_terms
        # eps |step|), each side rounds p0 + step to float32 and subtracts p0 again, which
        # costs up to eps |p0| per side, far more than the step's own rounding.
        eps = float(np.finfo(np.float32).eps)
        for p0, a, b in zip(*(jax.tree.leaves(t) for t in (params, single.params, state.params))):
            step_a, step_b = a - p0, b - p0
            atol = n_terms * eps * float(jnp.max(jnp.abs(step_a))) + 2 * eps * float(
                jnp.max(jnp.abs(p0))
            )
            chex.assert_trees_all_close(step_a, step_b, atol=atol)
            assert float(jnp.max(jnp.abs(step_a))) > 10 * atol or not np.size(p0)
    else:
        assert_trees_close_f32(single.opt_state, state.opt_state, n_terms)
    for k in ("loss/policy", "optim/grad_norm", "entropy/mean"):
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-5, atol=1e-6)
    assert float(m1["optim/grad_norm"]) > 0


def test_lora_sampling_copy_is_sharded_like_the_base():
    # The merged copy LoRA samples from follows the base's FSDP shardings: each device holds
    # its fraction of it, not a whole model (the value head, trained beside the adapters and
    # replicated like them, is the exception: D entries).
    from jaxagent.models import init_model
    from jaxagent.rl.train_state import begin_sampling, end_sampling

    graphdef, params = init_model(
        ModelConfig.test(num_layers=2, param_dtype="bfloat16", value_head=True), jax.random.key(0)
    )
    rl = get_recipe("ppo", lora={"rank": 4}, kl={"mode": "none"})
    tx = make_optimizer(rl)
    state = TrainState.create(params, rl, jax.random.key(1), optimizer=tx)
    mesh = make_mesh(fsdp=8)
    sh = state_shardings(state, mesh, param_logical_axes(graphdef, params), tx)
    state = jax.device_put(state, sh)
    merged, state = begin_sampling(state)
    flat = jax.tree_util.tree_flatten_with_path(merged)[0]
    for (path, m), b in zip(flat, jax.tree.leaves(state.frozen_params)):
        if "value_" not in jax.tree_util.keystr(path):
            assert m.sharding.is_equivalent_to(b.sharding, m.ndim), jax.tree_util.keystr(path)
    dev = jax.devices()[0]
    on_dev = sum(
        s.data.nbytes
        for x in jax.tree.leaves(merged)
        for s in x.addressable_shards
        if s.device == dev
    )
    total = sum(x.nbytes for x in jax.tree.leaves(merged))
    small = sum(x.nbytes for x in jax.tree.leaves(merged) if x.ndim < 2)  # norms, value head
    print(f"sampling copy on one device: {on_dev} of {total} bytes ({small} in small leaves)")
    assert on_dev <= total / 8 + small, (on_dev, total)
    state, merged = end_sampling(state, merged), None
