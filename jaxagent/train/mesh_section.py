"""The ``mesh`` and ``distributed`` sections of a run config (no JAX import: config stays light).

``mesh`` shapes the device mesh the trainer builds once (``jaxagent.train.mesh``): axis sizes
``data`` x ``fsdp`` x ``tensor`` (``-1`` for ``data`` = every device left over). The default
(1 x 1 x 1) is one device and no mesh, exactly the single-device program; ``mesh.data=-1``
uses every device of every host. ``distributed`` starts multi-host JAX
(``jax.distributed.initialize``) before anything touches a device.
"""

from __future__ import annotations

import dataclasses

from jaxagent.train.validate import _DC, ConfigError, _choice

ROLLOUT_LAYOUTS = ("train", "no_fsdp")


@dataclasses.dataclass(**_DC)
class MeshSection:
    """Device mesh. Static: a change rebuilds the mesh and recompiles every step."""

    data: int = 1  # pure data-parallel size; -1: every device left after fsdp x tensor
    fsdp: int = 1  # data-parallel size with parameters and Adam moments sharded (ZeRO-3)
    tensor: int = 1  # model-parallel size (heads, MLP width, vocabulary split)
    # The sampler's weight layout: "train" samples from the training shardings (no copy;
    # every decode step all-gathers FSDP-sharded weights), "no_fsdp" reshards the weights
    # once per iteration to replicated-over-fsdp (one extra model copy while sampling, no
    # per-step all-gathers), as the PyTorch stacks' hybrid engines do.
    rollout_layout: str = "train"

    def __post_init__(self):
        for name in ("data", "fsdp", "tensor"):
            value = getattr(self, name)
            if value == 0 or value < -1 or (value == -1 and name != "data"):
                allowed = "a positive size or -1 (every remaining device)"
                raise ConfigError(
                    f"mesh.{name}={value!r} is invalid; use "
                    + (allowed if name == "data" else "a positive size")
                )
        _choice("mesh.rollout_layout", self.rollout_layout, ROLLOUT_LAYOUTS)

    @property
    def single_device(self) -> bool:
        return self.data == 1 and self.fsdp == 1 and self.tensor == 1


@dataclasses.dataclass(**_DC)
class DistributedSection:
    """Multi-host start-up (``jax.distributed.initialize``), one process per host.

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
        _choice("distributed.mode", self.mode, ("off", "auto", "explicit"))
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
