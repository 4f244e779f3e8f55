import pytest

from jaxagent.envs.base import SplitLeakageError, StepResult, Task, check_disjoint_splits


class _Source:
    def __init__(self, table):
        self.table = table

    def splits(self):
        return list(self.table)

    def tasks(self, split):
        return self.table[split]


def test_disjoint_splits_pass():
    src = _Source({"train": [Task("a", "train", "p1")], "test": [Task("b", "test", "p2")]})
    check_disjoint_splits(src)


def test_leakage_by_prompt_is_detected():
    src = _Source({"train": [Task("a", "train", "same")], "test": [Task("b", "test", "same")]})
    with pytest.raises(SplitLeakageError, match="'b'.*'test'.*'train'"):
        check_disjoint_splits(src)


def test_step_result_truncation_is_not_termination():
    step = StepResult("obs", 0.0, True, {"truncated": True})
    assert step.truncated and not step.terminated
    assert StepResult("obs", 1.0, True).terminated
