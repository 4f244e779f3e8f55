"""Adding an environment touches no file outside the suite: a tiny echo suite, defined and
registered here exactly as a new ``envs/<suite>/`` package would, validates its options from
the config and trains one shrunken iteration through ``jaxagent.train``, inline and in process
workers. The suite is registered at run time, inside the test: a worker process, started from
a fork server rather than forked from this JAX-running process, does not inherit that
registration, so it must get what rebuilds the env from the runner itself."""

import dataclasses
import functools
import warnings

import pytest

# A world of one's own needs only the package's public names.
from jaxagent.envs import EnvSpec, StepResult, Task, env_names, register_env

WORDS = ["ok", "no", "red", "blue"]


@dataclasses.dataclass(frozen=True)
class EchoOptions:
    """Every key ``env.options`` may hold, typed and defaulted."""

    num_tasks: int = 8
    bonus: float = 1.0  # reward when the reply contains the word


class EchoEnv:
    def __init__(self, bonus: float):
        self.bonus = bonus

    def reset(self, task: Task) -> str:
        self.word = task.data["word"]
        return f"say {self.word}"

    def step(self, action: str) -> StepResult:
        hit = self.word in action.split()
        return StepResult(
            "",
            self.bonus * hit,
            True,
            {"success": hit, "failure_mode": None if hit else "wrong_answer"},
        )

    def close(self) -> None:
        pass


class EchoSource:
    def __init__(self, n: int):
        self.n = n

    def splits(self):
        return ("train", "test")

    def tasks(self, split):
        return [
            Task(f"{split}-{i}", split, "", {"word": WORDS[i % len(WORDS)]}) for i in range(self.n)
        ]


def build(options: EchoOptions) -> EnvSpec:
    return EnvSpec(
        name="echo",
        make_source=functools.partial(EchoSource, options.num_tasks),
        make_env=functools.partial(EchoEnv, options.bonus),
        system_prompt="",
        vocabulary=lambda: WORDS + ["say"],
    )


def _register():
    if "echo" not in env_names():
        register_env("echo", build, options=EchoOptions)


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_echo_suite_trains_one_iteration(backend, tmp_path):
    _register()
    from jaxagent.train.config import load_config
    from jaxagent.errors import ConfigError
    from jaxagent.train.metrics_log import read_jsonl
    from jaxagent.train.trainer import Trainer

    overrides = [
        "name=echo",
        "env.name=echo",
        f"env.pool.backend={backend}",
        "env.pool.num_envs=2",
        "env.options.num_tasks=8",
        "model.hidden_size=32",
        "model.num_layers=1",
        "model.num_heads=2",
        "model.num_kv_heads=1",
        "model.intermediate_size=64",
        "model.max_seq_len=64",
        "rollout.tasks_per_iteration=4",
        "rollout.samples_per_task=2",
        "rollout.max_turns=1",
        "rollout.max_new_tokens=4",
        "eval.num_tasks=4",
        "eval.samples_per_task=1",
        "eval.every=0",
        "train.iterations=1",
        "train.checkpoint_every=0",
        "train.progress=none",
        "train.tensorboard=false",
        "train.plot=false",
        f"train.out_dir={tmp_path}/run",
    ]
    with pytest.raises(
        ConfigError,
        match=r"env\.options\.num_task=8 .*did you mean "
        r"env\.options\.num_tasks\?",
    ):
        load_config(None, overrides[:3] + ["env.options.num_task=8"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(load_config(None, overrides), echo=lambda s: None).run()
    # JAX warns on every os.fork of a process whose runtime it has started (here, all along)
    forks = [str(w.message) for w in caught if "os.fork()" in str(w.message)]
    assert not forks, forks[0]
    (record,) = [
        r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "train/avg_reward" in r
    ]
    assert 0.0 <= record["train/avg_reward"] <= 1.0
    # a worker that could not rebuild the suite ends every episode with an env error
    assert record["env_health/env_error_episodes"] == 0
