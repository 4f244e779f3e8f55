"""Physics engines behind ``MujocoVectorEnv``: how N MuJoCo instances are stepped.

Every engine exposes the same small surface to the vector env:
  ``qpv [N, nq + nv]``: qpos then qvel of every env after the last call (a live array);
  ``xy [N, 2]`` / ``cfrc_ext [N, nbody, 6]``: main-body xy and external contact forces
    (only engines with ``supports_cfrc_ext``; Gymnasium's Ant reads them);
  ``step(actions, ids)``: set the controls of ``ids`` (``None``: all envs) and advance them by
    ``frame_skip`` substeps;
  ``reset(ids, qpos, qvel)``: ``mj_resetData``, then the given ``qpos [K, nq]`` / ``qvel [K, nv]``,
    then ``mj_forward``, as Gymnasium's ``MujocoEnv.reset``.

``BatchEngine`` (``mujoco.batch``, MuJoCo >= 4.0): every env's full integration state, solver
  warm start included, is one row of a state table; one C call steps a chunk of rows (the GIL
  is released), bit-identical to ``mj_step`` on one ``MjData`` per env. No Python per env.
  The chunks run on MuJoCo's C pool, on Python threads, or on the calling thread alone
  (``_Layout``), whichever is fastest on the machine as it is (``_Chooser``). Gymnasium-exact
  for the tasks whose readings are state (HalfCheetah, Hopper); not for Ant, whose
  ``cfrc_ext`` needs ``mj_rnePostConstraint`` after the step.
``ThreadEngine``: one ``MjData`` per env, ``mj_step`` per env on a small team of Python threads
  (the bindings release the GIL in ``mj_step``). Gymnasium-exact for every task, Ant included.
``RolloutEngine``: one ``mujoco.rollout`` call per step from a state vector WITHOUT the solver
  warm start, so contact solutions differ from Gymnasium's in the last bits and trajectories
  drift apart chaotically after ~100 steps. Kept for comparison; not Gymnasium-exact.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time

import mujoco
import numpy as np

_QPOS, _QVEL = mujoco.mjtState.mjSTATE_QPOS, mujoco.mjtState.mjSTATE_QVEL


class _Layout:
    """N envs as K ``mujoco.batch.Batch`` chunks (rows ``lo:hi`` each).

    K=1: one Batch on MuJoCo's own C thread pool (``nthread``), whose workers spin for a while
    between calls: the cheapest hand-off when a core is free, CPU taken from everyone else
    when none is. K>1: one C thread per chunk, the chunks claimed by the caller and helper
    Python threads (``_ThreadTeam``; ``Batch.step`` releases the GIL); nothing spins, and on a
    busy machine the caller steps the chunks a helper has not claimed yet.
    """

    def __init__(self, model, num_envs: int, chunks: int, num_threads: int, frame_skip: int):
        from mujoco import batch

        self.frame_skip, self.nq = frame_skip, model.nq
        bounds = np.linspace(0, num_envs, chunks + 1).round().astype(int)
        self.spans = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
        nthread = max(1, num_threads) if chunks == 1 else 1
        self.batches = [batch.Batch(model, hi - lo, nthread=nthread) for lo, hi in self.spans]
        (q0, nq), (v0, nv) = (self.batches[0]._component(c) for c in (_QPOS, _QVEL))
        if v0 != q0 + nq:  # qpos and qvel are adjacent in every mjSTATE layout so far
            raise RuntimeError(f"unexpected mujoco.batch state layout: qpos {q0}+{nq}, qvel {v0}")
        self.views = [b.state[:, q0 : q0 + nq + nv] for b in self.batches]
        self.ctrls = [b.bind("ctrl") for b in self.batches]
        for b in self.batches:
            b.reset()
        self.team = _ThreadTeam(min(num_threads, chunks)) if chunks > 1 else None
        self._actions = np.zeros((num_envs, model.nu))
        self._ids: list[np.ndarray | None] = [None] * chunks

    def _step_chunk(self, k: int) -> None:
        lo, hi = self.spans[k]
        ids = self._ids[k]
        if ids is None:
            self.ctrls[k][...] = self._actions[lo:hi]
        elif len(ids):
            self.ctrls[k][ids] = self._actions[lo:hi][ids]
        else:
            return
        self.batches[k].step(ids, self.frame_skip)

    def step(self, actions: np.ndarray, ids: np.ndarray | None) -> None:
        self._actions[...] = actions
        for k, (lo, hi) in enumerate(self.spans):
            self._ids[k] = (
                None if ids is None else (ids[(ids >= lo) & (ids < hi)] - lo).astype(np.int32)
            )
        if self.team is None:
            self._step_chunk(0)
        else:
            self.team.run(self._step_chunk, len(self.spans))

    def reset(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        nq = self.nq
        for (lo, hi), b, view in zip(self.spans, self.batches, self.views):
            mine = (ids >= lo) & (ids < hi)
            if mine.any():
                local = (ids[mine] - lo).astype(np.int32)
                b.reset(local, stage=mujoco.mjtStage.mjSTAGE_NONE)
                view[local, :nq], view[local, nq:] = qpos[mine], qvel[mine]
                b.forward(local)

    def read_qpv(self, out: np.ndarray) -> None:
        for (lo, hi), view in zip(self.spans, self.views):
            out[lo:hi] = view

    def copy_state_from(self, other: _Layout) -> None:
        """Every env's full integration state (warm start, ctrl, time included): exact."""
        rows = np.concatenate([b.state for b in other.batches])
        for (lo, hi), b in zip(self.spans, self.batches):
            b.state[...] = rows[lo:hi]

    def close(self) -> None:
        if self.team is not None:
            self.team.close()


class _Chooser:
    """Picks the fastest of several layouts from the wall time per step cycle, re-checked.

    All layouts give bit-identical results, so only speed is at stake, and it depends on how
    many cores are free (MuJoCo's spinning pool wins on an idle machine, Python threads or a
    single thread on a busy one). Each layout is timed over ``window`` steps (the mean, since
    throughput is what counts, of all but the first quarter, a warm-up, leaving out pauses of
    the caller); every ``period``
    steps the next other layout is tried again, and kept if it is at least 5% faster than the
    current one's last window.
    """

    def __init__(self, num_layouts: int, window: int = 64, period: int = 4096):
        self.num_layouts, self.window, self.period = num_layouts, window, period
        self.home, self.current = 0, 0
        self.mean: list[float | None] = [None] * num_layouts
        self._times: list[int] = []
        self._since_probe, self._next = 0, 0

    def record(self, ns: int) -> int:
        """Record one step cycle of ``current``; return the layout for the next step."""
        self._times.append(ns)
        if len(self._times) < self.window:
            return self.current
        times = np.asarray(self._times[self.window // 4 :], np.float64)
        # Cycles over 4x the median are pauses of the caller (a training update, a benchmark
        # timing other contenders), not costs of this layout.
        mean = float(times[times <= 4 * np.median(times)].mean())
        self._times.clear()
        self.mean[self.current] = mean
        if self.current != self.home:  # a probe just ended
            if mean < 0.95 * self.mean[self.home]:
                self.home = self.current
            self.current, self._since_probe = self.home, 0
        else:
            self._since_probe += self.window
        if self.current == self.home:
            untimed = [i for i, m in enumerate(self.mean) if m is None]
            if untimed:
                self.current = untimed[0]
            elif self._since_probe >= self.period:
                others = [i for i in range(self.num_layouts) if i != self.home]
                self._next = (self._next + 1) % len(others)
                self.current = others[self._next]
        return self.current


class BatchEngine:
    """``mujoco.batch`` over N envs: one C call per chunk of envs, no Python per env.

    ``chunks=K``: the ``_Layout`` with K chunks (1: MuJoCo's pool; K>1: Python threads).
    ``chunks=None`` with ``num_threads > 1``: three layouts (1 chunk on MuJoCo's pool of
    ``num_threads``; ``num_threads`` chunks on Python threads; 1 chunk on the calling thread
    alone), the fastest picked and re-checked as the machine's load changes (``_Chooser``);
    the state moves between them exactly, so results never depend on the choice.
    """

    supports_cfrc_ext = False

    def __init__(
        self,
        model: mujoco.MjModel,
        num_envs: int,
        num_threads: int,
        frame_skip: int,
        chunks: int | None = None,
    ):
        self.model, self.frame_skip = model, frame_skip
        if chunks is None and num_threads > 1 and num_envs > 1:  # (chunks, threads) each
            plans = [(1, num_threads), (min(num_threads, num_envs), num_threads), (1, 1)]
        else:
            plans = [(max(1, min(chunks or 1, num_envs)), num_threads)]
        self.layouts = [_Layout(model, num_envs, k, t, frame_skip) for k, t in plans]
        self.plans = plans
        self.chooser = _Chooser(len(plans)) if len(plans) > 1 else None
        self.active, self.switches = 0, 0
        self._last: int | None = None  # start of the last step (chooser timing)
        self.qpv = np.zeros((num_envs, model.nq + model.nv))
        self.layouts[0].read_qpv(self.qpv)

    def step(self, actions: np.ndarray, ids: np.ndarray | None) -> None:
        if self.chooser is not None:
            # Timed: the cycle from one step to the next, which includes what the caller does
            # in between (spinning pool workers slow that down on a busy machine) and steps of
            # a subset of envs (next-step autoresets), as the workload mixes them.
            now = time.perf_counter_ns()
            if self._last is not None:
                nxt = self.chooser.record(now - self._last)
                if nxt != self.active:
                    self.layouts[nxt].copy_state_from(self.layouts[self.active])
                    self.active = nxt
                    self.switches += 1
            self._last = now
        layout = self.layouts[self.active]
        layout.step(actions, ids)
        layout.read_qpv(self.qpv)

    def reset(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        layout = self.layouts[self.active]
        layout.reset(ids, qpos, qvel)
        layout.read_qpv(self.qpv)
        self._last = None

    def close(self) -> None:
        for layout in self.layouts:
            layout.close()


class _ThreadTeam:
    """Runs ``fn(i)`` for i in range(n) on the caller plus helper threads, dynamically.

    Items are claimed from a shared counter (``next`` on ``itertools.count`` is atomic under
    the GIL), so an idle machine splits the batch across threads while an oversubscribed one
    never waits for a helper that has not been scheduled yet: the caller simply claims the
    remaining items itself. The caller then waits only for items a helper is in the middle of.
    """

    def __init__(self, num_threads: int):
        self._inboxes = [queue.SimpleQueue() for _ in range(max(0, num_threads - 1))]
        self._busy = [threading.Lock() for _ in self._inboxes]
        self._errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._loop, args=(box, busy), daemon=True)
            for box, busy in zip(self._inboxes, self._busy)
        ]
        for t in self._threads:
            t.start()

    def _drain(self, fn, counter, n):
        while (i := next(counter)) < n:
            fn(i)

    def _loop(self, inbox, busy):
        while True:
            job = inbox.get()
            if job is None:
                return
            with busy:
                try:
                    self._drain(*job)
                except BaseException as exc:  # surfaced in the caller
                    self._errors.append(exc)

    def run(self, fn, n: int) -> None:
        counter = itertools.count()
        for box in self._inboxes:
            box.put((fn, counter, n))
        try:
            self._drain(fn, counter, n)
        finally:
            for busy in self._busy:  # wait for items a helper already claimed
                with busy:
                    pass
        if self._errors:
            error, self._errors = self._errors[0], []
            raise error

    def close(self) -> None:
        for box in self._inboxes:
            box.put(None)


class ThreadEngine:
    """One ``MjData`` per env, ``mj_step`` per env on a team of threads (GIL released)."""

    supports_cfrc_ext = True

    def __init__(
        self,
        model: mujoco.MjModel,
        num_envs: int,
        num_threads: int,
        frame_skip: int,
        cfrc_ext: bool,
    ):
        self.model, self.frame_skip, self._with_cfrc = model, frame_skip, cfrc_ext
        self.datas = [mujoco.MjData(model) for _ in range(num_envs)]
        self._ctrl_views = [d.ctrl for d in self.datas]  # views stay valid: MjData never moves
        self._spec = int(_QPOS | _QVEL)
        self.qpv = np.zeros((num_envs, model.nq + model.nv))
        self.cfrc_ext = np.zeros((num_envs, model.nbody, 6))
        self.xy = np.zeros((num_envs, 2))
        self._actions = np.zeros((num_envs, model.nu))
        self._active = np.ones(num_envs, bool)
        self._team = _ThreadTeam(min(num_threads, num_envs))
        for i in range(num_envs):
            self._gather(i)

    def _gather(self, i: int) -> None:
        d = self.datas[i]
        mujoco.mj_getState(self.model, d, self.qpv[i], self._spec)
        if self._with_cfrc:
            self.cfrc_ext[i] = d.cfrc_ext
            self.xy[i] = d.xpos[1, :2]

    def _step_one(self, i: int) -> None:
        if not self._active[i]:
            return
        m, d = self.model, self.datas[i]
        self._ctrl_views[i][:] = self._actions[i]  # cached view: d.ctrl builds a new array
        mujoco.mj_step(m, d, self.frame_skip)
        if self._with_cfrc:  # as Gymnasium's MujocoEnv does after every step
            mujoco.mj_rnePostConstraint(m, d)
        self._gather(i)

    def step(self, actions: np.ndarray, ids: np.ndarray | None) -> None:
        self._actions[:] = actions
        self._active[:] = ids is None
        if ids is not None:
            self._active[ids] = True
        self._team.run(self._step_one, len(self.datas))

    def reset(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        for k, i in enumerate(ids):
            d = self.datas[i]
            mujoco.mj_resetData(self.model, d)
            d.qpos[:], d.qvel[:] = qpos[k], qvel[k]
            mujoco.mj_forward(self.model, d)
            self._gather(i)

    def close(self) -> None:
        self._team.close()


class RolloutEngine:
    """One ``mujoco.rollout`` call per step (warm start zeroed: not Gymnasium-exact)."""

    supports_cfrc_ext = False

    def __init__(self, model: mujoco.MjModel, num_envs: int, num_threads: int, frame_skip: int):
        from mujoco import rollout

        m, n, fs = model, num_envs, frame_skip
        self.model, self.frame_skip = m, fs
        self._full = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)
        self._rollout = rollout.Rollout(nthread=num_threads if num_threads > 1 else 0)
        self._datas = [mujoco.MjData(m) for _ in range(max(1, num_threads))]
        self._scratch = mujoco.MjData(m)
        self._models = [m] * n
        self._state = np.zeros((n, mujoco.mj_stateSize(m, self._full)))
        self._ctrl = np.zeros((n, fs, m.nu))
        self._out = np.zeros((n, fs, self._state.shape[1]))
        self._sensor = np.zeros((n, fs, m.nsensordata))
        # Two chunks per thread: rollout's default (n / (10 * nthread)) is for large batches.
        self._chunk = max(1, n // max(1, 2 * num_threads))
        self.qpv = self._state[:, 1 : 1 + m.nq + m.nv]  # FULLPHYSICS = [time, qpos, qvel, ...]
        self.reset(np.arange(n), np.tile(self._scratch.qpos, (n, 1)), np.zeros((n, m.nv)))

    def step(self, actions: np.ndarray, ids: np.ndarray | None) -> None:
        m, fs = self.model, self.frame_skip
        if ids is None:
            self._ctrl[:] = actions[:, None, :]
            state0, ctrl, out, sensor = self._state, self._ctrl, self._out, self._sensor
        elif len(ids) == 0:  # e.g. every env is autoresetting: rollout must not see 0 envs
            return
        else:
            k = len(ids)
            state0, ctrl = self._state[ids], np.repeat(actions[ids, None, :], fs, axis=1)
            out, sensor = np.zeros((k, fs, self._state.shape[1])), np.zeros((k, fs, m.nsensordata))
        self._rollout.rollout(
            self._models[: len(state0)],
            self._datas,
            state0,
            ctrl,
            skip_checks=True,
            nstep=fs,
            state=out,
            sensordata=sensor,
            chunk_size=self._chunk,
        )
        self._state[slice(None) if ids is None else ids] = out[:, -1]

    def reset(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        m, d = self.model, self._scratch
        for k, i in enumerate(ids):
            mujoco.mj_resetData(m, d)
            d.qpos[:], d.qvel[:] = qpos[k], qvel[k]
            mujoco.mj_forward(m, d)
            mujoco.mj_getState(m, d, self._state[i], self._full)

    def close(self) -> None:
        if self._rollout is not None:
            self._rollout.close()
            self._rollout = None
