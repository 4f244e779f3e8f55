"""A content-addressed cache of SFT results (``sft.cache_dir``).

Runs that differ only after the warm-start (an RL ablation: ten recipes from one SFT start per
seed) would each repeat the same supervised fit, which on a small CPU costs as much as the RL
phase. The fit is a deterministic function of its inputs, so its result is stored under a key
hashed from exactly those inputs: the initial parameters' bytes (the language model's: SFT
leaves a value head as it is, so a critic's recipe shares the fit), the demonstrations' token
ids, loss masks and weights, the SFT hyper-parameters, the seed, the row length and the pad
id, and the JAX version. Any change to the model, tokenizer, expert, tasks or SFT settings
changes the key; nothing is matched by config names. A code change that alters the fit
without changing these inputs must bump ``FIT_VERSION`` (part of the key).

One entry is ``<cache_dir>/<key>.npz`` (the fitted leaves in flatten order) and
``<key>.json`` (the SFT metrics, written last: an entry without it is incomplete and ignored).
Only single-process runs read or write the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import jax
import numpy as np

# The fit's implementation: 2 = SFT through the RL update step (``rl.recipes.sft_config``).
FIT_VERSION = 2


def sft_key(params: Any, demos: Sequence[Any], settings: dict) -> str:
    """sha256 hex digest of the initial ``params``, the demonstrations and ``settings``.

    Args:
      params: the initial parameter tree (leaves are read to host memory once).
      demos: episodes with ``tokens``, ``loss_mask`` (lists of ints) and ``success``.
      settings: JSON-able SFT hyper-parameters and anything else the fit reads.
    """
    h = hashlib.sha256()
    meta = {**settings, "jax": jax.__version__, "fit_version": FIT_VERSION}
    h.update(json.dumps(meta, sort_keys=True).encode())
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        x = np.asarray(jax.device_get(leaf))
        h.update(f"{jax.tree_util.keystr(path)}:{x.dtype}:{x.shape}".encode())
        h.update(np.ascontiguousarray(x).tobytes())
    for ep in demos:
        h.update(np.asarray(ep.tokens, np.int64).tobytes())
        h.update(np.asarray(ep.loss_mask, np.int8).tobytes())
        h.update(b"1" if ep.success else b"0")
    return h.hexdigest()


def usable() -> bool:
    """The cache is read and written by single-process runs only."""
    return jax.process_count() == 1


def load(cache_dir: str, key: str, like: Any) -> Optional[tuple[Any, dict]]:
    """(params placed like ``like``, metrics) of a complete entry, or None."""
    base = Path(cache_dir) / key
    meta, arrays = base.with_suffix(".json"), base.with_suffix(".npz")
    if not (meta.exists() and arrays.exists()):
        return None
    leaves, treedef = jax.tree.flatten(like)
    with np.load(arrays) as data:
        stored = [data[f"leaf{i}"] for i in range(len(data.files))]
    if len(stored) != len(leaves) or any(
        s.shape != np.shape(x) or s.dtype != x.dtype for s, x in zip(stored, leaves)
    ):
        return None  # a hash collision or a hand-edited entry: refit
    placed = [
        jax.device_put(s, x.sharding) if isinstance(x, jax.Array) else s
        for s, x in zip(stored, leaves)
    ]
    return jax.tree.unflatten(treedef, placed), json.loads(meta.read_text())


def save(cache_dir: str, key: str, params: Any, metrics: dict) -> None:
    """Write an entry (arrays first, metrics last, each by an atomic rename)."""
    root = Path(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    leaves = [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(params)]
    tmp = root / f".{key}.{os.getpid()}.npz"
    np.savez(tmp, **{f"leaf{i}": x for i, x in enumerate(leaves)})
    os.replace(tmp, root / f"{key}.npz")
    tmp_meta = root / f".{key}.{os.getpid()}.json"
    tmp_meta.write_text(json.dumps(metrics, sort_keys=True))
    os.replace(tmp_meta, root / f"{key}.json")
