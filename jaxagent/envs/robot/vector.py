"""``MujocoVectorEnv``: N MuJoCo instances stepped in parallel C threads, Gymnasium-exact.

Each instance keeps its own ``MjData`` (so the solver warm start carries over between steps,
exactly as in Gymnasium). A step sets the controls, then a small team of threads calls
``mujoco.mj_step(model, data, nstep=frame_skip)``, claiming envs from a shared counter; the
MuJoCo bindings release the GIL inside ``mj_step``, so the physics runs in parallel. The
formulas on top are vectorised numpy (``tasks.py``).

Two engines:
  ``engine="exact"`` (default): as above; bitwise identical to Gymnasium (tested step by step).
  ``engine="rollout"``: one ``mujoco.rollout`` call steps the whole batch in MuJoCo's C thread
    pool (no Python per env). Faster, but ``mujoco.rollout`` restarts every call from a state
    vector WITHOUT the solver warm start (``qacc_warmstart`` is zeroed), so contact solutions
    differ from Gymnasium's in the last bits and trajectories drift apart chaotically after
    ~100 steps (measured on HalfCheetah: 4e-14 at step 40, 2e-4 at step 120). Same physics,
    same formulas, not bitwise the same trajectory. Not available for Ant (its observation
    needs ``cfrc_ext``, which rollout does not return).

Conventions follow Gymnasium's vector API (1.x): ``reset(seed)`` seeds env ``i`` with
``seed + i``; ``step`` returns ``terminated`` and ``truncated`` separately (truncation after
``max_episode_steps``, like ``TimeLimit``); autoreset is "next step": the step after an
episode ends resets that env (its action is ignored, reward 0, both flags False).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Sequence

import mujoco
import numpy as np

from jaxagent.envs.robot.tasks import TaskSpec, get_task, gymnasium_asset


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


class MujocoVectorEnv:
    """Batched Gymnasium-v5 locomotion (``ArrayEnv``): HalfCheetah-v5, Hopper-v5, Ant-v5.

    Args:
      task: task name (see ``tasks.TASKS``).
      num_envs: batch size N.
      num_threads: physics threads (the calling thread is one of them).
      max_episode_steps: truncation limit (Gymnasium's TimeLimit default: 1000).
    """

    def __init__(
        self,
        task: str,
        num_envs: int,
        num_threads: int = 2,
        max_episode_steps: int | None = None,
        engine: str = "exact",
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs={num_envs} must be >= 1")
        if engine not in ("exact", "rollout"):
            raise ValueError(
                f"engine={engine!r}; choose 'exact' (Gymnasium-identical) or 'rollout'"
            )
        self.spec: TaskSpec = get_task(task)
        if engine == "rollout" and self.spec.needs_cfrc_ext:
            raise ValueError(
                f"engine='rollout' cannot run {task}: its observation reads cfrc_ext, which "
                "mujoco.rollout does not return; use engine='exact'"
            )
        self.engine = engine
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps or self.spec.max_episode_steps
        self.model = mujoco.MjModel.from_xml_path(gymnasium_asset(self.spec.xml))
        self.datas = [mujoco.MjData(self.model) for _ in range(num_envs)]
        self._ctrl_views = [d.ctrl for d in self.datas]  # views stay valid: MjData never moves
        m = self.model
        self.init_qpos = self.datas[0].qpos.ravel().copy()
        self.init_qvel = self.datas[0].qvel.ravel().copy()
        self.dt = m.opt.timestep * self.spec.frame_skip
        self.act_dim = m.nu
        self.action_low, self.action_high = m.actuator_ctrlrange.T.astype(np.float32)
        self._rngs = [np.random.default_rng() for _ in range(num_envs)]
        self._elapsed = np.zeros(num_envs, np.int64)
        self._needs_reset = np.zeros(num_envs, bool)
        self._team = _ThreadTeam(min(num_threads, num_envs))
        self._spec_qpv = int(mujoco.mjtState.mjSTATE_QPOS | mujoco.mjtState.mjSTATE_QVEL)
        self._qpv = np.zeros((num_envs, m.nq + m.nv))
        self._cfrc = np.zeros((num_envs, m.nbody, 6))
        self._xy = np.zeros((num_envs, 2))
        self._actions = np.zeros((num_envs, m.nu))
        self._active = np.ones(num_envs, bool)
        self._all = np.ones(num_envs, bool)
        self.obs_dim = self.spec.observe(self._readings(self._actions)).shape[1]
        self._make_spaces()
        if engine == "rollout":
            self._init_rollout(num_threads)

    def _make_spaces(self) -> None:
        """Gymnasium spaces, as ``gymnasium.vector.SyncVectorEnv`` reports them for this task."""
        from gymnasium import spaces
        from gymnasium.vector.utils import batch_space

        bounds = self.model.actuator_ctrlrange.copy().astype(np.float32)
        self.single_action_space = spaces.Box(low=bounds[:, 0], high=bounds[:, 1], dtype=np.float32)
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float64)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

    def _init_rollout(self, num_threads: int) -> None:
        from mujoco import rollout

        m, n, fs = self.model, self.num_envs, self.spec.frame_skip
        self._full = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)
        self._rollout = rollout.Rollout(nthread=num_threads if num_threads > 1 else 0)
        self._rollout_datas = [mujoco.MjData(m) for _ in range(max(1, num_threads))]
        self._models = [m] * n
        self._state = np.zeros((n, mujoco.mj_stateSize(m, self._full)))
        self._ctrl = np.zeros((n, fs, m.nu))
        self._out = np.zeros((n, fs, self._state.shape[1]))
        self._sensor = np.zeros((n, fs, m.nsensordata))
        # Two chunks per thread: rollout's default (n / (10 * nthread)) is for large batches.
        self._chunk = max(1, n // max(1, 2 * num_threads))

    def _rollout_step(self, ids: np.ndarray) -> None:
        m, fs = self.model, self.spec.frame_skip
        if len(ids) == 0:  # e.g. every env is autoresetting; rollout must not see an empty batch
            return
        self._ctrl[ids] = self._actions[ids, None, :]
        if len(ids) == self.num_envs:
            state0, ctrl, out, sensor, models = (
                self._state,
                self._ctrl,
                self._out,
                self._sensor,
                self._models,
            )
        else:
            k = len(ids)
            state0, ctrl, models = self._state[ids], self._ctrl[ids], self._models[:k]
            out, sensor = np.zeros((k, fs, self._state.shape[1])), np.zeros((k, fs, m.nsensordata))
        self._rollout.rollout(
            models,
            self._rollout_datas,
            state0,
            ctrl,
            skip_checks=True,
            nstep=fs,
            state=out,
            sensordata=sensor,
            chunk_size=self._chunk,
        )
        self._state[ids] = out[:, -1]
        self._qpv[ids] = self._state[
            ids, 1 : 1 + m.nq + m.nv
        ]  # FULLPHYSICS = [time, qpos, qvel, ...]

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
            "qpv": self._qpv,
            "qpos": self._qpv[:, :nq],
            "qvel": self._qpv[:, nq:],
            "cfrc_ext": self._cfrc,
            "action": action,
            "dt": self.dt,
            "pos_after": pos_after,
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
        if self.engine == "rollout":
            mujoco.mj_getState(m, d, self._state[i], self._full)

    def reset(
        self, seed: int | Sequence[int] | None = None, options=None
    ) -> tuple[np.ndarray, dict]:
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

    def _step_one(self, i: int) -> None:
        if not self._active[i]:
            return
        m, d = self.model, self.datas[i]
        self._ctrl_views[i][:] = self._actions[i]  # cached view: d.ctrl builds a new array
        mujoco.mj_step(m, d, self.spec.frame_skip)
        if self.spec.needs_cfrc_ext:
            mujoco.mj_rnePostConstraint(m, d)
        self._gather(i)

    def step(self, actions: np.ndarray):
        """Step all envs. ``actions [N, act_dim]`` -> obs, reward, terminated, truncated, info."""
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs, self.act_dim):
            raise ValueError(
                f"actions have shape {actions.shape}; expected (num_envs, act_dim) = "
                f"({self.num_envs}, {self.act_dim})"
            )
        return self._step(actions, self._all)

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
        if self.engine == "rollout":
            self._rollout_step(np.flatnonzero(self._active))
        else:
            self._team.run(self._step_one, self.num_envs)
        if resetting.any():
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
        if getattr(self, "_rollout", None) is not None:
            self._rollout.close()
            self._rollout = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
