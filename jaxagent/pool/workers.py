"""Workers: one environment each, in a thread or in a child process.

A worker executes ``reset``/``step`` calls and puts every outcome on the pool's shared result
queue as ``Outcome(env_id, generation, seq, status, value)``. ``status`` is "ok", "error" (the
env raised), "crash" (the worker died), "corrupt" (the result could not be shipped) or "ready"
(sent once, when the env is built: call timeouts only start counting from then). The
``generation`` increases on every restart, so late results of an abandoned (hung) worker are
recognised and dropped by the pool.

Process workers talk over a ``multiprocessing`` pipe; a reader thread in the parent turns the
pipe's end-of-file into a "crash" outcome, which is how a process death is detected at once
rather than at the next timeout.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

from jaxagent.envs.faults import EnvCrash


class Outcome(NamedTuple):
    env_id: int
    generation: int
    seq: int | None  # None: the worker died while idle
    status: str  # "ok" | "error" | "crash" | "corrupt" | "ready" (the env was built)
    value: Any
    # When it arrived (time.monotonic(), one clock for every process on the host): the pool
    # judges a call late by this, not by when the consumer next calls recv, so a consumer
    # busy elsewhere (decoding, with environments streamed) never turns a prompt answer into
    # a timeout.
    at: float = 0.0


def execute(env, cmd: str, payload: Any) -> Any:
    """Run one command on an env (shared by both worker kinds)."""
    if cmd == "reset":
        task, seed = payload
        if seed is not None and callable(getattr(env, "seed", None)):
            env.seed(seed)
        return env.reset(task)
    if cmd == "step":
        return env.step(payload)
    raise ValueError(f"unknown worker command {cmd!r}")


def _format_error(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return "".join(lines).strip()


# ---------------------------------------------------------------------------- thread workers


class ThreadWorker:
    """An env living in a daemon thread. A hung thread cannot be killed: it is abandoned."""

    def __init__(self, env_fn: Callable[[int], Any], env_id: int, generation: int, results):
        self.env_id, self.generation, self._results = env_id, generation, results
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._loop, args=(env_fn,), name=f"env-{env_id}-g{generation}", daemon=True
        )
        self._thread.start()

    def _loop(self, env_fn):
        env, init_error = None, None
        try:
            env = env_fn(self.env_id)
        except Exception as exc:  # reported on every call, so the episode ends labelled
            init_error = f"env_fn({self.env_id}) failed: {_format_error(exc)}"
        self._put(None, "ready", None)
        while True:
            item = self._inbox.get()
            if item is None:
                break
            seq, cmd, payload = item
            if init_error is not None:
                self._put(seq, "error", init_error)
                continue
            try:
                self._put(seq, "ok", execute(env, cmd, payload))
            except EnvCrash as exc:
                self._put(seq, "crash", _format_error(exc))
                return  # a crashed worker takes no more calls; the pool restarts it
            except Exception as exc:
                self._put(seq, "error", _format_error(exc))
        if env is not None:
            try:
                env.close()
            except Exception:
                pass

    def _put(self, seq, status, value):
        self._results.put(
            Outcome(self.env_id, self.generation, seq, status, value, time.monotonic())
        )

    def submit(self, seq: int, cmd: str, payload: Any) -> None:
        self._inbox.put((seq, cmd, payload))

    def stop(self, timeout: float = 0.0) -> None:
        self._inbox.put(None)
        if timeout > 0:
            self._thread.join(timeout)

    def kill(self) -> None:
        self._inbox.put(None)  # a hung call keeps its thread until it returns; results dropped


# --------------------------------------------------------------------------- process workers


def _child_main(conn, env_fn, env_id: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    env, init_error = None, None
    try:
        env = env_fn(env_id)
    except Exception as exc:
        init_error = f"env_fn({env_id}) failed: {_format_error(exc)}"
    conn.send((None, "ready", None))
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            break
        if item is None:
            break
        seq, cmd, payload = item
        if init_error is not None:
            conn.send((seq, "error", init_error))
            continue
        try:
            reply = (seq, "ok", execute(env, cmd, payload))
        except Exception as exc:
            reply = (seq, "error", _format_error(exc))
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send((seq, "corrupt", f"result could not be pickled: {_format_error(exc)}"))
    if env is not None:
        try:
            env.close()
        except Exception:
            pass


class ProcessWorker:
    """An env living in a child process, with a reader thread that reports its death."""

    def __init__(self, env_fn, env_id: int, generation: int, results, context):
        self.env_id, self.generation, self._results = env_id, generation, results
        parent_conn, child_conn = context.Pipe(duplex=True)
        self._conn = parent_conn
        self.process = context.Process(
            target=_child_main,
            args=(child_conn, env_fn, env_id),
            name=f"jaxagent-env-{env_id}",
            daemon=True,
        )
        self.process.start()
        child_conn.close()
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"env-{env_id}-reader", daemon=True)
        self._reader.start()

    def _read(self):
        started = False
        while True:
            try:
                seq, status, value = self._conn.recv()
            except (EOFError, OSError):
                self.process.join(timeout=1.0)
                why = f"exit code {self.process.exitcode}"
                if not started:  # e.g. a script re-imported as __main__ without a main guard
                    why += " before building its env (the worker's stderr says why)"
                self._results.put(
                    Outcome(self.env_id, self.generation, None, "crash", why, time.monotonic())
                )
                return
            except Exception as exc:  # the child sent bytes we cannot unpickle
                self._results.put(
                    Outcome(
                        self.env_id,
                        self.generation,
                        None,
                        "corrupt",
                        _format_error(exc),
                        time.monotonic(),
                    )
                )
                continue
            started = True
            self._results.put(
                Outcome(self.env_id, self.generation, seq, status, value, time.monotonic())
            )

    def submit(self, seq: int, cmd: str, payload: Any) -> None:
        with self._send_lock:
            try:
                self._conn.send((seq, cmd, payload))
            except (BrokenPipeError, OSError):
                pass  # the reader thread reports the death

    def stop(self, timeout: float = 1.0) -> None:
        with self._send_lock:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self.process.join(timeout)
        if self.process.is_alive():
            self.kill()
        self._close_conn()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5.0)
        self._close_conn()

    def _close_conn(self):
        try:
            self._conn.close()
        except OSError:
            pass


def make_context(start_method: str, preload: tuple[str, ...] = ()):
    """The ``multiprocessing`` context of the process workers. With ``forkserver`` they fork
    from a small server that has imported only the env side of jaxagent and ``preload`` (the
    modules ``env_fn`` needs), so a restart costs a fork, not those imports. The server is
    one per process and imports its list when it starts: a later pool with other modules
    pays for them in each worker."""
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(["jaxagent.pool.workers", "jaxagent.envs.base", *preload])
    return ctx
