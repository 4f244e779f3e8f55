"""``jaxagent train`` for ``learner: dqn_dialogue`` configs: a DQN dialogue policy.

``train(config_path, overrides)`` trains ``jaxagent.learners.dqn_dialogue.dqn`` from scratch on the
dialogue suite's training goals (``num_envs`` dialogues stepped in lockstep over the state
tracker's features; epsilon-greedy; replay; double DQN), once per seed, then evaluates the
greedy policy and the hand-written rule policy (``envs.dialogue.policies.rule_policy``) on
every held-out goal (held-out routes, held-out simulator setting). Writes to
``train.out_dir``: ``curve.png`` (held-out return of the greedy policy against env steps, one
line per seed, the rule policy's return as a reference line), ``summary.json`` (the returned
dict) and ``config.yaml``. With several seeds the summary carries the DQN's mean and a 95%
Student-t interval over seeds (``dqn_return_ci95``, ``dqn_success_ci95``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, Sequence

import numpy as np
from omegaconf import OmegaConf

from jaxagent.learners.dqn_dialogue.dqn import DQNConfig
from jaxagent.errors import FROZEN, ConfigError
from jaxagent.eval.report import T95, seed_summary
from jaxagent.train.run_dir import learner_run


@dataclasses.dataclass(**FROZEN)
class DialogueEnvSection:
    """The dialogue suite's ``env.options`` (validated by the registry)."""

    options: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        from jaxagent.envs import registry

        try:
            registry.parse_options("dialogue", self.options)
        except (KeyError, ValueError) as exc:
            raise ConfigError(str(exc.args[0]) if exc.args else str(exc)) from None


@dataclasses.dataclass(**FROZEN)
class DQNTrainSection:
    """The run: length, seeds, evaluation and outputs."""

    total_steps: int = 40_000  # environment steps per seed (all dialogues together)
    num_envs: int = 16  # dialogues stepped in lockstep (one batched action choice a step)
    learning_starts: int = 1_000  # env steps of pure collection before the first update
    updates_per_step: int = 1  # updates after each lockstep (of num_envs env steps)
    seed: int = 0  # first seed
    num_seeds: int = 1  # seeds seed, seed+1, ... (mean and 95% interval when > 1)
    eval_every: int = 5_000  # env steps between held-out evaluations for the curve; 0 = end
    eval_goals: int = 100  # held-out goals in each curve evaluation (the final one uses all)
    out_dir: str = "runs/{name}"  # curve.png, summary.json, config.yaml
    plot: bool = True  # write curve.png
    log_every: int = 0  # print a progress line every this many env steps; 0 = never

    def __post_init__(self):
        for name in ("total_steps", "num_envs", "num_seeds", "eval_goals", "updates_per_step"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"train.{name}={getattr(self, name)!r} must be > 0")
        for name in ("learning_starts", "eval_every", "log_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name}={getattr(self, name)!r} must be >= 0")
        if self.num_seeds > len(T95) + 1:  # past the t-table the interval would be a normal one
            raise ConfigError(f"train.num_seeds={self.num_seeds} must be <= {len(T95) + 1}")


@dataclasses.dataclass(**FROZEN)
class DQNDialogueConfig:
    """A ``learner: dqn_dialogue`` YAML file."""

    learner: str = "dqn_dialogue"
    name: str = "dqn_dialogue"
    paper: str = ""
    env: DialogueEnvSection = dataclasses.field(default_factory=DialogueEnvSection)
    dqn: DQNConfig = dataclasses.field(default_factory=DQNConfig)
    train: DQNTrainSection = dataclasses.field(default_factory=DQNTrainSection)


def load_dqn_config(path: str | Path | None, overrides: Sequence[str] = ()) -> DQNDialogueConfig:
    """YAML + ``key=value`` overrides onto ``DQNDialogueConfig``; errors are ``ConfigError``
    naming the key, the value and the fix."""
    from jaxagent.learners.registry import load_learner_config

    return load_learner_config(
        DQNDialogueConfig,
        path,
        overrides,
        learner="dqn_dialogue",
    )


class _Dialogues:
    """``n`` dialogues in lockstep over trackers: features in, act ids out."""

    def __init__(self, spec, tasks, n: int, max_turns: int, rng: np.random.Generator | None):
        from jaxagent.envs.dialogue.tracker import Tracker

        self._Tracker, self.max_turns = Tracker, max_turns
        self.tasks, self.rng = tasks, rng
        self.envs = [spec.make_env() for _ in range(n)]
        self.trackers: list[Any] = [None] * n
        self.returns = np.zeros(n)
        self._next = 0
        for i in range(n):
            self._reset(i)

    def _reset(self, i: int) -> None:
        if self.rng is None:  # evaluation: the goals in order, the user as the task seeds it
            task = self.tasks[self._next]
            self._next += 1
        else:
            task = self.tasks[int(self.rng.integers(len(self.tasks)))]
            self.envs[i].seed(int(self.rng.integers(2**31)))  # another user for the same goal
        self.trackers[i] = self._Tracker(self.max_turns)
        self.trackers[i].update(self.envs[i].reset(task))
        self.returns[i] = 0.0

    def features(self) -> np.ndarray:
        return np.stack([t.features() for t in self.trackers])

    def step(self, actions: np.ndarray, on_end: Callable[[float, dict], bool]):
        """Steps every dialogue; returns (reward [n], terminated [n], next features [n, F])
        where the next features of an ended dialogue are its final state (then it restarts
        unless ``on_end`` returns False)."""
        n = len(self.envs)
        reward, terminated = np.zeros(n, np.float32), np.zeros(n, np.float32)
        next_f = np.zeros((n, self.features().shape[1]), np.float32)
        for i, a in enumerate(actions):
            result = self.envs[i].step(self.trackers[i].act_text(int(a)))
            self.trackers[i].update(result.observation)
            reward[i] = result.reward
            self.returns[i] += result.reward
            next_f[i] = self.trackers[i].features()
            if result.done:
                terminated[i] = float(not result.truncated)
                if on_end(float(self.returns[i]), result.info):
                    self._reset(i)
        return reward, terminated, next_f


def evaluate(spec, tasks, choose: Callable[[list, np.ndarray], np.ndarray], max_turns: int):
    """Mean return and success of ``choose(trackers, features [k, F]) -> act ids [k]`` on
    ``tasks`` (every dialogue to its end; the user as each task seeds it)."""
    from jaxagent.envs.dialogue.tracker import NUM_FEATURES, Tracker

    envs = [spec.make_env() for _ in tasks]
    trackers = [Tracker(max_turns) for _ in tasks]
    for env, tracker, task in zip(envs, trackers, tasks):
        tracker.update(env.reset(task))
    returns, success = np.zeros(len(tasks)), np.zeros(len(tasks))
    live = list(range(len(tasks)))
    while live:
        ts = [trackers[i] for i in live]
        # Padded to all dialogues: one array shape, so a jitted chooser compiles once.
        feats = np.zeros((len(tasks), NUM_FEATURES), np.float32)
        feats[: len(ts)] = np.stack([t.features() for t in ts])
        acts = np.asarray(choose(ts, feats))[: len(ts)]
        still = []
        for i, a in zip(live, acts):
            result = envs[i].step(trackers[i].act_text(int(a)))
            trackers[i].update(result.observation)
            returns[i] += result.reward
            if result.done:
                success[i] = float(bool(result.info.get("success")))
            else:
                still.append(i)
        live = still
    return float(returns.mean()), float(success.mean())


def _interval(values: Sequence[float]) -> list[float]:
    """95% Student-t interval of the mean over seeds ([mean, mean] for one seed)."""
    s = seed_summary(values)
    if s["n"] < 2:
        return [s["mean"]] * 2
    return [s["mean"] - s["ci95"], s["mean"] + s["ci95"]]


def train_seed(config: DQNDialogueConfig, seed: int, spec, rule_return: float, echo=print):
    """One seed: returns (final greedy return, success, curve [(step, held-out return)])."""
    import jax

    from jaxagent.envs.dialogue.tracker import NUM_ACTS, NUM_FEATURES
    from jaxagent.learners.dqn_dialogue import dqn

    cfg, tr = config.dqn, config.train
    max_turns = spec.make_env().config.max_turns
    source = spec.make_source()
    train_tasks, test_tasks = source.tasks("train"), source.tasks("test")
    curve_tasks = test_tasks[: tr.eval_goals]
    rng = np.random.default_rng([seed, 11])
    key = jax.random.PRNGKey(seed)
    key, k_init = jax.random.split(key)
    state = dqn.init_dqn(cfg, NUM_FEATURES, NUM_ACTS, k_init)
    buf = dqn.buffer_init(cfg.buffer_size, NUM_FEATURES)
    select = dqn.make_select_fn(cfg, NUM_ACTS)
    train_step = dqn.make_train_step(cfg, NUM_ACTS)

    def greedy(params):
        return lambda trackers, feats: np.asarray(select(params, feats, key, 0.0))

    runner = _Dialogues(spec, train_tasks, tr.num_envs, max_turns, rng)
    obs = runner.features()
    curve, episodes = [], []
    steps, next_eval = 0, tr.eval_every
    while steps < tr.total_steps:
        key, k_act, k_upd = jax.random.split(key, 3)
        eps = float(dqn.epsilon(steps, cfg))
        acts = np.asarray(select(state.params, obs, k_act, eps))
        reward, terminated, next_obs = runner.step(
            acts, lambda ret, info: episodes.append(ret) or True
        )
        buf = dqn.buffer_add(buf, obs, acts, reward, next_obs, terminated)
        obs = runner.features()  # restarted dialogues show their opening
        steps += tr.num_envs
        if steps >= tr.learning_starts:
            for k in jax.random.split(k_upd, tr.updates_per_step):
                state, metrics = train_step(state, buf, k)
        if tr.eval_every and steps >= next_eval:
            next_eval += tr.eval_every
            ret, _ = evaluate(spec, curve_tasks, greedy(state.params), max_turns)
            curve.append((steps, ret))
        if tr.log_every and steps % tr.log_every < tr.num_envs:
            recent = np.mean(episodes[-100:]) if episodes else float("nan")
            echo(f"seed {seed} step {steps} eps {eps:.2f} train return {recent:.3f} "
                 f"(rule on held-out {rule_return:.3f})")  # fmt: skip
    ret, succ = evaluate(spec, test_tasks, greedy(state.params), max_turns)
    curve.append((steps, evaluate(spec, curve_tasks, greedy(state.params), max_turns)[0]))
    return ret, succ, curve


def train(config_path: str | None, overrides: Sequence[str] = (), echo=print) -> dict[str, Any]:
    """Train every seed; returns the summary (also ``<out_dir>/summary.json``)."""
    t0 = time.perf_counter()
    config = load_dqn_config(config_path, overrides)
    out = Path(config.train.out_dir.format(name=config.name))
    with learner_run(out, OmegaConf.to_yaml(OmegaConf.structured(config))):
        return _train(config, out, echo, t0)


def _train(config: DQNDialogueConfig, out: Path, echo, t0: float) -> dict[str, Any]:
    from jaxagent.envs.dialogue import policies as P
    from jaxagent.envs.registry import get_env_spec

    spec = get_env_spec("dialogue", dict(config.env.options))
    max_turns = spec.make_env().config.max_turns
    test_tasks = spec.make_source().tasks("test")

    def policy(choose):
        return lambda trackers, feats: np.array([choose(t) for t in trackers])

    rule_return, rule_success = evaluate(spec, test_tasks, policy(P.rule_policy), max_turns)
    expert_return, expert_success = evaluate(spec, test_tasks, policy(P.expert_policy), max_turns)
    seeds = [config.train.seed + i for i in range(config.train.num_seeds)]
    runs = [train_seed(config, s, spec, rule_return, echo) for s in seeds]
    returns, successes = [r[0] for r in runs], [r[1] for r in runs]
    summary = {
        "dqn_return": float(np.mean(returns)),
        "rule_return": rule_return,
        "dqn_success": float(np.mean(successes)),
        "rule_success": rule_success,
        "wall_s": round(time.perf_counter() - t0, 1),
        "dqn_return_ci95": _interval(returns),
        "dqn_success_ci95": _interval(successes),
        "seeds": seeds,
        "dqn_return_per_seed": returns,
        "dqn_success_per_seed": successes,
        "expert_return": expert_return,
        "expert_success": expert_success,
        "held_out_goals": len(test_tasks),
        "out_dir": str(out),
    }
    if config.train.plot:
        summary["curve_png"] = str(out / "curve.png")
        _plot(out / "curve.png", seeds, [r[2] for r in runs], rule_return, expert_return)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _plot(path: Path, seeds, curves, rule_return: float, expert_return: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for seed, curve in zip(seeds, curves):
        if curve:
            ax.plot(*zip(*curve), "o-", label=f"DQN seed {seed} (greedy)")
    ax.axhline(rule_return, color="k", ls="--", label="rule policy")
    ax.axhline(expert_return, color="g", ls=":", label="scripted expert")
    ax.set(xlabel="environment steps", ylabel="return on held-out goals",
           title="DQN dialogue policy")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
