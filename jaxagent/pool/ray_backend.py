"""Ray backend: each worker's environment lives in a Ray actor, on any node of a Ray cluster.

``PoolConfig(backend="ray")`` scales environment capacity past the training hosts: the pool
(timeouts, reset retries, restarts, health counters) stays in the trainer, unchanged, and only
the ``reset``/``step`` calls travel to the actors. Ray is optional (``pip install
'jaxagent[ray]'``) and imported only when a ray pool is built.

Where the actors run is ``PoolConfig.ray_address``: ``""`` joins the Ray this process already
initialised, or else does what ``ray.init()`` does (``RAY_ADDRESS``, else a cluster that
``ray start`` runs on this node, else a new local instance); ``"local"`` always a new local
instance; ``"auto"`` the cluster running on this node; ``"ray://head:10001"`` a remote cluster
through Ray Client (with token authentication, as Ray 2.60 sets up by default, the client
needs ``RAY_AUTH_MODE=token`` and the cluster's token in ``~/.ray/auth_token``). A run that
starts its own instance does so from the trainer's process, where JAX's threads run: Ray
starts its daemons with fork + exec (JAX warns once about the fork); for long runs start Ray
first (``ray start --head``) and use ``"auto"``. ``ray_num_cpus`` and ``ray_resources`` are
each actor's resource request, what Ray schedules them by.

The ``Outcome`` contract of ``jaxagent.pool.backends`` maps onto Ray as follows. Each call is
one actor method call whose result arrives through a completion callback (no thread per
worker); an env exception comes back as an "error" value; a Ray error about the task itself
(a result Ray could not serialise) is "corrupt"; the actor's death (``RayActorError``: its
process exited or was killed, its node died) is a "crash", at once, even while the actor is
idle, because every actor also holds a ``watch`` call on a thread of its own (a threaded
actor, ``max_concurrency=3``) that only ends when the actor stops. A thread backend's injected
``EnvCrash`` ends the actor's process here (``os._exit``), as it does a process worker, so an
injected crash is a real actor death. The pool replaces a dead, hung or crashed actor with a
new one; Ray's own actor restarts are off (``max_restarts=0``) so that restarts are counted
in one place.

``env_fn`` is stored once in Ray's object store (Ray's cloudpickle: a lambda or closure works
too, and so do Ray handles inside it, Ray Client's included); an actor fetches and rebuilds
it itself, after adding this process's ``sys.path`` directories that exist on its node, as
``multiprocessing``'s spawn does: a module the caller can import (a test module, a
script's directory) is then importable in a local actor. On a cluster, install jaxagent and
the env's packages on every node (or ship them with a Ray ``runtime_env``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from importlib.util import find_spec
from typing import Any

from jaxagent.envs.faults import FAULT_KINDS, EnvCrash
from jaxagent.pool.workers import Outcome, _format_error, execute

INSTALL = "pip install 'jaxagent[ray]'"


def check_config(config) -> None:
    """``PoolConfig``'s checks of the ray fields when ``backend="ray"`` (no Ray import)."""
    if find_spec("ray") is None:
        raise ValueError(f"PoolConfig.backend='ray' needs Ray: {INSTALL}")
    address = config.ray_address
    if address not in ("", "auto", "local") and not (
        address.startswith("ray://") or ":" in address
    ):
        raise ValueError(
            f"PoolConfig.ray_address={address!r}; use '' (the Ray this process joined, else "
            "ray.init()'s choice), 'local' (a new local instance), 'auto' (the cluster on "
            "this node), 'host:port' (a cluster's GCS) or 'ray://host:10001' (Ray Client)"
        )
    if config.ray_num_cpus < 0:
        raise ValueError(f"PoolConfig.ray_num_cpus={config.ray_num_cpus} must be >= 0")
    for name, amount in config.ray_resources:
        if amount < 0:
            raise ValueError(f"PoolConfig.ray_resources[{name!r}]={amount} must be >= 0")


def connect(address: str):
    """Ray, initialised: the instance this process already joined, or ``address``'s."""
    try:
        import ray
    except ImportError as exc:
        raise ValueError(f"PoolConfig.backend='ray' needs Ray: {INSTALL} ({exc})") from exc
    if not ray.is_initialized():
        # no dashboard: its web server costs seconds and memory that a pool does not use
        ray.init(address=address or None, include_dashboard=False)
        _initialised.set()
    return ray


_initialised = threading.Event()  # ``connect`` called ray.init in this process


def shutdown() -> None:
    """Leave the Ray that ``connect`` initialised in this process, stopping the local
    instance it started (its daemons and agents, the env actors with them); nothing when
    Ray was never initialised here. Ray does this itself at interpreter exit (an ``atexit``
    hook); a command that ends with ``os._exit`` after Ctrl-C (``jaxagent.cli``) calls it
    first, or the instance's agent processes outlive the run."""
    if not _initialised.is_set():
        return
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _initialised.clear()


class _EnvActor:
    """The remote side: one env per actor; made a Ray actor class by ``RayBackend``."""

    def __init__(self, env_fn_refs: list, env_id: int, driver_path: list[str]):
        import ray

        for path in driver_path:
            if path not in sys.path and os.path.isdir(path):
                sys.path.append(path)
        self._stopped = threading.Event()
        self._lock = threading.Lock()  # the env's calls and close, one at a time
        self.env, self.init_error = None, None
        try:  # an error is reported on every call, so the episode ends labelled
            # in a list, the ref arrives as is: fetched once sys.path can import env_fn's modules
            self.env = ray.get(env_fn_refs[0])(env_id)
        except Exception as exc:
            self.init_error = f"env_fn({env_id}) failed: {_format_error(exc)}"

    def ready(self) -> None:
        return None

    def call(self, cmd: str, payload: Any) -> tuple[str, Any]:
        if self.init_error is not None:
            return "error", self.init_error
        with self._lock:
            try:
                return "ok", execute(self.env, cmd, payload)
            except EnvCrash:
                os._exit(17)  # an injected crash: the actor dies, as a process worker would
            except Exception as exc:
                return "error", _format_error(exc)

    def watch(self) -> None:
        """Waits on a thread of its own until ``close``: its failure reports the actor's
        death."""
        self._stopped.wait()

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            if self.env is not None:
                try:
                    self.env.close()
                except Exception:
                    pass


class RayWorker:
    """The pool's side of one actor: submits calls, turns their results into ``Outcome``s."""

    def __init__(self, backend: RayBackend, env_id: int, generation: int, results):
        self.env_id, self.generation, self._results = env_id, generation, results
        self._ray = backend.ray
        self._lock = threading.Lock()
        self._gone = False  # stopped, killed, or its death already reported: report no more
        # Ray runs each future's callback on its own schedule, so a call's result (or the
        # actor's death) can reach the callbacks before ``ready``'s does. The pool must see
        # ``ready`` first: it starts the call's clock then, and it respawns a worker that died
        # before ready only when the next call needs one. So every other result waits here
        # until ``ready``'s has been reported (an ordered channel, as the process backend's);
        # None once it has.
        self._waiting: list[tuple[Any, Any]] | None = []
        self.actor = backend.actor_class.remote([backend.env_fn_ref], env_id, backend.driver_path)
        self._attach(self.actor.ready.remote(), None)
        self._on_done(self.actor.watch.remote(), "watch")

    def _on_done(self, ref, seq) -> None:
        with self._lock:
            if self._waiting is not None:
                self._waiting.append((ref, seq))
                return
        self._attach(ref, seq)

    def _attach(self, ref, seq) -> None:
        ref.future().add_done_callback(lambda future: self._report(seq, future))

    def _release(self) -> None:
        """``ready``'s result is on the queue: the results that waited for it follow."""
        with self._lock:
            waiting, self._waiting = self._waiting or [], None
        for ref, seq in waiting:  # outside the lock: a done future calls back at once
            self._attach(ref, seq)

    def _report(self, seq, future) -> None:
        """Runs on Ray's completion thread: one ``Outcome`` on the pool's queue, or none."""
        try:
            self._report_outcome(seq, future)
        finally:
            if seq is None:
                self._release()

    def _report_outcome(self, seq, future) -> None:
        at = time.monotonic()
        exceptions = self._ray.exceptions
        call = seq if isinstance(seq, int) else None  # the call answered (None: ready, watch)
        try:
            value = future.result()
        except exceptions.RayActorError as exc:  # the actor died (exited, killed, node lost)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            status, value = "crash", f"Ray actor died: {first}"
        except exceptions.RayTaskError as exc:  # Ray could not run the call or ship its result
            cause = getattr(exc, "cause", None)
            cause = cause if isinstance(cause, BaseException) else exc
            status, value = "corrupt", f"Ray could not deliver the result: {_format_error(cause)}"
        except Exception as exc:  # the object was lost, the connection to Ray failed, ...
            status, value = "crash", f"Ray call failed: {_format_error(exc)}"
        else:
            if seq == "watch":
                return  # closed politely
            status, value = value if call is not None else ("ready", None)
        with self._lock:
            if self._gone:
                return
            if status == "crash":  # one report per death: the watch and the call both see it
                self._gone = True
        self._put(call, status, value, at)

    def _put(self, seq, status, value, at) -> None:
        self._results.put(Outcome(self.env_id, self.generation, seq, status, value, at))

    def submit(self, seq: int, cmd: str, payload: Any) -> None:
        self._on_done(self.actor.call.remote(cmd, payload), seq)

    def stop(self, timeout: float = 1.0) -> None:
        with self._lock:
            self._gone = True
        try:  # close runs after the calls queued before it; a hung one is cut off by the kill
            self._ray.get(self.actor.close.remote(), timeout=timeout)
        except Exception:
            pass
        self.kill()

    def kill(self) -> None:
        with self._lock:
            self._gone = True
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # already gone
            pass


class RayBackend:
    """Envs in Ray actors (``PoolConfig.ray_address``, ``ray_num_cpus``, ``ray_resources``)."""

    stop_timeout_s = 1.0
    check_config = staticmethod(check_config)

    def __init__(self, env_fn: Callable[[int], Any], config):
        self.ray = ray = connect(config.ray_address)
        try:
            self.env_fn_ref = ray.put(env_fn)  # stored once, fetched by each actor
        except Exception as exc:
            raise ValueError(
                f"env_fn {env_fn!r} cannot be pickled ({type(exc).__name__}: {exc}); the ray "
                "backend sends it to Ray actors: build what does not pickle (a lock, a "
                "shared-memory counter, an open connection) inside env_fn, or use "
                "backend='thread'"
            ) from exc
        self.driver_path = [os.path.abspath(p or os.curdir) for p in sys.path]
        self.actor_class = ray.remote(
            num_cpus=config.ray_num_cpus,
            resources=dict(config.ray_resources) or None,
            max_restarts=0,  # the pool restarts workers (and counts it)
            max_task_retries=0,  # a call is never run twice: a step is not idempotent
            # a threaded actor does not order its calls: one thread for the watch call, one
            # for the env's calls (the pool sends a worker one at a time; _EnvActor's lock
            # keeps close out of one) and one so that ready is answered while a call hangs
            # (else the call's timeout never starts: it counts from ready)
            max_concurrency=3,
        )(_EnvActor)

    def spawn(self, env_id: int, generation: int, results) -> RayWorker:
        return RayWorker(self, env_id, generation, results)


class _FaultCounts:
    def __init__(self):
        self.counts = dict.fromkeys(FAULT_KINDS, 0)

    def record(self, kind: str) -> None:
        self.counts[kind] += 1

    def get(self) -> dict[str, int]:
        return dict(self.counts)


class RayFaultLog:
    """``jaxagent.envs.faults.FaultLog``'s interface for the ray backend: the counts live in a
    small Ray actor, since env actors share no memory with this process (a ``FaultLog``'s
    shared-memory counters do not pickle outside ``multiprocessing``). Joins Ray as the pool
    does (``address``)."""

    def __init__(self, address: str = ""):
        self._ray = connect(address)
        self._actor = self._ray.remote(num_cpus=0)(_FaultCounts).remote()

    def record(self, kind: str) -> None:
        self._ray.get(self._actor.record.remote(kind))  # counted before an injected crash exits

    def counts(self) -> dict[str, int]:
        return self._ray.get(self._actor.get.remote())
