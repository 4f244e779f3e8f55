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

A long run has one more: glibc gives threads their own malloc arenas, up to 8 per core, and
memory freed in one arena serves only the threads attached to it. The trainer's threads come
and go (a reader thread per pool worker, replaced at each restart; XLA's and the checkpointer's
threads), and with many arenas the memory held free in them grew with the run's length.
``limit_arenas()``, which the trainer calls when it starts, caps them at two:
``experiments/soak.py`` (15 minutes, faults on) measured the per-iteration peak after the last
compilation at +45 +- 9 MB/h by default and -62 +- 8 MB/h with two arenas, ahead of a
``malloc_trim`` after every iteration (+90 +- 11) and of ``map_large_allocations`` (-15 +- 12,
but ~10% slower iterations: a mapping and page faults for each large buffer).

A fourth holder is compiled code: every program a run compiles (the samplers' prefill and
decode steps, the update, log-probs) stays in the heap for the life of its jit cache, ~80 MiB
for the update of an unrolled 12-layer model, and compiling leaves heap behind too. With
``train.release_compiled`` the trainer drops them when their phase ends
(``release(compiled=...)``) and JAX's persistent compilation cache (``compile_cache()``)
brings each back by loading, not compiling. ``benchmarks/trainer_memory.py`` measures both.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import hashlib
import os
import platform
from pathlib import Path

import jax

__all__ = ["compile_cache", "limit_arenas", "map_large_allocations", "release", "restore"]


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
# glibc only (musl, macOS lack them): nothing to trim or tune there
_TRIM, _MALLOPT = (getattr(_LIBC, name, None) for name in ("malloc_trim", "mallopt"))
_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8  # glibc's mallopt parameter numbers


def release(compiled: tuple = ()) -> None:
    """Collect reference cycles, then return free heap pages to the operating system.

    Args:
      compiled: holders of compiled programs (objects with ``release_compiled()``, e.g.
        ``ShardedUpdate``); when given, their programs and every jit cache
        (``jax.clear_caches``) are dropped first.
    """
    if compiled:
        for holder in compiled:
            holder.release_compiled()
        jax.clear_caches()
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


def map_large_allocations(threshold: int = 256 << 10) -> bool:
    """Serve every allocation of ``threshold`` bytes or more by its own mapping, unmapped at
    ``free``. glibc's default threshold grows to 32 MiB as large blocks are freed, so buffers
    (compile scratch, rollout buffers) come from the heap and, once freed, stay stranded
    behind small live blocks that ``malloc_trim`` cannot move: ~70 MiB at the peak of the
    768 x 12 run (benchmarks/trainer_memory.py). Process-wide and for good (glibc cannot go
    back to its adaptive threshold); False where the C library is not glibc."""
    return bool(_MALLOPT is not None and _MALLOPT(_M_MMAP_THRESHOLD, threshold))


def limit_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas at ``arenas`` (the module docstring says why). glibc fixes its
    limit once a process has more than eight arenas, so call this before threads multiply (the
    trainer does, before the pool, JAX's backend and the checkpointer start theirs); arenas
    that exist stay. More threads then share an arena's lock, which a thread's own malloc
    cache (glibc's tcache) mostly spares. False where the C library is not glibc."""
    return bool(_MALLOPT is not None and _MALLOPT(_M_ARENA_MAX, arenas))


def _host_key() -> str:
    """The CPU model and its instruction-set flags: XLA:CPU compiles for the host's ISA and
    JAX's cache key does not include it, so a cache shared by an AVX-512 machine and one
    without would hand the second programs it cannot run."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = platform.processor()
    return hashlib.sha1(f"{platform.machine()} {flags}".encode()).hexdigest()[:12]


def compile_cache(echo=print) -> dict:
    """Turns on JAX's persistent compilation cache for every program (also the fast ones) and
    returns the settings it replaced (for ``restore``). The directory is the user's own
    ``jax_compilation_cache_dir`` when set, else ``$XDG_CACHE_HOME/jaxagent/xla/<host>``
    (bounded at 4 GiB): JAX opens its cache once per process, so it is one stable place."""
    old = {
        name: getattr(jax.config, name)
        for name in (
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes",
        )
    }
    if not jax.config.jax_compilation_cache_dir:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        jax.config.update("jax_compilation_cache_dir", str(base / "jaxagent/xla" / _host_key()))
        if jax.config.jax_compilation_cache_max_size == -1:
            jax.config.update("jax_compilation_cache_max_size", 4 << 30)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if jax.process_count() > 1:  # JAX writes cache entries from process 0 only
        echo(
            f"[memory] {jax.process_count()} processes share compiled programs through "
            f"{jax.config.jax_compilation_cache_dir}: on several hosts it must be a directory "
            "every host sees (jax_compilation_cache_dir), else the others recompile every phase"
        )
    return old


def restore(settings: dict) -> None:
    """Puts back what ``compile_cache`` replaced (the directory stays: JAX opened it)."""
    for name, value in settings.items():
        jax.config.update(name, value)
