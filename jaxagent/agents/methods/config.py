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

from jaxagent.errors import ConfigError, check_choice, check_positive
from jaxagent.sections import load_typed, read_yaml

_DC = dict(frozen=True, kw_only=True)


def _at_least_one(method: str, section: Any) -> None:
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, int) and not isinstance(value, bool):
            check_positive(f"{method}.{f.name}", value)


@dataclasses.dataclass(**_DC)
class ReActConfig:
    thought: str = "name"  # "name": scripted policies get a thought naming the tool; "none"

    def __post_init__(self):
        check_choice("react.thought", self.thought, ("name", "none"))


@dataclasses.dataclass(**_DC)
class ReflexionConfig:
    max_attempts: int = 3  # attempts per (task, sample), the first included
    memory_size: int = 3  # lessons kept (most recent)
    reflector: str = "transcript"  # "transcript" (model-free) | "policy" (the LM writes it)

    def __post_init__(self):
        _at_least_one("reflexion", self)
        check_choice("reflexion.reflector", self.reflector, ("transcript", "policy"))


@dataclasses.dataclass(**_DC)
class SelfRefineConfig:
    max_rounds: int = 2  # revisions per action at most
    critic: str = "signature"  # the model-free tool-signature critic and reviser

    def __post_init__(self):
        _at_least_one("self_refine", self)
        check_choice("self_refine.critic", self.critic, ("signature",))


@dataclasses.dataclass(**_DC)
class BestOfNConfig:
    n: int = 4  # candidates per (task, sample)
    verifier: str = "env"  # "env" (the checker: oracle) | "claim_judge" | "policy_judge"

    def __post_init__(self):
        _at_least_one("best_of_n", self)
        check_choice("best_of_n.verifier", self.verifier, ("env", "claim_judge", "policy_judge"))


@dataclasses.dataclass(**_DC)
class DFSDTConfig:
    max_children: int = 2  # candidates tried per node (1 = greedy)
    max_env_steps: int = 30  # environment steps per (task, sample), all branches
    proposer: str = "policy"  # "policy" (LM samples) | "lookalike" (scripted, quickstart)

    def __post_init__(self):
        _at_least_one("dfsdt", self)
        check_choice("dfsdt.proposer", self.proposer, ("policy", "lookalike"))


SECTIONS = {
    "react": ReActConfig,
    "reflexion": ReflexionConfig,
    "self_refine": SelfRefineConfig,
    "best_of_n": BestOfNConfig,
    "dfsdt": DFSDTConfig,
}


@dataclasses.dataclass(frozen=True)
class MethodConfig:
    method: str
    section: Any

    def as_dict(self) -> dict:
        return {"method": self.method, **dataclasses.asdict(self.section)}


def parse_method(data: Any, origin: str = "method config") -> MethodConfig:
    """A ``MethodConfig`` from a mapping (``method:`` plus its section's keys), loaded onto the
    method's section by the run config's loader (``jaxagent.sections.load_typed``)."""
    if not isinstance(data, dict) or "method" not in data:
        raise ConfigError(f"{origin}: needs a 'method:' key, one of {sorted(SECTIONS)}")
    data = dict(data)
    name = data.pop("method")
    if name not in SECTIONS:
        close = difflib.get_close_matches(str(name), SECTIONS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{origin}: method={name!r} is unknown{hint}; one of {sorted(SECTIONS)}")
    section = load_typed(
        SECTIONS[name], data=data, origin=f"{origin} (method {name})", example=_EXAMPLE
    )
    return MethodConfig(name, section)


_EXAMPLE = "configs/methods/reflexion.yaml"


def load_method(path: str | Path) -> MethodConfig:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--method {path}: no such file (see configs/methods/*.yaml)")
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(read_yaml(p, _EXAMPLE))
    return parse_method(raw, origin=str(path))


def build_method(cfg: MethodConfig, run: Any, key: Any, *, scripted: bool):
    """The method object for a built run (``train.run.build_run``).

    Args:
      cfg: the method config.
      run: the run (chat, env spec, params, eval sampler).
      key: PRNG key for model-side parts (policy reflector, policy judge).
      scripted: whether the evaluated policy is a scripted one (no LM).
    """
    from jaxagent.agents.methods import best_of_n, dfsdt, react, reflexion
    from jaxagent.envs.tools.quickstart import scripted as S
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
