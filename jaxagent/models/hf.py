"""Hugging Face checkpoint import / export for the Llama and Qwen2 families.

A checkpoint directory holds ``config.json`` and either ``model.safetensors`` or sharded
``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``. ``save_hf`` writes
the same layout, so transformers (and vLLM etc.) load what jaxagent trained. A value head,
which HF has no slot for, goes to ``value_head.safetensors`` next to the weights.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any, Callable, Optional

import jax
import numpy as np
import jax.numpy as jnp
from safetensors import safe_open
from safetensors.flax import save_file

from jaxagent.models.api import Params, abstract_graphdef, abstract_params, model_config
from jaxagent.models.config import ModelConfig
from jaxagent.models.hf_config import (
    _add_legacy_keys,
    config_from_hf,
    config_to_hf,
)

_SINGLE = "model.safetensors"
_INDEX = "model.safetensors.index.json"
_VALUE_HEAD = "value_head.safetensors"
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")


# --- name and layout mapping -------------------------------------------------------------


def _hf_layout(config: ModelConfig) -> dict[str, tuple[tuple[str, ...], tuple, str, Any]]:
    """HF tensor name -> (jaxagent param path, HF shape, kind of reshaping, layer).

    ``layer`` is None for a parameter of its own, or the index along the leading axis of a
    ``scan_layers`` model's stacked parameter (path under ``blocks``) that the tensor fills.
    """
    d, h, k, hd, f, v = (
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.intermediate_size,
        config.vocab_size,
    )
    out = {
        "model.embed_tokens.weight": (("embed",), (v, d), "same", None),
        "model.norm.weight": (("final_norm", "scale"), (d,), "same", None),
    }
    if not config.tie_embeddings:
        out["lm_head.weight"] = (("lm_head",), (v, d), "transpose", None)
    for i in range(config.num_layers):
        hf = f"model.layers.{i}."
        ja, layer = ("blocks", i) if config.scan_layers else (f"layer_{i}", None)

        entries = [
            ("input_layernorm.weight", ("input_norm", "scale"), (d,), "same"),
            ("post_attention_layernorm.weight", ("post_attn_norm", "scale"), (d,), "same"),
        ]
        for name, n in (("q", h), ("k", k), ("v", k)):
            entries.append(
                (f"self_attn.{name}_proj.weight", ("attn", f"{name}_proj"), (n * hd, d), "in_proj")
            )
            if config.qkv_bias:
                entries.append(
                    (f"self_attn.{name}_proj.bias", ("attn", f"{name}_bias"), (n * hd,), "bias")
                )
        entries.append(("self_attn.o_proj.weight", ("attn", "o_proj"), (d, h * hd), "out_proj"))
        for name, shape in (("gate", (f, d)), ("up", (f, d)), ("down", (d, f))):
            entries.append((f"mlp.{name}_proj.weight", ("mlp", f"{name}_proj"), shape, "transpose"))
        for name, path, shape, kind in entries:
            out[hf + name] = ((ja, *path), shape, kind, layer)
    return out


def _to_jax(x, kind: str, target_shape: tuple) -> jax.Array:
    if kind == "transpose" or kind == "in_proj":
        x = x.T
    elif kind == "out_proj":
        x = x.T
    return jnp.reshape(x, target_shape)


def _to_hf(x: jax.Array, kind: str, hf_shape: tuple) -> jax.Array:
    if kind in ("transpose",):
        return x.T
    if kind == "in_proj":  # [D, N, hd] -> [N*hd, D]
        return x.reshape(x.shape[0], -1).T
    if kind == "out_proj":  # [H, hd, D] -> [D, H*hd]
        return x.reshape(-1, x.shape[-1]).T
    return x.reshape(hf_shape)


def _hf_slices(index: tuple, kind: str, target_shape: tuple, hf_shape: tuple) -> tuple:
    """The HF tensor's slices that hold ``target[index]`` (one device's shard): a shard of a
    jaxagent parameter is a rectangle of its HF tensor for every layout kind, as long as the
    head_dim axis of a projection is whole (its logical axis is never sharded)."""
    idx = tuple(
        range(n)[i] if isinstance(i, slice) else range(i, i + 1)
        for i, n in zip(index, target_shape)
    )

    def span(r: range, unit: int = 1) -> slice:
        return slice(r.start * unit, r.stop * unit)

    def whole(r: range, n: int) -> bool:
        return r.start == 0 and r.stop == n

    if kind == "transpose":  # target [a, b] = hf [b, a]
        return (span(idx[1]), span(idx[0]))
    if kind == "in_proj":  # target [D, N, hd] = hf [N*hd, D].T
        hd = target_shape[2]
        if not whole(idx[2], hd):
            raise ValueError("load_hf: a shard splits head_dim; shard the heads axis instead")
        return (span(idx[1], hd), span(idx[0]))
    if kind == "out_proj":  # target [H, hd, D] = hf [D, H*hd].T
        hd = target_shape[1]
        if not whole(idx[1], hd):
            raise ValueError("load_hf: a shard splits head_dim; shard the heads axis instead")
        return (span(idx[2]), span(idx[0], hd))
    if kind == "bias":  # target [N, hd] = hf [N*hd]
        hd = target_shape[1]
        if not whole(idx[1], hd):
            raise ValueError("load_hf: a shard splits head_dim; shard the heads axis instead")
        return (span(idx[0], hd),)
    return tuple(span(r) for r in idx)  # "same"


def _read_shard(handle, name: str, kind: str, target_shape: tuple, hf_shape: tuple, dtype):
    """``make_array_from_callback``'s reader: one device's shard, read as a slice of the
    safetensors file (never the whole tensor), laid out and cast on the host."""

    def read(index):
        index = tuple(index) + (slice(None),) * (len(target_shape) - len(index))
        part = handle.get_slice(name)[_hf_slices(index, kind, target_shape, hf_shape)]
        shape = tuple(len(range(n)[i]) for i, n in zip(index, target_shape))
        if kind in ("transpose", "in_proj", "out_proj"):
            part = part.T
        return np.asarray(part).astype(dtype).reshape(shape)

    return read


def _read_stacked(sources, kind: str, target_shape: tuple, hf_shape: tuple, dtype):
    """``_read_shard`` for a stacked (``scan_layers``) parameter [L, ...]: one device's shard
    is a range of layers (the layer axis is never sharded, but any range works), each layer
    read as a slice of its own HF tensor. ``sources``: (handle, HF name) per layer."""
    readers = [_read_shard(h, name, kind, target_shape[1:], hf_shape, dtype) for h, name in sources]

    def read(index):
        index = tuple(index) + (slice(None),) * (len(target_shape) - len(index))
        layers = range(target_shape[0])[index[0]]
        return np.stack([readers[i](index[1:]) for i in layers])

    return read


def _get(tree: Params, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: Params, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


# --- load / save ------------------------------------------------------------------------


def _weight_files(path: str) -> dict[str, str]:
    """HF tensor name -> file holding it."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"load_hf: {path!r} is not a directory")
    single, index = os.path.join(path, _SINGLE), os.path.join(path, _INDEX)
    if os.path.exists(index):
        with open(index) as fh:
            weight_map = json.load(fh)["weight_map"]
        missing = sorted(
            {f for f in weight_map.values() if not os.path.exists(os.path.join(path, f))}
        )
        if missing:
            raise FileNotFoundError(
                f"load_hf: {index} lists shard files missing from {path}: {missing}"
            )
        return {name: os.path.join(path, f) for name, f in weight_map.items()}
    if os.path.exists(single):
        with safe_open(single, framework="flax") as fh:
            return {name: single for name in fh.keys()}
    raise FileNotFoundError(
        f"load_hf: no {_SINGLE} or {_INDEX} in {path} (found {sorted(os.listdir(path))}); "
        "save the model with save_pretrained(..., safe_serialization=True)"
    )


def load_hf(
    path: str,
    *,
    param_dtype: str = "float32",
    dtype: Optional[str] = None,
    value_head: Optional[bool] = None,
    key: Optional[jax.Array] = None,
    kv_cache_dtype: str = "",
    shardings: Optional[Callable[[ModelConfig], Any]] = None,
    scan_layers: bool = False,
    abstract: bool = False,
):
    """Load a local HF Llama / Qwen2 checkpoint.

    Args:
      path: directory with config.json and safetensors weights.
      param_dtype / dtype: storage and compute dtypes (default float32; dtype defaults to
        param_dtype). Weights are cast to ``param_dtype`` as they are read, whatever the
        checkpoint stores (bf16 on disk still trains with fp32 master weights).
      kv_cache_dtype: the sampler's KV-cache dtype ("" = dtype).
      value_head: add a value head. None: only if ``value_head.safetensors`` exists. A head
        requested but absent is initialised (zero bias, small random kernel from ``key``).
      scan_layers: build the model with stacked blocks (``ModelConfig.scan_layers``); the
        per-layer HF tensors are stacked as they are read.
      shardings: ``config -> pytree of jax.sharding.Sharding`` shaped like the params (the
        device layout's, computed from the config this function reads). Then every
        parameter is born sharded: each process reads from the safetensors files only the
        slices its own devices hold (``jax.make_array_from_callback``), laid out and cast
        per slice, so no device and no host ever holds a whole tensor. None: whole tensors
        on the default device.
      abstract: check the directory (config, tensor names) but read no weight: the params
        are ``jax.ShapeDtypeStruct``s (a resumed run restores its weights from a checkpoint).

    Returns:
      (config, graphdef, params).
    """
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"load_hf: missing {config_path}; expected a HF model directory")
    with open(config_path) as fh:
        hf_config = json.load(fh)
    vh_path = os.path.join(path, _VALUE_HEAD)
    has_vh = os.path.exists(vh_path)
    config = config_from_hf(
        hf_config,
        param_dtype=param_dtype,
        dtype=dtype or param_dtype,
        value_head=has_vh if value_head is None else value_head,
        kv_cache_dtype=kv_cache_dtype,
        scan_layers=scan_layers,
    )
    files = _weight_files(path)
    layout = _hf_layout(config)
    missing = sorted(set(layout) - set(files))
    if missing:
        raise ValueError(
            f"load_hf: checkpoint {path} lacks tensors {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''} needed by its config.json"
        )
    # Some tied checkpoints also store a copy of the head; the embedding is what is used.
    ignored = {"lm_head.weight"} if config.tie_embeddings else set()
    unexpected = sorted(n for n in set(files) - set(layout) - ignored if not _IGNORED.search(n))
    if unexpected:
        raise ValueError(
            f"load_hf: checkpoint {path} has tensors this architecture does not use: "
            f"{unexpected[:8]}; check model_type / attention_bias / tie_word_embeddings"
        )
    pdt = config.jnp_param_dtype
    params: Params = {}
    graphdef = abstract_graphdef(config)
    expected = abstract_params(config)
    placement = None if shardings is None else shardings(config)
    if abstract:
        return config, graphdef, expected
    # HF names per parameter: one, or one a layer (in layer order) for a stacked parameter.
    by_target: dict[tuple, list[str]] = {}
    for name, (target, _, _, _) in layout.items():
        by_target.setdefault(target, []).append(name)
    framework = "flax" if placement is None else "numpy"
    with contextlib.ExitStack() as stack:
        handles = {
            f: stack.enter_context(safe_open(f, framework=framework))
            for f in dict.fromkeys(files[name] for name in layout)
        }
        for name, (_, hf_shape, _, _) in layout.items():
            stored = tuple(handles[files[name]].get_slice(name).get_shape())
            if stored != tuple(hf_shape):
                raise ValueError(
                    f"load_hf: tensor {name} in {files[name]} has shape {stored}, "
                    f"expected {tuple(hf_shape)} from config.json"
                )
        for target, names in by_target.items():
            _, hf_shape, kind, layer = layout[names[0]]
            shape = _get(expected, target).shape
            sources = [(handles[files[n]], n) for n in names]
            if placement is None:
                one = shape if layer is None else shape[1:]
                parts = [_to_jax(h.get_tensor(n), kind, one).astype(pdt) for h, n in sources]
                x = parts[0] if layer is None else jnp.stack(parts)
            else:
                if layer is None:
                    reader = _read_shard(*sources[0], kind, shape, hf_shape, pdt)
                else:
                    reader = _read_stacked(sources, kind, shape, hf_shape, pdt)
                x = jax.make_array_from_callback(shape, _get(placement, target), reader)
            _set(params, target, x)
    if config.value_head:
        _load_value_head(config, params, vh_path if has_vh else None, key)
        if placement is not None:
            for leaf in ("value_kernel", "value_bias"):
                params[leaf] = jax.device_put(params[leaf], placement[leaf])
    return config, graphdef, params


def _load_value_head(config, params, vh_path, key):
    d, pdt = config.hidden_size, config.jnp_param_dtype
    if vh_path is None:
        key = jax.random.key(0) if key is None else key
        params["value_kernel"] = (0.02 * jax.random.normal(key, (d,))).astype(pdt)
        params["value_bias"] = jnp.zeros((), pdt)
        return
    with safe_open(vh_path, framework="flax") as fh:
        kernel, bias = fh.get_tensor("value_head.weight"), fh.get_tensor("value_head.bias")
    if kernel.shape != (d,):
        raise ValueError(
            f"load_hf: tensor value_head.weight has shape {kernel.shape}, expected ({d},)"
        )
    params["value_kernel"] = kernel.astype(pdt)
    params["value_bias"] = jnp.reshape(bias, ()).astype(pdt)


def _parse_size(size) -> int:
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B)\s*", str(size).upper())
    if not m:
        raise ValueError(f"save_hf: max_shard_size={size!r}; use bytes or a string like '2GB'")
    return int(float(m.group(1)) * {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}[m.group(2)])


# safetensors' dtype names (the format's header, https://github.com/huggingface/safetensors)
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64"}


def _host_tensor(params: Params, target, layer, kind: str, hf_shape: tuple, store) -> np.ndarray:
    """One HF tensor on the host: the parameter (for a ``scan_layers`` model its one layer,
    sliced on the device), gathered from its shards, laid out as HF's and cast there. Only
    this tensor exists beside the parameters (on the host; on the device at most one layer
    of a stacked parameter)."""
    x = _get(params, target)
    if layer is not None:
        x = x[layer]
    host = np.asarray(jax.device_get(x))
    if kind in ("transpose",):
        host = host.T
    elif kind == "in_proj":  # [D, N, hd] -> [N*hd, D]
        host = host.reshape(host.shape[0], -1).T
    elif kind == "out_proj":  # [H, hd, D] -> [D, H*hd]
        host = host.reshape(-1, host.shape[-1]).T
    else:
        host = host.reshape(hf_shape)
    return np.ascontiguousarray(host.astype(store))


def _write_safetensors(path: str, entries: list, metadata: dict, fetch: Callable) -> None:
    """A safetensors file written tensor by tensor: the header from the shapes alone, then
    each tensor's bytes as ``fetch(entry)`` makes it (one host copy at a time, never the
    whole file in memory). ``entries``: (name, shape, dtype). Stored in the order the
    safetensors library stores a dict (by dtype, largest first, then by name), so the file
    is byte for byte the one ``safetensors.flax.save_file`` writes."""
    entries = sorted(entries, key=lambda e: (-np.dtype(e[2]).itemsize, e[0]))
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, shape, dtype in entries:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {
            "dtype": _ST_DTYPES[np.dtype(dtype).name],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes
    with open(path, "wb") as fh:
        fh.write(len(text).to_bytes(8, "little"))
        fh.write(text)
        for entry in entries:
            x = fetch(entry)
            if x.dtype != np.dtype(entry[2]) or x.shape != tuple(entry[1]):
                raise ValueError(f"save_hf: {entry[0]} came out {x.dtype}{x.shape}, not {entry}")
            fh.write(x.tobytes())
            del x


def save_hf(
    path: str,
    config: ModelConfig,
    graphdef,
    params: Params,
    *,
    max_shard_size="2GB",
    dtype: Optional[str] = None,
) -> None:
    """Write ``params`` as a HF checkpoint transformers can load (config.json + safetensors).

    Shards above ``max_shard_size`` bytes with a ``model.safetensors.index.json``. ``dtype``
    (default: config.param_dtype) is the stored dtype.

    Streams: each tensor is gathered from the (possibly sharded) parameters, laid out and
    cast on the host and written before the next one is made, so the export holds one
    tensor beside the model, never a second copy of it (on the device or the host).
    """
    if model_config(graphdef) != config:
        raise ValueError("save_hf: config does not match the graphdef's config")
    os.makedirs(path, exist_ok=True)
    hf_config = config_to_hf(config if dtype is None else config.replace(param_dtype=dtype))
    hf_config.architectures = [
        "Qwen2ForCausalLM" if config.model_type == "qwen2" else "LlamaForCausalLM"
    ]
    hf_config.save_pretrained(path)
    _add_legacy_keys(os.path.join(path, "config.json"))
    store = np.dtype(jnp.dtype(dtype or config.param_dtype))
    layout = _hf_layout(config)

    shards, current, size = [], [], 0
    limit = _parse_size(max_shard_size)
    for name, (_, shape, _, _) in layout.items():
        nbytes = int(np.prod(shape, dtype=np.int64)) * store.itemsize
        if current and size + nbytes > limit:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape, store))
        size += nbytes
    shards.append(current)
    total = sum(int(np.prod(s, dtype=np.int64)) * store.itemsize for _, s, _ in sum(shards, []))

    def fetch(entry):
        target, shape, kind, layer = layout[entry[0]]
        return _host_tensor(params, target, layer, kind, shape, store)

    for stale in (_SINGLE, _INDEX):
        if os.path.exists(os.path.join(path, stale)):
            os.remove(os.path.join(path, stale))
    meta = {"format": "pt"}
    if len(shards) == 1:
        _write_safetensors(os.path.join(path, _SINGLE), shards[0], meta, fetch)
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            _write_safetensors(os.path.join(path, fname), shard, meta, fetch)
            weight_map.update({name: fname for name, _, _ in shard})
        index = {"metadata": {"total_size": int(total)}, "weight_map": weight_map}
        with open(os.path.join(path, _INDEX), "w") as fh:
            json.dump(index, fh, indent=2)
    if config.value_head:
        save_file(
            {
                "value_head.weight": jnp.asarray(params["value_kernel"]),
                "value_head.bias": jnp.reshape(params["value_bias"], (1,)),
            },
            os.path.join(path, _VALUE_HEAD),
            metadata=meta,
        )


def load_tokenizer(path: str):
    """``transformers.AutoTokenizer`` from a local directory (chat template included)."""
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise FileNotFoundError(f"load_tokenizer: {path!r} is not a directory")
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(
            f"load_tokenizer: no usable tokenizer in {path} (found {sorted(os.listdir(path))}); "
            f"save one with tokenizer.save_pretrained(path). Cause: {exc}"
        ) from exc
