"""A run's device layout: one mesh from its ``mesh:`` section, built once, used everywhere.

``DeviceLayout.build(config.mesh, graphdef, params)`` makes the ('data', 'fsdp', 'tensor') mesh
(``jaxagent.parallel.mesh``) and keeps the logical axes of the model's parameters. It then places

- the train state: parameters and Adam moments by the logical-axis rules (``state``);
- each packed batch: rows split over the mesh axes of the logical 'batch' axis, assembled
  from every process's local rows into one global array (``put_batch``);
- the rollout's weights: the training shardings, or with ``mesh.rollout_layout=replicas``
  one jitted reshard per iteration (device to device) to tensor-parallel weights replicated
  over 'data' and 'fsdp', so every chip samples without FSDP all-gathers in its decode steps;
  ``mesh.sampling_dtype=bfloat16`` casts fp32 weights in that same program
  (``rollout_params``). The sampler shards its KV cache over batch rows by itself (it reads
  the mesh off the parameters, see ``jaxagent.generate.sampler``).

With the default mesh (1 x 1 x 1) there is no mesh at all: every method is the identity
and the program is the single-device one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxagent.models import param_logical_axes
from jaxagent.parallel.mesh import (
    DEFAULT_RULES,
    MeshConfig,
    batch_mesh_axes,
    batch_shardings,
    make_mesh,
    param_shardings,
    replica_rules,
    state_shardings,
)
from jaxagent.perf import host_memory
from jaxagent.errors import ConfigError


@dataclasses.dataclass
class DeviceLayout:
    """The mesh of a run and the shardings derived from it (``mesh`` None: one device)."""

    mesh: Optional[Mesh]
    logical_axes: Any  # tree of logical-axis tuples like the params (None without a mesh)
    rollout_layout: str = "train"
    rules: tuple = DEFAULT_RULES
    sampling_dtype: str = "param"
    # The rollout's own devices (disaggregated, ``overlap.sampler_devices``): the sampling
    # weights are copied there device to device; None: the rollout samples on ``mesh``.
    sampler_mesh: Optional[Mesh] = None
    # argument types and shardings -> the compiled reshard (one program per param structure)
    _reshards: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(cls, m: MeshConfig, graphdef, params, sampler_devices: int = 0) -> "DeviceLayout":
        """The layout ``m`` (a run's ``mesh:`` section) asks for, over the model's params;
        ``sampler_devices`` > 0 keeps the last that many devices for the rollout (its own
        data-parallel mesh of replicas) and lays the update out over the others."""
        devices = jax.devices()
        sampler = None
        if sampler_devices:
            if jax.process_count() > 1 or sampler_devices >= len(devices):
                raise ConfigError(
                    f"overlap.sampler_devices={sampler_devices} must leave the update at least "
                    f"one of this process's {len(devices)} devices (one process); lower it or "
                    "set it to 0 (the rollout then samples on the update's devices)"
                )
            sampler = make_mesh(MeshConfig(data=-1), devices=devices[-sampler_devices:])
            devices = devices[:-sampler_devices]
        if m.single_device and jax.process_count() == 1:
            logical = None if sampler is None else param_logical_axes(graphdef, params)
            return cls(
                mesh=None,
                logical_axes=logical,
                sampling_dtype=m.sampling_dtype,
                sampler_mesh=sampler,
            )
        size = m.data * m.fsdp * m.tensor
        if m.data != -1 and size < len(devices):
            if jax.process_count() > 1:
                raise ConfigError(
                    f"mesh {m.data}x{m.fsdp}x{m.tensor} covers {size} of the "
                    f"{len(devices)} devices of a multi-host run; use mesh.data=-1"
                )
            devices = devices[:size]  # a smaller mesh on one host: the first devices
        try:
            mesh = make_mesh(m, devices=devices)
        except ValueError as exc:
            raise ConfigError(f"mesh: {exc}") from None
        logical = param_logical_axes(graphdef, params)
        return cls(mesh, logical, m.rollout_layout, m.rules, m.sampling_dtype, sampler)

    @property
    def batch_devices(self) -> int:
        """Devices the batch rows are split over (1 without a mesh)."""
        if self.mesh is None:
            return 1
        return math.prod(self.mesh.shape[a] for a in batch_mesh_axes(self.mesh, self.rules))

    def devices(self) -> list:
        """The devices the run computes on (one without a mesh)."""
        return [jax.devices()[0]] if self.mesh is None else list(self.mesh.devices.flat)

    def describe(self) -> str:
        if self.mesh is None:
            return "1 device (no mesh)"
        shape = " x ".join(f"{k}={v}" for k, v in self.mesh.shape.items())
        return f"{self.mesh.size} devices over {jax.process_count()} process(es), {shape}"

    # ---- placement ---------------------------------------------------------------------
    def params(self, params) -> Any:
        """Parameters placed by their logical axes (the identity without a mesh)."""
        if self.mesh is None:
            return params
        return place(params, self.param_shardings(params))

    def param_shardings(self, params, rules=None) -> Any:
        return param_shardings(params, self.logical_axes, self.mesh, rules or self.rules)

    def state(self, state, optimizer) -> tuple[Any, Any]:
        """(state placed on the mesh, its sharding tree); (state, None) without a mesh."""
        if self.mesh is None:
            return state, None
        shardings = self.state_shardings(state, optimizer)
        # donate: the single-device buffers are freed as the sharded ones are made
        return place(state, shardings, donate=True), shardings

    def state_shardings(self, state, optimizer) -> Any:
        """The sharding tree of a train state (concrete or abstract) on this mesh."""
        return state_shardings(state, self.mesh, self.logical_axes, optimizer, self.rules)

    def abstract_state(self, abstract, optimizer) -> Any:
        """``abstract`` (ShapeDtypeStructs, e.g. from ``jax.eval_shape``) with the shardings
        the state has on this layout: the template a checkpoint is restored into."""
        if self.mesh is None:
            one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            shardings = jax.tree.map(lambda _: one, abstract)
        else:
            shardings = self.state_shardings(abstract, optimizer)
        return jax.tree.map(
            lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), abstract, shardings
        )

    def batch_sharding(self, batch) -> Any:
        return None if self.mesh is None else batch_shardings(self.mesh, batch, self.rules)

    def put_batch(self, batch, sharding) -> Any:
        """A host batch as (global) device arrays split over the batch axes.

        Every process passes its own rows (its shard of the episodes); with one process this
        is a ``device_put``."""
        if self.mesh is None:
            return jax.tree.map(jax.numpy.asarray, batch)
        if jax.process_count() == 1:
            return jax.device_put(batch, sharding)
        return jax.tree.map(
            lambda sh, x: jax.make_array_from_process_local_data(sh, np.asarray(x)),
            sharding,
            batch,
        )

    def rollout_shardings(self, params) -> Any:
        """Where the sampling weights live: the training shardings ("train") or the
        ``replica_rules`` of the run's rules ("replicas"); None without a mesh."""
        if self.mesh is None:
            return None
        if self.rollout_layout == "train":
            return jax.tree.map(lambda x: x.sharding, params)
        return self.param_shardings(params, replica_rules(self.rules))

    def rollout_params(self, params) -> Any:
        """The weights the sampler reads: ``params`` themselves when neither the layout nor
        the dtype changes (no copy), else a copy made by one compiled program, device to
        device (``reshard_program``)."""
        target = self.rollout_shardings(params)
        same_place = target is None or all(
            x.sharding.is_equivalent_to(sh, x.ndim)
            for x, sh in zip(jax.tree.leaves(params), jax.tree.leaves(target))
        )
        if same_place and not any(_casts(x, self.sampling_dtype) for x in jax.tree.leaves(params)):
            return params
        return self.reshard_program(params)(params)

    def to_sampler(self, params) -> Any:
        """The sampling weights copied onto the rollout's own devices (``sampler_mesh``),
        device to device, replicated over them (each samples its share of the rows)."""
        shardings = param_shardings(
            params, self.logical_axes, self.sampler_mesh, replica_rules(self.rules)
        )
        return jax.device_put(params, shardings)

    def reshard_program(self, params) -> Any:
        """The compiled ``params -> sampling weights`` program: the cast to
        ``sampling_dtype`` on each input shard (so only the narrow values move), then
        ``out_shardings`` = ``rollout_shardings``; XLA's partitioner emits the collectives
        (all-gathers over 'fsdp' for "replicas"). Compiled once per argument structure,
        types and shardings; the training weights are read, never donated."""
        leaves, tree = jax.tree.flatten(params)
        key = (tree, tuple((jax.typeof(x), x.sharding) for x in leaves))
        compiled = self._reshards.get(key)
        if compiled is None:
            casts = [_casts(x, self.sampling_dtype) for x in leaves]
            where = [None if self.mesh is None else x.sharding for x in leaves]

            def reshard(p):
                xs = jax.tree.leaves(p)
                for i, x in enumerate(xs):
                    if casts[i]:
                        xs[i] = x.astype(jax.numpy.bfloat16)
                        if where[i] is not None:  # round where the fp32 shard lives
                            xs[i] = jax.lax.with_sharding_constraint(xs[i], where[i])
                return jax.tree.unflatten(tree, xs)

            out = self.rollout_shardings(params)
            compiled = jax.jit(reshard, out_shardings=out).lower(params).compile()
            self._reshards[key] = compiled
        return compiled

    def host_shardings(self, params) -> Any:
        """Shardings over this process's own devices for its per-host sampler (the run's
        rules on a local mesh: the weights split over the host's chips, the batch rows too),
        or None with one local device or one process (the sampler then reads ``params``)."""
        local = jax.local_devices()
        if self.mesh is None or jax.process_count() == 1 or len(local) == 1:
            return None
        mesh = make_mesh(MeshConfig(data=1, fsdp=len(local), tensor=1), devices=local)
        return param_shardings(params, self.logical_axes, mesh, self.rules)

    def activation_sharding(self) -> Optional[NamedSharding]:
        """[B, T, D] activations with their rows over the batch axes (None without a mesh):
        the learner pass pins its residual stream to it (``Transformer.hidden``)."""
        if self.mesh is None:
            return None
        axes = batch_mesh_axes(self.mesh, self.rules)
        rows = None if not axes else axes[0] if len(axes) == 1 else axes
        return NamedSharding(self.mesh, P(rows, None, None))

    def replicated(self) -> Optional[NamedSharding]:
        return None if self.mesh is None else NamedSharding(self.mesh, P())


def _casts(x, sampling_dtype: str) -> bool:
    """Whether the sampling copy rounds leaf ``x``: fp32 weights under ``bfloat16``."""
    return sampling_dtype == "bfloat16" and x.dtype == np.float32


def added_bytes(tree, base) -> int:
    """The bytes one device holds of ``tree``'s arrays in buffers that ``base`` does not
    hold (the largest over this process's devices): what the sampling copy costs a chip, 0
    when the sampler reads ``base``'s own buffers (the same arrays, or in-place views of
    them such as ``distributed.host_local``'s)."""
    if tree is base:
        return 0
    own = {
        (s.device, s.data.unsafe_buffer_pointer())
        for x in jax.tree.leaves(base)
        for s in x.addressable_shards
    }
    per: dict = {}
    for x in jax.tree.leaves(tree):
        for s in x.addressable_shards:
            if (s.device, s.data.unsafe_buffer_pointer()) not in own:
                per[s.device] = per.get(s.device, 0) + s.data.nbytes
    return max(per.values(), default=0)


def place(tree, shardings, donate: bool = False):
    """``jax.device_put(tree, shardings)``; with several processes, every process holds the
    same full values (same seed, same checkpoint) and each builds its own shards of the
    global arrays (``make_array_from_callback``: device_put cannot target other hosts)."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings, donate=donate)

    def one(x, sh):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = one(jax.random.key_data(x), sh)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        host = np.asarray(jax.device_get(x))
        return jax.make_array_from_callback(host.shape, sh, lambda index: host[index])

    return jax.tree.map(one, tree, shardings)


class ShardedUpdate:
    """``update(state, batch)`` under the layout: the host batch is placed on the mesh and one
    jitted step per batch structure (optional fields present or not) takes the state's own
    shardings in and out, so the donated state keeps its layout from step to step.

    Args:
      layout: the run's ``DeviceLayout``.
      make: ``make(mesh=, state_sharding=, batch_sharding=)`` -> jitted update
        (``jaxagent.rl.update.make_update_step`` with the recipe bound).
    """

    def __init__(self, layout: DeviceLayout, make):
        self.layout, self._make = layout, make
        self._plain = make() if layout.mesh is None else None
        self._steps: dict = {}
        self._compiled: dict = {}  # argument structure, types and shardings -> compiled step
        self.temp_bytes = 0  # the largest XLA scratch a compiled step planned (memory report)

    def __call__(self, state, batch):
        if self.layout.mesh is None:
            return self._run(self._plain, state, self.layout.put_batch(batch, None))
        b_sh = self.layout.batch_sharding(batch)
        key = jax.tree.structure(batch)
        if key not in self._steps:
            st_sh = jax.tree.map(lambda x: x.sharding, state)
            self._steps[key] = self._make(
                mesh=self.layout.mesh,
                state_sharding=st_sh,
                batch_sharding=b_sh,
                rules=self.layout.rules,
            )
        return self._run(self._steps[key], state, self.layout.put_batch(batch, b_sh))

    def release_compiled(self) -> None:
        """Drops the compiled steps (``train.release_compiled``; the jitted functions' own
        caches go with ``jax.clear_caches``). ``temp_bytes`` keeps their planned scratch."""
        self._compiled.clear()

    def _run(self, jitted, state, batch):
        """Compiles ahead of the call, so that the compiler's scratch memory is returned
        (``host_memory.release``) before the step allocates its gradients: otherwise a new
        batch shape's first step peaks at compiler leftovers + the step's own working set."""
        # Keyed as jit keys its cache (a compiled step refuses other argument types).
        leaves, tree = jax.tree.flatten((state, batch))
        key = (tree, tuple(_arg_type(x) for x in leaves))
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = jitted.lower(state, batch).compile()
            self._compiled[key] = compiled
            plan = compiled.memory_analysis()  # None where the backend does not plan
            if plan is not None:
                self.temp_bytes = max(self.temp_bytes, plan.temp_size_in_bytes)
            host_memory.release()
        return compiled(state, batch)


def _arg_type(x) -> tuple:
    """What a compiled step is specialised on: shape, dtype, weak type, sharding."""
    return (jax.typeof(x), getattr(x, "sharding", None))
