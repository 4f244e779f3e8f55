"""BFCLEnv: BFCL multi-turn stateful API worlds as a ``TextEnv``.

One episode is one BFCL entry. ``reset`` builds the entry's app instances (file system,
messaging, posting, tickets, trading, travel, vehicle, math) from its initial configuration
and shows the documented tools and the first user turn. Each ``step`` is either tool calls
(Python-call syntax, a list of calls, JSON calls, or ReAct ``Action:``), executed against the
live instances, or a message without calls (``Final: ...``, plain text, or empty), which ends
the user turn. At the end of every turn the turn is scored with BFCL's own checker functions
(``state_checker``: every app instance equals the one reached by the ground truth;
``response_checker``: the ground truth's call results are covered by the agent's), then the
next user turn (and any functions that turn makes available) is shown. An entry with
``answers`` (generated tasks) also needs each turn's answers in the reply that ends it, and
one with ``shown_functions`` lists only those tools. As in BFCL's executor,
a documented function of an involved app runs even before the turn that offers it.

Agent text is parsed with ``ast`` and calls go to public methods of the involved instances by
name: nothing is ``eval``-ed. With ``strict_schema=False`` (default, the benchmark's own
semantics) a call to a known tool runs even when its arguments fail the JSON Schema (the step
is labelled ``bad_arguments`` and the schema error is shown next to the result); with
``strict_schema=True`` such calls are rejected.
"""

from __future__ import annotations

import dataclasses
import json

from jaxagent.envs import actions as A
from jaxagent.envs.tool_spec import ActionError, ErrorKind, ParsedAction, ToolCall, ToolSpec
from jaxagent.envs.base import (
    FailureMode,
    StepResult,
    Task,
    Termination,
    env_error_info,
    truncate_observation,
)
from jaxagent.envs.rewards import RewardMix, episode_reward, reward_terms
from jaxagent.envs.tools.bfcl import data as D

_LADDER = {
    FailureMode.INVALID_SYNTAX: 0.0,
    FailureMode.UNKNOWN_TOOL: 1 / 3,
    FailureMode.BAD_ARGUMENTS: 2 / 3,
}
_SEVERITY = [
    FailureMode.INVALID_SYNTAX,
    FailureMode.UNKNOWN_TOOL,
    FailureMode.BAD_ARGUMENTS,
    FailureMode.TOOL_ERROR,
]
_CHECK_LABEL = {
    "multi_turn:instance_state_mismatch": FailureMode.WRONG_STATE,
    "multi_turn:execution_response_mismatch": FailureMode.WRONG_ANSWER,
    "multi_turn:empty_turn_model_response": FailureMode.GAVE_UP,
    "multi_turn:irrelevance_error:decoder_success": FailureMode.WRONG_STATE,
    "answer_missing": FailureMode.WRONG_ANSWER,
}


TOOL_FORMATS = ("json", "signature", "compact")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BFCLEnvConfig:
    """Episode settings."""

    max_steps_per_turn: int = 10  # tool-call actions per user turn before truncation
    strict_schema: bool = False  # reject schema-invalid calls instead of running them
    stop_at_first_failed_turn: bool = True  # BFCL fails the entry at its first failed turn
    max_result_chars: int = 2000  # longer tool results are cut with a visible marker (>= 64)
    # "json": full JSON Schema docs; "signature": one line a tool with its description;
    # "compact": the signature alone (a fifth of the prompt: small models on CPU)
    tool_format: str = "json"
    # "json": results as BFCL returns them; "keywords": in call syntax (price=102.8), so a
    # value is read and written with the same left context (data.keyword_text)
    result_format: str = "json"
    task_weight: float = 1.0  # RewardMix weights; the episode reward is paid on its last step
    outcome_weight: float = 0.0  # outcome term: fraction of user turns passed
    process_weight: float = 0.0  # mean per-step process score (valid-call ladder)
    gate: str = "none"  # RewardMix gate: "none" | "cap" | "task"
    cap: float = 0.5  # RewardMix cap on shaping under the "cap" and "task" gates

    def __post_init__(self):
        if self.max_steps_per_turn < 1:
            raise ValueError(
                f"BFCLEnvConfig.max_steps_per_turn must be >= 1, got {self.max_steps_per_turn}"
            )
        if self.max_result_chars < 64:
            raise ValueError(
                f"BFCLEnvConfig.max_result_chars must be >= 64, got {self.max_result_chars}"
            )
        if self.tool_format not in TOOL_FORMATS:
            raise ValueError(
                f"BFCLEnvConfig.tool_format must be one of {TOOL_FORMATS}, got {self.tool_format!r}"
            )
        if self.result_format not in ("json", "keywords"):
            raise ValueError(
                "BFCLEnvConfig.result_format must be 'json' or 'keywords', "
                f"got {self.result_format!r}"
            )
        self.reward_mix  # validates weights, gate and cap

    @property
    def reward_mix(self) -> RewardMix:
        return RewardMix(
            process_weight=self.process_weight,
            outcome_weight=self.outcome_weight,
            task_weight=self.task_weight,
            gate=self.gate,
            cap=self.cap,
        )


def system_prompt() -> str:
    return (
        "You operate stateful apps through tool calls. Reply with calls in Python syntax, "
        "e.g. [cd(folder='docs'), ls()], or with JSON calls; you will see each call's "
        "result. When the user's request is done, reply with a message without calls "
        "(e.g. 'Final: done') to get the next request."
    )


def _tool_error(result: str) -> bool:
    if result.startswith("Error during execution"):
        return True
    try:
        value = json.loads(result)
    except (ValueError, TypeError):
        return False
    return isinstance(value, dict) and "error" in value


class BFCLEnv:
    """One BFCL multi-turn entry per episode (``TextEnv`` protocol)."""

    def __init__(self, config: BFCLEnvConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or BFCLEnvConfig(), **overrides)
        self._entry: dict | None = None

    # ---------------------------------------------------------------- episode set-up
    def reset(self, task: Task) -> str:
        self._entry = dict(task.data)
        self._turn, self._turn_steps, self._done = 0, 0, False
        self._turn_calls: list[str] = []  # calls executed in the current turn
        self._all_results: list[str] = []  # every executed call's result, all turns
        self._turn_results: list[dict] = []  # BFCL verdict per finished turn
        self._setup_error = None
        self._terms: list[dict[str, float]] = []
        try:
            self._instances = D.make_instances(self._entry)
            self._gt_instances = D.make_instances(self._entry)
            self._methods = D.public_methods(self._instances)
            self._gt_methods = D.public_methods(self._gt_instances)
            self._all_specs = D.tool_specs(self._entry, self._methods)
            held = {
                name for names in self._entry.get("missed_function", {}).values() for name in names
            }
            self._tools = {n: s for n, s in self._all_specs.items() if n not in held}
            if "shown_functions" in self._entry:  # generated tasks list a few tools, in order
                shown = self._entry["shown_functions"]
                self._tools = {n: self._tools[n] for n in shown if n in self._tools}
        except Exception as exc:  # bad data or a broken backend: the environment failed
            self._setup_error = f"{type(exc).__name__}: {exc}"
            return f"environment error while loading {task.id}: {self._setup_error}"
        return self._tools_text(self._tools) + "\n\n" + self._user_text(0)

    def _tools_text(self, tools: dict[str, ToolSpec], header="Available tools") -> str:
        if self.config.tool_format == "json":
            lines = [json.dumps(s.to_json_schema()) for s in tools.values()]
        elif self.config.tool_format == "compact":
            lines = [s.signature() for s in tools.values()]
        else:
            lines = [f"{s.signature()}: {s.description}" for s in tools.values()]
        return f"{header}:\n" + "\n".join(lines)

    def _user_text(self, turn: int) -> str:
        messages = [m["content"] for m in self._entry["question"][turn] if m.get("role") == "user"]
        return "User: " + ("\n".join(messages) if messages else "(no new message; continue)")

    # ---------------------------------------------------------------- stepping
    def step(self, action: str) -> StepResult:
        if self._entry is None or self._done:
            raise RuntimeError(
                "BFCLEnv.step called before reset() or after the episode ended; "
                "call reset(task) first"
            )
        if self._setup_error is not None:
            return self._end(
                FailureMode.ENV_ERROR, "environment error", process=0.0, note=self._setup_error
            )
        try:
            parsed = A.parse_action(action)
            ends_turn = (isinstance(parsed, ParsedAction) and parsed.is_final) or (
                isinstance(parsed, ActionError)
                and parsed.kind in (ErrorKind.EMPTY, ErrorKind.NO_ACTION)
            )
            if ends_turn:
                return self._end_turn(parsed.final if isinstance(parsed, ParsedAction) else "")
            self._turn_steps += 1
            if isinstance(parsed, ActionError):
                obs, mode, process, dangerous = parsed.message, parsed.failure_mode, 0.0, []
            else:
                obs, mode, process, dangerous = self._run_calls(parsed.calls)
        except Exception as exc:  # a bug or a crash on our side, never the agent's fault
            return self._end(
                FailureMode.ENV_ERROR,
                "environment error",
                process=0.0,
                note=f"{type(exc).__name__}: {exc}",
            )
        if self._turn_steps >= self.config.max_steps_per_turn:
            return self._end(
                FailureMode.STEP_BUDGET,
                obs + "\n(step budget of this turn over)",
                process=process,
                truncated=True,
                dangerous=dangerous,
            )
        return self._result(obs, False, mode, process, dangerous=dangerous)

    def _run_calls(self, calls) -> tuple[str, FailureMode | None, float, list[str]]:
        lines, modes, dangerous = [], [], []
        asked = {c.split("(")[0].strip() for c in self._current_ground_truth()}
        for call in calls:
            # Like BFCL's executor, any documented function of the involved apps runs, even
            # one held out for a later turn (the miss_func ground truth sometimes calls one
            # early); only the offered tools are shown and suggested.
            spec = self._all_specs.get(call.name)
            if spec is None or call.name not in self._methods:
                err = A.unknown_tool_error(call.name, self._tools)
                lines.append(err.message)
                modes.append(err.failure_mode)
                continue
            bound = A.bind_call(call, spec)
            note = ""
            if isinstance(bound, ActionError):
                modes.append(bound.failure_mode)
                if self.config.strict_schema or bound.kind != ErrorKind.INVALID_ARGUMENTS:
                    lines.append(bound.message)
                    continue
                note = f"  [schema: {bound.message}]"
                kwargs = dict(call.kwargs, **dict(zip(spec.param_order, call.args)))
            else:
                kwargs = dict(bound.kwargs)
            result = D.call_method(self._methods[call.name], kwargs)
            self._all_results.append(result)
            self._turn_calls.append(call.name)
            if _tool_error(result):
                modes.append(FailureMode.TOOL_ERROR)
            if spec.dangerous and call.name not in asked:
                dangerous.append(ToolCall(call.name, kwargs).render())
            shown = D.shown_result(result, self.config.result_format)
            shown = truncate_observation(shown, self.config.max_result_chars)
            lines.append(f"{ToolCall(call.name, kwargs).render()} -> {shown}{note}")
        mode = min(modes, key=_SEVERITY.index) if modes else None
        process = min((_LADDER.get(m, 1.0) for m in modes), default=1.0)
        return "\n".join(lines), mode, process, dangerous

    def _current_ground_truth(self) -> list[str]:
        return list(self._entry["ground_truth"][self._turn])

    # ---------------------------------------------------------------- turn ends and scoring
    def _end_turn(self, reply: str) -> StepResult:
        verdict = self._score_turn()
        answers = self._entry.get("answers", [])
        missing = [a for a in (answers[self._turn] if answers else []) if a not in reply]
        if verdict["valid"] and missing:  # a question's answer belongs in the reply
            verdict = {
                "valid": False,
                "error_type": "answer_missing",
                "error_message": f"the reply ending turn {self._turn} does not contain "
                f"the answer {missing[0]!r}",
            }
        self._turn_results.append(verdict)
        turn = self._turn
        if not verdict["valid"] and self.config.stop_at_first_failed_turn:
            mode = _CHECK_LABEL.get(verdict.get("error_type"), FailureMode.WRONG_STATE)
            return self._end(
                mode,
                f"turn {turn} failed: {verdict['error_message']}",
                process=1.0,
                outcome=self._passed_fraction(),
            )
        self._turn, self._turn_steps, self._turn_calls = turn + 1, 0, []
        if self._turn >= len(self._entry["question"]):
            ok = all(v["valid"] for v in self._turn_results)
            first_bad = next((v for v in self._turn_results if not v["valid"]), None)
            mode = (
                None
                if ok
                else _CHECK_LABEL.get(first_bad.get("error_type"), FailureMode.WRONG_STATE)
            )
            return self._end(mode, "all turns done", process=1.0, outcome=self._passed_fraction())
        new = {
            n: s
            for n, s in self._all_specs.items()
            if n in self._entry.get("missed_function", {}).get(str(self._turn), [])
        }
        self._tools.update(new)
        text = self._tools_text(new, "New tools available") + "\n\n" if new else ""
        return self._result(
            text + self._user_text(self._turn), False, None, 1.0, outcome=float(verdict["valid"])
        )

    def _passed_fraction(self) -> float:
        passed = sum(v["valid"] for v in self._turn_results)
        return passed / len(self._entry["question"])

    def _score_turn(self) -> dict:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
            response_checker,
            state_checker,
        )

        gt_results = []
        for call_text in self._current_ground_truth():
            parsed = A.parse_action(call_text)
            call = parsed.calls[0]
            spec = self._all_specs[call.name]
            kwargs = dict(call.kwargs, **dict(zip(spec.param_order, call.args)))
            gt_results.append(D.call_method(self._gt_methods[call.name], kwargs))
        if not gt_results:  # the request cannot be served yet: the agent must not act
            if self._turn_calls:
                return {
                    "valid": False,
                    "error_type": "multi_turn:irrelevance_error:decoder_success",
                    "error_message": "called tools in a turn that "
                    "needed none (information or a function was missing)",
                }
            return {"valid": True}
        if not self._turn_calls:
            return {
                "valid": False,
                "error_type": "multi_turn:empty_turn_model_response",
                "error_message": f"no tool call in turn {self._turn}",
            }
        verdict = state_checker(self._instances, self._gt_instances)
        if verdict["valid"]:
            verdict = response_checker(self._all_results, gt_results, self._turn)
        return verdict

    # ---------------------------------------------------------------- results
    def _result(
        self,
        obs,
        done,
        mode,
        process,
        outcome=0.0,
        task=0.0,
        truncated=False,
        dangerous=(),
        note=None,
    ) -> StepResult:
        terms = reward_terms(process, outcome, task)
        self._terms.append(terms)
        reward = episode_reward(self._terms, self.config.reward_mix) if done else 0.0
        info = {
            "reward_terms": terms,
            "failure_mode": mode and mode.value,
            "truncated": truncated,
            "success": done and task == 1.0,
            "dangerous": list(dangerous),
            "turn": self._turn,
        }
        if done:
            info["termination"] = (
                Termination.TRUNCATED if truncated else Termination.TERMINATED
            ).value
            info["turn_results"] = list(self._turn_results)
        if mode == FailureMode.ENV_ERROR:
            info.update(env_error_info("exception", note or ""))
        if note is not None:
            info["error"] = note
        return StepResult(obs, reward, done, info)

    def _end(
        self, mode, obs, process, outcome=0.0, truncated=False, dangerous=(), note=None
    ) -> StepResult:
        self._done = True
        return self._result(
            obs,
            True,
            mode,
            process,
            outcome=outcome,
            task=float(mode is None),
            truncated=truncated,
            dangerous=dangerous,
            note=note,
        )

    def close(self) -> None:
        self._entry = None
        self._instances = self._gt_instances = {}
