"""``save_hf`` streams: each HF tensor is gathered, laid out, cast and written before the
next one exists, from sharded parameters too; the files equal the whole-model export's byte
for byte."""

import os
import subprocess
import sys
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P
from safetensors import safe_open
from safetensors.flax import save_file

import jaxagent.models.hf as hf
from jaxagent.models import ModelConfig, init_model, save_hf


def _whole_model_export(path, config, params, store):
    """The export as it was: every converted tensor on the device at once, then written
    by safetensors (one file)."""
    tensors = {}
    for name, (target, shape, kind, layer) in hf._hf_layout(config).items():
        x = hf._get(params, target)
        x = x if layer is None else x[layer]
        tensors[name] = jnp.asarray(hf._to_hf(x, kind, shape)).astype(store)
    save_file(tensors, path, metadata={"format": "pt"})


def _tensors(path):
    with safe_open(path, framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


@pytest.mark.parametrize(
    "scan_layers, store, sharded",
    [(False, "float32", False), (True, "bfloat16", False), (False, "bfloat16", True)],
)
def test_streamed_export_equals_the_whole_model_export(tmp_path, scan_layers, store, sharded):
    cfg = ModelConfig.test(num_layers=2, scan_layers=scan_layers, tie_embeddings=False)
    graphdef, params = init_model(cfg, jax.random.key(0))
    if sharded:  # FSDP-like: every matrix split over 8 devices along its first axis
        mesh = jax.make_mesh((8,), ("fsdp",))
        sh = lambda x: NamedSharding(mesh, P("fsdp") if x.shape[0] % 8 == 0 else P())
        params = jax.tree.map(lambda x: jax.device_put(x, sh(x)), params)
    save_hf(str(tmp_path / "new"), cfg, graphdef, params, dtype=store)
    _whole_model_export(str(tmp_path / "old.safetensors"), cfg, params, jnp.dtype(store))
    new_path = tmp_path / "new" / "model.safetensors"
    new, new_meta = _tensors(str(new_path))
    old, old_meta = _tensors(str(tmp_path / "old.safetensors"))
    assert new.keys() == old.keys() and new_meta == old_meta
    for k in old:
        assert new[k].dtype == old[k].dtype and new[k].shape == old[k].shape, k
        np.testing.assert_array_equal(new[k].view(np.uint8), old[k].view(np.uint8), err_msg=k)
    # and byte for byte: the same header, order and padding
    assert new_path.read_bytes() == (tmp_path / "old.safetensors").read_bytes()


def test_export_holds_one_tensor_at_a_time(tmp_path, monkeypatch):
    cfg = ModelConfig.test(num_layers=3, scan_layers=True, tie_embeddings=False)
    graphdef, params = init_model(cfg, jax.random.key(0))
    made, alive_at_call, device_growth = [], [], []
    own = {x.unsafe_buffer_pointer() for x in jax.live_arrays()}

    def live_bytes():  # device bytes in buffers other than those alive before the export
        seen = {}
        for x in jax.live_arrays():
            if not x.is_deleted() and x.unsafe_buffer_pointer() not in own:
                seen[x.unsafe_buffer_pointer()] = x.nbytes
        return sum(seen.values())

    base = 0
    real = hf._host_tensor

    def counting(*a, **k):
        alive_at_call.append(sum(r() is not None for r in made))
        out = real(*a, **k)
        device_growth.append(live_bytes() - base)
        made.append(weakref.ref(out))
        return out

    monkeypatch.setattr(hf, "_host_tensor", counting)
    save_hf(str(tmp_path / "out"), cfg, graphdef, params, max_shard_size="40KB")
    n = len(hf._hf_layout(cfg))
    assert len(made) == n  # every tensor went through the one-at-a-time path
    # no earlier host tensor is alive when the next one is made
    assert max(alive_at_call) == 0, alive_at_call
    # on the device: never more beyond the parameters than one tensor's bytes (the whole
    # model's export held all of them: len(made) tensors)
    largest = max(int(np.prod(s)) * 4 for _, s, _, _ in hf._hf_layout(cfg).values())
    assert max(device_growth) <= largest, (device_growth, largest)
    assert len(os.listdir(tmp_path / "out")) > 3  # several shards and an index


def test_cli_refuses_export_into_the_runs_checkpoints(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for out in (run / "checkpoints", run / "checkpoints" / "hf"):
        proc = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "jaxagent"), "export",
             "--checkpoint", str(run), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )  # fmt: skip
        assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "checkpoint directory" in lines[0], proc.stderr
        assert not (out / "config.json").exists()
