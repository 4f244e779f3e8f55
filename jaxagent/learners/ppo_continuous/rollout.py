"""The host side of continuous-control PPO: experience from the pool's MuJoCo engine.

``Collector`` steps an ``ArrayEnvPool`` over a ``MujocoVectorEnv`` (send all N actions, recv
one batched step) for ``horizon`` steps with the jitted ``act`` of a ``PPOLearner`` and
returns a ``Rollout``. Gymnasium's next-step autoreset means the step after an episode's end
is a placeholder (action ignored, reward 0): those rows are marked ``valid = 0`` and leave the
loss, the reward scaler and the episode statistics alone. ``evaluate_policy`` runs the
deterministic (mean) policy for whole episodes on a separate vector env.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np

from jaxagent.envs.robot import MujocoVectorEnv
from jaxagent.pool.array_pool import ArrayEnvPool
from jaxagent.learners.ppo_continuous.update import PPOLearner, Rollout
from jaxagent.learners.ppo_continuous.networks import NumpyPolicy
from jaxagent.learners.ppo_continuous.normalize import ObsStats, RewardScaler, normalize_obs


class Collector:
    """Rollouts of ``learner`` on ``pool``; keeps per-env episode returns across rollouts."""

    def __init__(
        self, learner: PPOLearner, pool: ArrayEnvPool, action_low, action_high, seed: int = 0
    ):
        self.learner, self.pool = learner, pool
        c = learner.config
        self.n = pool.num_envs
        self.low, self.high = np.asarray(action_low), np.asarray(action_high)
        self.rng = np.random.default_rng(seed)  # action noise
        self.scaler = RewardScaler(self.n, c.gamma) if c.scale_rewards else None
        pool.async_reset()
        self.obs = pool.recv().obs
        self.prev_done = np.zeros(self.n, bool)
        self.ep_return = np.zeros(self.n)
        self.ep_length = np.zeros(self.n, np.int64)
        self.env_steps = 0  # real (valid) transitions so far
        self.episodes: list[tuple[int, float, int]] = []  # (env step at its end, return, length)
        self.env_seconds = 0.0  # wall time inside the pool (physics + formulas)

    def collect(self, params, stats: ObsStats) -> tuple[Rollout, np.ndarray]:
        """One rollout; also returns the raw observations ``[K, D]`` (for the normaliser)."""
        c, n = self.learner.config, self.n
        T = c.horizon
        policy = NumpyPolicy(jax.device_get(params))
        obs_buf = np.zeros((T, n, self.learner.obs_dim), np.float32)
        raw_obs = np.zeros((T, n, self.learner.obs_dim))
        act_buf = np.zeros((T, n, self.learner.act_dim), np.float32)
        logp_buf, val_buf = np.zeros((T, n), np.float32), np.zeros((T + 1, n), np.float32)
        rew_buf = np.zeros((T, n), np.float32)
        term_buf, trunc_buf = np.zeros((T, n), bool), np.zeros((T, n), bool)
        valid_buf = np.zeros((T, n), bool)
        ids = np.arange(n)
        for t in range(T):
            z = normalize_obs(self.obs, stats, c.obs_clip)
            action, logp, value = policy.sample(z, self.rng)
            valid = ~self.prev_done
            start = time.perf_counter()
            self.pool.send(ids, np.clip(action, self.low, self.high))
            out = self.pool.recv()
            self.env_seconds += time.perf_counter() - start
            raw_obs[t], obs_buf[t], act_buf[t] = self.obs, z, action
            logp_buf[t], val_buf[t], valid_buf[t] = logp, value, valid
            term_buf[t], trunc_buf[t] = out.terminated, out.truncated
            done = out.terminated | out.truncated
            reward = out.reward
            rew_buf[t] = self.scaler.scale(reward, done, valid) if self.scaler else reward * valid
            self._track(reward, done, valid)
            self.prev_done = done
            self.obs = out.obs
        val_buf[T] = policy.value(normalize_obs(self.obs, stats, c.obs_clip))
        rollout = Rollout(
            obs=obs_buf,
            actions=act_buf,
            logprobs=logp_buf,
            values=val_buf,
            rewards=rew_buf,
            terminated=term_buf.astype(np.float32),
            truncated=trunc_buf.astype(np.float32),
            valid=valid_buf.astype(np.float32),
        )
        # Only real inputs feed the normaliser (a placeholder row's input is a final obs, seen).
        return rollout, raw_obs[valid_buf]

    def _track(self, reward, done, valid) -> None:
        self.ep_return += np.where(valid, reward, 0.0)
        self.ep_length += valid
        self.env_steps += int(valid.sum())
        for i in np.flatnonzero(done & valid):
            self.episodes.append((self.env_steps, float(self.ep_return[i]), int(self.ep_length[i])))
            self.ep_return[i], self.ep_length[i] = 0.0, 0


def evaluate_policy(
    learner: PPOLearner,
    params,
    stats: ObsStats,
    task: str,
    episodes: int,
    seed: int,
    max_episode_steps: int | None = None,
    num_threads: int = 1,
    render_dir: str = "",
) -> list[float]:
    """Returns of ``episodes`` episodes of the mean policy (one env per episode, run together).
    ``render_dir``: also write every 4th frame of episode 0 as PNG, and a GIF."""
    env = MujocoVectorEnv(
        task, episodes, num_threads=num_threads, max_episode_steps=max_episode_steps
    )
    try:
        low, high = env.single_action_space.low, env.single_action_space.high
        obs, _ = env.reset(seed=seed)
        policy = NumpyPolicy(jax.device_get(params))
        total, running = np.zeros(episodes), np.ones(episodes, bool)
        frames = _Frames(env, render_dir) if render_dir else None
        t = 0
        while running.any():
            if frames is not None and running[0] and t % 4 == 0:
                frames.add()
            t += 1
            action = policy.mean(normalize_obs(obs, stats, learner.config.obs_clip))
            obs, reward, terminated, truncated, _ = env.step(np.clip(action, low, high))
            total += np.where(running, reward, 0.0)
            running &= ~(terminated | truncated)
        if frames is not None:
            frames.close()
        return total.tolist()
    finally:
        env.close()


class _Frames:
    """Frames of env 0 of a ``MujocoVectorEnv`` (its state copied into one ``MjData``)."""

    def __init__(self, env: MujocoVectorEnv, out_dir: str):
        import mujoco

        from jaxagent.envs.robot.manipulation.frames import OffscreenRenderer

        self.env, self.out = env, Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        m = env.model
        m.vis.global_.offwidth, m.vis.global_.offheight = 320, 240
        self.data = mujoco.MjData(m)
        self.renderer = OffscreenRenderer(m, 320, 240)
        self.images = []

    def add(self) -> None:
        import mujoco
        from PIL import Image

        m, d = self.env.model, self.data
        d.qpos[:], d.qvel[:] = self.env.engine.qpv[0, : m.nq], self.env.engine.qpv[0, m.nq :]
        mujoco.mj_forward(m, d)
        image = Image.fromarray(self.renderer.render(d, track=d.xpos[1].copy()))
        image.save(self.out / f"step_{len(self.images):04d}.png")
        self.images.append(image)

    def close(self) -> None:
        if self.images:
            self.images[0].save(
                self.out / "episode_000.gif",
                save_all=True,
                append_images=self.images[1:],
                duration=80,
                loop=0,
            )
        self.renderer.close()
