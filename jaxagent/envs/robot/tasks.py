"""Gymnasium v5 MuJoCo locomotion tasks, written batched over numpy arrays.

Each ``TaskSpec`` reproduces one Gymnasium ``*-v5`` environment with its default arguments:
the model file, frame skip, reset noise, and observation / reward / termination formulas, as
functions of batched physics readings. ``MujocoVectorEnv`` supplies the readings after making
the same MuJoCo calls as Gymnasium (``mj_resetData`` + ``mj_forward`` on reset;
``mj_step(nstep=frame_skip)`` + ``mj_rnePostConstraint`` on step), so observations and rewards
match Gymnasium's own environments for the same seeds and actions.

Readings (per batch of N envs): ``qpv [N, nq + nv]`` (qpos then qvel), ``qpos [N, nq]``,
``qvel [N, nv]``, ``pos_before`` / ``pos_after`` (``[N]`` x position of the root joint, or
``[N, 2]`` xy of the main body for Ant), ``cfrc_ext [N, nbody, 6]`` (Ant only),
``action [N, nu]``, ``dt`` seconds per env step.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import numpy as np


def gymnasium_asset(name: str) -> str:
    """Path of a model file shipped with gymnasium[mujoco] (no download)."""
    import gymnasium.envs.mujoco as gm

    return os.path.join(os.path.dirname(gm.__file__), "assets", name)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One locomotion task. Functions take a dict of batched readings (see module docstring)."""

    name: str
    xml: str  # file name under gymnasium's mujoco assets
    frame_skip: int
    reset_noise: str  # "uniform_normal": qpos U(-s, s), qvel s*N(0,1); "uniform": both U(-s, s)
    reset_noise_scale: float
    position: str  # "x": qpos[0] before/after the step; "xy_body1": xpos of body 1 (Ant)
    needs_cfrc_ext: bool  # the observation/reward reads cfrc_ext (needs mj_rnePostConstraint)
    observe: Callable[[dict], np.ndarray]
    reward: Callable[[dict], np.ndarray]
    terminated: Callable[[dict], np.ndarray]
    max_episode_steps: int = 1000


def _ctrl_cost(r, weight):
    # Same dtype path as Gymnasium: np.square of the action as given, then sum (np.sum is
    # np.add.reduce behind ~2 us of Python dispatch, a tenth of a batched step's overhead).
    return weight * np.add.reduce(np.square(r["action"]), axis=1)


def _velocity(r):
    return (r["pos_after"] - r["pos_before"]) / r["dt"]


# --- HalfCheetah-v5: obs = qpos[1:], qvel; reward = x_vel - 0.1 |a|^2; never terminates.


def _cheetah_obs(r):
    return r["qpv"][:, 1:].copy()  # == concatenate([qpos[:, 1:], qvel]); qpv is [qpos, qvel]


def _cheetah_reward(r):
    return 1.0 * _velocity(r) - _ctrl_cost(r, 0.1)


def _never(r):
    return np.zeros(r["qpos"].shape[0], bool)


# --- Hopper-v5: obs = qpos[1:], clip(qvel, -10, 10); healthy reward 1; ctrl cost 1e-3.


def _hopper_healthy(r):
    state = np.concatenate([r["qpos"], r["qvel"]], axis=1)[:, 2:]
    z, angle = r["qpos"][:, 1], r["qpos"][:, 2]
    ok_state = np.all((-100.0 < state) & (state < 100.0), axis=1)
    return ok_state & (0.7 < z) & (z < np.inf) & (-0.2 < angle) & (angle < 0.2)


def _hopper_obs(r):
    return np.concatenate([r["qpos"][:, 1:], np.clip(r["qvel"], -10, 10)], axis=1)


def _hopper_reward(r):
    healthy = _hopper_healthy(r) * 1.0
    return (1.0 * _velocity(r) + healthy) - _ctrl_cost(r, 1e-3)


def _hopper_terminated(r):
    return ~_hopper_healthy(r)


# --- Ant-v5: obs = qpos[2:], qvel, clip(cfrc_ext[1:], -1, 1); contact cost 5e-4; ctrl 0.5.


def _ant_healthy(r):
    state = np.concatenate([r["qpos"], r["qvel"]], axis=1)
    z = state[:, 2]
    return np.isfinite(state).all(axis=1) & (0.2 <= z) & (z <= 1.0)


def _ant_obs(r):
    forces = np.clip(r["cfrc_ext"][:, 1:], -1.0, 1.0).reshape(r["qpos"].shape[0], -1)
    return np.concatenate([r["qpos"][:, 2:], r["qvel"], forces], axis=1)


def _ant_reward(r):
    x_velocity = _velocity(r)[:, 0]
    healthy = _ant_healthy(r) * 1.0
    contact = 5e-4 * np.sum(
        np.square(np.clip(r["cfrc_ext"], -1.0, 1.0)).reshape(len(healthy), -1), axis=1
    )
    return (x_velocity * 1 + healthy) - (_ctrl_cost(r, 0.5) + contact)


def _ant_terminated(r):
    return ~_ant_healthy(r)


# --- InvertedPendulum-v5: obs = qpos, qvel; reward 1 while |pole angle| <= 0.2 (a cheap
# task for learning tests: threshold 950 of 1000).


def _pendulum_obs(r):
    return r["qpv"].copy()


def _pendulum_terminated(r):
    obs = r["qpv"]
    return ~np.isfinite(obs).all(axis=1) | (np.abs(obs[:, 1]) > 0.2)


def _pendulum_reward(r):
    return (~_pendulum_terminated(r)) * 1.0


TASKS = {
    "HalfCheetah-v5": TaskSpec(
        "HalfCheetah-v5",
        "half_cheetah.xml",
        5,
        "uniform_normal",
        0.1,
        "x",
        False,
        _cheetah_obs,
        _cheetah_reward,
        _never,
    ),
    "Hopper-v5": TaskSpec(
        "Hopper-v5",
        "hopper.xml",
        4,
        "uniform",
        5e-3,
        "x",
        False,
        _hopper_obs,
        _hopper_reward,
        _hopper_terminated,
    ),
    "Ant-v5": TaskSpec(
        "Ant-v5",
        "ant.xml",
        5,
        "uniform_normal",
        0.1,
        "xy_body1",
        True,
        _ant_obs,
        _ant_reward,
        _ant_terminated,
    ),
    "InvertedPendulum-v5": TaskSpec(
        "InvertedPendulum-v5",
        "inverted_pendulum.xml",
        2,
        "uniform",
        0.01,
        "x",
        False,
        _pendulum_obs,
        _pendulum_reward,
        _pendulum_terminated,
    ),
}


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"unknown MuJoCo task {name!r}; available: {sorted(TASKS)}")
    return TASKS[name]
