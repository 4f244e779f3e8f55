"""MuJoCo robots on jaxagent's array side (Gymnasium v5 tasks, batched, Gymnasium-exact)."""

from jaxagent.envs.robot.tasks import TASKS, TaskSpec, get_task
from jaxagent.envs.robot.vector import ENGINES, MujocoVectorEnv

__all__ = ["ENGINES", "TASKS", "MujocoVectorEnv", "TaskSpec", "get_task"]
