"""The BFCL suite in the registry (``env.name: bfcl``); needs ``bfcl-eval`` when built."""

from __future__ import annotations

import dataclasses
import functools

from jaxagent.envs.registry import FLATTEN, EnvSpec, register_env
from jaxagent.envs.tools.bfcl.data import require_bfcl
from jaxagent.envs.tools.bfcl.replay import drop_check
from jaxagent.envs.tools.bfcl.env import BFCLEnv, BFCLEnvConfig, system_prompt
from jaxagent.envs.tools.bfcl.expert import make_expert
from jaxagent.envs.tools.bfcl.source import BFCLSource, BFCLSourceConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class BFCLOptions:
    """``env.options`` of the BFCL suite: the source's keys (``category``, ``limit``, ...) and
    the episode's (``tool_format``, ``max_steps_per_turn``, ...), flat."""

    source: BFCLSourceConfig = dataclasses.field(default_factory=BFCLSourceConfig, metadata=FLATTEN)
    env: BFCLEnvConfig = dataclasses.field(default_factory=BFCLEnvConfig, metadata=FLATTEN)


def build(options: BFCLOptions) -> EnvSpec:
    require_bfcl()  # raises with the install command when bfcl-eval is missing
    source = BFCLSource(options.source)
    return EnvSpec(
        name="bfcl",
        make_source=lambda: source,
        make_env=functools.partial(BFCLEnv, options.env),
        system_prompt=system_prompt(),
        make_expert=make_expert,  # the entry's ground-truth calls (SFT, jaxagent check)
        check_extras=drop_check,
    )


register_env("bfcl", build, options=BFCLOptions)
