"""Web navigation suites: embedded procedural sites (shop, booking) and MiniWoB++.

Embedded sites: ``domain`` (what is sold, catalogs around one target), ``layout`` (seeded
layouts, disjoint train/test pools), ``site`` (pages from state, transitions), ``actions``
(the shared action vocabulary over the shared tool-call parser), ``env`` (``WebEnv``: the
viewport text view, WebShop's reward, failure labels, snapshot/restore), ``tasks``
(``WebWorld``), ``expert`` (scripted, random and no-scroll policies), ``vocab``, ``check``
(the suites' figures in ``jaxagent check``) and ``suite`` (registry entries). MiniWoB++ in a
real headless browser: ``miniwob`` (the env) and ``miniwob_solvers``. Nothing here imports JAX.
"""

from jaxagent.envs.web.env import WebEnv, WebEnvConfig
from jaxagent.envs.web.expert import ExpertPolicy, random_action
from jaxagent.envs.web.tasks import WebTasksConfig, WebWorld
from jaxagent.envs.web.vocab import vocabulary

__all__ = [
    "ExpertPolicy",
    "WebEnv",
    "WebEnvConfig",
    "WebTasksConfig",
    "WebWorld",
    "random_action",
    "vocabulary",
]
