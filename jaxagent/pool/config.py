"""Typed configuration of the environment pool."""

from __future__ import annotations

import dataclasses

START_METHODS = ("forkserver", "spawn", "fork")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PoolConfig:
    """How ``EnvPool`` runs its environments. All fields are host-side (nothing is traced)."""

    num_envs: int  # number of concurrent environments (one worker each)
    # a jaxagent.pool.backends.BACKENDS name: "thread" for I/O-bound tool envs, "process" for
    # CPU-bound or crashy ones, "ray" for envs in Ray actors across a cluster
    backend: str = "thread"
    step_timeout_s: float = 30.0  # a step taking longer is a timeout: worker restarted, env_error
    reset_timeout_s: float = 60.0  # same for reset (resets are retried, see max_retries)
    start_timeout_s: float = 60.0  # a worker must build its env within this (else: timeout)
    max_retries: int = 2  # extra reset attempts after a failed reset, before giving up
    backoff_s: float = 0.05  # first retry waits backoff_s, then 2x, 4x ... (capped)
    backoff_max_s: float = 2.0  # cap of the retry back-off
    seed: int = 0  # pool seed: episode seeds derive from (seed, env id, episode, attempt)
    # process backend: "forkserver" keeps restarts cheap; "fork" only in a process without
    # JAX's runtime threads (a fork of them can deadlock; jaxagent.pool.shipping)
    start_method: str = "forkserver"
    latency_window: int = 10_000  # calls kept for latency percentiles
    # ray backend (jaxagent.pool.ray_backend): "" joins the Ray this process initialised, else
    # as ray.init() (a `ray start` cluster on this node, else a new local instance); "local" a
    # new local instance, "auto" the cluster on this node, "ray://head:10001" a remote cluster
    # through Ray Client
    ray_address: str = ""
    # what each env actor asks Ray for: CPUs (1 spreads CPU-bound envs one per core of the
    # cluster; 0 packs them anywhere) and custom resources, e.g. {"env_host": 1}
    ray_num_cpus: float = 0.0
    ray_resources: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        if self.num_envs < 1:
            raise ValueError(f"PoolConfig.num_envs={self.num_envs} must be >= 1")
        from jaxagent.pool.backends import BACKENDS  # local: backends import the workers

        if self.backend not in BACKENDS:
            raise ValueError(
                f"PoolConfig.backend={self.backend!r}; choose one of {tuple(BACKENDS)}"
            )
        check = getattr(BACKENDS[self.backend], "check_config", None)
        if check is not None:  # the backend's own fields and requirements (Ray installed)
            check(self)
        if self.start_method not in START_METHODS:
            raise ValueError(
                f"PoolConfig.start_method={self.start_method!r}; choose one of {START_METHODS}"
            )
        for name in ("step_timeout_s", "reset_timeout_s", "start_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"PoolConfig.{name}={getattr(self, name)} must be > 0 seconds")
        if self.max_retries < 0:
            raise ValueError(f"PoolConfig.max_retries={self.max_retries} must be >= 0")
        if self.backoff_s < 0 or self.backoff_max_s < self.backoff_s:
            raise ValueError(
                f"PoolConfig.backoff_s={self.backoff_s}, backoff_max_s={self.backoff_max_s}: "
                "need 0 <= backoff_s <= backoff_max_s"
            )
