"""Multi-host start-up and the one-writer rule.

``start_distributed(config.distributed)`` (a ``DistributedConfig``) runs ``jax.distributed.initialize`` before anything
touches a device: the coordinator address, process count and id come from the config, else
from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, and ``mode: auto`` lets
JAX detect Cloud TPU pods, SLURM and Open MPI itself. On CPU the collectives go through gloo
(the only CPU implementation that crosses processes), so a run of N processes on localhost
is a real multi-host run; that is how the CI test exercises it.

After start-up every process runs the same program on the same global arrays; host-side data
is split (``task_shard``: a process's contiguous slice, its host-local rows) and output is
written once (``is_writer``: process 0). The rollout is per host: each process samples its
slice of the iteration's tasks with its own environment pool from a host-local copy of the
weights (``host_local``), and the per-episode records every process needs for metrics are
exchanged with ``allgather_objects`` (tests/test_multihost_trainer.py).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
from typing import Any, Sequence, TypeVar

import jax
import numpy as np

from jaxagent.errors import ConfigError, FROZEN, check_choice

T = TypeVar("T")
_started = False


@dataclasses.dataclass(**FROZEN)
class DistributedConfig:
    """Multi-host start-up (``jax.distributed.initialize``), one process per host: the
    ``distributed:`` section of a run config.

    ``mode``: "off" (one process; still "explicit" when JAX_COORDINATOR_ADDRESS is set),
    "auto" (JAX detects Cloud TPU pods, SLURM, Open MPI, ...), or "explicit" (the fields below,
    each falling back to JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID).
    """

    mode: str = "off"  # off | auto | explicit
    coordinator_address: str = ""  # "host:port" of process 0
    num_processes: int = 0  # 0: from the environment
    process_id: int = -1  # -1: from the environment
    local_device_count: int = 0  # CPU only: simulated devices per process (0: leave as is)

    def __post_init__(self):
        check_choice("distributed.mode", self.mode, ("off", "auto", "explicit"))
        if self.num_processes < 0:
            raise ConfigError(
                f"distributed.num_processes={self.num_processes} must be >= 1 (or 0: from "
                "the environment variable JAX_NUM_PROCESSES)"
            )
        if self.process_id < -1 or (self.num_processes and self.process_id >= self.num_processes):
            raise ConfigError(
                f"distributed.process_id={self.process_id} must be in [0, num_processes) "
                "(or -1: from the environment variable JAX_PROCESS_ID)"
            )
        if self.coordinator_address and ":" not in self.coordinator_address:
            raise ConfigError(
                f"distributed.coordinator_address={self.coordinator_address!r} must be "
                "host:port, e.g. 10.0.0.1:1234"
            )


def start_distributed(config: DistributedConfig) -> bool:
    """Initialise multi-host JAX when the config or the environment asks; True when it did.
    Must run before any other JAX call. Idempotent (a second Trainer in the same process
    reuses the first start-up)."""
    global _started
    env = os.environ
    address = config.coordinator_address or env.get("JAX_COORDINATOR_ADDRESS")
    if _started or (config.mode == "off" and not address):
        return _started
    if config.local_device_count:
        jax.config.update("jax_num_cpu_devices", config.local_device_count)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if config.mode == "auto":
        jax.distributed.initialize()
    else:
        num = config.num_processes or (
            int(env["JAX_NUM_PROCESSES"]) if "JAX_NUM_PROCESSES" in env else None
        )
        pid = config.process_id if config.process_id >= 0 else None
        if pid is None and "JAX_PROCESS_ID" in env:
            pid = int(env["JAX_PROCESS_ID"])
        missing = [
            n
            for n, v in (
                ("coordinator_address", address),
                ("num_processes", num),
                ("process_id", pid),
            )
            if v is None
        ]
        if missing:
            raise ConfigError(
                f"distributed start-up needs {missing}: set distributed.* or the "
                "JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables"
            )
        jax.distributed.initialize(coordinator_address=address, num_processes=num, process_id=pid)
    _started = True
    return True


def is_writer() -> bool:
    """Whether this process writes checkpoints, metrics and summaries (process 0)."""
    return jax.process_index() == 0


def task_shard(items: Sequence[T]) -> list[T]:
    """This process's contiguous slice of ``items`` (equal slices; the count must divide)."""
    n = jax.process_count()
    if len(items) % n:
        raise ValueError(
            f"{len(items)} episodes cannot be split evenly over {n} processes; make "
            "rollout.tasks_per_iteration x samples_per_task a multiple of the process count"
        )
    return task_slice(items)[1]


def task_slice(items: Sequence[T]) -> tuple[int, list[T]]:
    """(first index, this process's contiguous slice) of ``items``, the slices within one item
    of each other: evaluations, whose episodes never form global arrays, may split unevenly."""
    n, i = jax.process_count(), jax.process_index()
    lo, hi = len(items) * i // n, len(items) * (i + 1) // n
    return lo, list(items[lo:hi])


def allgather_objects(obj: Any) -> list[Any]:
    """Every process's ``obj`` (picklable), in process order; ``[obj]`` with one process.

    Host-side records (episodes, timings) travel as padded byte arrays through
    ``process_allgather``: the same collectives the arrays use, no second channel."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    blob = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([blob.size], np.int64)))
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[: blob.size] = blob
    blobs = np.asarray(multihost_utils.process_allgather(buf))
    return [pickle.loads(blobs[p, : int(sizes[p, 0])].tobytes()) for p in range(len(blobs))]


def host_local(params: Any, shardings: Any = None) -> Any:
    """The weights as this process's own arrays, for a rollout that runs on each host
    independently; the identity with one process.

    Two paths, chosen for the whole tree:

    - zero copy: when every leaf is a global array whose shards on this host's devices
      together hold all of it (``mesh.rollout_layout=replicas`` with the 'tensor' axis inside
      a host: every host's chips hold whole copies), each leaf is viewed as a host-local
      array over the same buffers (``host_view``), keeping its layout; ``shardings`` is
      not used.
    - gather (otherwise, e.g. the training layout with FSDP across hosts, or a tensor axis
      spanning hosts): the global leaves are gathered through host memory in one collective
      (``process_allgather``) and placed by ``shardings`` (a tree like ``params`` over this
      process's devices, e.g. ``DeviceLayout.host_shardings``: every local chip holds its
      slice and samples its rows; None: one full copy on the first local device). Leaves
      already this host's own (e.g. the SFT result) are placed as they are.

    Global arrays sharded across hosts cannot feed a per-host sampler: each host's decode
    loop runs as long as its own episodes need, so no collective could line up."""
    if jax.process_count() == 1:
        return params
    leaves, treedef = jax.tree.flatten(params)
    local = jax.local_devices()
    glob = [isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves]
    axes = set().union(*(split_axes(x) for x, g in zip(leaves, glob) if g))
    views = [host_view(x, local, axes) if g else None for x, g in zip(leaves, glob)]
    if leaves and all(v is not None for v in views):
        return jax.tree.unflatten(treedef, views)
    from jax.experimental import multihost_utils

    where = (
        [local[0]] * len(leaves)
        if shardings is None
        else jax.tree.leaves(shardings, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding))
    )
    glob = [
        i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not x.is_fully_addressable
    ]
    if glob:
        full = multihost_utils.process_allgather([leaves[i] for i in glob], tiled=True)
        for i, x in zip(glob, full):
            leaves[i] = jax.device_put(x, where[i])
    if shardings is not None:
        leaves = [x if i in glob else jax.device_put(x, where[i]) for i, x in enumerate(leaves)]
    return jax.tree.unflatten(treedef, leaves)


def split_axes(x: jax.Array) -> set:
    """The mesh axes that ``x``'s ``NamedSharding`` splits it over (empty for others)."""
    if not isinstance(x.sharding, jax.sharding.NamedSharding):
        return set()
    return {
        a
        for entry in x.sharding.spec
        if entry is not None
        for a in (entry if isinstance(entry, tuple) else (entry,))
    }


def host_view(x: jax.Array, devices: Sequence, axes: set | None = None) -> Any:
    """``x`` (a global array on a ``NamedSharding``) as an array over ``devices`` alone,
    made of the shards they already hold (``jax.make_array_from_single_device_arrays``: no
    copy, no collective), or None when those shards do not hold all of ``x``.

    The view's mesh is the slice of ``x``'s mesh on ``devices``: the mesh axes in ``axes``
    (default: those ``x`` is split over; a tree passes the union over its leaves, so every
    leaf's view is on the same mesh) keep their size and must lie wholly inside
    ``devices``, the others shrink to the groups of ``devices``, each holding one whole
    copy; each device keeps exactly the slice it held (checked)."""
    sharding = x.sharding
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    mesh, spec = sharding.mesh, sharding.spec
    used = split_axes(x) if axes is None else split_axes(x) | set(axes)
    names = list(mesh.axis_names)
    split = [n for n in names if n in used]
    rest = [n for n in names if n not in used]
    # devices as (copies, *split axes): one row per combination of the unsplit axes
    grid = np.transpose(mesh.devices, [names.index(n) for n in rest + split])
    grid = grid.reshape(math.prod(mesh.shape[n] for n in rest), -1)
    mine = set(devices)
    held = np.array([[d in mine for d in row.flat] for row in grid])
    rows = grid[held.all(axis=1)]
    if not len(rows) or (held.any(axis=1) & ~held.all(axis=1)).any():
        return None  # no whole copy here, or a copy only partly here
    if not rest and len(rows) > 1:
        return None
    # back to the mesh's axis order: the copies on the first unsplit axis, the others size 1
    shape = {n: mesh.shape[n] for n in split}
    shape.update({n: 1 for n in rest})
    if rest:
        shape[rest[0]] = len(rows)
    arranged = rows.reshape([len(rows)] + [mesh.shape[n] for n in split])
    arranged = arranged.reshape([shape[n] for n in rest + split])
    arranged = np.transpose(arranged, [(rest + split).index(n) for n in names])
    local_mesh = jax.sharding.Mesh(arranged, mesh.axis_names, axis_types=mesh.axis_types)
    view = jax.sharding.NamedSharding(local_mesh, spec)
    want = sharding.devices_indices_map(x.shape)
    got = view.devices_indices_map(x.shape)
    if any(want[d] != got[d] for d in got):
        return None
    shards = {s.device: s.data for s in x.addressable_shards}
    return jax.make_array_from_single_device_arrays(x.shape, view, [shards[d] for d in got])
