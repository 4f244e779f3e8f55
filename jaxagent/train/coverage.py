"""Start-up checks of what the model will read: the tokenizer covers the environment's words,
and the first prompts fit the episode's token budget.

A first prompt that leaves no room for one turn within the budget ends its episode before the
policy acts (``Termination.PROMPT_OVERFLOW``): every such task would train on nothing and
score 0, a configuration problem that looks like a weak policy. ``check_prompt_budget``
renders the first prompt of a sample of train and eval tasks through the run's chat template
and refuses the run, naming the budget field to raise.

A word-level tokenizer maps every word outside its vocabulary to ``<|unk|>``. When that word is
one the scripted expert types (a tool name, an option), the environment receives ``<|unk|>``
instead and every demonstration fails: a suite whose ``vocabulary()`` missed one such word took
the expert from 1.000 to 0.000 success and SFT's start from 0.52 to 0.16, silently. The same
happens with ``model.init_from`` pointing at a model trained on another world (21 of 37 prompt
tokens unknown). ``check_coverage`` runs the expert on a few training tasks through the run's
own chat format and budgets, counts unknown ids in what the model would read and write, and
stops the run (naming the words) when the policy could not even express the expert's actions.

Byte-level tokenizers (the BPE ones, real models' with byte fallback) cover every string; a
probe string of rare characters tells them apart, and the check then costs nothing.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable

import jax

from jaxagent.errors import ConfigError

# Unknown ids in prompts and observations: above this fraction the run is refused, below it
# the unknown words are listed as a warning (an observation may quote rare text verbatim).
MAX_UNKNOWN_FRACTION = 0.02
_PROBE = "qzxjvq \u2603 \x07"  # no word vocabulary holds these; bytes cover them


def unknown_words(tokenizer, texts) -> tuple[int, int, Counter]:
    """(unknown ids, all ids, unknown substrings by count) of ``texts`` under ``tokenizer``."""
    unk = tokenizer.unk_token_id
    n_unk, n_all, words = 0, 0, Counter()
    for text in texts:
        if not text:
            continue
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        n_all += len(enc["input_ids"])
        for tid, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]):
            if tid == unk:
                n_unk += 1
                words[text[a:b]] += 1
    return n_unk, n_all, words


def covers_every_string(tokenizer) -> bool:
    """True for tokenizers that never emit the unknown id (byte-level, byte fallback)."""
    if tokenizer.unk_token_id is None:
        return True
    return unknown_words(tokenizer, [_PROBE])[0] == 0


def _top(words: Counter, n: int = 12) -> str:
    return ", ".join(repr(w) for w, _ in words.most_common(n))


class _Recorded:
    def __init__(self, expert, into: list):
        self._expert, self._into = expert, into

    def act(self, observation: str) -> str:
        action = self._expert.act(observation)
        self._into.append(action)
        return action


def check_prompt_budget(run, *, tasks: int = 8) -> int:
    """The longest first prompt, in tokens, of the first ``tasks`` train and eval tasks.

    Each task's environment is reset (in this process) and its first observation rendered
    with the run's chat, system prompt and observation cut, exactly as the rollout driver
    renders it. Raises ``ConfigError`` when a prompt plus one turn (``rollout.max_new_tokens``)
    exceeds the episode budget (``Run.budget.max_total_tokens``), naming the field that sets
    the budget, the prompt's length and the field's value. Tasks whose reset fails are left to
    the rollout, which reports them as environment errors.
    """
    from jaxagent.agents.runner import InlineRunner
    from jaxagent.envs.base import truncate_observation

    budget, config = run.budget, run.config
    sample = [(t, "train") for t in run.tasks.train[:tasks]]
    sample += [(t, "eval") for t in run.tasks.eval[:tasks]]
    runner = InlineRunner(run.env.make_env)
    try:
        replies = runner.reset([0] * len(sample), [t for t, _ in sample])
    finally:
        runner.close()
    longest = 0
    limit = budget.max_observation_chars
    for (task, split), reply in zip(sample, replies):
        if reply.error is not None:
            continue
        obs = truncate_observation(reply.observation, limit) if limit else reply.observation
        n = len(run.chat.prompt(run.env.system_prompt, obs, task=task))
        longest = max(longest, n)
        need = n + budget.max_new_tokens
        if need <= budget.max_total_tokens:
            continue
        r, seq = config.rollout, run.model_config.max_seq_len
        if config.max_total_tokens <= seq - r.max_new_tokens:  # the config's budget binds
            fix = (
                f"raise rollout.max_total_tokens (now {r.max_total_tokens}) to at least {need}"
                if r.max_total_tokens
                else f"set rollout.max_total_tokens (now 0: model.max_seq_len="
                f"{config.model.max_seq_len}) to at least {need}"
            )
        else:  # the model's length binds: episodes end max_new_tokens short of it
            fix = (
                f"raise model.max_seq_len (now {seq}) to at least {need + r.max_new_tokens} or "
                f"lower rollout.max_new_tokens"
            )
        raise ConfigError(
            f"the first prompt of {split} task {task.id!r} is {n} tokens: with "
            f"rollout.max_new_tokens={r.max_new_tokens} it needs {need} > the episode budget "
            f"of {budget.max_total_tokens} tokens, so its episodes would end before any turn; "
            f"{fix} (or shorten observations: rollout.max_observation_chars)"
        )
    return longest


def check_coverage(run, *, echo: Callable[[str], None] = print, tasks: int = 8) -> dict:
    """Unknown-token figures of the run's prompts, observations and expert actions, after
    ``check_prompt_budget`` (figure ``prompt_tokens_max``).

    Raises ``ConfigError`` (naming the words) when an expert action holds a word the tokenizer
    lacks, or when more than ``MAX_UNKNOWN_FRACTION`` of the prompt and observation tokens are
    unknown; echoes a warning for a smaller share. Returns the figures.
    """
    tok, config = run.tokenizer, run.config
    longest = check_prompt_budget(run, tasks=tasks)
    if covers_every_string(tok):
        return {"unknown_fraction": 0.0, "prompt_tokens_max": longest}
    sample = (run.tasks.sft or run.tasks.train)[:tasks]
    read, written = [run.env.system_prompt, *(t.prompt for t in sample)], []
    if run.env.make_expert is not None:
        from jaxagent.agents.expert import ExpertTurnPolicy
        from jaxagent.agents.rollout import collect_episodes

        def recorded(task, error_rate, rng):  # the expert's own text, before tokenisation
            return _Recorded(run.env.make_expert(task, error_rate, rng), written)

        expert = ExpertTurnPolicy(recorded, run.chat, error_rate=0.0, seed=0)
        # Observations whole: a cut leaves its marker and half-words, which are no gap of
        # the vocabulary.
        whole = dataclasses.replace(run.budget, max_observation_chars=0)
        spec = dataclasses.replace(run.rollout, budget=whole)
        episodes, _ = collect_episodes(
            expert, None, sample, samples_per_task=1, spec=spec, key=jax.random.key(0)
        )
        for ep in episodes:
            read += [ep.first_observation, *(t.observation for t in ep.turns)]
    origin = (
        f"model.init_from={config.model.init_from!r}"
        if config.model.init_from
        else f"tokenizer.kind={config.tokenizer.kind!r}"
    )
    a_unk, a_all, a_words = unknown_words(tok, written)
    if a_unk:
        raise ConfigError(
            f"the tokenizer ({origin}) lacks words env {config.env.name!r}'s expert writes "
            f"({_top(a_words)}: {a_unk} of {a_all} action tokens), so the policy could never "
            "write them; add them to the suite's vocabulary() or use a tokenizer that covers "
            "the env (tokenizer.kind='bpe')"
        )
    r_unk, r_all, r_words = unknown_words(tok, read)
    fraction = r_unk / max(r_all, 1)
    if fraction > MAX_UNKNOWN_FRACTION:
        raise ConfigError(
            f"the tokenizer ({origin}) maps {r_unk} of {r_all} tokens of env "
            f"{config.env.name!r}'s prompts and observations to the unknown token "
            f"({fraction:.1%} > {MAX_UNKNOWN_FRACTION:.0%}: {_top(r_words)}); use the env's "
            "own tokenizer (tokenizer.kind='word' builds it, 'bpe' covers any text) or a model "
            "trained on this env"
        )
    if r_unk:
        echo(
            f"[tokenizer] {r_unk} of {r_all} prompt/observation tokens are unknown "
            f"({fraction:.2%}): {_top(r_words)}"
        )
    return {"unknown_fraction": fraction, "prompt_tokens_max": longest}
