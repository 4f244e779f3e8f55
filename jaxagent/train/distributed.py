"""Multi-host start-up and the one-writer rule.

``start_distributed(config.distributed)`` runs ``jax.distributed.initialize`` before anything
touches a device: the coordinator address, process count and id come from the config, else
from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, and ``mode: auto`` lets
JAX detect Cloud TPU pods, SLURM and Open MPI itself. On CPU the collectives go through gloo
(the only CPU implementation that crosses processes), so a run of N processes on localhost
is a real multi-host run; that is how the CI test exercises it.

After start-up every process runs the same program on the same global arrays; host-side data
is split (``task_shard``: a process's contiguous slice, its host-local rows) and output is
written once (``is_writer``: process 0). The learner side is multi-host today
(tests/test_multihost.py); the trainer's rollout is not yet (``refuse_multihost_rollout``).
"""

from __future__ import annotations

import os
from typing import Sequence, TypeVar

import jax

from jaxagent.parallel import MeshConfig, initialize_distributed
from jaxagent.train.mesh_section import DistributedSection

T = TypeVar("T")
_started = False


def start_distributed(section: DistributedSection) -> bool:
    """Initialise multi-host JAX when the section or the environment asks; True when it did.

    Idempotent (a second Trainer in the same process reuses the first start-up)."""
    global _started
    env_address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if _started or (section.mode == "off" and not env_address):
        return _started
    if section.local_device_count:
        jax.config.update("jax_num_cpu_devices", section.local_device_count)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    initialize_distributed(
        MeshConfig(
            distributed="explicit" if section.mode == "off" else section.mode,
            coordinator_address=section.coordinator_address or None,
            num_processes=section.num_processes or None,
            process_id=None if section.process_id < 0 else section.process_id,
        )
    )
    _started = True
    return True


def is_writer() -> bool:
    """Whether this process writes checkpoints, metrics and summaries (process 0)."""
    return jax.process_index() == 0


def task_shard(items: Sequence[T]) -> list[T]:
    """This process's contiguous slice of ``items`` (equal slices; the count must divide)."""
    n, i = jax.process_count(), jax.process_index()
    if len(items) % n:
        raise ValueError(
            f"{len(items)} episodes cannot be split evenly over {n} processes; make "
            "rollout.tasks_per_iteration x samples_per_task a multiple of the process count"
        )
    per = len(items) // n
    return list(items[i * per : (i + 1) * per])


def refuse_multihost_rollout() -> None:
    """The trainer's rollout does not split episodes over hosts yet (each process would need
    its own environment pool over ``task_shard`` and a process-local copy of the weights to
    sample from); say so instead of failing inside the sampler. The learner side works
    across processes (``jaxagent.train.mesh``: global batches, the sharded update,
    collective checkpoints; tests/test_multihost.py)."""
    if jax.process_count() > 1:
        from jaxagent.train.config import ConfigError

        raise ConfigError(
            f"distributed: {jax.process_count()} processes started, but jaxagent train's "
            "rollout is single-process for now; run one process (distributed.mode=off) with "
            "mesh.data=-1 over this host's devices"
        )
