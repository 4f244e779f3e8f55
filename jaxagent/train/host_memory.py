"""Hand freed host memory back between the phases of an iteration.

On the CPU backend every array lives in the process heap, so the peak resident memory of a
run is set by what is live in its largest phase (the update: parameters, optimiser state,
gradients, activations) *plus* what earlier phases freed but the process still holds:

- reference cycles (traced closures, episode records, exception frames) that keep native
  buffers alive until Python's cyclic collector runs, which it does on allocation counts,
  not on bytes (measured on the 768 x 12 model: ~120 MiB held into the update);
- pages glibc's allocator keeps after ``free`` for reuse (the sampler's transposed weight
  copy, the KV cache, evaluation buffers: ~150-500 MiB here), which ``malloc_trim`` returns
  to the kernel.

``release()`` does both; the trainer calls it where a phase's buffers are dead and the next
phase is about to allocate (before the update, after an evaluation). It costs a full
collection (tens of milliseconds) and is a no-op for the allocator where glibc is absent.
``benchmarks/trainer_memory.py`` measures its effect on the peak.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

__all__ = ["release"]


def _load_trim():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_TRIM = _load_trim()


def release() -> None:
    """Collect reference cycles, then return free heap pages to the operating system."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
