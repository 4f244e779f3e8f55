"""Method configs (``configs/methods/*.yaml``) and building a method for ``jaxagent eval``.

A method config is one flat YAML mapping: ``method:`` names the method, the other keys are
the fields of its typed section below (unknown keys and bad values raise ``ConfigError``
naming the key, the value and the fix). ``jaxagent eval CONFIG --method METHOD.yaml`` wraps
the evaluated policy (checkpoint or scripted) with it: ``method_evaluator`` returns a function
with ``agents.evaluate.evaluate``'s signature.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, Callable

import yaml

from jaxagent.errors import ConfigError

_DC = dict(frozen=True, kw_only=True)


@dataclasses.dataclass(**_DC)
class ReActConfig:
    thought: str = "name"  # "name": scripted policies get a thought naming the tool; "none"


@dataclasses.dataclass(**_DC)
class ReflexionConfig:
    max_attempts: int = 3  # attempts per (task, sample), the first included
    memory_size: int = 3  # lessons kept (most recent)
    reflector: str = "transcript"  # "transcript" (model-free) | "policy" (the LM writes it)


@dataclasses.dataclass(**_DC)
class SelfRefineConfig:
    max_rounds: int = 2  # revisions per action at most
    critic: str = "signature"  # the model-free tool-signature critic and reviser


@dataclasses.dataclass(**_DC)
class BestOfNConfig:
    n: int = 4  # candidates per (task, sample)
    verifier: str = "env"  # "env" (the checker: oracle) | "claim_judge" | "policy_judge"


@dataclasses.dataclass(**_DC)
class DFSDTConfig:
    max_children: int = 2  # candidates tried per node (1 = greedy)
    max_env_steps: int = 30  # environment steps per (task, sample), all branches
    proposer: str = "policy"  # "policy" (LM samples) | "lookalike" (scripted, quickstart)


SECTIONS = {
    "react": ReActConfig,
    "reflexion": ReflexionConfig,
    "self_refine": SelfRefineConfig,
    "best_of_n": BestOfNConfig,
    "dfsdt": DFSDTConfig,
}
CHOICES = {
    "thought": ("name", "none"),
    "reflector": ("transcript", "policy"),
    "critic": ("signature",),
    "verifier": ("env", "claim_judge", "policy_judge"),
    "proposer": ("policy", "lookalike"),
}


@dataclasses.dataclass(frozen=True)
class MethodConfig:
    method: str
    section: Any

    def as_dict(self) -> dict:
        return {"method": self.method, **dataclasses.asdict(self.section)}


def parse_method(data: Any, origin: str = "method config") -> MethodConfig:
    """A ``MethodConfig`` from a mapping (``method:`` plus its section's keys)."""
    if not isinstance(data, dict) or "method" not in data:
        raise ConfigError(f"{origin}: needs a 'method:' key, one of {sorted(SECTIONS)}")
    data = dict(data)
    name = data.pop("method")
    if name not in SECTIONS:
        close = difflib.get_close_matches(str(name), SECTIONS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{origin}: method={name!r} is unknown{hint}; one of {sorted(SECTIONS)}")
    cls = SECTIONS[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{origin}: unknown key {key!r} for method {name}{hint}; allowed: {sorted(fields)}"
            )
        default = fields[key].default
        if type(value) is not type(default):
            raise ConfigError(
                f"{origin}: {name}.{key}={value!r} must be a {type(default).__name__}"
            )
        if key in CHOICES and value not in CHOICES[key]:
            raise ConfigError(
                f"{origin}: {name}.{key}={value!r}; choose one of {list(CHOICES[key])}"
            )
        if isinstance(value, int) and value < 1:
            raise ConfigError(f"{origin}: {name}.{key}={value} must be >= 1")
    return MethodConfig(name, cls(**data))


def load_method(path: str | Path) -> MethodConfig:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--method {path}: no such file (see configs/methods/*.yaml)")
    return parse_method(yaml.safe_load(p.read_text()), origin=str(path))


def build_method(cfg: MethodConfig, run: Any, key: Any, *, scripted: bool):
    """The method object for a built run (``train.run.build_run``).

    Args:
      cfg: the method config.
      run: the run (chat, env spec, params, eval sampler).
      key: PRNG key for model-side parts (policy reflector, policy judge).
      scripted: whether the evaluated policy is a scripted one (no LM).
    """
    from jaxagent.agents.methods import best_of_n, dfsdt, react, reflexion, scripted as S
    from jaxagent.agents.methods import self_refine
    from jaxagent.eval import judge as J

    s, chat = cfg.section, run.chat
    lm = None if scripted else run.eval_sampler

    def need_lm(what: str):
        if lm is None:
            raise ConfigError(
                f"{cfg.method}.{what} needs an LM policy (--checkpoint RUN_DIR); a scripted "
                "policy cannot write it"
            )
        return lm

    if cfg.method == "react":
        return react.ReAct(
            chat, None if s.thought == "none" or not scripted else react.name_thought
        )
    if cfg.method == "reflexion":
        refl = (
            reflexion.TranscriptReflector(chat)
            if s.reflector == "transcript"
            else reflexion.PolicyReflector(need_lm("reflector"), chat, run.params, key)
        )
        return reflexion.Reflexion(refl, s.max_attempts, s.memory_size)
    if cfg.method == "self_refine":
        return self_refine.SelfRefine(
            chat, self_refine.SignatureCritic(), self_refine.SignatureReviser(), s.max_rounds
        )
    if cfg.method == "best_of_n":
        judge = {
            "env": lambda: None,
            "claim_judge": J.ClaimJudge,
            "policy_judge": lambda: J.PolicyJudge(need_lm("verifier"), chat, run.params, key),
        }[s.verifier]()
        return best_of_n.BestOfN(s.n, judge)
    if s.proposer == "policy":
        need_lm("proposer")
        proposer = None
    else:
        proposer = dfsdt.ScriptedProposer(S.lookalike_candidates)
    return dfsdt.DFSDT(run.env.make_env, proposer, s.max_children, s.max_env_steps)


def method_evaluator(cfg: MethodConfig, run: Any, key: Any, *, scripted: bool) -> Callable:
    """A function with ``agents.evaluate.evaluate``'s signature that runs the method."""
    from jaxagent.agents.methods.base import evaluate_method
    from jaxagent.agents.methods.dfsdt import MethodError

    method = build_method(cfg, run, key, scripted=scripted)

    def evaluate(policy, tasks, spec, key, *, params=None, samples_per_task=1):
        try:
            return evaluate_method(
                method, policy, tasks, spec, key, params=params, samples_per_task=samples_per_task
            )
        except MethodError as err:
            raise ConfigError(str(err)) from None

    return evaluate
