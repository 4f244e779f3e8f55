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
  warm start included, is one row of a state table; one C call steps the selected rows on a C
  thread pool (the GIL is released), bit-identical to ``mj_step`` on one ``MjData`` per env.
  No Python per env. Gymnasium-exact for the tasks whose readings are state (HalfCheetah,
  Hopper); not for Ant, whose ``cfrc_ext`` needs ``mj_rnePostConstraint`` after the step.
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

import mujoco
import numpy as np

_QPOS, _QVEL = mujoco.mjtState.mjSTATE_QPOS, mujoco.mjtState.mjSTATE_QVEL


class BatchEngine:
    """``mujoco.batch.Batch`` over N envs: one C call per chunk of envs, no Python per env.

    ``chunks=1``: one ``Batch`` whose own C thread pool (``num_threads``) splits the envs.
    ``chunks=K>1``: K ``Batch`` objects of ~N/K envs on one C thread each, claimed dynamically
    by the caller and ``num_threads - 1`` Python helper threads (``_ThreadTeam``; the GIL is
    released inside ``Batch.step``): on a busy machine the caller steps the chunks a helper has
    not claimed yet instead of waiting for it to be scheduled.
    """

    supports_cfrc_ext = False

    def __init__(
        self,
        model: mujoco.MjModel,
        num_envs: int,
        num_threads: int,
        frame_skip: int,
        chunks: int = 1,
    ):
        from mujoco import batch

        self.model, self.frame_skip = model, frame_skip
        chunks = max(1, min(chunks, num_envs))
        bounds = np.linspace(0, num_envs, chunks + 1).round().astype(int)
        self._spans = list(zip(bounds[:-1], bounds[1:]))
        nthread = max(1, num_threads) if chunks == 1 else 1
        self._batches = [batch.Batch(model, int(hi - lo), nthread=nthread) for lo, hi in self._spans]
        (q0, nq), (v0, nv) = (self._batches[0]._component(c) for c in (_QPOS, _QVEL))
        if v0 != q0 + nq:  # qpos and qvel are adjacent in every mjSTATE layout so far
            raise RuntimeError(f"unexpected mujoco.batch state layout: qpos {q0}+{nq}, qvel {v0}")
        self._views = [b.state[:, q0 : q0 + nq + nv] for b in self._batches]
        self._ctrls = [b.bind("ctrl") for b in self._batches]
        for b in self._batches:
            b.reset()
        if chunks == 1:  # a view of the live state rows: nothing to gather
            self.qpv, self._team = self._views[0], None
        else:
            self.qpv = np.concatenate(self._views)
            self._team = _ThreadTeam(min(num_threads, chunks))
        self._actions = np.zeros((num_envs, model.nu))
        self._chunk_ids: list[np.ndarray | None] = [None] * chunks

    def _step_chunk(self, k: int) -> None:
        (lo, hi), ids = self._spans[k], self._chunk_ids[k]
        if ids is None:
            self._ctrls[k][...] = self._actions[lo:hi]
        elif len(ids):
            self._ctrls[k][ids] = self._actions[lo:hi][ids]
        else:
            return
        self._batches[k].step(ids, self.frame_skip)
        self.qpv[lo:hi] = self._views[k]

    def step(self, actions: np.ndarray, ids: np.ndarray | None) -> None:
        if self._team is None:
            if ids is None:
                self._ctrls[0][...] = actions
                self._batches[0].step(None, self.frame_skip)
            elif len(ids):
                self._ctrls[0][ids] = actions[ids]
                self._batches[0].step(ids.astype(np.int32), self.frame_skip)
            return
        self._actions[...] = actions
        for k, (lo, hi) in enumerate(self._spans):
            self._chunk_ids[k] = (
                None if ids is None else (ids[(ids >= lo) & (ids < hi)] - lo).astype(np.int32)
            )
        self._team.run(self._step_chunk, len(self._spans))

    def reset(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        nq = self.model.nq
        for k, ((lo, hi), b, view) in enumerate(zip(self._spans, self._batches, self._views)):
            mine = (ids >= lo) & (ids < hi)
            if not mine.any():
                continue
            local = (ids[mine] - lo).astype(np.int32)
            b.reset(local, stage=mujoco.mjtStage.mjSTAGE_NONE)
            view[local, :nq], view[local, nq:] = qpos[mine], qvel[mine]
            b.forward(local)
            if self._team is not None:
                self.qpv[lo:hi] = view

    def close(self) -> None:
        if self._team is not None:
            self._team.close()


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
