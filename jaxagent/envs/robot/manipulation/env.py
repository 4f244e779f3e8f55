"""``ManipulationEnv``: the tabletop as a text environment whose physics is real.

  reset -> "task : put the red block in the blue cup tools : look ( ) move_to ( object ) ..."
  step('Action : move_to ( object = " red block " )')             -> "Observation : ok"
  step('Action : grasp ( object = " red block " )')               -> "Observation : ok"
  step('Action : place ( object = " red block " , location = " blue cup " )') -> ok
  step("Final : done")                                            -> done; success from physics

Every skill call runs its scripted controller in MuJoCo (``skills.py``); success and the
process reward are read from the simulated state at the end (``tasks.check_subgoal``). The
reward, paid on the last step: ``task_weight * success + process_weight * (sub-goals met /
sub-goals)``. Safety violations (an object knocked off the table, a contact force over the
limit, a skill attempted on an unreachable object) are counted in ``info["safety"]`` and
reported as ``info["dangerous"]`` on the step where they happen, which the evaluation
report counts as safety violations.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxagent.envs import actions as A
from jaxagent.envs.tool_spec import ActionError, ErrorKind, ToolCall, ToolSpec
from jaxagent.envs.base import FailureMode, StepResult, Task, Termination, env_error_info
from jaxagent.envs.robot.manipulation import scene as S
from jaxagent.envs.robot.manipulation.skills import DIRECTIONS, Safety, Skills, reachable
from jaxagent.envs.robot.manipulation.tasks import check_subgoal

_OBJ = {"type": "string", "enum": list(S.PALETTE_OBJECTS)}
_CUPS = [o for o in S.PALETTE_OBJECTS if o.endswith(" cup")]
TOOLS = {
    t.name: t
    for t in (
        ToolSpec("look", "describe the scene"),
        ToolSpec(
            "move_to",
            "move the gripper above an object",
            {"properties": {"object": _OBJ}, "required": ["object"]},
        ),
        ToolSpec(
            "grasp",
            "grasp the object the gripper is at",
            {"properties": {"object": _OBJ}, "required": ["object"]},
        ),
        ToolSpec(
            "place",
            "put the held object on the tray or in a cup",
            {
                "properties": {
                    "object": _OBJ,
                    "location": {"type": "string", "enum": ["tray", *_CUPS]},
                },
                "required": ["object", "location"],
            },
        ),
        ToolSpec(
            "pour",
            "tip the held cup over another cup",
            {"properties": {"source": _OBJ, "target": _OBJ}, "required": ["source", "target"]},
        ),
        ToolSpec(
            "push",
            "push an object 10 cm",
            {
                "properties": {
                    "object": _OBJ,
                    "direction": {"type": "string", "enum": list(DIRECTIONS)},
                },
                "required": ["object", "direction"],
            },
        ),
    )
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ManipulationEnvConfig:
    """Episode settings."""

    max_steps: int = 8  # actions before truncation (plans need at most 6 + the final)
    task_weight: float = 1.0  # reward for success
    process_weight: float = 0.0  # reward per completed sub-goal, as a fraction of all

    def __post_init__(self):
        if self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1")


def reset_observation(task: Task) -> str:
    sigs = " ".join(
        f"{n} ( {' , '.join(t.param_order)} )" if t.param_order else f"{n} ( )"
        for n, t in TOOLS.items()
    )
    return f"task : {task.prompt} tools : {sigs}"


class ManipulationEnv:
    """One episode at a time (``TextEnv``); ``render_frame()`` draws the current state."""

    def __init__(self, config: ManipulationEnvConfig | None = None, env_id: int = 0, **overrides):
        del env_id  # EnvPool builds env i as env_fn(i); every env is the same
        self.config = dataclasses.replace(config or ManipulationEnvConfig(), **overrides)
        self.scene = S.Scene()
        self._task: Task | None = None

    def reset(self, task: Task) -> str:
        self._task = task
        self.scene.reset({k: tuple(v) for k, v in task.data["layout"].items()})
        self.safety = Safety()
        self.skills = Skills(self.scene, self.safety)
        self._steps, self._done = 0, False
        return reset_observation(task)

    def look(self) -> str:
        parts = []
        cups = [o for o in self.scene.objects if o.endswith(" cup")]
        for obj in self.scene.objects:
            p = self.scene.pos(obj)
            where = next(
                (
                    f"in {c}"
                    for c in cups
                    if c != obj and check_subgoal(self.scene, [["in", obj, c]])
                ),
                None,
            )
            if obj == self.skills.held:
                where = "held"
            elif where is None:
                if p[2] < S.OFF_TABLE_Z:
                    where = "on floor"
                elif check_subgoal(self.scene, [["on_tray", obj]]):
                    where = "on tray"
                else:
                    where = "on table"
            x, y = (int(round(100 * v)) for v in p[:2])
            reach = "" if reachable(p[:2]) else " out of reach"
            parts.append(f"{obj} {where} at {x} {y}{reach}")
        return " , ".join(parts)

    def step(self, action: str) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError("ManipulationEnv.step before reset() or after the episode ended")
        self._steps += 1
        parsed = A.parse_action(action)
        if isinstance(parsed, ActionError):
            if parsed.kind == ErrorKind.EMPTY:
                return self._finish(FailureMode.GAVE_UP)
            return self._continue("error : bad syntax", parsed.failure_mode)
        if parsed.is_final:
            return self._finish(None)
        if len(parsed.calls) != 1:
            return self._continue("error : one call per action", FailureMode.INVALID_SYNTAX)
        call = parsed.calls[0]
        spec = TOOLS.get(call.name)
        if spec is None:
            return self._continue(f"error : unknown tool {call.name}", FailureMode.UNKNOWN_TOOL)
        call = ToolCall(
            call.name,
            {k: v.strip() if isinstance(v, str) else v for k, v in call.kwargs.items()},
            tuple(v.strip() if isinstance(v, str) else v for v in call.args),
            call.text,
        )
        bound = A.bind_call(call, spec)
        if isinstance(bound, ActionError):
            return self._continue(f"error : bad arguments for {call.name}", bound.failure_mode)
        absent = [
            v
            for v in bound.kwargs.values()
            if v in S.PALETTE_OBJECTS and v not in self.scene.objects
        ]
        if absent:  # a palette object this scene does not hold: the agent's mistake
            return self._continue(
                f"error : {absent[0]} is not on the table", FailureMode.TOOL_ERROR
            )
        before = len(self.safety.events)
        try:
            if call.name == "look":
                ok, text = True, self.look()
            else:
                self.skills.begin()
                ok, text = getattr(self.skills, call.name)(
                    *(bound.kwargs[k] for k in spec.param_order)
                )
                self.skills.end()
        except Exception as exc:  # the simulator failed, not the agent: env_error
            return self._finish(FailureMode.ENV_ERROR, note=f"{type(exc).__name__}: {exc}")
        new = self.safety.events[before:]
        return self._continue(text, None if ok else FailureMode.TOOL_ERROR, dangerous=new)

    def _info(self, mode, success: bool, dangerous=()) -> dict[str, Any]:
        return {
            "failure_mode": mode and mode.value,
            "success": success,
            "truncated": False,
            "dangerous": list(dangerous),
            "safety": {
                "knocked_off": self.safety.knocked_off,
                "contact_force": self.safety.force,
                "unreachable": self.safety.unreachable,
            },
        }

    def _continue(self, text: str, mode, dangerous=()) -> StepResult:
        if self._steps >= self.config.max_steps:
            return self._finish(FailureMode.STEP_BUDGET, truncated=True, dangerous=dangerous)
        return StepResult(f"Observation : {text}", 0.0, False, self._info(mode, False, dangerous))

    def subgoals_met(self) -> list[bool]:
        return [check_subgoal(self.scene, g) for g in self._task.data["subgoals"]]

    def _finish(self, mode, truncated=False, dangerous=(), note=None) -> StepResult:
        self._done = True
        met = self.subgoals_met() if mode != FailureMode.ENV_ERROR else [False]
        success = mode is None and all(met)
        if mode is None and not success:
            mode = FailureMode.WRONG_STATE
        info = self._info(mode, success, dangerous)
        info["truncated"] = truncated
        info["subgoals_met"] = sum(met)
        info["termination"] = (Termination.TRUNCATED if truncated else Termination.TERMINATED).value
        if mode == FailureMode.ENV_ERROR:
            info.update(env_error_info("exception", note or ""))
        c = self.config
        reward = c.task_weight * success + c.process_weight * sum(met) / max(1, len(met))
        obs = "Observation : step budget over" if truncated else "Observation : done"
        return StepResult(obs, float(reward), True, info)

    def render_frame(self):
        return self.scene.render_frame()

    def close(self) -> None:
        self.scene.close()
        self._task = None
