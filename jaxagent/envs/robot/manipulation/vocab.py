"""The manipulation world's closed vocabulary (for ``tokenizer.kind: word``)."""

from __future__ import annotations

from jaxagent.envs.robot.manipulation import scene as S
from jaxagent.envs.robot.manipulation.env import TOOLS
from jaxagent.envs.robot.manipulation.skills import DIRECTIONS
from jaxagent.envs.robot.manipulation.tasks import template_words


def vocabulary() -> list[str]:
    """Every word of prompts, observations (``look`` included) and planner actions."""
    words = set(template_words())
    words.update(w for o in S.PALETTE_OBJECTS for w in o.split())
    words.update(DIRECTIONS)
    for name, spec in TOOLS.items():
        words.add(name)
        words.update(spec.param_order)
    words.update(str(i) for i in range(-50, 51))
    words.update(
        'Action Final Thought Observation task tools : ( ) , = " done ok error is out of reach '
        "already holding not at gripper cannot place on a in cup pour into direction must be "
        "one bad syntax arguments for unknown tool call per action step budget over held "
        "floor tray table knocked_off contact_force unreachable".split()
    )
    return sorted(words)
