"""QuickstartEnv: the quickstart tool world as a ``TextEnv``.

Observations and actions are single-space separated words (see ``vocab.vocabulary``):

  reset -> "task : what do 3 shares of acme cost ? tools : price ( item ) mul ( a , b ) ..."
  step("Action : price ( item = \" acme \" )")  -> "Observation : 12"
  step("Action : mul ( a = 12 , b = 3 )")       -> "Observation : 36"
  step("Final : 36")                            -> done, success

String arguments are whitespace-stripped before validation, because a word-level detokenizer
puts spaces inside the quotes. Malformed calls come back as short error observations
(``compact_errors=True``, words from the vocabulary) or as the full readable messages of
``jaxagent.envs.actions`` (``compact_errors=False``); they never raise and never end the
episode (except an empty action, which is giving up). Success = the final answer is right and
the calendar and notes equal the expected end state.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from jaxagent.envs import actions as A
from jaxagent.envs.tool_spec import ActionError, ErrorKind, ToolCall
from jaxagent.envs.base import FailureMode, StepResult, Task, Termination, env_error_info
from jaxagent.envs.rewards import RewardMix, episode_reward, process_score, reward_terms
from jaxagent.envs.tools.quickstart import world as W
from jaxagent.envs.tools.quickstart.vocab import vocabulary


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuickstartEnvConfig:
    """Episode settings. The reward terms combine through ``jaxagent.envs.rewards.RewardMix``;
    the episode's reward is paid on its last step (earlier steps pay 0), so the sum of step
    rewards equals ``episode_reward(terms, mix)``. Default: the task term alone (LOOP)."""

    max_steps: int = 6  # actions per episode before truncation (plans need at most 5)
    compact_errors: bool = True  # short vocabulary-only error observations
    tool_list: str = "signatures"  # reset shows "price ( item )" ("signatures") or "price"
    task_weight: float = 1.0  # weight of the task term (1 at a successful end)
    outcome_weight: float = 0.0  # weight of the outcome term (1 when the final answer is right)
    process_weight: float = 0.0  # weight of the mean per-step process score (valid-call ladder)
    gate: str = "none"  # RewardMix gate: "none" | "cap" | "task"
    cap: float = 0.5  # RewardMix cap on shaping under the "cap" and "task" gates

    def __post_init__(self):
        if self.max_steps < 1:
            raise ValueError(f"QuickstartEnvConfig.max_steps must be >= 1, got {self.max_steps}")
        if self.tool_list not in ("signatures", "names"):
            raise ValueError(
                f"QuickstartEnvConfig.tool_list must be 'signatures' or 'names', "
                f"got {self.tool_list!r}"
            )
        self.reward_mix  # validates weights, gate and cap (errors name the field)

    @property
    def reward_mix(self) -> RewardMix:
        return RewardMix(
            process_weight=self.process_weight,
            outcome_weight=self.outcome_weight,
            task_weight=self.task_weight,
            gate=self.gate,
            cap=self.cap,
        )


def _strip_strings(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def reset_observation(task: Task, tool_list: str = "signatures") -> str:
    """``task : <sentence> tools : <the task's tools>`` (signatures or bare names)."""
    show = W.compact_signature if tool_list == "signatures" else str
    return f"task : {task.prompt} tools : {' '.join(show(t) for t in task.data['tools'])}"


def normalize_answer(text: str) -> str:
    return " ".join(text.replace('"', " ").split()).lower()


class QuickstartEnv:
    """One episode at a time over quickstart tasks (``TextEnv`` protocol)."""

    def __init__(self, config: QuickstartEnvConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or QuickstartEnvConfig(), **overrides)
        self._task: Task | None = None

    def reset(self, task: Task) -> str:
        self._task = task
        self._state = copy.deepcopy(dict(task.data["state"]))
        self._tools = {t: W.TOOL_SPECS[t] for t in task.data["tools"]}
        self._steps = 0
        self._terms: list[dict[str, float]] = []
        self._done = False
        return reset_observation(task, self.config.tool_list)

    @property
    def state(self) -> dict:
        """The live world state (read-only use: tests and evaluation)."""
        return self._state

    def step(self, action: str) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError(
                "QuickstartEnv.step called before reset() or after the episode "
                "ended; call reset(task) first"
            )
        self._steps += 1
        parsed = A.parse_action(action)
        if isinstance(parsed, ActionError):
            if parsed.kind == ErrorKind.EMPTY:
                return self._finish(None, FailureMode.GAVE_UP, process=0.0)
            return self._error_step(parsed)
        if parsed.is_final:
            return self._finish(parsed.final, None, process=1.0)
        if len(parsed.calls) != 1:
            return self._error_step(
                ActionError(ErrorKind.NOT_A_CALL, "error: write one call per action")
            )
        return self._call_step(parsed.calls[0])

    def _call_step(self, call: ToolCall) -> StepResult:
        spec = self._tools.get(call.name)
        if spec is None:
            return self._error_step(A.unknown_tool_error(call.name, self._tools))
        call = ToolCall(
            call.name,
            {k: _strip_strings(v) for k, v in call.kwargs.items()},
            tuple(_strip_strings(v) for v in call.args),
            call.text,
        )
        bound = A.bind_call(call, spec)
        if isinstance(bound, ActionError):
            return self._error_step(bound)
        try:
            result, self._state, is_error = W.execute(self._state, call.name, bound.kwargs)
        except Exception as exc:  # a bug in the world, not the agent's fault: env_error
            return self._finish(
                None, FailureMode.ENV_ERROR, process=1.0, note=f"{type(exc).__name__}: {exc}"
            )
        dangerous = (
            [bound.render()]
            if spec.dangerous and call.name not in self._task.data["asked_dangerous"]
            else []
        )
        mode = FailureMode.TOOL_ERROR if is_error else None
        return self._continue(f"Observation : {result}", mode, process=1.0, dangerous=dangerous)

    def _error_step(self, error: ActionError) -> StepResult:
        text = self._compact(error) if self.config.compact_errors else error.message
        mode = error.failure_mode
        process = process_score(
            mode != FailureMode.INVALID_SYNTAX,
            mode not in (FailureMode.INVALID_SYNTAX, FailureMode.UNKNOWN_TOOL),
            False,
        )
        return self._continue(f"Observation : {text}", mode, process=process)

    def _compact(self, error: ActionError) -> str:
        vocab = _vocab()
        if error.failure_mode == FailureMode.UNKNOWN_TOOL:
            name = error.tool if error.tool in vocab else ""
            return " ".join(f"error : unknown tool {name}".split())
        if error.failure_mode == FailureMode.BAD_ARGUMENTS:
            arg = error.argument if error.argument in vocab else ""
            return " ".join(f"error : bad argument {arg} for {error.tool}".split())
        return "error : bad syntax"

    def _continue(self, obs: str, mode, process: float, dangerous=()) -> StepResult:
        if self._steps >= self.config.max_steps:
            return self._finish(
                None, FailureMode.STEP_BUDGET, process=process, truncated=True, dangerous=dangerous
            )
        terms = reward_terms(process=process)
        self._terms.append(terms)
        info = {
            "reward_terms": terms,
            "failure_mode": mode and mode.value,
            "truncated": False,
            "success": False,
            "dangerous": list(dangerous),
        }
        return StepResult(obs, 0.0, False, info)

    def _finish(
        self,
        answer: str | None,
        mode,
        process: float,
        truncated: bool = False,
        dangerous=(),
        note: str | None = None,
    ) -> StepResult:
        self._done = True
        data = self._task.data
        right_answer = answer is not None and normalize_answer(answer) == normalize_answer(
            data["answer"]
        )
        right_state = W.mutable_part(self._state) == data["expected"]
        if mode is None:
            if answer is None or not normalize_answer(answer):
                mode = FailureMode.GAVE_UP
            elif not right_state:
                mode = FailureMode.WRONG_STATE
            elif not right_answer:
                mode = FailureMode.WRONG_ANSWER
        success = mode is None
        terms = reward_terms(process, float(right_answer), float(success))
        self._terms.append(terms)
        info = {
            "reward_terms": terms,
            "failure_mode": mode and mode.value,
            "truncated": truncated,
            "success": success,
            "dangerous": list(dangerous),
        }
        info["termination"] = (Termination.TRUNCATED if truncated else Termination.TERMINATED).value
        if mode == FailureMode.ENV_ERROR:
            info.update(env_error_info("exception", note or ""))
            info["error"] = note
        obs = "Observation : step budget over" if truncated else "Observation : done"
        return StepResult(obs, episode_reward(self._terms, self.config.reward_mix), True, info)

    def snapshot(self) -> dict:
        """The whole episode state (``SnapshotEnv``): a deep copy, so later steps leave it
        unchanged. For tree search (``jaxagent.agents.methods.dfsdt``)."""
        if self._task is None:
            raise RuntimeError("QuickstartEnv.snapshot called before reset(task)")
        keep = ("_state", "_steps", "_terms", "_done")
        return {"task": self._task, **copy.deepcopy({k: getattr(self, k) for k in keep})}

    def restore(self, snapshot: dict) -> None:
        """Put the episode back where ``snapshot()`` was taken (the same task's tools)."""
        self._task = snapshot["task"]
        self._tools = {t: W.TOOL_SPECS[t] for t in self._task.data["tools"]}
        for k in ("_state", "_steps", "_terms", "_done"):
            setattr(self, k, copy.deepcopy(snapshot[k]))

    def close(self) -> None:
        self._task = None


_VOCAB: frozenset[str] | None = None


def _vocab() -> frozenset[str]:
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = frozenset(vocabulary())
    return _VOCAB
