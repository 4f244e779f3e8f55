"""``collate``: token lists (or texts) -> fixed, bucketed ``[B, T]`` numpy arrays.

Shapes entering jit must come from a small set, or every batch recompiles. ``collate`` pads the
sequence length up to the smallest bucket that fits, and optionally the batch size up to a
batch bucket (extra rows are all padding, ``segment_ids == 0``). Pure numpy; the rollout driver
calls it before anything crosses to the device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from jaxagent.buckets import pick_bucket

DEFAULT_BUCKETS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclasses.dataclass(frozen=True)
class Collated:
    """A padded batch. ``tokens/positions/segment_ids [B, T] int32``, ``lengths [B] int32``.

    ``segment_ids`` is 1 on real tokens and 0 on padding (``jaxagent/types.py`` convention);
    ``positions`` count real tokens from 0 (0 on padding); rows past ``num_rows`` are padding.
    """

    tokens: np.ndarray
    positions: np.ndarray
    segment_ids: np.ndarray
    lengths: np.ndarray
    num_rows: int


def collate(
    seqs: Sequence[Sequence[int]] | Sequence[str],
    *,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    batch_buckets: Sequence[int] | None = None,
    pad_id: int = 0,
    padding_side: str = "right",
    tokenize: Callable[[str], Sequence[int]] | None = None,
) -> Collated:
    """Pad sequences to a bucketed ``[B, T]``.

    Args:
      seqs: token-id lists, or strings when ``tokenize`` is given.
      buckets: allowed sequence lengths T.
      batch_buckets: allowed batch sizes B (default: B = len(seqs), unpadded).
      pad_id: token id written on padding.
      padding_side: "right" (training, packing) or "left" (prompts for generation).
      tokenize: maps a string to token ids.

    Returns:
      ``Collated`` with ``tokens [B, T]``, ``positions [B, T]``, ``segment_ids [B, T]``,
      ``lengths [B]``.
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side={padding_side!r}; use 'left' or 'right'")
    if seqs and isinstance(seqs[0], str):
        if tokenize is None:
            raise ValueError("collate got strings but no tokenize=...; pass a tokenizer's encode")
        seqs = [list(tokenize(s)) for s in seqs]
    n = len(seqs)
    lengths = np.array([len(s) for s in seqs], np.int32)
    t = pick_bucket(int(lengths.max(initial=1)), buckets)
    b = n if batch_buckets is None else pick_bucket(max(n, 1), batch_buckets, what="batch size")
    tokens = np.full((b, t), pad_id, np.int32)
    seg = np.zeros((b, t), np.int32)
    pos = np.zeros((b, t), np.int32)
    for i, s in enumerate(seqs):
        k = lengths[i]
        cols = slice(0, k) if padding_side == "right" else slice(t - k, t)
        tokens[i, cols] = np.asarray(s, np.int32)
        seg[i, cols] = 1
        pos[i, cols] = np.arange(k, dtype=np.int32)
    all_lengths = np.zeros((b,), np.int32)
    all_lengths[:n] = lengths
    return Collated(tokens, pos, seg, all_lengths, n)
