"""Tool calls constrained to their schemas in the built-in driver (``rollout.constrained_tool_calls``).

``TurnGrammar`` says which automaton (``jaxagent.generate.grammar``) each episode's turns are
decoded under: the language of a turn that calls one of the task's tools with schema-valid
arguments, in the chat's call syntax, or answers (``jaxagent.envs.call_grammar.turn_regex``).
The samplers (``CachedTurnSampler``, the slot engine) start every turn of an episode in its
task's start state and return, per sampled token, the packed mask of the vocabulary it was
drawn from; the episode records those masks (``Episode.constraint_ids`` /
``constraint_masks``) and the learner takes its log-probs under the same masks, so the policy
gradient is that of the distribution the sampler drew from (importance ratios stay exact).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np

from jaxagent.envs.base import Task
from jaxagent.envs.call_grammar import turn_regex
from jaxagent.errors import ConfigError
from jaxagent.generate.grammar import GrammarTable, token_texts


class TurnGrammar:
    """The automaton of each task's turns over one ``GrammarTable``.

    Args:
      table: the automata of the run's languages.
      regex_of: ``regex_of(task)`` -> the language of the task's turns (None: unconstrained).
    """

    def __init__(self, table: GrammarTable, regex_of: Callable[[Task], Optional[str]]):
        self.table, self.regex_of = table, regex_of

    def starts(self, tasks: Sequence[Task]) -> list[int]:
        """Each task's start state (-1: unconstrained)."""
        out = []
        for task in tasks:
            regex = self.regex_of(task)
            out.append(-1 if regex is None else self.table.start(regex))
        return out

    def row_masks(self, states: np.ndarray, lengths: Sequence[int]) -> list[list]:
        """``GrammarTable.masks`` of each row's first ``lengths[b]`` tokens from a ``[B, N]``
        state array."""
        return [self.table.masks(states[b, :k].tolist()) for b, k in enumerate(lengths)]


def tool_call_grammar(
    tokenizer, vocab_size: int, stop_ids: Sequence[int], syntax: str, tools_of
) -> TurnGrammar:
    """The grammar of schema-valid tool calls (or an answer) for the tasks ``tools_of``
    describes (``jaxagent.agents.task_tools``), in ``syntax``."""
    if tools_of is None:
        raise ConfigError(
            "rollout.constrained_tool_calls=true needs a world whose tasks have tool schemas "
            "(quickstart, bfcl); set it to false"
        )
    table = GrammarTable(token_texts(tokenizer, vocab_size), stop_ids)

    def regex_of(task: Task) -> Optional[str]:
        tools = tools_of(task)
        return turn_regex(tools, syntax) if tools else None

    return TurnGrammar(table, regex_of)
