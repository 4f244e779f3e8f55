"""Born-sharded HF loading on 8 simulated CPU devices: every parameter is created in its
target sharding from slices of the safetensors files; no whole tensor is ever read, no
device holds more than its share, and the values equal the plain load's."""

import math

import jax
import numpy as np
import pytest

from jaxagent.models import ModelConfig, abstract_params, init_model, load_hf, param_logical_axes
from jaxagent.models import save_hf
from jaxagent.models import hf as HF
from jaxagent.models.api import abstract_graphdef
from jaxagent.parallel.mesh import MeshConfig, make_mesh, param_shardings


class _Recorder:
    """Wraps ``safe_open``: records every read's element count; a whole-tensor read fails."""

    def __init__(self, real):
        self.real, self.reads = real, []

    def __call__(self, *args, **kwargs):
        recorder, handle = self, self.real(*args, **kwargs)

        class Handle:
            def __enter__(self):
                self.h = handle.__enter__()
                return self

            def __exit__(self, *exc):
                return handle.__exit__(*exc)

            def keys(self):
                return self.h.keys()

            def get_tensor(self, name):
                raise AssertionError(f"whole tensor {name} read by a born-sharded load")

            def get_slice(self, name):
                inner = self.h.get_slice(name)

                class Slice:
                    def get_shape(self):
                        return inner.get_shape()

                    def __getitem__(self, index):
                        out = inner[index]
                        recorder.reads.append((name, out.size, math.prod(inner.get_shape())))
                        return out

                return Slice()

        return Handle()


@pytest.mark.parametrize("scan_layers", [False, True])
def test_params_are_born_in_their_shards(tmp_path, monkeypatch, scan_layers):
    qkv_bias, tie = True, False  # biases and an untied head: every layout kind is read
    assert jax.device_count() == 8
    cfg = ModelConfig.test(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
        intermediate_size=128, qkv_bias=qkv_bias, tie_embeddings=tie,
    )  # fmt: skip
    graphdef, params = init_model(cfg, jax.random.key(0))
    save_hf(str(tmp_path), cfg, graphdef, params)
    # scan_layers: each stacked [L, ...] parameter is read layer by layer, slice by slice
    _, _, plain = load_hf(str(tmp_path), scan_layers=scan_layers)
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))

    def shardings(config):
        abstract = abstract_params(config)
        axes = param_logical_axes(abstract_graphdef(config), abstract)
        return param_shardings(abstract, axes, mesh)

    recorder = _Recorder(HF.safe_open)
    monkeypatch.setattr(HF, "safe_open", recorder)
    _, _, placed = load_hf(str(tmp_path), shardings=shardings, scan_layers=scan_layers)

    flat_plain = dict(jax.tree_util.tree_leaves_with_path(plain))
    sharded_leaves = 0
    for path, x in jax.tree_util.tree_leaves_with_path(placed):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(flat_plain[path]))
        per_device = {s.device: s.data.size for s in x.addressable_shards}
        share = math.prod(x.sharding.shard_shape(x.shape))
        assert len(per_device) == 8 and set(per_device.values()) == {share}, path
        sharded_leaves += share < x.size
    assert sharded_leaves >= 6  # embeddings, projections and MLP kernels are split
    # every read is one device's shard: at most an 8th ... a whole replicated norm vector
    assert recorder.reads
    split = [(n, got, whole) for n, got, whole in recorder.reads if "norm" not in n]
    assert all(got < whole for _, got, whole in split), split[:3]
