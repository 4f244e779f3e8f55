"""One process of the multi-host test (tests/test_multihost.py); not collected by pytest.

    python tests/multihost_worker.py PID NPROC PORT DEVICES_PER_PROCESS OUT_DIR

Every process builds the same tiny model and the same global batch of 16 rows, keeps only
its own rows (``task_shard``: the host-local data), and runs the trainer's device path:
``DeviceLayout`` over all processes' devices (data=-1), the state sharded, host-local rows
assembled into global arrays, two update steps, an orbax checkpoint written collectively,
restored into an abstract template (a resume), and a third update. Process 0 alone writes
the final parameters and metrics (``is_writer``).
"""

import os
import sys

pid, nproc, port, per, out = sys.argv[1:6]
os.environ["XLA_FLAGS"] = ""  # the device count comes from distributed.local_device_count
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

from jaxagent.parallel.distributed import DistributedConfig, is_writer  # noqa: E402
from jaxagent.parallel.distributed import start_distributed, task_shard  # noqa: E402

if int(nproc) > 1:
    start_distributed(
        DistributedConfig(
            mode="explicit",
            coordinator_address=f"localhost:{port}",
            num_processes=int(nproc),
            process_id=int(pid),
            local_device_count=int(per),
        )
    )
else:
    jax.config.update("jax_num_cpu_devices", int(per))

from jax.experimental import multihost_utils  # noqa: E402

from jaxagent.models import ModelConfig, init_model, param_logical_axes  # noqa: E402
from jaxagent.parallel.mesh import make_mesh  # noqa: E402
from jaxagent.rl.recipes import get_recipe  # noqa: E402
from jaxagent.rl.train_state import TrainState, make_optimizer  # noqa: E402
from jaxagent.rl.update import make_update_step  # noqa: E402
from jaxagent.rl.model_fns import model_apply_fn  # noqa: E402
from jaxagent.train.checkpoint import Checkpointer  # noqa: E402
from jaxagent.parallel.layout import DeviceLayout, ShardedUpdate  # noqa: E402
from jaxagent.types import TokenBatch  # noqa: E402

B, T, V = 16, 12, 128
graphdef, params = init_model(ModelConfig.test(num_layers=1, vocab_size=V), jax.random.key(0))
config = get_recipe(
    "grpo",
    kl={"mode": "none", "beta": 0.0},
    optim={"learning_rate": 1e-2, "eps": 1.0},
    update={"minibatch_size": 8, "num_epochs": 1},
)
tx = make_optimizer(config)
rng = np.random.default_rng(0)
full = TokenBatch(
    tokens=rng.integers(0, V, (B, T)).astype(np.int32),
    positions=np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
    segment_ids=np.ones((B, T), np.int32),
    loss_mask=(np.arange(T)[None] >= 4).repeat(B, 0).astype(np.float32),
    old_logprobs=np.full((B, T), -4.8, np.float32),
    advantages=np.zeros((B, T), np.float32),
    rewards=rng.random(B).astype(np.float32),
    group_ids=np.repeat(np.arange(4), 4).astype(np.int32),
    turn_ids=np.zeros((B, T), np.int32),
)
mine = np.asarray(task_shard(list(range(B))))  # this process's rows
local = jax.tree.map(lambda x: x[mine], full)

mesh = make_mesh(data=-1)
layout = DeviceLayout(mesh, param_logical_axes(graphdef, params))
state, _ = layout.state(TrainState.create(params, config, jax.random.key(1), optimizer=tx), tx)
update = ShardedUpdate(
    layout, lambda **kw: make_update_step(config, model_apply_fn(graphdef), tx, **kw)
)
state, m1 = update(state, local)
state, m2 = update(state, local)
ckpt = Checkpointer(os.path.join(out, "ckpt"), async_save=False)
ckpt.save(2, state, {"iteration": 2})
ckpt.wait()
like = jax.eval_shape(
    lambda p: TrainState.create(p, config, jax.random.key(1), optimizer=tx), params
)
like = layout.abstract_state(like, tx).replace(rng=jax.random.key(1))
restored, meta = ckpt.restore(2, like)
ckpt.close()
state, m3 = update(restored, local)
final = multihost_utils.process_allgather(state.params, tiled=True)
if is_writer():
    flat = {
        "/".join(map(str, k)): np.asarray(v)
        for k, v in jax.tree_util.tree_flatten_with_path(final)[0]
    }
    np.savez(os.path.join(out, "params.npz"), **flat)
    losses = [float(m["loss/policy"]) for m in (m1, m2, m3)]
    np.save(os.path.join(out, "losses.npy"), np.asarray(losses))
    print(
        "meta", meta, "losses", losses, "devices", jax.device_count(), "procs", jax.process_count()
    )
