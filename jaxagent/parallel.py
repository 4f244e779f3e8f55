"""Device mesh, parameter / optimiser-state / batch shardings, and multi-host start-up.

One mesh with three named axes: ``data`` (pure data parallelism), ``fsdp`` (data parallel with
parameters and optimiser state sharded, ZeRO-3 style) and ``tensor`` (model dimensions split).
The model names only logical axes ('embed', 'heads', 'kv_heads', 'mlp', 'vocab'); one rules
table maps them to mesh axes. The update step is a plain ``jax.jit`` with NamedShardings: XLA's
partitioner inserts the collectives (no pmap, which is in maintenance mode).

Typical use (one host or many)::

    initialize_distributed(mesh_cfg)                 # no-op on a single host
    mesh = make_mesh(mesh_cfg)                       # e.g. data=4, fsdp=2
    st_sh = state_shardings(state, mesh, param_logical_axes(graphdef, params), tx)
    state = jax.device_put(state, st_sh)
    update = make_update_step(cfg, apply_fn, tx, mesh=mesh, state_sharding=st_sh,
                              batch_sharding=batch_shardings(mesh, batch))
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
# logical axis -> mesh axes. The batch is split over data and fsdp; weights' 'embed' dimension
# over fsdp; the model-parallel dimensions over tensor.
DEFAULT_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("batch", BATCH_AXES),
    ("embed", ("fsdp",)),
    ("vocab", ("tensor",)),
    ("heads", ("tensor",)),
    ("kv_heads", ("tensor",)),
    ("mlp", ("tensor",)),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshConfig:
    """Mesh shape and multi-host start-up.

    Static: changing any field rebuilds the mesh and recompiles.
    """

    data: int = -1  # data-parallel size; -1: all devices left after fsdp x tensor
    fsdp: int = 1  # parameter-sharded data-parallel size
    tensor: int = 1  # tensor-parallel size
    rules: tuple[tuple[str, tuple[str, ...]], ...] = DEFAULT_RULES  # logical -> mesh axes
    distributed: str = (
        "off"  # off | auto (jax.distributed.initialize() auto-detects TPU/SLURM) | explicit
    )
    coordinator_address: Optional[str] = (
        None  # "host:port" (explicit; or env JAX_COORDINATOR_ADDRESS)
    )
    num_processes: Optional[int] = None  # explicit; or env JAX_NUM_PROCESSES
    process_id: Optional[int] = None  # explicit; or env JAX_PROCESS_ID

    def __post_init__(self) -> None:
        for name in ("data", "fsdp", "tensor"):
            value = getattr(self, name)
            if value == 0 or value < -1 or (value == -1 and name != "data"):
                raise ValueError(
                    f"MeshConfig.{name}={value} is invalid; use a positive size"
                    + (" or -1 (all remaining devices)" if name == "data" else "")
                )
        if self.distributed not in ("off", "auto", "explicit"):
            raise ValueError(
                f"MeshConfig.distributed={self.distributed!r}; use off, auto or explicit"
            )
        known = {name for name, _ in self.rules}
        for name, axes in self.rules:
            bad = [a for a in axes if a not in MESH_AXES]
            if bad:
                raise ValueError(
                    f"MeshConfig.rules maps {name!r} to unknown mesh axes {bad}; "
                    f"mesh axes are {MESH_AXES}"
                )
        if "batch" not in known:
            raise ValueError(
                "MeshConfig.rules needs a 'batch' entry (e.g. ('batch', ('data', 'fsdp')))"
            )

    def axis_sizes(self, num_devices: int) -> tuple[int, int, int]:
        """(data, fsdp, tensor) for ``num_devices``; raises when they do not multiply out."""
        rest = self.fsdp * self.tensor
        data = num_devices // rest if self.data == -1 else self.data
        if data < 1 or data * rest != num_devices:
            raise ValueError(
                f"mesh data={self.data} x fsdp={self.fsdp} x tensor={self.tensor} does not fit "
                f"{num_devices} devices; make the product equal the device count (or data=-1)"
            )
        return data, self.fsdp, self.tensor


def make_mesh(
    config: Optional[MeshConfig] = None, *, devices: Optional[Sequence] = None, **sizes: int
) -> Mesh:
    """A ('data', 'fsdp', 'tensor') mesh over ``devices`` (default: all devices, all hosts).

    ``make_mesh(data=4, fsdp=2)`` is shorthand for ``make_mesh(MeshConfig(data=4, fsdp=2))``.
    """
    if config is None:
        config = MeshConfig(**sizes)
    elif sizes:
        raise TypeError("make_mesh: pass either a MeshConfig or axis sizes, not both")
    devices = list(jax.devices() if devices is None else devices)
    shape = config.axis_sizes(len(devices))
    return Mesh(np.array(devices).reshape(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def _rules_dict(rules) -> dict[str, tuple[str, ...]]:
    return {name: tuple(axes) for name, axes in rules}


def logical_to_spec(
    axes: Sequence[Optional[str]], shape: Sequence[int], mesh: Mesh, rules=DEFAULT_RULES
) -> P:
    """PartitionSpec for one array from its logical axis names.

    A dimension is split only over mesh axes of size > 1 that divide it and are not already
    used by an earlier dimension; otherwise it is replicated (so any model shards on any mesh).
    """
    table = _rules_dict(rules)
    used: set[str] = set()
    spec = []
    for name, size in zip(axes, shape):
        mesh_axes = [a for a in table.get(name, ()) if mesh.shape[a] > 1 and a not in used]
        if mesh_axes and size % math.prod(mesh.shape[a] for a in mesh_axes) == 0:
            used.update(mesh_axes)
            spec.append(mesh_axes[0] if len(mesh_axes) == 1 else tuple(mesh_axes))
        else:
            spec.append(None)
    return P(*spec)


def param_shardings(params: Any, logical_axes: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """NamedSharding for every leaf of ``params`` from a matching tree of logical-axis tuples
    (``jaxagent.models.param_logical_axes``); ``logical_axes=None`` replicates everything."""
    if logical_axes is None:
        return jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
    return jax.tree.map(
        lambda axes, x: NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh, rules)),
        logical_axes,
        params,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def state_shardings(
    state: Any,
    mesh: Mesh,
    logical_axes: Any,
    optimizer: optax.GradientTransformation,
    rules=DEFAULT_RULES,
) -> Any:
    """Shardings for a ``jaxagent.rl.TrainState``: parameters (and the reference and LoRA base)
    by their logical axes, Adam moments like their parameters, scalars replicated. LoRA
    adapters are small and replicated."""
    replicated = NamedSharding(mesh, P())
    if state.uses_lora:
        trained = jax.tree.map(lambda _: replicated, state.params)
        frozen = param_shardings(state.frozen_params, logical_axes, mesh, rules)
    else:
        trained = param_shardings(state.params, logical_axes, mesh, rules)
        frozen = None
    opt = optax.tree_map_params(
        optimizer,
        lambda _, sh: sh,
        state.opt_state,
        trained,
        transform_non_params=lambda _: replicated,
    )
    ref = (
        None
        if state.ref_params is None
        else param_shardings(state.ref_params, logical_axes, mesh, rules)
    )
    return state.replace(
        params=trained,
        opt_state=opt,
        step=replicated,
        rng=replicated,
        frozen_params=frozen,
        ref_params=ref,
    )


def batch_mesh_axes(mesh: Mesh, rules=DEFAULT_RULES) -> tuple[str, ...]:
    """The mesh axes of size > 1 that the logical 'batch' axis maps to under ``rules``."""
    return tuple(a for a in _rules_dict(rules)["batch"] if mesh.shape[a] > 1)


def batch_shardings(mesh: Mesh, batch: Any, rules=DEFAULT_RULES) -> Any:
    """Split every batch leaf's leading (batch) dimension over the 'batch' mesh axes."""
    axes = batch_mesh_axes(mesh, rules)

    def one(x):
        n = math.prod(mesh.shape[a] for a in axes)
        if not axes or x.shape[0] % n:
            raise ValueError(
                f"batch dimension {x.shape[0]} is not divisible by the {n} devices of "
                f"mesh axes {axes}; use a batch size that is a multiple of {n}"
            )
        return NamedSharding(mesh, P(axes if len(axes) > 1 else axes[0]))

    if not axes:
        return jax.tree.map(lambda _: NamedSharding(mesh, P()), batch)
    return jax.tree.map(one, batch)


def host_local_to_global(batch: Any, shardings: Any) -> Any:
    """Assemble a global batch from each process's local rows (multi-host; identity-like on one
    host): ``jax.make_array_from_process_local_data`` per leaf."""
    return jax.tree.map(
        lambda sh, x: jax.make_array_from_process_local_data(sh, np.asarray(x)), shardings, batch
    )


def initialize_distributed(config: Optional[MeshConfig] = None) -> bool:
    """Start multi-host JAX (``jax.distributed.initialize``) when the config or environment asks.

    ``distributed="auto"`` lets JAX detect the cluster (Cloud TPU pods, SLURM, ...);
    ``"explicit"`` (or the environment variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
    JAX_PROCESS_ID) passes the coordinator address, process count and id. Must run before any
    other JAX call. Returns True when it initialised, False on a single host.
    """
    config = config or MeshConfig()
    env = os.environ
    address = config.coordinator_address or env.get("JAX_COORDINATOR_ADDRESS")
    mode = config.distributed
    if mode == "off" and address:
        mode = "explicit"
    if mode == "off":
        return False
    if mode == "auto":
        jax.distributed.initialize()
        return True
    num = config.num_processes or (
        int(env["JAX_NUM_PROCESSES"]) if "JAX_NUM_PROCESSES" in env else None
    )
    pid = config.process_id
    if pid is None and "JAX_PROCESS_ID" in env:
        pid = int(env["JAX_PROCESS_ID"])
    missing = [
        n
        for n, v in (("coordinator_address", address), ("num_processes", num), ("process_id", pid))
        if v is None
    ]
    if missing:
        raise ValueError(
            f"distributed start-up needs {missing}: set MeshConfig fields or the "
            "JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables"
        )
    jax.distributed.initialize(coordinator_address=address, num_processes=num, process_id=pid)
    return True
