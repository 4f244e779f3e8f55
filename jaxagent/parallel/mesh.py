"""Device mesh (the ``mesh:`` config section), parameter / optimiser-state / batch shardings.

One mesh with three named axes: ``data`` (pure data parallelism), ``fsdp`` (data parallel with
parameters and optimiser state sharded, ZeRO-3 style) and ``tensor`` (model dimensions split).
The model names only logical axes ('embed', 'heads', 'kv_heads', 'mlp', 'vocab'); one rules
table maps them to mesh axes. The update step is a plain ``jax.jit`` with NamedShardings: XLA's
partitioner inserts the collectives (no pmap, which is in maintenance mode).

Typical use (one host or many)::

    start_distributed(DistributedConfig())           # parallel.distributed; no-op on one host
    mesh = make_mesh(MeshConfig(data=4, fsdp=2))
    st_sh = state_shardings(state, mesh, param_logical_axes(graphdef, params), tx)
    state = jax.device_put(state, st_sh)
    update = make_update_step(cfg, apply_fn, tx, mesh=mesh, state_sharding=st_sh,
                              batch_sharding=batch_shardings(mesh, batch))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jaxagent.errors import ConfigError, check_choice

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


ROLLOUT_LAYOUTS = ("train", "replicas")
SAMPLING_DTYPES = ("param", "bfloat16")


def replica_rules(rules) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``rules`` with the weights' data-parallel axes dropped: every logical axis but 'batch'
    keeps only its 'tensor' split, so a weight is tensor-parallel and replicated over 'data'
    and 'fsdp' (with the default rules: 'embed' unsharded, the rest as before)."""
    return tuple(
        (name, tuple(axes) if name == "batch" else tuple(a for a in axes if a == "tensor"))
        for name, axes in rules
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshConfig:
    """The device mesh: the ``mesh:`` section of a run config. Static: a change rebuilds the
    mesh and recompiles every step. The default (1 x 1 x 1) is one device and no mesh, exactly
    the single-device program; ``data=-1`` takes every device left over, on every host."""

    data: int = 1  # pure data-parallel size; -1: every device left after fsdp x tensor
    fsdp: int = 1  # data-parallel size with parameters and Adam moments sharded (ZeRO-3)
    tensor: int = 1  # model-parallel size (heads, MLP width, vocabulary split)
    # The sampler's weight layout: "train" samples from the training shardings (no copy;
    # every decode step all-gathers FSDP-sharded weights); "replicas" makes every chip a
    # sampler: once per iteration one jitted reshard (device to device, on the global mesh)
    # turns the weights tensor-parallel over 'tensor' and replicated over 'data' and 'fsdp'
    # (``replica_rules``), so decode steps run without all-gathers and each host's chips
    # hold whole copies (a multi-host rollout then views them in place, no host round
    # trip: ``distributed.host_local``). Costs one model copy per chip group while sampling,
    # as the PyTorch stacks' hybrid engines do.
    rollout_layout: str = "train"
    # The sampling copy's floating-point dtype: "param" (exact, the learner's weights) or
    # "bfloat16" (fp32 master weights cast inside the same reshard: half the copy's bytes
    # and half the decode steps' weight reads). With bfloat16 the sampler's log-probs are
    # those of the rounded weights and differ from the learner's fp32 ones (expected: the
    # update's ratios against the sampler's log-probs carry that mismatch, as with rollouts
    # from a lower-precision inference engine).
    sampling_dtype: str = "param"
    rules: tuple[tuple[str, tuple[str, ...]], ...] = DEFAULT_RULES  # logical -> mesh axes

    def __post_init__(self) -> None:
        for name in ("data", "fsdp", "tensor"):
            value = getattr(self, name)
            if value == 0 or value < -1 or (value == -1 and name != "data"):
                raise ConfigError(
                    f"mesh.{name}={value!r} is invalid; use a positive size"
                    + (" or -1 (every remaining device)" if name == "data" else "")
                )
        check_choice("mesh.rollout_layout", self.rollout_layout, ROLLOUT_LAYOUTS)
        check_choice("mesh.sampling_dtype", self.sampling_dtype, SAMPLING_DTYPES)
        # YAML hands the rules back as lists: the config stays hashable and comparable.
        object.__setattr__(self, "rules", tuple((n, tuple(a)) for n, a in self.rules))
        known = {name for name, _ in self.rules}
        for name, axes in self.rules:
            bad = [a for a in axes if a not in MESH_AXES]
            if bad:
                raise ConfigError(
                    f"mesh.rules maps {name!r} to unknown mesh axes {bad}; "
                    f"mesh axes are {MESH_AXES}"
                )
        if "batch" not in known:
            raise ConfigError("mesh.rules needs a 'batch' entry (e.g. ['batch', ['data', 'fsdp']])")

    @property
    def single_device(self) -> bool:
        return self.data == 1 and self.fsdp == 1 and self.tensor == 1

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
