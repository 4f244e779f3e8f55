"""Training-free agent methods, each wrapping any turn policy.

``react`` (ReAct prompting: a thought before each action), ``reflexion`` (a verbal lesson
after each failed attempt, prepended to the next; attempts capped), ``self_refine``
(generate -> self-critique -> revise before acting; rounds capped), ``best_of_n`` (N episodes,
one kept by a verifier: the environment's checker or a judge), ``dfsdt`` (depth-first tree
search with backtracking over ``SnapshotEnv`` snapshot/restore). Every method returns one
``Episode`` per (task, sample), so ``jaxagent.eval`` reports it like any policy, with what it
spent beyond that episode in ``info["method_tokens"]`` (``base``). ``config`` reads
``configs/methods/*.yaml`` for ``jaxagent eval --method``; ``scripted`` holds the
imperfect quickstart policies with systematic mistakes that the methods' tests fix.
"""

from jaxagent.agents.methods.base import (
    MemoryRunner,
    Method,
    add_method_tokens,
    evaluate_method,
    merge_attempts,
    method_tokens,
)
from jaxagent.agents.methods.best_of_n import BestOfN
from jaxagent.agents.methods.dfsdt import DFSDT, MethodError, PolicyProposer, ScriptedProposer
from jaxagent.agents.methods.react import ReAct, ReActPolicy
from jaxagent.agents.methods.reflexion import PolicyReflector, Reflexion, TranscriptReflector
from jaxagent.agents.methods.self_refine import (
    SelfRefine,
    SelfRefinePolicy,
    SignatureCritic,
    SignatureReviser,
)

__all__ = [
    "BestOfN",
    "DFSDT",
    "MemoryRunner",
    "Method",
    "MethodError",
    "PolicyProposer",
    "PolicyReflector",
    "ReAct",
    "ReActPolicy",
    "Reflexion",
    "ScriptedProposer",
    "SelfRefine",
    "SelfRefinePolicy",
    "SignatureCritic",
    "SignatureReviser",
    "TranscriptReflector",
    "add_method_tokens",
    "evaluate_method",
    "merge_attempts",
    "method_tokens",
]
