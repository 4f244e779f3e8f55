"""``MujocoVectorEnv``: N Gymnasium-v5 MuJoCo instances stepped as one batch, Gymnasium-exact.

The physics is one of the engines in ``engines.py``; the formulas on top (observation, reward,
termination: ``tasks.py``) are vectorised numpy over the whole batch, evaluated on live views of
the engine's state, so a step costs one engine call plus a fixed handful of numpy operations,
whatever N is.

Engines (``engine=``):
  ``"batch"`` (default where available): ``mujoco.batch`` steps every env's full integration
    state, solver warm start included, in one C call per chunk of envs (no Python per env),
    on MuJoCo's C pool, Python threads or the calling thread, whichever is fastest on the
    machine as it is; bit-identical to Gymnasium (tested step by step). HalfCheetah-v5 and
    Hopper-v5; needs MuJoCo >= 4.0.
  ``"threads"``: one ``MjData`` per env and ``mj_step`` per env on Python threads (the GIL is
    released inside); bit-identical to Gymnasium. Every task; the default for Ant-v5, whose
    observation reads ``cfrc_ext`` (computed by ``mj_rnePostConstraint`` after the step).
  ``"rollout"``: one ``mujoco.rollout`` call per step, which zeroes the solver warm start, so
    contact solutions differ from Gymnasium's in the last bits and trajectories drift apart
    chaotically after ~100 steps (HalfCheetah: 4e-14 at step 40, 2e-4 at step 120). Same
    physics and formulas, not the same trajectory. Kept for comparison; not for Ant.

Conventions follow Gymnasium's vector API (1.x): ``reset(seed)`` seeds env ``i`` with
``seed + i``; ``step`` returns ``terminated`` and ``truncated`` separately (truncation after
``max_episode_steps``, like ``TimeLimit``); autoreset is "next step": the step after an
episode ends resets that env (its action is ignored, reward 0, both flags False).
"""

from __future__ import annotations

from collections.abc import Sequence

import mujoco
import numpy as np

from jaxagent.envs.robot.engines import BatchEngine, RolloutEngine, ThreadEngine
from jaxagent.envs.robot.tasks import TaskSpec, get_task, gymnasium_asset

ENGINES = ("batch", "threads", "rollout")


def _has_mujoco_batch() -> bool:
    try:
        from mujoco import batch  # noqa: F401  (MuJoCo >= 4.0)
    except ImportError:
        return False
    return True


class MujocoVectorEnv:
    """Batched Gymnasium-v5 locomotion (``ArrayEnv``): HalfCheetah-v5, Hopper-v5, Ant-v5.

    Args:
      task: task name (see ``tasks.TASKS``).
      num_envs: batch size N.
      num_threads: physics threads (the calling thread is one of them).
      max_episode_steps: truncation limit (Gymnasium's TimeLimit default: 1000).
      engine: one of ``ENGINES``; None picks "batch", or "threads" for tasks reading cfrc_ext
        and where MuJoCo is older than 4.0 (no ``mujoco.batch``).
      chunks: "batch" engine only. K>1: the envs as K ``mujoco.batch`` chunks, each stepped in
        one C call by one of ``num_threads`` Python threads (nothing spins). 1: one ``Batch``
        on MuJoCo's own C thread pool, whose workers spin between calls (the cheapest hand-off
        when a core is free, CPU taken from everyone else when none is). None: those two and
        the calling thread alone, the fastest picked from timings and re-checked every ~4000
        steps (engines.py); results are bit-identical whichever runs.
    """

    def __init__(
        self,
        task: str,
        num_envs: int,
        num_threads: int = 2,
        max_episode_steps: int | None = None,
        engine: str | None = None,
        chunks: int | None = None,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs={num_envs} must be >= 1")
        self.spec: TaskSpec = get_task(task)
        if engine is None:
            batch_ok = _has_mujoco_batch() and not self.spec.needs_cfrc_ext
            engine = "batch" if batch_ok else "threads"
        if engine not in ENGINES:
            raise ValueError(
                f"engine={engine!r}; choose one of {ENGINES} ('batch' and 'threads' are "
                "Gymnasium-identical, 'rollout' is not)"
            )
        if chunks is not None and (engine != "batch" or chunks < 1):
            raise ValueError(
                f"chunks={chunks} with engine={engine!r}: chunks is a positive int, and only "
                "for engine='batch'"
            )
        if engine == "batch" and not _has_mujoco_batch():
            raise ValueError(
                f"engine='batch' needs mujoco.batch (MuJoCo >= 4.0; installed "
                f"{mujoco.__version__}); upgrade mujoco or use engine='threads'"
            )
        if engine != "threads" and self.spec.needs_cfrc_ext:
            raise ValueError(
                f"engine={engine!r} cannot run {task}: its observation reads cfrc_ext, which "
                f"engine={engine!r} does not compute; use engine='threads'"
            )
        self.engine_name = engine
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps or self.spec.max_episode_steps
        self.model = m = mujoco.MjModel.from_xml_path(gymnasium_asset(self.spec.xml))
        data = mujoco.MjData(m)
        self.init_qpos, self.init_qvel = data.qpos.copy(), data.qvel.copy()
        self.dt = m.opt.timestep * self.spec.frame_skip
        self.act_dim = m.nu
        fs = self.spec.frame_skip
        if engine == "batch":
            self.engine = BatchEngine(m, num_envs, num_threads, fs, chunks)
        elif engine == "rollout":
            self.engine = RolloutEngine(m, num_envs, num_threads, fs)
        else:
            self.engine = ThreadEngine(m, num_envs, num_threads, fs, self.spec.needs_cfrc_ext)
        self._rngs = [np.random.default_rng() for _ in range(num_envs)]
        self._elapsed = np.zeros(num_envs, np.int64)
        self._needs_reset = np.zeros(num_envs, bool)
        self._num_needs_reset = 0  # a Python int: the common step skips the autoreset path
        qpv = self.engine.qpv
        # Live readings for the formulas in tasks.py; only "action" changes per step.
        position = self.engine.xy if self.spec.position == "xy_body1" else qpv[:, 0]
        self._pos_before = np.array(position)
        self._readings = {
            "qpv": qpv,
            "qpos": qpv[:, : m.nq],
            "qvel": qpv[:, m.nq :],
            "cfrc_ext": getattr(self.engine, "cfrc_ext", None),
            "dt": self.dt,
            "pos_after": position,
            "pos_before": self._pos_before,
            "action": np.zeros((num_envs, m.nu), np.float32),
        }
        self.obs_dim = self.spec.observe(self._readings).shape[1]
        self._make_spaces()

    def _make_spaces(self) -> None:
        """Gymnasium spaces, as ``gymnasium.vector.SyncVectorEnv`` reports them for this task."""
        from gymnasium import spaces
        from gymnasium.vector.utils import batch_space

        bounds = self.model.actuator_ctrlrange.copy().astype(np.float32)
        self.single_action_space = spaces.Box(low=bounds[:, 0], high=bounds[:, 1], dtype=np.float32)
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float64)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

    # ------------------------------------------------------------------ reset

    def _reset_envs(self, ids: np.ndarray, seeds: Sequence[int | None] | None) -> None:
        """Gymnasium's ``reset_model`` for envs ``ids [K]`` (same RNG draws, same order)."""
        m, s = self.model, self.spec
        lo, hi = -s.reset_noise_scale, s.reset_noise_scale
        qpos, qvel = np.empty((len(ids), m.nq)), np.empty((len(ids), m.nv))
        for k, i in enumerate(ids):
            if seeds is not None and seeds[k] is not None:
                # == gymnasium.utils.seeding.np_random(seed)
                self._rngs[i] = np.random.default_rng(seeds[k])
            rng = self._rngs[i]
            qpos[k] = self.init_qpos + rng.uniform(low=lo, high=hi, size=m.nq)
            if s.reset_noise == "uniform":
                qvel[k] = self.init_qvel + rng.uniform(low=lo, high=hi, size=m.nv)
            else:
                qvel[k] = self.init_qvel + s.reset_noise_scale * rng.standard_normal(m.nv)
        self.engine.reset(ids, qpos, qvel)
        self._elapsed[ids] = 0
        self._needs_reset[ids] = False
        self._num_needs_reset = int(np.count_nonzero(self._needs_reset))

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
        self._reset_envs(np.arange(self.num_envs), seeds)
        return self.spec.observe(self._readings), {}

    # ------------------------------------------------------------------ step

    def step(self, actions: np.ndarray):
        """Step all envs. ``actions [N, act_dim]`` -> obs, reward, terminated, truncated, info."""
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs, self.act_dim):
            raise ValueError(
                f"actions have shape {actions.shape}; expected (num_envs, act_dim) = "
                f"({self.num_envs}, {self.act_dim})"
            )
        return self._step(actions, None)

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
        obs, reward, terminated, truncated, info = self._step(full, np.sort(env_ids))
        return obs[env_ids], reward[env_ids], terminated[env_ids], truncated[env_ids], info

    def _step(self, actions: np.ndarray, ids: np.ndarray | None):
        """Step envs ``ids`` (sorted; None: all). Rows of envs not in ``ids`` are meaningless."""
        resetting = None
        if self._num_needs_reset:  # next-step autoreset of envs whose episode ended
            resetting = self._needs_reset.copy()
            if ids is not None:
                resetting &= np.isin(np.arange(self.num_envs), ids)
            if not resetting.any():
                resetting = None
        step_ids = ids
        if resetting is not None:
            keep = ~resetting if ids is None else ~resetting[ids]
            step_ids = np.flatnonzero(keep) if ids is None else ids[keep]
        r = self._readings
        np.copyto(self._pos_before, r["pos_after"])
        self.engine.step(actions, step_ids)
        if resetting is not None:
            self._reset_envs(np.flatnonzero(resetting), None)
        r["action"] = actions
        spec = self.spec
        obs = spec.observe(r)
        reward = np.asarray(spec.reward(r), np.float64)
        terminated = spec.terminated(r)
        if ids is None:
            self._elapsed += 1
        else:
            self._elapsed[ids] += 1
        truncated = self._elapsed >= self.max_episode_steps
        if resetting is not None:
            reward[resetting], terminated[resetting], truncated[resetting] = 0.0, False, False
            self._elapsed[resetting] = 0
        done = terminated | truncated
        if ids is None:
            self._needs_reset = done
        else:
            self._needs_reset[ids] = done[ids]
        self._num_needs_reset = int(np.count_nonzero(self._needs_reset))
        return obs, reward, terminated, truncated, {}

    def close(self) -> None:
        if getattr(self, "engine", None) is not None:
            self.engine.close()
            self.engine = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
