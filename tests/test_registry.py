"""The environment registry: typed options, readable errors, lazy suites, picklable envs."""

import dataclasses
import json
import pickle
import subprocess
import sys
import textwrap

import pytest

from jaxagent.envs.base import StepResult, Task
from jaxagent.envs.registry import (
    FLATTEN,
    EnvOptionsError,
    EnvSpec,
    env_names,
    get_env_spec,
    parse_options,
    register_env,
)


def test_builtin_options_are_typed_and_flat():
    opts = parse_options(
        "quickstart",
        {
            "num_train": 5,
            "levels": ["arith"],
            "max_steps": 4,
            "task_weight": 1,
            "system_prompt": True,
        },
    )
    assert opts.world.num_train == 5 and opts.world.levels == ("arith",)
    assert opts.env.max_steps == 4 and opts.env.task_weight == 1.0 and opts.system_prompt
    assert parse_options("quickstart", opts) is opts  # typed options pass through
    code = parse_options("code", {"num_train": 3, "reward": "shaped", "timeout_s": 2})
    assert code.source.num_train == 3 and code.env.sandbox.timeout_s == 2.0
    spec = get_env_spec("quickstart", {"num_train": 5, "num_test": 2, "max_steps": 3})
    assert len(spec.make_source().tasks("train")) == 5 and spec.system_prompt == ""
    # make_env goes to process workers: it pickles and rebuilds the same config.
    env = pickle.loads(pickle.dumps(spec.make_env))()
    assert env.config.max_steps == 3


@pytest.mark.parametrize(
    "options, match",
    [
        (
            {"num_trian": 5},
            r"env\.options\.num_trian=5 .*did you mean env\.options\.num_train\?"
            r".*allowed: \[.*'max_steps'",
        ),
        ({"num_train": "many"}, r"env\.options\.num_train='many' .* must be of type int"),
        ({"max_steps": True}, r"env\.options\.max_steps=True .* must be of type int"),
        ({"max_steps": 0}, r"env\.options\.max_steps=0: QuickstartEnvConfig\.max_steps must be"),
        ({"levels": ["nope"]}, r"env\.options\.levels=\('nope',\).*each must be one of"),
    ],
)
def test_option_errors_name_the_key_the_value_and_the_fix(options, match):
    with pytest.raises(EnvOptionsError, match=match):
        get_env_spec("quickstart", options)


def test_unknown_env_suggests_the_closest():
    with pytest.raises(KeyError, match="did you mean 'quickstart'"):
        get_env_spec("quickstrat")
    assert {"quickstart", "bfcl", "code"} <= set(env_names())


class _Echo:
    def reset(self, task):
        return task.prompt

    def step(self, action):
        return StepResult(action, 1.0, True, {"success": True})

    def close(self):
        pass


@dataclasses.dataclass(frozen=True)
class _EchoEnvConfig:
    loud: bool = False


@dataclasses.dataclass(frozen=True)
class _EchoOptions:
    num_tasks: int = 2
    env: _EchoEnvConfig = dataclasses.field(default_factory=_EchoEnvConfig, metadata=FLATTEN)


def test_a_suite_registers_itself_with_typed_options():
    seen = []

    def build(options):
        seen.append(options)
        tasks = [Task(str(i), "train", f"say {i}") for i in range(options.num_tasks)]
        return EnvSpec(name="echo_t", make_source=lambda: tasks, make_env=_Echo, system_prompt="")

    register_env("echo_t", build, options=_EchoOptions)
    register_env("echo_t", build, options=_EchoOptions)  # the same registration: harmless
    with pytest.raises(ValueError, match="already registered"):
        register_env("echo_t", lambda o: None, options=_EchoOptions)
    get_env_spec("echo_t", {"num_tasks": 3, "loud": True})
    assert seen[-1] == _EchoOptions(num_tasks=3, env=_EchoEnvConfig(loud=True))
    with pytest.raises(EnvOptionsError, match="allowed: \\['loud', 'num_tasks'\\]"):
        get_env_spec("echo_t", {"volume": 3})

    @dataclasses.dataclass(frozen=True)
    class Clash:
        num_tasks: int = 1
        env: _EchoOptions = dataclasses.field(default_factory=_EchoOptions, metadata=FLATTEN)

    with pytest.raises(TypeError, match="declared twice"):
        register_env("echo_clash", build, options=Clash)


def test_suites_load_lazily_without_jax(tmp_path):
    """Looking up one suite imports only that suite, never JAX; 'module:name' imports the
    module that registers it."""
    (tmp_path / "my_suite.py").write_text(
        textwrap.dedent("""
        from jaxagent.envs.registry import EnvSpec, register_env
        register_env("mine", lambda o: EnvSpec(name="mine", make_source=list,
                                               make_env=object, system_prompt="hi"))
    """)
    )
    code = textwrap.dedent("""
        import json, sys
        from jaxagent.envs.registry import get_env_spec
        get_env_spec("quickstart", {"num_train": 2}).make_env()
        get_env_spec("code", {}).make_env()
        spec = get_env_spec("my_suite:mine")
        print(json.dumps({"jax": "jax" in sys.modules,
                          "bfcl": "jaxagent.envs.tools.bfcl.suite" in sys.modules,
                          "mine": spec.system_prompt}))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "jax": False,
        "bfcl": False,
        "mine": "hi",
    }
