"""``MujocoVectorEnv``: N MuJoCo instances stepped in parallel C threads, Gymnasium-exact.

Each instance keeps its own ``MjData`` (so the solver warm start carries over between steps,
exactly as in Gymnasium). A step sets the controls, then a small team of threads calls
``mujoco.mj_step(model, data, nstep=frame_skip)`` over contiguous slices of the batch; the
MuJoCo bindings release the GIL inside ``mj_step``, so the physics runs in parallel. The
formulas on top are vectorised numpy (``tasks.py``).

Why not ``mujoco.rollout``: it restarts every rollout from a state vector without the solver
warm start (``qacc_warmstart``), which changes contact solutions in the last bits and makes
trajectories drift away from Gymnasium's after ~100 steps (measured: 2e-4 at step 120 on
HalfCheetah). The parity requirement wins; ``benchmarks/pool.py`` reports both.

Conventions follow Gymnasium's vector API (1.x): ``reset(seed)`` seeds env ``i`` with
``seed + i``; ``step`` returns ``terminated`` and ``truncated`` separately (truncation after
``max_episode_steps``, like ``TimeLimit``); autoreset is "next step": the step after an
episode ends resets that env (its action is ignored, reward 0, both flags False).
"""

from __future__ import annotations

import queue
import threading
from typing import Sequence

import mujoco
import numpy as np

from jaxagent.envs.robot.tasks import TaskSpec, get_task, gymnasium_asset


class _ThreadTeam:
    """Runs ``fn(lo, hi)`` over ``num_threads`` contiguous slices; the caller runs slice 0."""

    def __init__(self, num_items: int, num_threads: int):
        num_threads = max(1, min(num_threads, num_items))
        bounds = np.linspace(0, num_items, num_threads + 1).round().astype(int)
        self.slices = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        self._inboxes = [queue.SimpleQueue() for _ in self.slices[1:]]
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._loop, args=(box, sl), daemon=True)
            for box, sl in zip(self._inboxes, self.slices[1:])
        ]
        for t in self._threads:
            t.start()

    def _loop(self, inbox, sl):
        while True:
            fn = inbox.get()
            if fn is None:
                return
            try:
                fn(*sl)
                self._done.put(None)
            except BaseException as exc:  # surfaced in the caller
                self._done.put(exc)

    def run(self, fn) -> None:
        for box in self._inboxes:
            box.put(fn)
        error = None
        try:
            fn(*self.slices[0])
        except BaseException as exc:
            error = exc
        for _ in self._inboxes:
            result = self._done.get()
            error = error or result
        if error is not None:
            raise error

    def close(self) -> None:
        for box in self._inboxes:
            box.put(None)


class MujocoVectorEnv:
    """Batched Gymnasium-v5 locomotion (``ArrayEnv``): HalfCheetah-v5, Hopper-v5, Ant-v5.

    Args:
      task: task name (see ``tasks.TASKS``).
      num_envs: batch size N.
      num_threads: physics threads (the calling thread is one of them).
      max_episode_steps: truncation limit (Gymnasium's TimeLimit default: 1000).
    """

    def __init__(self, task: str, num_envs: int, num_threads: int = 2, max_episode_steps: int | None = None):
        if num_envs < 1:
            raise ValueError(f"num_envs={num_envs} must be >= 1")
        self.spec: TaskSpec = get_task(task)
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps or self.spec.max_episode_steps
        self.model = mujoco.MjModel.from_xml_path(gymnasium_asset(self.spec.xml))
        self.datas = [mujoco.MjData(self.model) for _ in range(num_envs)]
        m = self.model
        self.init_qpos = self.datas[0].qpos.ravel().copy()
        self.init_qvel = self.datas[0].qvel.ravel().copy()
        self.dt = m.opt.timestep * self.spec.frame_skip
        self.act_dim = m.nu
        self.action_low, self.action_high = m.actuator_ctrlrange.T.astype(np.float32)
        self._rngs = [np.random.default_rng() for _ in range(num_envs)]
        self._elapsed = np.zeros(num_envs, np.int64)
        self._needs_reset = np.zeros(num_envs, bool)
        self._team = _ThreadTeam(num_envs, num_threads)
        self._spec_qpv = int(mujoco.mjtState.mjSTATE_QPOS | mujoco.mjtState.mjSTATE_QVEL)
        self._qpv = np.zeros((num_envs, m.nq + m.nv))
        self._cfrc = np.zeros((num_envs, m.nbody, 6))
        self._xy = np.zeros((num_envs, 2))
        self._actions = np.zeros((num_envs, m.nu))
        self._active = np.ones(num_envs, bool)
        self.obs_dim = self.spec.observe(self._readings(self._actions)).shape[1]

    # ------------------------------------------------------------------ readings

    def _gather(self, i: int) -> None:
        d = self.datas[i]
        mujoco.mj_getState(self.model, d, self._qpv[i], self._spec_qpv)
        if self.spec.needs_cfrc_ext:
            self._cfrc[i] = d.cfrc_ext
            self._xy[i] = d.xpos[1, :2]

    def _position(self) -> np.ndarray:
        return self._xy.copy() if self.spec.position == "xy_body1" else self._qpv[:, 0].copy()

    def _readings(self, action, pos_before=None) -> dict:
        nq = self.model.nq
        pos_after = self._position()
        return {
            "qpv": self._qpv, "qpos": self._qpv[:, :nq], "qvel": self._qpv[:, nq:], "cfrc_ext": self._cfrc,
            "action": action, "dt": self.dt, "pos_after": pos_after,
            "pos_before": pos_after if pos_before is None else pos_before,
        }

    # ------------------------------------------------------------------ reset

    def _reset_one(self, i: int, seed: int | None) -> None:
        if seed is not None:
            self._rngs[i] = np.random.default_rng(seed)  # == gymnasium.utils.seeding.np_random
        rng, m, d, s = self._rngs[i], self.model, self.datas[i], self.spec
        mujoco.mj_resetData(m, d)
        lo, hi = -s.reset_noise_scale, s.reset_noise_scale
        qpos = self.init_qpos + rng.uniform(low=lo, high=hi, size=m.nq)
        if s.reset_noise == "uniform":
            qvel = self.init_qvel + rng.uniform(low=lo, high=hi, size=m.nv)
        else:
            qvel = self.init_qvel + s.reset_noise_scale * rng.standard_normal(m.nv)
        d.qpos[:], d.qvel[:] = qpos, qvel
        mujoco.mj_forward(m, d)
        self._elapsed[i] = 0
        self._needs_reset[i] = False
        self._gather(i)

    def reset(self, seed: int | Sequence[int] | None = None, options=None) -> tuple[np.ndarray, dict]:
        """Reset all envs. ``seed``: int (env i gets seed + i), a list of N seeds, or None."""
        del options
        if seed is None or isinstance(seed, (int, np.integer)):
            seeds = [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset got {len(seeds)} seeds for num_envs={self.num_envs}")
        for i, s in enumerate(seeds):
            self._reset_one(i, s)
        obs = self.spec.observe(self._readings(self._actions))
        return obs, {}

    # ------------------------------------------------------------------ step

    def _step_slice(self, lo: int, hi: int) -> None:
        m, fs, rne = self.model, self.spec.frame_skip, self.spec.needs_cfrc_ext
        step, actions, active = mujoco.mj_step, self._actions, self._active
        for i in range(lo, hi):
            if not active[i]:
                continue
            d = self.datas[i]
            d.ctrl[:] = actions[i]
            step(m, d, fs)
            if rne:
                mujoco.mj_rnePostConstraint(m, d)
            self._gather(i)

    def step(self, actions: np.ndarray):
        """Step all envs. ``actions [N, act_dim]``; returns obs, reward, terminated, truncated, info."""
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs, self.act_dim):
            raise ValueError(
                f"actions have shape {actions.shape}; expected (num_envs, act_dim) = "
                f"({self.num_envs}, {self.act_dim})"
            )
        return self._step(actions, np.ones(self.num_envs, bool))

    def step_envs(self, env_ids: np.ndarray, actions: np.ndarray):
        """Step only ``env_ids [K]`` with ``actions [K, act_dim]``; returns arrays over those K."""
        env_ids = np.asarray(env_ids, np.int64)
        if env_ids.ndim != 1 or len(np.unique(env_ids)) != len(env_ids):
            raise ValueError(f"env_ids {env_ids.tolist()} must be a 1-D list without repeats")
        if env_ids.size and (env_ids.min() < 0 or env_ids.max() >= self.num_envs):
            raise ValueError(f"env_ids {env_ids.tolist()} out of range 0..{self.num_envs - 1}")
        actions = np.asarray(actions)
        if actions.shape != (len(env_ids), self.act_dim):
            raise ValueError(
                f"actions have shape {actions.shape}; expected (len(env_ids), act_dim) = "
                f"({len(env_ids)}, {self.act_dim})"
            )
        full = np.zeros((self.num_envs, self.act_dim), actions.dtype)
        full[env_ids] = actions
        selected = np.zeros(self.num_envs, bool)
        selected[env_ids] = True
        obs, reward, terminated, truncated, info = self._step(full, selected)
        return obs[env_ids], reward[env_ids], terminated[env_ids], truncated[env_ids], info

    def _step(self, actions: np.ndarray, selected: np.ndarray):
        resetting = self._needs_reset & selected
        pos_before = self._position()
        self._actions[:] = actions
        np.logical_and(selected, ~resetting, out=self._active)
        self._team.run(self._step_slice)
        for i in np.flatnonzero(resetting):
            self._reset_one(i, None)
        r = self._readings(actions, pos_before)
        obs = self.spec.observe(r)
        reward = self.spec.reward(r).astype(np.float64)
        terminated = self.spec.terminated(r)
        self._elapsed += selected
        truncated = self._elapsed >= self.max_episode_steps
        reward[resetting], terminated[resetting], truncated[resetting] = 0.0, False, False
        self._elapsed[resetting] = 0
        self._needs_reset = np.where(selected, terminated | truncated, self._needs_reset)
        return obs, reward, terminated, truncated, {}

    def close(self) -> None:
        self._team.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
