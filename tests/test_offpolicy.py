"""Off-policy corrections (loss.off_policy) and the sampler-vs-learner mismatch (mismatch/*).

Each correction's weights against numpy, and its corrected loss against a hand-computed PPO
loss on constructed log-probs; ``off_policy="none"`` is the previous loss bit for bit, and
the mismatch measurement (free or full) leaves the default update unchanged; the mismatch
metrics of a batch whose behaviour log-probs are the learner's plus known offsets; and the
mismatch of a real sampler (KV-cache decode) against the learner's first pass, fp32 and bf16.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_rl_common import assert_trees_close_f32, copy_tree, on_policy_batch, tiny_model

from jaxagent.rl import losses as L
from jaxagent.rl.config import LossConfig, RLConfigError, UpdateConfig
from jaxagent.rl.model_fns import logits_logprob_fn
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import TrainState
from jaxagent.rl.update import make_loss_fn, make_update_step

EPS32 = float(np.finfo(np.float32).eps)


def _loop(**sections):
    update = {"minibatch_size": 8, **sections.pop("update", {})}
    return get_recipe(
        "loop", lora={"rank": 0}, advantage={"drop_below": 0.0}, update=update, **sections
    )


# ----------------------------------------------------------------------------- weights


def _np_weights(name, prox, behav, mask, cfg):
    k = np.exp(prox - behav)
    if name == "decoupled":
        drop = (k > cfg.decoupled_cap) if cfg.decoupled_cap > 0 else np.zeros_like(k, bool)
        w = np.where(drop, 0.0, k)
    elif name == "tis":
        drop, w = np.zeros_like(k, bool), np.minimum(k, cfg.tis_cap)
    else:
        drop = (k < cfg.icepop_low) | (k > cfg.icepop_high)
        w = np.where(drop, 0.0, k)
    return w * mask, drop * mask


@pytest.mark.parametrize(
    "name,extra",
    [("decoupled", {}), ("decoupled", {"decoupled_cap": 2.0}), ("tis", {}), ("icepop", {})],
)
def test_correction_weights_match_numpy(name, extra):
    from jaxagent.rl.tables import OFF_POLICY_CORRECTIONS

    cfg = LossConfig(off_policy=name, **extra)
    # log(pi_prox / pi_behav) on both sides of every bound: 0.37, 0.74, 1, 1.49, 2.46
    log_k = np.array([[-1.0, -0.3, 0.0, 0.4, 0.9], [0.9, 0.4, 0.0, -0.3, -1.0]], np.float32)
    prox = np.full_like(log_k, -2.0)
    behav = prox - log_k
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0]], np.float32)
    w, dropped = OFF_POLICY_CORRECTIONS[name].fn(cfg, prox, behav, mask)
    w_ref, d_ref = _np_weights(name, prox, behav, mask, cfg)
    np.testing.assert_allclose(w, w_ref, rtol=1e-6)
    np.testing.assert_array_equal(dropped, d_ref)
    expected_drops = {"decoupled": 2 if extra else 0, "tis": 0, "icepop": 3}[name]
    assert float(np.sum(dropped)) == expected_drops  # the bounds really cut
    if name == "tis":
        assert float(np.max(w)) == cfg.tis_cap


# ----------------------------------------------------------------------------- losses


def _np_ppo_loss(logp, ref, adv, weight, mask, low, high):
    """seq_mean_token_mean of ``weight * -min(r A, clip(r) A)``, r = pi / ref (numpy)."""
    r = np.exp(logp - ref)
    tok = -np.minimum(r * adv, np.clip(r, low, high) * adv) * weight * mask
    per_seq = tok.sum(1) / np.maximum(mask.sum(1), 1)
    return per_seq.sum() / (mask.sum(1) > 0).sum()


@pytest.fixture(scope="module")
def constructed():
    """A tiny model, its batch and the learner's log-probs; pi_prox = learner + offsets that
    put ratios outside PPO's clip, and pi_behav = pi_prox - log k across IcePop's band."""
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8)
    logp = np.asarray(
        jax.jit(
            lambda p: logits_logprob_fn(apply_fn)(
                p, batch.tokens, batch.positions, batch.segment_ids
            )[0]
        )(params)
    )
    rng = np.random.default_rng(0)
    mask = np.asarray(batch.loss_mask)
    prox = (logp + rng.uniform(-0.4, 0.4, mask.shape)) * mask
    log_k = rng.choice([-1.0, -0.3, 0.0, 0.4, 0.9], mask.shape)
    behav = (prox - log_k) * mask
    adv = rng.normal(size=mask.shape).astype(np.float32) * mask
    batch = batch.replace(old_logprobs=jnp.asarray(behav, jnp.float32), advantages=jnp.asarray(adv))
    return apply_fn, params, batch, logp, jnp.asarray(prox, jnp.float32)


@pytest.mark.parametrize("name", ["none", "decoupled", "tis", "icepop"])
def test_corrected_loss_equals_hand_computed(constructed, name):
    apply_fn, params, batch, logp, prox = constructed
    cfg = _loop(loss={"off_policy": name})
    loss_fn = jax.jit(make_loss_fn(cfg, logits_logprob_fn(apply_fn)))
    nt, ns = L.aggregation_denominators(batch.loss_mask)
    loss, m = loss_fn(params, batch, nt, ns, prox)
    mask = np.asarray(batch.loss_mask)
    behav, p = np.asarray(batch.old_logprobs), np.asarray(prox)
    if name == "none":  # LOOP's clip on the behaviour log-probs, no weight
        ref, w = behav, mask
    else:
        ref, w = p, _np_weights(name, p, behav, mask, cfg.loss)[0]
    low, high = L.clip_bounds(cfg.loss.clip_eps_low, cfg.loss.clip_eps_high, cfg.loss.clip_lower)
    expected = _np_ppo_loss(logp, ref, np.asarray(batch.advantages), w, mask, low, high)
    np.testing.assert_allclose(float(m["loss/policy"]), expected, rtol=2e-5)
    assert float(m["clip/low_frac"]) + float(m["clip/high_frac"]) > 0.05  # the clip acts
    if name == "none":
        # pi_prox is not read: the loss without it is the same bits
        loss0, _ = loss_fn(params, batch, nt, ns)
        assert float(loss0) == float(loss)


def test_default_update_unchanged_by_the_mismatch_measurement():
    # Two minibatches of two microbatches, two epochs: "free" (the default: metrics from the
    # first minibatch's forward) trains exactly like "none" (SGD: the parameter change is the
    # gradient, float reassociation is the only freedom). ("full" without a correction runs
    # one more forward whose output the loss never reads.)
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8)
    tx = optax.sgd(0.5)
    out = {}
    for mode in ("none", "free"):
        cfg = _loop(
            update={
                "minibatch_size": 4,
                "microbatch_size": 2,
                "num_epochs": 2,
                "measure_mismatch": mode,
            }
        )
        state = TrainState.create(copy_tree(params), cfg, jax.random.key(0), optimizer=tx)
        out[mode] = make_update_step(cfg, apply_fn, tx)(state, batch)
    (s0, m0) = out["none"]
    assert not any(k.startswith("mismatch/") for k in m0)
    for mode in ("free",):
        s, m = out[mode]
        assert_trees_close_f32(s.params, s0.params, n_terms=2 * 96)
        for k in ("loss/policy", "optim/grad_norm", "kl/approx_old_new"):
            np.testing.assert_allclose(m[k], m0[k], rtol=1e-6, atol=1e-9)
        # on-policy batch (old log-probs from the same params, one jit apart)
        assert float(m["mismatch/max_abs"]) < 1e-5
        assert float(m["mismatch/frac_gt_1e-3"]) == 0.0


# ----------------------------------------------------------------------------- mismatch


OFFSETS = np.array([0.0, 5e-4, -5e-3, 5e-2, -0.5, 0.5], np.float32)


@pytest.mark.parametrize("mode,minibatch", [("full", 4), ("free", 8)])
def test_mismatch_of_known_offsets(mode, minibatch):
    # old_logprobs = learner + known offsets: the metrics are the offsets' statistics.
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8)
    mask = np.asarray(batch.loss_mask)
    offs = np.resize(OFFSETS, mask.size).reshape(mask.shape) * mask
    batch = batch.replace(old_logprobs=batch.old_logprobs + jnp.asarray(offs))
    loss = {"off_policy": "icepop", "icepop_low": 0.5, "icepop_high": 1.5}
    cfg = _loop(
        update={"minibatch_size": minibatch, "measure_mismatch": mode},
        loss=loss if mode == "full" else {},
    )
    state = TrainState.create(copy_tree(params), cfg, jax.random.key(0))
    _, m = make_update_step(cfg, apply_fn)(state, batch)
    d = np.abs(offs[mask > 0])
    np.testing.assert_allclose(m["mismatch/mean_abs"], d.mean(), atol=1e-6)
    np.testing.assert_allclose(m["mismatch/max_abs"], 0.5, atol=1e-6)
    for name, x in (("1e-3", 1e-3), ("1e-2", 1e-2), ("1e-1", 1e-1)):
        assert float(m[f"mismatch/frac_gt_{name}"]) == pytest.approx((d > x).mean(), abs=1e-6)
    if mode == "full":
        # IcePop: k = pi_prox / pi_behav = exp(-offset); exp(0.5) = 1.65 > 1.5 is dropped
        k = np.exp(-offs[mask > 0])
        keep = (k >= 0.5) & (k <= 1.5)
        assert 0 < (~keep).sum() < keep.size
        np.testing.assert_allclose(m["offpolicy/masked_frac"], (~keep).mean(), atol=1e-6)
        np.testing.assert_allclose(m["offpolicy/weight_mean"], (k * keep).mean(), rtol=1e-5)


@pytest.mark.slow  # two more compiles (~40 s on 2 busy cores); test_parallel covers the mesh
def test_correction_on_a_data_mesh_equals_one_device():
    # pi_prox's forward and the corrected loss on 8 simulated devices (rows split over
    # 'data'): the one device's metrics, to float reassociation.
    from jaxagent.models import ModelConfig, abstract_graphdef, param_logical_axes
    from jaxagent.parallel.mesh import batch_shardings, make_mesh, state_shardings

    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=16)
    mask = np.asarray(batch.loss_mask)
    offs = np.resize(OFFSETS, mask.size).reshape(mask.shape) * mask
    batch = batch.replace(old_logprobs=batch.old_logprobs + jnp.asarray(offs))
    cfg = _loop(loss={"off_policy": "tis", "tis_cap": 1.5}, update={"microbatch_size": 4})
    tx = optax.sgd(1e-2)
    single = TrainState.create(copy_tree(params), cfg, jax.random.key(7), optimizer=tx)
    _, m1 = make_update_step(cfg, apply_fn, tx)(single, batch)
    mesh = make_mesh(data=8)
    state = TrainState.create(copy_tree(params), cfg, jax.random.key(7), optimizer=tx)
    logical = param_logical_axes(abstract_graphdef(ModelConfig.test(num_layers=1)), params)
    st_sh, b_sh = state_shardings(state, mesh, logical, tx), batch_shardings(mesh, batch)
    update = make_update_step(
        cfg, apply_fn, tx, mesh=mesh, state_sharding=st_sh, batch_sharding=b_sh
    )
    _, m8 = update(jax.device_put(state, st_sh), jax.device_put(batch, b_sh))
    k = np.exp(-offs[mask > 0])  # pi_prox / pi_behav
    assert np.minimum(k, 1.5).mean() < k.mean()  # the cap cuts exp(0.5) = 1.65
    np.testing.assert_allclose(m1["offpolicy/weight_mean"], np.minimum(k, 1.5).mean(), rtol=1e-5)
    for k in ("loss/policy", "optim/grad_norm", "offpolicy/weight_mean", "mismatch/mean_abs"):
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-5, atol=1e-6)
    for k in ("mismatch/frac_gt_1e-3", "mismatch/frac_gt_1e-1", "offpolicy/masked_frac"):
        assert float(m8[k]) == float(m1[k])


def _sampled_batch(params, graphdef, n_rows=8, prompt=4, new=12, seed=0):
    """A batch whose old log-probs a KV-cache sampler recorded (``jaxagent.generate``)."""
    from jaxagent.generate import SamplingConfig
    from jaxagent.generate.sampler import Sampler
    from jaxagent.types import TokenBatch

    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(1, 128, prompt)) for _ in range(n_rows)]
    out = Sampler(graphdef)(
        params,
        prompts,
        SamplingConfig(max_new_tokens=new, temperature=1.0),
        jax.random.key(seed),
    )
    toks, lps, lengths = (np.asarray(x) for x in (out.tokens, out.logprobs, out.lengths))
    t = prompt + new
    tokens = np.zeros((n_rows, t), np.int32)
    old = np.zeros((n_rows, t), np.float32)
    mask = np.zeros((n_rows, t), np.float32)
    tokens[:, :prompt] = np.asarray(prompts)
    tokens[:, prompt:] = toks
    old[:, prompt:] = lps
    seg = (np.arange(t)[None] < prompt + lengths[:, None]).astype(np.int32)
    mask[:, prompt:] = 1.0
    mask *= seg
    return TokenBatch(
        tokens=jnp.asarray(tokens),
        positions=jnp.broadcast_to(jnp.arange(t), (n_rows, t)),
        segment_ids=jnp.asarray(seg),
        loss_mask=jnp.asarray(mask),
        old_logprobs=jnp.asarray(old),
        advantages=jnp.zeros((n_rows, t)),
        rewards=jnp.zeros((n_rows,)),
        group_ids=jnp.arange(n_rows) // 4,
        turn_ids=jnp.where(jnp.asarray(mask) > 0, 0, -1).astype(jnp.int32),
    )


@pytest.mark.parametrize("sampling_dtype", ["float32", "bfloat16"])
def test_sampler_vs_learner_mismatch(sampling_dtype):
    """The mismatch the update measures between a KV-cache sampler's recorded log-probs and
    the learner's first full-sequence pass, on one tiny fp32 model.

    fp32: not exactly zero on CPU, the decode step (one query against the cache) and the
    full-sequence forward reduce the same sums in other orders and tile sizes. A sum of n
    float32 terms reassociated moves by at most about n eps32 times its magnitude; the widest
    reduction here is the MLP's (intermediate_size = 96 terms), so the bound is
    96 eps32 max|log p| (measured: a few ulps, half the tokens bit-equal). bf16 sampling
    weights (``mesh.sampling_dtype=bfloat16``) round every weight to 8 bits of mantissa: the
    mismatch is far above that bound.
    """
    from jaxagent.models import ModelConfig, init_model
    from jaxagent.rl.model_fns import model_logprob_fn

    mcfg = ModelConfig.test()
    graphdef, params = init_model(mcfg, jax.random.key(0))
    sp = params
    if sampling_dtype == "bfloat16":
        sp = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x, params)
    batch = _sampled_batch(sp, graphdef)
    # the learner's first pass: the update's own log-prob function at the fp32 params
    learner = jax.jit(model_logprob_fn(graphdef))(
        params, batch.tokens, batch.positions, batch.segment_ids, loss_mask=batch.loss_mask
    )[0]
    m = L.mismatch_metrics(learner, batch.old_logprobs, batch.loss_mask)
    mask = np.asarray(batch.loss_mask) > 0
    scale = float(np.abs(np.asarray(batch.old_logprobs)[mask]).max())
    bound = mcfg.intermediate_size * EPS32 * scale
    if sampling_dtype == "float32":
        assert float(m["mismatch/max_abs"]) <= bound
        assert float(m["mismatch/frac_gt_1e-3"]) == 0.0
    else:
        assert float(m["mismatch/mean_abs"]) > bound
        assert float(m["mismatch/frac_gt_1e-3"]) > 0.0


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "section,fields,match",
    [
        (LossConfig, {"off_policy": "vtrace"}, r"loss.off_policy='vtrace' is not valid"),
        (LossConfig, {"off_policy": "tis", "tis_cap": 0.5}, r"loss.tis_cap=0.5 must be >= 1"),
        (LossConfig, {"decoupled_cap": 0.5}, r"loss.decoupled_cap=0.5 must be 0"),
        (LossConfig, {"icepop_low": 1.5}, r"loss.icepop_low=1.5, loss.icepop_high=2.0"),
        (LossConfig, {"icepop_high": 0.9}, r"icepop_high=0.9: need 0 <= icepop_low"),
        (LossConfig, {"policy": "sft", "off_policy": "tis"}, r"loss.off_policy='tis' with loss"),
        (UpdateConfig, {"measure_mismatch": "off"}, r"update.measure_mismatch='off' is not"),
    ],
)
def test_bad_values_name_the_key(section, fields, match):
    with pytest.raises(RLConfigError, match=match):
        section(**fields)
