"""``jaxagent train`` / ``jaxagent eval`` for ``learner: ppo_continuous`` configs.

``train(config_path, overrides)`` runs PPO (``jaxagent.learners.ppo_continuous.update``) on one of
the pool's MuJoCo tasks and writes to ``train.out_dir``: ``curve.png`` (training-episode
returns against env steps, evaluation points on top), ``summary.json`` (the returned dict),
``metrics.jsonl`` (one line per iteration), ``config.yaml`` and ``checkpoint.msgpack`` (params
and observation statistics). ``evaluate(config_path, checkpoint, episodes, overrides)``
reloads a checkpoint and reports the mean return of the deterministic policy.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from omegaconf import OmegaConf

from jaxagent.learners.ppo_continuous.update import PPOConfig
from jaxagent.errors import FROZEN, ConfigError
from jaxagent.train.run_dir import learner_run


@dataclasses.dataclass(**FROZEN)
class PPOEnvSection:
    """Which MuJoCo task, and how the pool steps it."""

    name: str = "HalfCheetah-v5"  # a task of jaxagent.envs.robot.TASKS
    num_threads: int = 1  # physics threads of the vector env
    engine: str = ""  # "" = the vector env's default; "batch" | "threads" | "rollout"
    max_episode_steps: int = 0  # 0 = the task's TimeLimit (1000)

    def __post_init__(self):
        from jaxagent.envs.robot import ENGINES, TASKS

        if self.name not in TASKS:
            raise ConfigError(
                f"env.name={self.name!r} is not a MuJoCo task; choose one of {sorted(TASKS)}"
            )
        if self.engine and self.engine not in ENGINES:
            raise ConfigError(f"env.engine={self.engine!r}; choose one of {list(ENGINES)} or ''")
        if self.num_threads < 1 or self.max_episode_steps < 0:
            raise ConfigError(
                f"env.num_threads={self.num_threads} must be >= 1 and env.max_episode_steps="
                f"{self.max_episode_steps} >= 0"
            )


@dataclasses.dataclass(**FROZEN)
class PPOTrainSection:
    """The run: length, seed, evaluation and outputs."""

    total_steps: int = 1_000_000  # environment steps (all envs together)
    seed: int = 0  # network init, sampling and env seeds
    eval_episodes: int = 10  # episodes of the mean policy at the end (and at each eval_every)
    eval_every: int = 0  # env steps between evaluations during training; 0 = only at the end
    out_dir: str = "runs/ppo_continuous"  # outputs (curve, summary, checkpoint)
    log_every: int = 10  # print a progress line every this many iterations; 0 = never
    render_dir: str = ""  # jaxagent eval: also write PNG frames + a GIF of episode 0 here

    def __post_init__(self):
        if self.total_steps <= 0 or self.eval_episodes <= 0:
            raise ConfigError(
                f"train.total_steps={self.total_steps} and train.eval_episodes="
                f"{self.eval_episodes} must be > 0"
            )


@dataclasses.dataclass(**FROZEN)
class PPORunConfig:
    """A ``learner: ppo_continuous`` YAML file."""

    learner: str = "ppo_continuous"
    env: PPOEnvSection = dataclasses.field(default_factory=PPOEnvSection)
    ppo: PPOConfig = dataclasses.field(default_factory=PPOConfig)
    train: PPOTrainSection = dataclasses.field(default_factory=PPOTrainSection)


def load_ppo_config(path: str | Path | None, overrides: Sequence[str] = ()) -> PPORunConfig:
    """YAML + ``key=value`` overrides onto ``PPORunConfig``; every error is a ``ConfigError``
    naming the key, the value and the fix."""
    from jaxagent.learners.registry import load_learner_config

    return load_learner_config(
        PPORunConfig,
        path,
        overrides,
        learner="ppo_continuous",
    )


def _make_pool(config: PPORunConfig, num_envs: int, seed: int):
    from jaxagent.envs.robot import MujocoVectorEnv
    from jaxagent.pool.array_pool import ArrayEnvPool

    e = config.env
    env = MujocoVectorEnv(
        e.name,
        num_envs,
        num_threads=e.num_threads,
        max_episode_steps=e.max_episode_steps or None,
        engine=e.engine or None,
    )
    return ArrayEnvPool(env, seed=seed)


def train(config_path: str | None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train; returns the summary (also written to ``<out_dir>/summary.json``)."""
    config = load_ppo_config(config_path, overrides)
    config_yaml = OmegaConf.to_yaml(OmegaConf.structured(config))
    with learner_run(Path(config.train.out_dir), config_yaml) as out:
        return _train(config, out)


def _train(config: PPORunConfig, out: Path) -> dict[str, Any]:
    import jax

    from jaxagent.learners.ppo_continuous.update import PPOLearner
    from jaxagent.learners.ppo_continuous.normalize import RunningMoments, obs_stats, update_moments
    from jaxagent.learners.ppo_continuous.rollout import Collector, evaluate_policy

    c, t = config.ppo, config.train
    iterations = -(-t.total_steps // c.batch_size)
    pool = _make_pool(config, c.num_envs, t.seed)
    space = pool.env.single_action_space
    learner = PPOLearner(c, pool.env.obs_dim, pool.env.act_dim, iterations)
    state = learner.init(jax.random.key(t.seed))
    moments = RunningMoments.zeros((pool.env.obs_dim,)) if c.normalize_obs else None
    collector = Collector(learner, pool, space.low, space.high, seed=t.seed)
    evals: list[tuple[int, float]] = []
    log = (out / "metrics.jsonl").open("w")
    start = time.perf_counter()
    update_s = 0.0
    next_eval = t.eval_every or None

    def run_eval(stats) -> list[float]:
        returns = evaluate_policy(
            learner,
            state.params,
            stats,
            config.env.name,
            t.eval_episodes,
            seed=t.seed + 10_000,
            max_episode_steps=config.env.max_episode_steps or None,
        )
        evals.append((collector.env_steps, float(np.mean(returns))))
        return returns

    try:
        for it in range(iterations):
            stats = obs_stats(moments, pool.env.obs_dim)
            rollout, raw_obs = collector.collect(state.params, stats)
            u0 = time.perf_counter()
            state, metrics = learner.update(state, rollout)
            metrics = jax.device_get(metrics)
            update_s += time.perf_counter() - u0
            if moments is not None:
                moments = update_moments(moments, raw_obs)
            recent = [r for _, r, _ in collector.episodes[-10:]]
            row = {
                "iteration": it + 1,
                "env_steps": collector.env_steps,
                "return_recent": float(np.mean(recent)) if recent else None,
                **{k: float(v) for k, v in metrics.items()},
            }
            log.write(json.dumps(row) + "\n")
            if next_eval is not None and collector.env_steps >= next_eval:
                run_eval(obs_stats(moments, pool.env.obs_dim))
                next_eval += t.eval_every
            if t.log_every and (it + 1) % t.log_every == 0:
                print(
                    f"[ppo] it {it + 1}/{iterations} steps {collector.env_steps} "
                    f"return(last10) {row['return_recent']} "
                    f"{collector.env_steps / (time.perf_counter() - start):.0f} steps/s",
                    flush=True,
                )
        train_s = time.perf_counter() - start
        stats = obs_stats(moments, pool.env.obs_dim)
        final = run_eval(stats)
    finally:
        log.close()
        pool.close()
    save_checkpoint(out / "checkpoint.msgpack", state.params, stats)
    recent = [r for _, r, _ in collector.episodes[-10:]]
    summary = {
        "env": config.env.name,
        "steps": collector.env_steps,
        "return_mean": float(np.mean(final)),
        "return_std": float(np.std(final)),
        "train_return_last10": float(np.mean(recent)) if recent else None,
        "episodes": len(collector.episodes),
        "wall_s": round(train_s, 2),
        "env_steps_per_s": round(collector.env_steps / train_s, 1),
        "physics_s": round(collector.env_seconds, 2),
        "update_s": round(update_s, 2),
        "seed": t.seed,
        "out_dir": str(out),
    }
    _plot(out / "curve.png", collector.episodes, evals, config.env.name)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def save_checkpoint(path: Path, params, stats) -> None:
    from flax import serialization

    blob = {"params": params, "obs_mean": stats.mean, "obs_inv_std": stats.inv_std}
    path.write_bytes(serialization.msgpack_serialize(serialization.to_state_dict(blob)))


def load_checkpoint(path: Path):
    from flax import serialization

    from jaxagent.learners.ppo_continuous.normalize import ObsStats

    blob = serialization.msgpack_restore(Path(path).read_bytes())
    return blob["params"], ObsStats(np.asarray(blob["obs_mean"]), np.asarray(blob["obs_inv_std"]))


def evaluate(config_path: str, checkpoint: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Mean return of the checkpoint's mean policy over ``train.eval_episodes`` episodes (an
    override: ``train.eval_episodes=N``), on env seeds the training run never used."""
    from jaxagent.learners.ppo_continuous.update import PPOLearner
    from jaxagent.learners.ppo_continuous.rollout import evaluate_policy

    config = load_ppo_config(config_path, overrides)
    episodes = config.train.eval_episodes
    path = Path(checkpoint)
    path = path / "checkpoint.msgpack" if path.is_dir() else path
    if not path.is_file():
        raise ConfigError(
            f"--checkpoint {checkpoint!r} has no checkpoint.msgpack; pass the train.out_dir "
            "of a finished ppo_continuous run"
        )
    params, stats = load_checkpoint(path)
    from jaxagent.envs.robot import MujocoVectorEnv

    probe = MujocoVectorEnv(config.env.name, 1)
    learner = PPOLearner(config.ppo, probe.obs_dim, probe.act_dim, 1)
    probe.close()
    returns = evaluate_policy(
        learner,
        params,
        stats,
        config.env.name,
        episodes,
        seed=config.train.seed + 20_000,
        max_episode_steps=config.env.max_episode_steps or None,
        render_dir=config.train.render_dir,
    )
    return {
        "env": config.env.name,
        "episodes": episodes,
        "return_mean": float(np.mean(returns)),
        "return_std": float(np.std(returns)),
        "checkpoint": str(path),
    }


def _plot(path: Path, episodes, evals, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    if episodes:
        steps, rets = np.array([e[0] for e in episodes]), np.array([e[1] for e in episodes])
        ax.plot(steps, rets, ".", alpha=0.25, label="training episodes")
        k = min(10, len(rets))
        smooth = np.convolve(rets, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1 :], smooth, label=f"mean of {k}")
    if evals:
        ax.plot(*zip(*evals), "o-", label="evaluation (mean policy)")
    ax.set(xlabel="environment steps", ylabel="episode return", title=f"PPO on {title}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
