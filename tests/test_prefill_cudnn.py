"""cuDNN flash attention for the prefill (``model.attention: cudnn|auto`` with a KV cache).

A chunk of several tokens written into the cache (the rollout engine's admit, the lock-step
sampler's prompt) attends through ``jax.nn.dot_product_attention`` instead of the float32
scores of ``attend_cache``. The kernel itself runs only on a GPU; here its call (layout, head
order, scale, the per-row offset causal mask) is run through XLA's implementation of the same
API, directly and inside the slot sampler's admit (one device and a data x tensor mesh, where
it runs per device), against the plain path. Where XLA's GPU compiler is importable (the
virtualenv of ``scripts/gpu_compiler_venv.sh``), the admit program is compiled for deviceless
H100s and its temporaries bounded.
"""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.generate import SamplingConfig
from jaxagent.generate.slots import SlotSampler
from jaxagent.models import ModelConfig, init_model, param_logical_axes
from jaxagent.models import blockwise
from jaxagent.models.blockwise import attend_cache_cudnn, prefill_kernel
from jaxagent.models.transformer import attend_cache
from jaxagent.parallel.mesh import make_mesh, param_shardings

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_prefill_kernel_choice():
    # "auto": cuDNN on an NVIDIA GPU with 16-bit activations only (cuDNN takes no float32)
    assert prefill_kernel("auto", "gpu", jnp.bfloat16) == "cudnn"
    assert prefill_kernel("auto", "cuda", jnp.float16) == "cudnn"
    assert prefill_kernel("auto", "gpu", jnp.float32) == "plain"
    assert prefill_kernel("auto", "cpu", jnp.bfloat16) == "plain"
    assert prefill_kernel("auto", "tpu", jnp.bfloat16) == "plain"  # splash has no cache form
    assert prefill_kernel("cudnn", "cpu", jnp.float32) == "cudnn"  # named: always
    assert prefill_kernel("blockwise", "gpu", jnp.bfloat16) == "plain"


def test_the_cudnn_prefill_call_attends_as_the_cache_path():
    """``attend_cache_cudnn``'s call through XLA's implementation: the same outputs as
    ``attend_cache`` over the cache layout, for rows with different cache lengths (the
    chunk's causal mask offset by each), padding queries and a fully masked row, within
    float32 reassociation (S roundings of the largest entry)."""
    rng = np.random.default_rng(0)
    b, t, k, g, hd, s = 3, 16, 2, 3, 16, 64
    q = jnp.asarray(rng.normal(size=(b, t, k, g, hd)) * hd**-0.5, jnp.float32)
    keys = jnp.asarray(rng.normal(size=(b, k, hd, s)), jnp.float32)
    values = jnp.asarray(rng.normal(size=(b, k, s, hd)), jnp.float32)
    lengths = np.array([0, 21, 40])
    real = np.array([16, 9, 1])  # real tokens a row, then padding
    rank = np.minimum(np.arange(t)[None], real[:, None] - 1)
    slots = jnp.asarray(lengths[:, None] + rank, jnp.int32)
    mask = jnp.arange(s)[None, None, :] <= slots[:, :, None]
    ref = np.asarray(attend_cache(q, keys, values, mask), np.float64)
    got = np.asarray(attend_cache_cudnn(q, keys, values, slots, implementation="xla"))
    valid = np.arange(t)[None] < real[:, None]
    tol = s * float(jnp.finfo(jnp.float32).eps) * np.abs(ref).max()
    np.testing.assert_allclose(got[valid], ref[valid], atol=tol)


def _xla_cudnn(monkeypatch):
    """Route the cuDNN prefill kernel through XLA's implementation of the same call (CPU),
    counting its traces: the model reaches it only through ``blockwise.attend_cached``."""
    calls = []

    def fake(*args, **kw):
        calls.append(1)
        return attend_cache_cudnn(*args, **{**kw, "implementation": "xla"})

    monkeypatch.setattr(blockwise, "attend_cache_cudnn", fake)
    return calls


def _admit_twice(cfg, params, sampling, prompts, observations):
    """Fresh prompts into every slot, then observations appended to half the slots (a
    non-fresh admit: queries offset by the rows' lengths)."""
    graphdef = init_model(cfg, jax.random.key(0))[0]
    rows = len(prompts)
    slots = SlotSampler(graphdef, sampling, rows, 128, decode_steps=8)
    st = slots.init(params)
    fused = slots.prepare(params)
    ids = list(range(rows))
    st = slots.admit(
        params, fused, st, ids, prompts, [True] * rows, jax.random.key(3), ids, [0] * rows
    )
    first = jax.device_get((st.tokens[:, 0], st.logprobs[:, 0]))
    half = ids[::2]
    st = slots.admit(
        params, fused, st, half, observations, [False] * len(half), jax.random.key(4), half,
        [1] * len(half),
    )  # fmt: skip
    second = jax.device_get((st.tokens[:, 0], st.logprobs[:, 0]))
    cache = jax.device_get((jax.tree.leaves(st.cache.keys), st.cache.lengths))
    return first, second, cache


@pytest.mark.parametrize(
    "mesh",
    [None, pytest.param((4, 2), marks=pytest.mark.slow)],
    ids=["one-device", "data4-tensor2"],
)
def test_cudnn_prefill_admits_what_the_plain_prefill_admits(monkeypatch, mesh):
    """The slot sampler's admit with ``model.attention: cudnn`` (its kernel routed through
    XLA's implementation) against the plain prefill, same parameters: the first tokens
    equal, their log-probs and the cache within float32 reassociation; prompts longer than
    the prefill chunk (the chunked loop) and a second, non-fresh admit. On the mesh the
    kernel runs per device (rows over data, KV heads over tensor)."""
    calls = _xla_cudnn(monkeypatch)
    rng = np.random.default_rng(1)
    rows = 8
    prompts = [rng.integers(4, 128, size=int(n)).tolist() for n in rng.integers(3, 40, rows)]
    obs = [rng.integers(4, 128, size=int(n)).tolist() for n in rng.integers(1, 20, rows // 2)]
    sampling = SamplingConfig(
        max_new_tokens=6, temperature=1.0, stop_token_ids=(3,), prefill_chunk=16
    )
    outs = []
    for attention in ("blockwise", "cudnn"):
        cfg = ModelConfig.test(num_layers=2, num_heads=4, num_kv_heads=2, attention=attention)
        graphdef, params = init_model(cfg, jax.random.key(0))
        if mesh is not None:
            m = make_mesh(data=mesh[0], tensor=mesh[1])
            sh = param_shardings(params, param_logical_axes(graphdef, params), m)
            params = jax.device_put(params, sh)
        n = len(calls)
        outs.append(_admit_twice(cfg, params, sampling, prompts, obs))
        assert (len(calls) > n) == (attention == "cudnn"), (attention, len(calls))
    plain, cudnn = outs
    for turn in (0, 1):
        np.testing.assert_array_equal(cudnn[turn][0], plain[turn][0])
        np.testing.assert_allclose(cudnn[turn][1], plain[turn][1], atol=1e-5)
    np.testing.assert_array_equal(cudnn[2][1], plain[2][1])  # lengths
    for a, b in zip(cudnn[2][0], plain[2][0]):
        np.testing.assert_allclose(a, b, atol=1e-5)


# ---- deviceless H100 compile (XLA:GPU, no GPU) ---------------------------------------------
def _cuda_plugin() -> bool:
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:
        return False


_NO_PLUGIN = (
    "needs XLA's GPU compiler (the CUDA PJRT plugin, jax[cuda12]): "
    "bash scripts/gpu_compiler_venv.sh, then run this file with that virtualenv's python"
)


@pytest.mark.skipif(not _cuda_plugin(), reason=_NO_PLUGIN)
def test_cudnn_admit_compiles_deviceless_with_bounded_temporaries(monkeypatch):
    """The rollout engine's admit (``SlotSampler._admit``, through ``pod_plan.rollout_plan``)
    of the tiny model for 8 deviceless H100s (data 2 x tensor 4), 8 slots x 4,096 tokens,
    prompts of 1,024 in chunks of 512: with ``auto`` the program calls cuDNN's attention, and
    its temporaries (the mask as a bf16 bias [rows, 1, chunk, capacity]: 16.8 MB here) stay
    under one query head's float32 scores of one chunk on a chip (rows x chunk x capacity x 4
    bytes: what the plain path's ``attend_cache`` keeps for each head, with probabilities
    besides), and under a third of the plain program's (measured: 22.7 MB against 105.1 MB)."""
    monkeypatch.syspath_prepend(str(_BENCH))
    import pod_plan

    def plan(attention):
        args = pod_plan._args(
            ["--model", "tiny", "--topology", "h100:8", "--phase", "rollout", "--episodes",
             "8", "--tokens", "4096", "--new-tokens", "64", "--attention", attention]
        )  # fmt: skip
        return pod_plan.rollout_plan(args)["programs"]["admit"]

    cudnn, plain = plan("auto"), plan("blockwise")
    print(
        "admit temporaries, bytes a chip: cudnn", cudnn["temp_bytes"], "plain", plain["temp_bytes"]
    )
    assert cudnn["cudnn_attention_calls"] > 0 and plain["cudnn_attention_calls"] == 0
    rows = 8 // 2  # slots a data shard, all admitted
    scores = rows * 512 * 4096 * 4  # one query head's float32 scores of one chunk
    assert cudnn["temp_bytes"] < scores < plain["temp_bytes"], (cudnn, plain, scores)
    assert cudnn["temp_bytes"] * 3 < plain["temp_bytes"], (cudnn, plain)
