"""LoRA's sampling copy (the base never written); the critic's values without vocabulary-sized
logits; streaming checkpoints and freed host memory between phases; the roofline's arithmetic.

The trainer's peak memory over (params + grads + Adam) is measured by
``benchmarks/trainer_memory.py`` (the 768 x 12 model, minutes); these tests check the
mechanisms it relies on.
"""

import dataclasses
import gc
import os

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import ModelConfig, init_model
from jaxagent.rl.lora import merge_lora
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import TrainState, begin_sampling, end_sampling, on_sampling_params
from jaxagent.perf import host_memory
from jaxagent.train.checkpoint import Checkpointer
from jaxagent.perf.roofline import Roofline


def _params():
    """A small model-shaped tree (no model build: the merge only needs kernels by name)."""
    k = jax.random.split(jax.random.key(0), 3)
    return {
        "layer_0": {
            "mlp": {
                "up_proj": 0.02 * jax.random.normal(k[0], (64, 96)),
                "down_proj": 0.02 * jax.random.normal(k[1], (96, 64)),
            },
            "input_norm": {"scale": jnp.ones((64,))},
        },
        "embed": 0.02 * jax.random.normal(k[2], (128, 64)),
    }


def _lora_state():
    params = _params()
    config = get_recipe("loop", lora={"rank": 4, "alpha": 8.0})
    state = TrainState.create(params, config, jax.random.key(1))
    # adapters with a nonzero product (b starts at zero)
    adapters = jax.tree.map(lambda x: x + 0.05, state.params)
    return state.replace(params=adapters)


def test_lora_samples_from_a_merged_copy_and_leaves_the_base_untouched():
    state = _lora_state()
    host = lambda t: jax.tree.map(lambda x: np.asarray(jnp.copy(x)), t)  # noqa: E731
    base = host(state.frozen_params)
    expected = host(merge_lora(state.frozen_params, state.params, state.lora_alpha, 4))
    leaf = state.frozen_params["layer_0"]["mlp"]["up_proj"]
    for _ in range(20):  # 20 rollouts' worth of sampling copies
        merged, state = begin_sampling(state)
        for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(expected)):
            np.testing.assert_array_equal(np.asarray(a), b)
        state, merged = end_sampling(state, merged), None
    # A copy: the base's buffers were neither donated nor written, bit for bit.
    assert not leaf.is_deleted() and state.frozen_params["layer_0"]["mlp"]["up_proj"] is leaf
    for w0, w1 in zip(jax.tree.leaves(base), jax.tree.leaves(state.frozen_params)):
        assert np.array_equal(w0, np.asarray(w1))


def test_full_finetuning_samples_from_the_state_itself():
    state = TrainState.create(_params(), get_recipe("loop", lora={"rank": 0}), jax.random.key(1))
    sample_params, same = begin_sampling(state)
    assert sample_params is state.params and same is state
    assert end_sampling(same, sample_params) is state


def test_roofline_arithmetic():
    cfg = ModelConfig.test(num_layers=2)  # vocab 128, D 64, tied=False
    params = jax.eval_shape(lambda: init_model(cfg, jax.random.key(0))[1])  # shapes only
    roof = Roofline(
        peak_flop_s=1e9,
        peak_bytes_s=1e9,
        source="test",
        matmul_params=1000,
        head_params=100,
        param_bytes=4000,
        layers=2,
        attn_width=8,
    )
    args = dict(
        context_tokens=10,
        sampled_tokens=4,
        decode_steps=5,
        generate_s=1.0,
        batch_tokens=20,
        loss_tokens=4,
        epochs=1,
        optimizer_steps=2,
        update_s=2.0,
        env_s=0.5,
        iteration_s=4.0,
        rows=1,
    )
    m = roof.iteration(**args)
    # sampler: 2*1000*10 + 4*2*8*(10/2)*10 + 2*100*4 = 20000 + 3200 + 800 = 24000 FLOPs in 1 s
    np.testing.assert_allclose(m["time/sample_mfu"], 24000 / 1e9)
    # 5 decode steps x 4000 bytes of weights
    np.testing.assert_allclose(m["time/sample_mbu"], 20000 / 1e9)
    # update: 4 passes x (2*1000*20 + 4*2*8*10*20 + 2*100*4) = 4 * 53600 FLOPs in 2 s
    np.testing.assert_allclose(m["time/update_flop_s"], 4 * 53600 / 2)
    np.testing.assert_allclose(m["time/update_mbu"], 2 * 8 * 4000 / 2 / 1e9)
    # MFU by model FLOPs on real tokens (half the batch is padding here): 6 N T + attention,
    # 3 x (2*1000*10 + 4*2*8*(10/2)*10 + 2*100*10) = 75600 in 2 s; the hardware figure keeps
    # the padded batch and the recomputation
    real = roof.iteration(**args, real_tokens=10)
    np.testing.assert_allclose(real["time/update_mfu"], 75600 / 2 / 1e9)
    np.testing.assert_allclose(real["time/update_hfu"], 4 * 53600 / 2 / 1e9)
    assert real["time/update_mfu"] < real["time/update_hfu"]
    assert "mem/peak_gib" not in m  # a device without memory_stats (the test's: none)
    # without block remat (rl.update.remat=false) the backward recomputes nothing: 3 passes
    plain = roof.iteration(**{**args, "passes": 3})
    np.testing.assert_allclose(plain["time/update_flop_s"], 3 * 53600 / 2)
    assert m["time/env_wait_frac"] == 0.125

    # from a real model: the embedding is excluded from the matmul weights
    class Chip:  # a device that reports its memory, as GPUs and TPUs do
        def __init__(self, peak):
            self.peak = peak

        def memory_stats(self):
            return {
                "peak_bytes_in_use": self.peak,
                "bytes_in_use": 1 << 30,
                "bytes_limit": 16 << 30,
            }

    chips = dataclasses.replace(roof, devices=(Chip(3 << 30), Chip(5 << 30)))
    mem = chips.iteration(**args)
    assert (mem["mem/peak_gib"], mem["mem/in_use_gib"], mem["mem/limit_gib"]) == (5.0, 1.0, 16.0)
    real = Roofline.create(cfg, params)
    total = sum(x.size for x in jax.tree.leaves(params))
    assert real.matmul_params == total - 2 * cfg.vocab_size * cfg.hidden_size
    assert real.peak_flop_s > 0 and jnp.isfinite(real.peak_bytes_s)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_streaming_checkpoint_waits_before_the_state_is_donated(tmp_path):
    """A streaming save reads the arrays after ``save`` returns: ``before_mutation`` must
    block until it has, so that donating the state afterwards cannot corrupt or fail it."""
    ck = Checkpointer(tmp_path / "ck", keep=2, save_window_mb=1)  # 1 MB: many round trips
    keys = jax.random.split(jax.random.key(0), 8)
    state = {f"w{i}": jax.random.normal(k, (512, 256)) for i, k in enumerate(keys)}  # 4 MiB
    saved = jax.tree.map(lambda x: np.asarray(jnp.copy(x)), state)
    ck.save(1, state, {"iteration": 1})
    assert ck._pending
    ck.before_mutation()
    assert not ck._pending
    bump = jax.jit(lambda t: jax.tree.map(lambda x: x + 1.0, t), donate_argnums=0)
    state = bump(state)  # the saved buffers are donated (deleted) now
    ck.before_mutation()  # nothing in flight: a no-op
    like = jax.tree.map(jnp.zeros_like, state)
    restored, meta = ck.restore(1, like)
    assert meta == {"iteration": 1}
    for k in saved:
        np.testing.assert_array_equal(np.asarray(restored[k]), saved[k])
    ck.close()


def test_checkpoints_written_by_orbax_standard_save_still_restore(tmp_path):
    """Runs saved before the streaming handler (orbax StandardSave) resume unchanged."""
    import orbax.checkpoint as ocp

    state = {"a": jnp.arange(6.0), "b": {"c": jnp.ones((2, 3), jnp.int32)}}
    mgr = ocp.CheckpointManager(tmp_path / "ck", options=ocp.CheckpointManagerOptions(create=True))
    mgr.save(
        3,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave({"iteration": 3})
        ),
    )
    mgr.wait_until_finished()
    mgr.close()
    ck = Checkpointer(tmp_path / "ck")
    assert ck.latest_step() == 3
    restored, meta = ck.restore(3, jax.tree.map(jnp.zeros_like, state))
    np.testing.assert_array_equal(np.asarray(restored["a"]), np.arange(6.0))
    assert restored["b"]["c"].dtype == jnp.int32 and meta["iteration"] == 3
    ck.close()


def test_release_frees_buffers_held_by_reference_cycles():
    """A cycle keeps a 256 MiB buffer alive until the cyclic collector runs (which it does
    on object counts, not bytes): ``release`` hands it back before the next phase."""
    gc.disable()
    try:
        before = _rss_mib()
        a, b = {"buf": np.ones(64 * 2**20, np.float32)}, {}
        a["other"], b["other"] = b, a
        del a, b
        held = _rss_mib()
        assert held - before > 200  # the buffer is resident while the cycle lives
        host_memory.release()
        assert held - _rss_mib() > 200
    finally:
        gc.enable()


def test_on_sampling_params_runs_on_the_merged_model():
    state = _lora_state()
    expected = merge_lora(state.frozen_params, state.params, state.lora_alpha, 4)
    expected = jax.tree.map(lambda x: np.asarray(jnp.copy(x)), expected)
    leaf = state.frozen_params["layer_0"]["mlp"]["up_proj"]
    before = np.asarray(jnp.copy(leaf))

    def fn(params):
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected)):
            np.testing.assert_array_equal(np.asarray(a), b)
        return "done"

    state, out = on_sampling_params(state, fn)
    assert out == "done" and state.frozen_params["layer_0"]["mlp"]["up_proj"] is leaf
    assert np.array_equal(np.asarray(leaf), before)


def _buffers_over(jaxpr, size: int) -> list:
    """Shapes of the values (at any nesting depth) of ``jaxpr`` with ``size`` or more entries."""
    found = []
    for eqn in jaxpr.eqns:
        found += [v.aval.shape for v in eqn.outvars if np.prod(v.aval.shape) >= size]
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _buffers_over(sub, size)
    return found


def test_critic_values_run_without_vocabulary_sized_logits():
    from jaxagent.rl.model_fns import model_values
    from jaxagent.train.policy import make_logprob_fn
    from jaxagent.rl.prepare import with_critic_values
    from jaxagent.types import TokenBatch

    # A vocabulary much wider than the model, as in an LLM (V = 64 D).
    cfg = ModelConfig.test(num_layers=2, vocab_size=4096, value_head=True)
    graphdef, params = init_model(cfg, jax.random.key(0))
    b, t, v = 4, 16, cfg.vocab_size
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, v)
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    seg = jnp.ones((b, t), jnp.int32)
    values = model_values(graphdef, params, tokens, pos, seg)
    # the trainer's former value pass: the learner's full log-prob pass, logits and all
    full_pass = make_logprob_fn(graphdef)
    _, full = full_pass(params, tokens, pos, seg)
    # The same float32 blocks and head; only fusion differs: a few float32 roundings of
    # values of order 1.
    scale = float(jnp.max(jnp.abs(full)))
    assert scale > 1e-3
    np.testing.assert_allclose(values, full, rtol=0, atol=64 * np.finfo(np.float32).eps * scale)
    # No [B, T, V] value anywhere in the program...
    args = (params, tokens, pos, seg)
    values_jaxpr = jax.make_jaxpr(lambda *a: model_values(graphdef, *a))(*args)
    assert _buffers_over(values_jaxpr.jaxpr, b * t * v) == []
    # ...and the compiled program's temporaries stay below one float32 [B, T, V] tensor,
    # where the full pass's exceed it (measured on CPU: 94,208 vs 2,032,112 bytes; the bound
    # is 1,048,576).
    mem = model_values.lower(graphdef, *args).compile().memory_analysis()
    full_mem = full_pass.lower(*args).compile().memory_analysis()
    if mem is not None and full_mem is not None:
        assert mem.temp_size_in_bytes < b * t * v * 4 <= full_mem.temp_size_in_bytes
    # with_critic_values: the padded batch's values and each row's bootstrap value
    lengths = np.array([16, 10, 7, 12])
    seg = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int32)
    zeros = np.zeros((b, t), np.float32)
    batch = TokenBatch(
        tokens=np.asarray(tokens) * seg,
        positions=np.asarray(pos) * seg,
        segment_ids=seg,
        loss_mask=zeros,
        old_logprobs=zeros,
        advantages=zeros,
        turn_ids=np.zeros((b, t), np.int32),
        rewards=np.zeros((b,), np.float32),
        group_ids=np.arange(b, dtype=np.int32),
    )
    out = with_critic_values(graphdef, params, batch)
    pad = lambda x: np.pad(x, ((0, 0), (0, 1)))  # noqa: E731
    ext = model_values(graphdef, params, pad(batch.tokens), pad(batch.positions), pad(seg))
    np.testing.assert_array_equal(out.values, np.asarray(ext)[:, :t])
    np.testing.assert_array_equal(out.bootstrap_value, np.asarray(ext)[np.arange(b), lengths])


def test_lora_training_evaluates_through_the_sampling_copy(tmp_path, monkeypatch):
    """Validation, periodic and final evaluations and the best-validation test of a LoRA run
    sample through ``on_sampling_params`` (a merged copy dropped when the call returns), never
    through ``model_params()``, whose copy the caller would keep."""
    from jaxagent.train.config import load_config
    from jaxagent.train.trainer import Trainer

    from test_train import ROOT, TINY

    def no_copy(self):
        raise AssertionError("model_params() built a merged copy of a LoRA model")

    monkeypatch.setattr(TrainState, "model_params", no_copy)
    extra = ["rl.lora.rank=4", "rl.lora.alpha=8", "train.iterations=3", "eval.every=2"]
    extra += ["eval.val_tasks=4", "train.checkpoint_every=1", f"train.out_dir={tmp_path}"]
    config = load_config(ROOT / "configs/quickstart.yaml", TINY + extra)
    trainer = Trainer(config, echo=lambda s: None)
    summary = trainer.run()
    assert summary["iterations"] == 3 and "success_best_val" in summary


@pytest.mark.slow  # two runs and a reload from the compile cache: nightly
def test_release_compiled_reloads_programs_from_the_cache_and_changes_no_metric(
    tmp_path, monkeypatch
):
    """``train.release_compiled``: every phase's programs are dropped when it ends, so later
    iterations load them from the persistent cache (hits, which a run that keeps its programs
    never needs) and every deterministic metric equals that run's."""
    from jaxagent.train.config import load_config
    from jaxagent.train.trainer import Trainer

    from test_train import ROOT, TINY, _by_step

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # unless the user set a dir
    extra = ["train.iterations=3", "eval.every=0", "eval.val_tasks=0", "sft.enabled=false"]
    hits: list = []
    listener = lambda event, **_: hits.append(event) if event.endswith("cache_hits") else None  # noqa: E731
    jax.monitoring.register_event_listener(listener)
    per_iteration, runs = {}, {}
    try:
        for lean in (False, True):
            out = tmp_path / f"lean{lean}"
            overrides = TINY + extra + [f"train.out_dir={out}", f"train.release_compiled={lean}"]
            trainer = Trainer(load_config(ROOT / "configs/quickstart.yaml", overrides), echo=print)
            run_iteration = trainer.iteration

            def counted(state, it, run_iteration=run_iteration, lean=lean):
                before = len(hits)
                try:
                    return run_iteration(state, it)
                finally:
                    per_iteration.setdefault(lean, []).append(len(hits) - before)

            trainer.iteration = counted
            trainer.run()
            assert not lean or not trainer.update_step._compiled  # the update's went too
            trainer.close()
            runs[lean] = _by_step(out / "metrics.jsonl")
    finally:
        jax.monitoring.unregister_event_listener(listener)
    assert per_iteration[True][1] > 0 and per_iteration[True][2] > 0, per_iteration
    assert sum(per_iteration[False]) == 0 or jax.config.jax_compilation_cache_dir, per_iteration
    assert runs[True] == runs[False]


_MAPPED_PROBE = """
import ctypes, os, sys
from jaxagent.perf import host_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
def alloc(n):
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    return p
if sys.argv[1] == "1":
    assert host_memory.map_large_allocations()
libc.free(alloc(16 << 20))  # a freed 16 MiB mapping: glibc raises its threshold to 16 MiB
base = rss()
big = [alloc(1 << 20) for _ in range(256)]  # 256 MiB in 1 MiB blocks
held = rss() - base  # resident: the blocks were touched
for p in big[::2]:  # every other block: holes between live blocks
    libc.free(p)
print(held, rss() - base)
"""


def test_large_allocations_are_mapped_and_go_back_at_free():
    """glibc's adaptive threshold puts 1 MiB buffers in the heap once a 16 MiB block was
    freed; freed between live ones, they stay resident until a trim. With
    ``map_large_allocations`` (train.release_compiled) each is its own mapping, gone at free."""
    import subprocess
    import sys

    if host_memory._MALLOPT is None:
        import pytest

        pytest.skip("not glibc")
    run = lambda mode: subprocess.check_output([sys.executable, "-c", _MAPPED_PROBE, mode])  # noqa: E731
    (held0, after0), (held1, after1) = (map(int, run(m).split()) for m in ("0", "1"))
    assert held0 > 200 and held1 > 200  # MiB resident before the frees
    assert after0 > 240 and after1 < 140, (after0, after1)  # heap holes stay; mappings go
