"""benchmarks/pod_plan.py at small shapes: the trainer's update compiled on the 8 simulated
CPU devices (its per-device plan), the whole-iteration table (``--phase all``), the one-line
errors, the attention kernel choice, and (where XLA's GPU compiler is importable, i.e. in
the virtualenv of ``scripts/gpu_compiler_venv.sh``; CI has no CUDA plugin and skips them)
the same programs and cuDNN attention compiled for deviceless H100s.
"""

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.errors import ConfigError
from jaxagent.models import ModelConfig
from jaxagent.models.blockwise import kernel_for
from jaxagent.train.model_section import ModelSection

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _cuda_plugin() -> bool:
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins package at all
        return False


_HAS_CUDA_PLUGIN = _cuda_plugin()
_NO_PLUGIN = (
    "needs XLA's GPU compiler (the CUDA PJRT plugin, jax[cuda12]): "
    "bash scripts/gpu_compiler_venv.sh, then run this file with that virtualenv's python"
)
needs_gpu_compiler = pytest.mark.skipif(not _HAS_CUDA_PLUGIN, reason=_NO_PLUGIN)


@pytest.fixture
def pod_plan(monkeypatch):
    monkeypatch.syspath_prepend(str(_BENCH))
    import pod_plan

    return pod_plan


def _args(pod_plan, *argv):
    return pod_plan._args(["--model", "tiny", *argv])


# ---- the update on simulated devices ------------------------------------------------------
def test_update_plan_shards_the_state_and_keeps_rows_on_their_device(pod_plan):
    """fsdp 8: each device's arguments are an eighth of the fp32 params and two Adam moments
    (plus its rows of the batch); a second row a device adds activations for one row, not a
    copy of the batch's (rows pinned to their device)."""
    one = pod_plan.plan(_args(pod_plan, "--cpu-devices", "8", "--episodes", "8", "--tokens", "256"))
    two = pod_plan.plan(
        _args(pod_plan, "--cpu-devices", "8", "--episodes", "16", "--tokens", "256",
              "--microbatch", "16")
    )  # fmt: skip
    n = pod_plan._n_params(_args(pod_plan))
    state = 3 * 4 * n / 8  # params + mu + nu in fp32, split 8 ways
    rows = 8 * 256 * 4 * 8 / 8  # a device's rows of the batch's [B, T] fields, at most
    b1, b2 = one["bytes"], two["bytes"]
    assert one["chips"] == 8 and one["fits"] is None and one["hbm_gib"] is None
    assert state <= b1["argument"] <= 1.05 * state + rows, (b1, state)
    assert b1["peak"] == b1["argument"] + b1["output"] + b1["temp"] - b1["alias"]
    # the second row a device costs less than the first row's whole temporaries
    assert b2["temp"] - b1["temp"] < b1["temp"], (b1, b2)


def test_cpu_devices_print_no_hbm_limit(pod_plan, capsys):
    pod_plan.main(["--model", "tiny", "--cpu-devices", "8", "--episodes", "8", "--tokens", "256"])
    out = capsys.readouterr().out
    assert "no HBM limit" in out and "None GiB" not in out and "fits: None" not in out


def test_phase_all_reports_every_phase_and_ends_with_the_summary(pod_plan, capsys):
    pod_plan.main(
        ["--model", "tiny", "--cpu-devices", "8", "--phase", "all", "--episodes", "8"]
        + ["--tokens", "1024", "--prefill-chunk", "256", "--scan-layers"]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert set(summary["phases"]) == {"sft", "update", "admit", "decode", "eval", "export"}
    for name in ("sft", "update", "admit", "decode", "eval"):
        row = summary["phases"][name]
        assert row["peak_gib_per_chip"] is not None and row["fits"] is None, name
    assert summary["phases"]["export"]["host_gib"] is not None  # streamed: a tensor at a time
    assert summary["projected_tokens_per_s_per_chip"] is None  # CPUs have no table peak
    table = [line for line in lines if line.startswith("| ")]
    assert len(table) >= 8  # header + sft, update, admit, decode, eval x2, export


# ---- one-line errors ----------------------------------------------------------------------
@pytest.mark.skipif(_HAS_CUDA_PLUGIN, reason="the CUDA plugin is importable here")
def test_gpu_target_without_the_cuda_plugin_is_one_line(pod_plan, capsys):
    with pytest.raises(SystemExit) as exit_:
        pod_plan.main(["--model", "tiny", "--topology", "h100:8"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "gpu_compiler_venv.sh" in err


def test_bad_gpu_count_is_one_line(pod_plan, capsys):
    with pytest.raises(SystemExit) as exit_:
        pod_plan.main(["--model", "tiny", "--topology", "h100:eight"])
    assert exit_.value.code == 2 and "h100:8" in capsys.readouterr().err


# ---- the attention kernel ----------------------------------------------------------------
def test_auto_attention_picks_the_platforms_kernel():
    assert kernel_for("auto", "gpu") == "cudnn" and kernel_for("auto", "cuda") == "cudnn"
    assert kernel_for("auto", "tpu") == "splash" and kernel_for("auto", "cpu") == "blockwise"
    assert kernel_for("blockwise", "gpu") == "blockwise"


def test_bad_attention_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"model\.attention='flash'"):
        ModelSection(attention="flash")
    assert ModelSection(attention="cudnn").attention == "cudnn"
    with pytest.raises(ValueError, match="attention"):
        ModelConfig.test(attention="flash")


def test_auto_attention_on_cpu_equals_the_tiles():
    """``auto`` on this CPU backend is the pure-JAX tiles: the same long-row logits."""
    from jaxagent.models import apply_model, init_model

    t = 640  # > blockwise.BLOCK: the tiled path
    outs = []
    for kernel in ("blockwise", "auto"):
        cfg = ModelConfig.test(attention=kernel, max_seq_len=t)
        graphdef, params = init_model(cfg, jax.random.key(0))
        tokens = jax.random.randint(jax.random.key(1), (2, t), 1, cfg.vocab_size)
        seg = jnp.ones((2, t), jnp.int32)
        pos = jnp.broadcast_to(jnp.arange(t), (2, t))
        outs.append(np.asarray(apply_model(graphdef, params, tokens, pos, seg).logits))
    np.testing.assert_array_equal(outs[0], outs[1])


# ---- deviceless GPU compiles (XLA:GPU, no GPU) ---------------------------------------------
def _h100(n: int):
    from jax.experimental import topologies

    spec = importlib.util.spec_from_file_location("pod_plan_gpu", _BENCH / "pod_plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    desc = topologies.get_topology_desc(
        platform="cuda", target_config=module.GPU_TARGETS["h100"], topology=f"1x1x{n}"
    )
    return desc.devices


@needs_gpu_compiler
def test_tiny_update_and_decode_compile_for_deviceless_h100s(pod_plan):
    """The trainer's update and the rollout engine's admit and decode of the tiny model
    compile for 8 deviceless H100s, with cuDNN attention (``auto`` on a GPU target) in the
    update."""
    up = pod_plan.plan(
        _args(pod_plan, "--topology", "h100:8", "--episodes", "8", "--tokens", "1024",
              "--attention", "auto", "--scan-layers")
    )  # fmt: skip
    assert up["chip"] == "NVIDIA H100 80GB HBM3" and up["chips"] == 8 and up["fits"] is True
    assert up["cudnn_attention_calls"] > 0
    ro = pod_plan.rollout_plan(
        _args(pod_plan, "--topology", "h100:8", "--phase", "rollout", "--episodes", "8",
              "--tokens", "1024", "--prefill-chunk", "256")
    )  # fmt: skip
    assert ro["fits"] is True and ro["programs"]["decode"]["peak_gib_per_chip"] is not None


@needs_gpu_compiler
def test_cudnn_attention_compiles_deviceless_with_bounded_temporaries():
    """The tiny model's forward + backward with ``model.attention: cudnn``, compiled for one
    deviceless H100: the program calls cuDNN's fused attention, and its temporaries stay
    under a bound that leaves no room for XLA's plain attention: the cuDNN program keeps the
    segment mask as a bf16 bias (B T^2 2 bytes) and the activations; one layer's fp32
    scores and bf16 probabilities (B H T^2 6 bytes) alone would exceed it."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxagent.models import abstract_graphdef, apply_model, init_model

    devices = _h100(1)
    mesh = jax.sharding.Mesh(devices, ("data",))
    rows, t = 2, 4096
    put = NamedSharding(mesh, P())
    cfg = ModelConfig.tiny(attention="cudnn", dtype="bfloat16", max_seq_len=t)
    graphdef = abstract_graphdef(cfg)
    params = jax.eval_shape(lambda k: init_model(cfg, k)[1], jax.random.key(0))
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=put), params)
    tokens = jax.ShapeDtypeStruct((rows, t), jnp.int32, sharding=put)

    def loss(p, tokens):
        seg = jnp.ones_like(tokens)
        pos = jnp.broadcast_to(jnp.arange(t), tokens.shape)
        return apply_model(graphdef, p, tokens, pos, seg).logits.astype(jnp.float32).mean()

    compiled = jax.jit(jax.grad(loss)).lower(params, tokens).compile()
    assert 'custom_call_target="__cudnn$fmha' in compiled.as_text()
    temp = compiled.memory_analysis().temp_size_in_bytes
    plain_scores = rows * cfg.num_heads * t * t * 6  # one layer's, XLA's plain attention
    assert temp < plain_scores, (temp, plain_scores)


def test_the_cudnn_call_attends_as_the_tiles():
    """``attend_cudnn``'s call (head order of grouped queries, layout, scale, segment mask)
    run through XLA's implementation of the same API on CPU: fp32 values and gradients equal
    the blockwise tiles' on packed rows with padding, within reassociation (t roundings).
    The kernel itself runs only on a GPU: tests/test_gpu.py."""
    dtype = jnp.float32
    from jaxagent.models.blockwise import attend_blockwise, attend_cudnn

    rng = np.random.default_rng(0)
    b, t, k, g, hd = 2, 256, 2, 2, 16
    q = jnp.asarray(rng.normal(size=(b, t, k, g, hd)) * hd**-0.5, dtype)
    keys, values = (jnp.asarray(rng.normal(size=(b, k, t, hd)), dtype) for _ in range(2))
    seg = np.zeros((b, t), np.int32)
    seg[0, :90], seg[0, 90:200], seg[1, : t - 7] = 1, 2, 1
    seg = jnp.asarray(seg)
    w = jnp.asarray(rng.normal(size=q.shape), jnp.float32) * (seg != 0)[:, :, None, None, None]

    def run(fn):
        def loss(q, k, v):
            return jnp.sum(fn(q, k, v).astype(jnp.float32) * w)

        grads = jax.grad(loss, (0, 1, 2))(q, keys, values)
        return [np.asarray(x, np.float64) for x in (fn(q, keys, values), *grads)]

    ref = run(lambda q, k, v: attend_blockwise(q, k, v, seg, block=64))
    got = run(lambda q, k, v: attend_cudnn(q, k, v, seg, implementation="xla"))
    valid = np.asarray(seg != 0)
    tol = t * float(jnp.finfo(dtype).eps)
    np.testing.assert_allclose(got[0][valid], ref[0][valid], atol=tol * np.abs(ref[0]).max())
    for x, r in zip(got[1:], ref[1:]):
        assert np.abs(x - r).max() <= tol * np.abs(r).max()
