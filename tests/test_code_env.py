"""Unit-test rewards: shaped / binary, robustness to checker gaming, multi-turn feedback, pool."""

import functools

import pytest

from jaxagent.envs.base import FailureMode, Task, TextEnv
from jaxagent.envs.code import CodeEnv, CodeEnvConfig, Sandbox, SandboxConfig, TestSpec

TESTS = """
def check(candidate):
    assert candidate(1, 2) == 3
    assert candidate(-4, 4) == 0
    assert candidate(10, 5) == 15
    assert candidate(0, 7) == 7
"""
TASK = Task(
    id="add",
    split="train",
    prompt='def add(a, b):\n    """Return a + b.\n\n    >>> add(2, 2)\n    4\n    """\n',
    data={"entry_point": "add", "test": TESTS, "prelude": ""},
)
SPEC = TestSpec("add", TESTS)
RIGHT = "def add(a, b):\n    return a + b\n"
PARTIAL = "def add(a, b):\n    return a + b if a > 0 else 99\n"  # passes tests 1 and 3


# Wall-clock limits far above what these programs take (well under a second): on a loaded
# 2-core machine (load average 9) 2-5 s limits turned passing programs into timeouts. The
# tests of a limit set a short one of their own on a program that never ends.
@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(timeout_s=30.0, memory_mb=256)) as sb:
        yield sb


def test_shaped_and_binary_scores(sandbox):
    r = sandbox.run(RIGHT, SPEC)
    assert r.status == "passed" and (r.tests_passed, r.tests_total) == (4, 4)
    r = sandbox.run(PARTIAL, SPEC)
    assert r.status == "failed" and (r.tests_passed, r.tests_total) == (2, 4)
    assert r.fraction_passed == 0.5
    assert "assert candidate(-4, 4) == 0" in r.detail and "-> 99" in r.detail
    for reward, expected in (("shaped", 0.5), ("binary", 0.0)):
        env = CodeEnv(CodeEnvConfig(reward=reward), sandbox=sandbox)
        env.reset(TASK)
        step = env.step(f"Here you go:\n```python\n{PARTIAL}```")
        assert step.done and step.reward == expected
        assert step.info["failure_mode"] == FailureMode.TESTS_FAILED.value
        assert step.info["reward_terms"]["process"] == 0.5


GAMING = {
    "exit 0 before the tests": "import os\nos._exit(0)\n",
    "sys.exit(0) in the call": "def add(a, b):\n    raise SystemExit(0)\n",
    "always-equal object": (
        "class Eq:\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Eq()\n"
    ),
    "int subclass equal to all": (
        "class I(int):\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return I(0)\n"
    ),
    "non-builtin type equal to the answer": (
        "import fractions\ndef add(a, b):\n    return fractions.Fraction(a + b)\n"
    ),
    "forge the ready message": (
        "import os, pickle, struct\n"
        "msg = pickle.dumps(('load_error', 1, 2))\n"
        "for fd in range(3, 20):\n"
        "    try:\n        os.write(fd, struct.pack('<Q', len(msg)) + msg)\n"
        "    except OSError:\n        pass\n"
        "def add(a, b):\n    return a + b\n"
    ),
    "patch assert and builtins": (
        "import builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\n"
        "builtins.abs = lambda x: 0\nbuiltins.print = lambda *a: None\n"
        "def check(candidate):\n    return True\n"
        "def add(a, b):\n    return None\n"
    ),
    "print fake results": (
        "print('4/4 tests passed'); print('passed')\n"
        "def add(a, b):\n    print('PASSED')\n    return None\n"
    ),
    "forge replies on the pipes": (
        "import os, pickle, struct\n"
        "msg = pickle.dumps(('ok', 3))\n"
        "for fd in range(3, 20):\n"
        "    try:\n        os.write(fd, struct.pack('<Q', len(msg)) + msg * 50)\n"
        "    except OSError:\n        pass\n"
        "def add(a, b):\n    return None\n"
    ),
    "kill the harness": (
        "import os, signal\n"
        "for pid in range(1, 50):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\n"
        "def add(a, b):\n    return None\n"
    ),
}


@pytest.mark.parametrize("name", sorted(GAMING))
def test_gaming_the_checker_earns_nothing(sandbox, name):
    r = sandbox.run(GAMING[name], SPEC)
    # "error" would mean the sandbox's fault (excluded from training statistics): never allowed
    assert r.status in ("failed", "crashed") and r.tests_passed == 0, (name, r)


def test_candidate_never_holds_the_expected_values(sandbox):
    # The expected value appears only in the tests; a candidate that searches its own memory
    # for it (gc objects, frames, the solution file, its cwd) must not find it.
    tests = "def check(candidate):\n    assert candidate() == 'zq' + '-hidden-7781'\n"
    code = (
        "import gc, os, sys\n"
        "def steal():\n"
        "    for o in gc.get_objects():\n"
        "        if isinstance(o, str) and 'hidden-7781' in o:\n            return o\n"
        "    for name in os.listdir('.'):\n"
        "        text = open(name, errors='ignore').read()\n"
        "        if 'hidden-7781' in text and 'steal' not in text:\n            return text\n"
        "    return None\n"
    )
    r = sandbox.run(code, TestSpec("steal", tests))
    assert r.status == "failed" and "-> None" in r.detail, r


def test_multi_turn_feedback_then_fix(sandbox):
    env = CodeEnv(CodeEnvConfig(reward="binary", max_turns=3), sandbox=sandbox)
    assert isinstance(env, TextEnv)
    obs = env.reset(TASK)
    assert "def add(a, b)" in obs
    s1 = env.step("```python\ndef add(a, b):\n    return a - b\n```")
    assert not s1.done and s1.reward == 0.0
    # feedback quotes the prompt's own example, never a hidden test or its expected value
    assert "assert add(2, 2) == 4" in s1.observation and "candidate(2, 2) -> 0" in s1.observation
    assert "0/1 passed" in s1.observation and "Hidden tests: not all passed" in s1.observation
    assert "candidate(1, 2)" not in s1.observation and "== 3" not in s1.observation
    s2 = env.step("```python\ndef add(a, b):\n    return a +\n```")
    assert not s2.done and "SyntaxError" in s2.observation
    assert s2.info["failure_mode"] == FailureMode.INVALID_SYNTAX.value
    s3 = env.step(f"```python\n{RIGHT}```")
    assert s3.done and s3.reward == 1.0 and s3.info["success"] and s3.info["turn"] == 3


def test_multi_turn_budget_ends_with_the_last_attempt(sandbox):
    env = CodeEnv(CodeEnvConfig(reward="shaped", max_turns=2), sandbox=sandbox)
    env.reset(TASK)
    assert not env.step("def add(a, b):\n    return 0\n").done
    last = env.step(PARTIAL)
    assert last.done and last.reward == 0.5 and not last.info["success"]


def test_timeout_is_labelled():
    with Sandbox(SandboxConfig(timeout_s=1.0, memory_mb=256)) as short:
        env = CodeEnv(CodeEnvConfig(), sandbox=short)
        env.reset(TASK)
        step = env.step("def add(a, b):\n    while True:\n        pass\n")
    assert step.done and step.reward == 0.0
    assert step.info["failure_mode"] == FailureMode.TIMEOUT.value


def test_runs_through_the_env_pool_process_backend():
    from jaxagent.pool import EnvPool, PoolConfig

    cfg = CodeEnvConfig(reward="shaped", sandbox=SandboxConfig(timeout_s=30.0, memory_mb=256))
    from jaxagent.envs.code.env import make_code_env

    pool = EnvPool(
        functools.partial(make_code_env, config=cfg),
        PoolConfig(num_envs=2, backend="process", step_timeout_s=120),
    )
    try:
        pool.async_reset([0, 1], [TASK, TASK])
        resets = pool.recv(min_batch=2, timeout=60)
        assert sorted(r.env_id for r in resets) == [0, 1]
        pool.send([0, 1], [RIGHT, PARTIAL])
        steps = {r.env_id: r for r in pool.recv(min_batch=2, timeout=60)}
        assert steps[0].done and steps[0].reward == 1.0
        assert steps[1].done and steps[1].reward == 0.5
    finally:
        pool.close()


def test_suite_options_and_expert(sandbox):
    from jaxagent.envs.code import suite

    s = suite.build({"num_train": 5, "seed": 3, "reward": "shaped", "timeout_s": 2.0})
    assert len(s.source.tasks("train")) == 5 and s.env_config.reward == "shaped"
    with pytest.raises(ValueError, match="env.options.colour"):
        suite.build({"colour": "red"})
    task = s.source.tasks("train")[0]
    env = CodeEnv(s.env_config, sandbox=sandbox)
    for error_rate, reward in ((0.0, 1.0), (1.0, 0.0)):
        expert = s.make_expert(task, error_rate, None)
        env.reset(task)
        step = env.step(expert.act(""))
        assert step.done and step.reward == reward, step.info


def test_call_timeout_fails_one_test_and_the_rest_still_run():
    tests = "def check(candidate):\n" + "".join(
        f"    assert candidate({i}) == {i}\n" for i in range(5)
    )
    slow = "def f(x):\n    while x == 2:\n        pass\n    return x\n"
    with Sandbox(SandboxConfig(timeout_s=30.0, call_timeout_s=0.4, memory_mb=256)) as sb:
        r = sb.run(slow, TestSpec("f", tests))
        assert r.status == "timeout" and (r.tests_passed, r.tests_total) == (4, 5), r
        assert [u["ok"] for u in r.test_results] == [True, True, False, True, True]
        assert r.duration_s < 15.0  # the hung call was cut, not the whole job's timeout_s
        assert sb.run("def f(x):\n    return x\n", TestSpec("f", tests)).passed
    with pytest.raises(ValueError, match="call_timeout_s=5"):
        SandboxConfig(timeout_s=2.0, call_timeout_s=5)
