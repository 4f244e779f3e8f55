"""The BFCL suites in the registry (``env.name: bfcl``, the shipped entries, and
``bfcl_gen``, generated tasks on the same backends); both need ``bfcl-eval`` when built."""

from __future__ import annotations

import dataclasses
import functools

from jaxagent.envs.base import SplitLeakageError
from jaxagent.envs.registry import FLATTEN, EnvSpec, register_env
from jaxagent.envs.tools.bfcl.data import require_bfcl
from jaxagent.envs.tools.bfcl.replay import drop_check
from jaxagent.envs.tools.bfcl.env import BFCLEnv, BFCLEnvConfig, system_prompt
from jaxagent.envs.tools.bfcl.expert import make_expert, make_random
from jaxagent.envs.tools.bfcl.generated import BFCLGenConfig, cached_source
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class BFCLGenOptions:
    """``env.options`` of the generated suite (``bfcl_gen``): the generator's keys
    (``num_train``, ``seed``, ``test_fraction``, ...) and the episode's, flat."""

    source: BFCLGenConfig = dataclasses.field(default_factory=BFCLGenConfig, metadata=FLATTEN)
    env: BFCLEnvConfig = dataclasses.field(
        # compact signatures; 300 characters hold the longest result a task must read;
        # results in call syntax (a value is read and written after the same tokens). The
        # keys not given keep these values (the registry builds the section from this default).
        default_factory=lambda: BFCLEnvConfig(
            tool_format="compact", max_result_chars=300, result_format="keywords"
        ),
        metadata=FLATTEN,
    )


def gen_check(config: BFCLGenConfig, tasks, runs) -> dict:
    """The generated suite's figures in ``jaxagent check``: the split leakage check (a
    failure fails the check) and the calls a task needs."""
    errors = [
        f"{e.task.id}: the expert failed ({e.final.info.get('failure_mode')})"
        for e in (runs["expert"].episodes if "expert" in runs else ())
        if not e.success
    ]
    source = cached_source(config)
    leakage = "ok"
    try:
        source.check_disjoint()
    except SplitLeakageError as err:
        leakage = str(err)
        errors.append(f"leakage: {err}")
    calls = [sum(len(turn) for turn in t.data["ground_truth"]) for t in tasks]
    return {
        "leakage": leakage,
        "longest_result": max((t.data["longest_result"] for t in tasks), default=0),
        "compositions": {k: len(v) for k, v in source.combos.items()},
        "calls_per_task": [min(calls), round(float(sum(calls) / len(calls)), 2), max(calls)]
        if calls
        else [],
        "failed_checks": errors[:10],
    }


def build_gen(options: BFCLGenOptions) -> EnvSpec:
    require_bfcl()
    return EnvSpec(
        name="bfcl_gen",
        make_source=functools.partial(cached_source, options.source),  # generated on first use
        make_env=functools.partial(BFCLEnv, options.env),
        system_prompt=system_prompt(),
        make_expert=make_expert,  # the ground truth step by step, answers in the reply
        make_random=make_random,  # random calls to the listed tools with seen values
        check_extras=functools.partial(gen_check, options.source),
        task_group=lambda task: f"{len(task.data['question'])} turns",
    )


register_env("bfcl_gen", build_gen, options=BFCLGenOptions)
