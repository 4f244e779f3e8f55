"""The SFT warm start trains like the RL update: the memory-lean learner pass (chunked
vocabulary head, rematerialised blocks, no [B, T, V] logits) and the run's LoRA setting."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.episode import Episode
from jaxagent.models import ModelConfig, init_model
from jaxagent.rl.config import LoraConfig
from jaxagent.rl.model_fns import model_apply_fn
from jaxagent.rl.train_state import TrainState, make_optimizer
from jaxagent.rl.update import make_update_step
from jaxagent.train.sft import make_sft_step, run_sft, sft_recipe, sft_state_like
from jaxagent.types import TokenBatch


def _episodes(n, vocab, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(8, 20))
        tokens = rng.integers(3, vocab, length).tolist()
        mask = [0] * 4 + [1] * (length - 4)
        out.append(Episode(task=None, group=i, tokens=tokens, loss_mask=mask))
    return out


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


def test_sft_loss_equals_the_full_logits_loss():
    cfg = ModelConfig.test(num_layers=2)
    graphdef, params = init_model(cfg, jax.random.key(0))
    batch = pack_episodes(_episodes(12, cfg.vocab_size), pad_id=0, max_len=48, dense=True)
    batch = jax.tree.map(lambda x: x[:4], batch)
    config = sft_recipe(1e-3, 4, 4, lora=LoraConfig(rank=0))
    tx = make_optimizer(config)
    old = make_update_step(config, model_apply_fn(graphdef), tx, compute_advantages=False)
    new = make_sft_step(graphdef, config, tx)
    key = jax.random.key(1)
    _, m_old = old(TrainState.create(_copy(params), config, key, optimizer=tx), batch)
    _, m_new = new(TrainState.create(_copy(params), config, key, optimizer=tx), batch)
    a, b = float(m_old["loss/total"]), float(m_new["loss/total"])
    # a token mean of log-softmax entries: the two programs differ in the log-sum-exp's
    # summation order over V entries (chunked online vs whole), ~log2(V) roundings of eps
    eps = float(jnp.finfo(jnp.float32).eps)
    tol = 8 * eps * np.log2(cfg.vocab_size) * (abs(a) + 1)
    assert abs(a - b) <= tol, (a, b, tol)
    np.testing.assert_allclose(
        float(m_new["optim/grad_norm"]), float(m_old["optim/grad_norm"]), rtol=1e-4
    )


def test_sft_with_lora_trains_only_the_adapted_kernels():
    cfg = ModelConfig.test(num_layers=2)
    graphdef, params = init_model(cfg, jax.random.key(0))
    start = jax.tree.map(np.asarray, params)
    lora = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    out, losses = run_sft(
        graphdef,
        params,
        _episodes(16, cfg.vocab_size),
        steps=6,
        batch_size=4,
        learning_rate=1e-2,
        seed=0,
        pad_id=0,
        max_len=48,
        lora=lora,
    )
    assert losses and np.isfinite(losses[-1])
    flat_start = jax.tree_util.tree_flatten_with_path(start)[0]
    changed = set()
    for (path, a), b in zip(flat_start, jax.tree.leaves(out)):
        name = jax.tree_util.keystr(path)
        if not np.array_equal(a, np.asarray(b)):
            changed.add(name)
    assert changed, "SFT changed nothing"
    assert all("q_proj" in n or "v_proj" in n for n in changed), sorted(changed)
    assert len(changed) == 2 * cfg.num_layers, sorted(changed)


def _temp_bytes(step, state_like, batch_like) -> int:
    return step.lower(state_like, batch_like).compile().memory_analysis().temp_size_in_bytes


def test_sft_step_temporaries_do_not_scale_with_the_logits():
    # A vocabulary large against the model, so that [B, T, V] float32 logits dominate.
    cfg = ModelConfig.test(num_layers=1, vocab_size=16384)
    graphdef, params = init_model(cfg, jax.random.key(0))
    length = 256
    logits = lambda rows: rows * length * cfg.vocab_size * 4  # [B, T, V] float32 bytes
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)

    def temps(rows, lean=True):
        config = sft_recipe(1e-3, 4, rows, lora=LoraConfig(rank=0))
        tx = make_optimizer(config)
        step = (
            make_sft_step(graphdef, config, tx)
            if lean
            else make_update_step(config, model_apply_fn(graphdef), tx, compute_advantages=False)
        )
        return _temp_bytes(
            step, sft_state_like(like, config, tx), TokenBatch.abstract(rows, length)
        )

    old8, new8, new32 = temps(8, lean=False), temps(8), temps(32)
    mib = lambda b: f"{b / 2**20:.0f} MiB"
    print(
        f"SFT step temporaries, 8 rows x {length}, V={cfg.vocab_size}: full logits "
        f"{mib(old8)}, lean {mib(new8)} ([B, T, V] float32: {mib(logits(8))}); "
        f"lean at 32 rows {mib(new32)} ({mib(logits(32))})"
    )
    assert old8 >= logits(8)  # the full-logits step held them (and more)
    assert new32 < logits(32) / 2, (new32, logits(32))
    # 4x the rows: the lean step's scratch grows by far less than the logits would
    assert new32 - new8 < (logits(32) - logits(8)) / 4, (new8, new32)


def test_lora_sft_on_a_mesh_equals_one_device_and_stays_sharded():
    from jaxagent.parallel.layout import DeviceLayout
    from jaxagent.parallel.mesh import MeshConfig

    cfg = ModelConfig.test(num_layers=2)
    graphdef, params = init_model(cfg, jax.random.key(0))
    losses = {}
    for name, mesh in (("one", MeshConfig()), ("mesh", MeshConfig(data=2, fsdp=4))):
        layout = DeviceLayout.build(mesh, graphdef, params)
        start = layout.params(_copy(params))  # born sharded, as the trainer's
        out, losses[name] = run_sft(
            graphdef,
            start,
            _episodes(16, cfg.vocab_size),
            steps=3,
            batch_size=8,
            learning_rate=1e-2,
            seed=0,
            pad_id=0,
            max_len=48,
            lora=LoraConfig(rank=4, alpha=8.0),
            layout=layout,
        )
        if layout.mesh is not None:
            kernels = [x for x in jax.tree.leaves(out) if x.ndim == 2]
            assert all(len(x.sharding.device_set) == 8 for x in kernels)
            assert any(x.addressable_shards[0].data.size < x.size for x in kernels)
    np.testing.assert_allclose(losses["mesh"], losses["one"], rtol=1e-5)


def test_sft_step_plans_without_weights_on_a_mesh():
    # How a planner asks for the SFT step's memory on a mesh, allocating no weight: the
    # abstract state in the layout's shardings, the batch's rows over the batch axes
    # (LoRA over a scan_layers model here: adapters stacked along the layers).
    from jaxagent.models import abstract_graphdef, abstract_params
    from jaxagent.parallel.layout import DeviceLayout
    from jaxagent.parallel.mesh import MeshConfig

    cfg = ModelConfig.test(num_layers=2, scan_layers=True)
    graphdef, like = abstract_graphdef(cfg), abstract_params(cfg)
    layout = DeviceLayout.build(MeshConfig(fsdp=8), graphdef, like)
    config = sft_recipe(1e-4, 10, 8, lora=LoraConfig(rank=8))
    tx = make_optimizer(config)
    state = sft_state_like(like, config, tx, layout)
    assert all(k.startswith("blocks/") for k in state.params)
    batch = TokenBatch.abstract(8, 64)
    b_sh = layout.batch_sharding(batch)
    batch = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), batch, b_sh
    )
    step = make_sft_step(
        graphdef,
        config,
        tx,
        activation_sharding=layout.activation_sharding(),
        mesh=layout.mesh,
        state_sharding=jax.tree.map(lambda x: x.sharding, state),
        batch_sharding=b_sh,
        rules=layout.rules,
    )
    plan = step.lower(state, batch).compile().memory_analysis()
    assert plan.temp_size_in_bytes > 0 and plan.argument_size_in_bytes > 0
