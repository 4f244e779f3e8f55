"""Tasks: HumanEval canonical solutions pass and wrong ones fail; generated split; leakage."""

import dataclasses

import pytest

from jaxagent.envs.base import SplitLeakageError, Task
from jaxagent.envs.code import (
    CodeTaskSource,
    Sandbox,
    SandboxConfig,
    assemble_program,
    check_no_leakage,
    extract_code,
    hidden_tests,
)
from jaxagent.envs.code._harness import split_check
from jaxagent.envs.code.generators import FAMILIES

SOURCE = CodeTaskSource(num_train=400, num_validation=60, seed=0)


@pytest.fixture(scope="module")
def sandbox():
    # 30 s: far above what a canonical solution takes; 5 s timed HumanEval/80 out at load 9
    with Sandbox(SandboxConfig(timeout_s=30.0), num_workers=2) as sb:
        yield sb


def _check_all(sandbox, tasks, completion=None):
    jobs = [
        (
            assemble_program(t, t.data["canonical_solution"] if completion is None else completion),
            hidden_tests(t),
        )
        for t in tasks
    ]
    return sandbox.map(jobs)


def test_humaneval_is_the_test_split():
    test = SOURCE.tasks("test")
    assert len(test) == 164 and {t.split for t in test} == {"test"}
    assert test[0].id == "HumanEval/0"
    assert all(not t.id.startswith("HumanEval") for t in SOURCE.tasks("train"))


def test_humaneval_sample_canonical_pass_and_return_none_fails(sandbox):
    # every 8th problem here; all 164 in the slow test below and in benchmarks/sandbox.py
    sample = SOURCE.tasks("test")[::8]
    results = _check_all(sandbox, sample)
    assert [r.status for r in results] == ["passed"] * len(sample), [
        (t.id, r.detail) for t, r in zip(sample, results) if not r.passed
    ]
    wrong = _check_all(sandbox, sample, "    return None\n")
    assert not any(r.passed for r in wrong)


@pytest.mark.slow
def test_humaneval_all_164(sandbox):
    tasks = SOURCE.tasks("test")
    assert sum(r.passed for r in _check_all(sandbox, tasks)) == 164
    assert sum(r.passed for r in _check_all(sandbox, tasks, "    return None\n")) == 0


def test_generated_canonical_pass_and_wrong_fail(sandbox):
    tasks = SOURCE.tasks("train")[:48]
    results = _check_all(sandbox, tasks)
    assert all(r.passed and r.tests_total == 8 for r in results), [
        (t.id, r.detail) for t, r in zip(tasks, results) if not r.passed
    ]
    wrong = _check_all(sandbox, tasks, "    return None\n")
    assert not any(r.passed for r in wrong)


def test_generated_split_is_varied_and_deterministic():
    train = SOURCE.tasks("train")
    assert len({t.prompt for t in train}) == len(train)  # no repeated problem
    assert len({t.data["family"] for t in train}) == len(FAMILIES)
    again = CodeTaskSource(num_train=400, num_validation=60, seed=0).tasks("train")
    assert [t.prompt for t in again] == [t.prompt for t in train]
    other = CodeTaskSource(num_train=400, seed=1).tasks("train")
    assert not {t.prompt for t in other} & {t.prompt for t in train}
    # the docstring example is never one of the hidden tests
    for t in train[:50]:
        example = t.prompt.split(">>> ")[1].split("\n")[0]
        assert example.replace(t.data["entry_point"], "candidate") not in t.data["test"]


def test_splits_disjoint_and_no_leakage_into_humaneval():
    SOURCE.check()


def test_leakage_check_catches_planted_overlaps():
    he = SOURCE.tasks("test")
    train = list(SOURCE.tasks("train")[:5])
    copy_prompt = dataclasses.replace(train[0], id="gen/x/1", prompt=he[3].prompt)
    same_name = dataclasses.replace(
        train[1], id="gen/x/2", data={**train[1].data, "entry_point": he[7].data["entry_point"]}
    )
    he_assert = next(line for line in he[11].data["test"].splitlines() if "assert" in line)
    same_assert = dataclasses.replace(
        train[2], id="gen/x/3", data={**train[2].data, "test": train[2].data["test"] + he_assert}
    )
    for bad, what in (
        (copy_prompt, "13-word prompt span"),
        (same_name, "entry point"),
        (same_assert, "test assertion"),
    ):
        with pytest.raises(SplitLeakageError, match=what):
            check_no_leakage(train + [bad], he)


def test_extract_code_and_assemble():
    task = Task("t", "train", 'def f(x):\n    """doc"""\n', {"entry_point": "f"})
    assert extract_code("text\n```python\na = 1\n```\nmore ```python\nb = 2\n```") == "b = 2\n"
    assert extract_code("def f(x): return x") == "def f(x): return x"
    assert assemble_program(task, "    return x\n").endswith('"""doc"""\n    return x\n')
    assert assemble_program(task, "def f(x):\n    return x\n").endswith(
        "\ndef f(x):\n    return x\n"
    )


def test_split_check_errors_name_the_problem():
    with pytest.raises(ValueError, match="exactly one `def check"):
        split_check("x = 1\n")
    with pytest.raises(ValueError, match="no assert"):
        split_check("def check(candidate):\n    assert True\n")
    spec = split_check(
        "import math\ndef check(candidate):\n    x = 2\n    assert candidate(x)\n"
        "    assert True\n    for i in range(3):\n        assert candidate(i) >= 0\n"
    )
    assert [is_test for is_test, _ in spec["units"]] == [False, True, False, True]
    assert "import math" in spec["module"]


def test_evaluate_samples_pass_at_k(sandbox):
    from jaxagent.envs.code.evaluate import evaluate_samples

    tasks = SOURCE.tasks("test")[:3]
    right = [f"```python\n{t.prompt}{t.data['canonical_solution']}```" for t in tasks]
    wrong = "    return None\n"
    # task 0: 2 of 3 right; task 1: 0 of 3; task 2: 3 of 3
    samples = [[right[0], wrong, right[0]], [wrong] * 3, [right[2]] * 3]
    report = evaluate_samples(sandbox, tasks, samples, ks=(1, 2))
    assert [p["passed"] for p in report["per_task"]] == [2, 0, 3]
    # pass@1 = mean(c/n); pass@2 = mean(1 - C(n-c,2)/C(n,2)) = (1 + 0 + 1) / 3
    assert report["pass@1"] == pytest.approx((2 / 3 + 0 + 1) / 3)
    assert report["pass@2"] == pytest.approx(2 / 3)
    assert report["pass^2"] == pytest.approx((1 / 3 + 0 + 1) / 3)
    with pytest.raises(ValueError, match="one list of sampled answers per task"):
        evaluate_samples(sandbox, tasks, samples[:2])
