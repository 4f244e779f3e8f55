"""Sessions: a conversation's exact token trajectory, its divergences, and its episode.

A session (``X-Session-Id`` header, else the request's ``user`` field) keeps the token ids
the policy saw and produced, in order: prompt and observation chunks (loss mask 0) and the
sampled ids with their sampler log-probs and policy version (loss mask 1), plus, for every
message, where its tokens end. A request whose messages extend the stored ones is served
from the stored tokens plus the rendering of the new messages only (``Renderer.after_turn``),
never a re-rendering of the whole history: the harness's text of an assistant turn is
compared with what was returned, never re-tokenised.

Where the messages disagree with the stored ones (the harness edited or dropped a message,
changed a tool result or the tools, or retried a turn), the stream is cut back to the last
stored assistant turn both agree on and the rest is rendered anew; the request is answered
with the ``X-Jaxagent-Divergence`` header and the cut is recorded (``Session.divergences``,
``Episode.info["divergences"]``) with the number of tokens and sampled tokens dropped.

``Session.score`` runs a reward function (``harness.reward``) over the recorded messages, for
a session ended without a reward. ``Session.episode`` turns the trajectory into the rollout
driver's ``Episode``: the same ``tokens`` / ``loss_mask`` / ``logprobs`` / ``turn_ids`` the
driver records for the same conversation (``record_turn``'s convention: the turn's index on
its sampled tokens).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from collections.abc import Sequence

from jaxagent.agents.episode import Episode, Turn
from jaxagent.envs.base import Task, Termination
from jaxagent.serve.render import Renderer, tools_key

DIVERGENCE_HEADER = "X-Jaxagent-Divergence"


@dataclasses.dataclass
class Sampled:
    """One choice of a policy turn: its ids, log-probs and the message returned for it."""

    tokens: list[int]
    logprobs: list[float]
    message: dict  # normalised (``protocol.normal_message``)
    text: str  # the decoded turn (``Turn.action``)
    masks: list | None = None  # constrained decoding: each token's packed vocabulary mask


@dataclasses.dataclass
class Plan:
    """How a request continues its session (``Session.plan``); applied by ``commit``."""

    cut: int  # stored messages kept
    cut_tokens: int  # stored tokens kept
    new: list[dict]  # the request's messages after the kept ones
    chunk: list[int]  # their rendering
    context: list[int]  # the ids the policy reads: kept tokens + chunk
    divergence: dict | None  # what was dropped, or None


@dataclasses.dataclass
class Session:
    id: str
    # the token trajectory in the driver's own record (tokens, loss mask, log-probs, turns,
    # per-token policy versions, constrained masks); its task and ending are set by ``episode``
    record: Episode = dataclasses.field(
        default_factory=lambda: Episode(task=Task(id="", split="serve", prompt=""), group=0)
    )
    messages: list[dict] = dataclasses.field(default_factory=list)
    ends: list[int | None] = dataclasses.field(default_factory=list)  # token end a message
    turns: list[Turn] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)  # policy version a turn
    divergences: list[dict] = dataclasses.field(default_factory=list)
    tools: str = "[]"
    sampled: list[bool] = dataclasses.field(default_factory=list)  # a message the policy's
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    last_used: float = dataclasses.field(default_factory=time.monotonic)

    # ---- planning ------------------------------------------------------------------------
    def plan(self, messages: Sequence[dict], tools, renderer: Renderer) -> Plan:
        """How ``messages`` continue this session (nothing is changed until ``commit``)."""
        messages = list(messages)
        stored = self.messages
        same_tools = tools_key(tools) == self.tools or not stored
        k = 0
        if same_tools:
            while k < min(len(stored), len(messages)) and stored[k] == messages[k]:
                k += 1
        tokens = self.record.tokens
        if k == len(stored):  # an extension (or a new turn right after the last one)
            cut, cut_tokens, divergence = k, len(tokens), None
        else:
            # Back to the last agreed assistant turn whose end is known (a clean boundary
            # after its end-of-turn token), or to the start.
            cut = k
            while cut > 0 and (
                stored[cut - 1]["role"] != "assistant" or self.ends[cut - 1] is None
            ):
                cut -= 1
            cut_tokens = self.ends[cut - 1] if cut else 0
            divergence = {
                "at_message": k,
                "reason": "tools changed" if not same_tools else "messages differ",
                "kept_messages": cut,
                "kept_tokens": cut_tokens,
                "dropped_tokens": len(tokens) - cut_tokens,
                "dropped_sampled_tokens": int(sum(self.record.loss_mask[cut_tokens:])),
            }
        new = messages[cut:]
        chunk = renderer.after_turn(new) if cut else renderer.first(new, tools)
        return Plan(cut, cut_tokens, new, chunk, tokens[:cut_tokens] + chunk, divergence)

    # ---- recording -----------------------------------------------------------------------
    def _truncate(self, n_tokens: int, n_messages: int) -> None:
        self.record.truncate(n_tokens)
        n_turns = sum(self.sampled[:n_messages])
        for seq in (self.messages, self.ends, self.sampled):
            del seq[n_messages:]
        del self.turns[n_turns:]
        del self.versions[n_turns:]

    def commit(self, plan: Plan, tools, choice: Sampled, version: int) -> None:
        """Record a served request: the plan's cut and chunk, then the sampled turn (with
        ``n`` > 1, the first choice: continuing from another one is a divergence)."""
        if plan.divergence is not None:
            self.divergences.append(plan.divergence)
        self._truncate(plan.cut_tokens, plan.cut)
        if not self.messages:
            self.tools = tools_key(tools)
        self.record.append(plan.chunk, sampled=False)
        for i, m in enumerate(plan.new):
            self.messages.append(m)
            self.sampled.append(False)
            self.ends.append(len(self.record.tokens) if i == len(plan.new) - 1 else None)
        if self.turns and plan.new:
            obs = "\n".join(m["content"] for m in plan.new if m["role"] != "assistant")
            self.turns[-1].observation = obs
            self.turns[-1].num_observation_tokens = len(plan.chunk)
        self.record.append(
            choice.tokens,
            sampled=True,
            logprobs=choice.logprobs,
            turn=len(self.turns),
            version=version,
            masks=choice.masks,
        )
        self.messages.append(choice.message)
        self.sampled.append(True)
        self.ends.append(len(self.record.tokens))
        self.turns.append(
            Turn(
                action=choice.text, observation="", reward=0.0, num_action_tokens=len(choice.tokens)
            )
        )
        self.versions.append(version)
        self.last_used = time.monotonic()

    def score(self, reward_fn, task=None) -> float:
        """``reward_fn(messages, task)`` (``harness.reward``) over a copy of the recorded
        messages, as a float; anything but a number raises ``TypeError``."""
        r = reward_fn(copy.deepcopy(self.messages), task)
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise TypeError(f"the reward function returned {r!r}, not a reward (a number)")
        return float(r)

    def episode(self, reward: float, *, success: bool | None = None, group: int = 0) -> Episode:
        """The session as a training episode; ``reward`` is the last turn's (the driver puts a
        task's final reward on the turn that ended it)."""
        first_user = next((m["content"] for m in self.messages if m["role"] == "user"), "")
        ep = copy.deepcopy(self.record)
        ep.task, ep.group = Task(id=self.id, split="serve", prompt=first_user), group
        ep.turns = [dataclasses.replace(t) for t in self.turns]
        ep.first_observation = first_user
        if ep.turns:
            ep.turns[-1].reward = float(reward)
        ep.info = {
            "session": self.id,
            "divergences": list(self.divergences),
            "policy_versions": list(self.versions),
        }
        ok = bool(success) if success is not None else reward > 0
        ep.finish(Termination.TERMINATED, None if ok else "harness_reward", success=ok)
        return ep


class SessionStore:
    """Live sessions by id, and the episodes of the ended ones (``pop_episodes``);
    ``reward_fn`` (``harness.reward``) scores a session ended without a reward."""

    def __init__(self, reward_fn=None):
        self.reward_fn = reward_fn
        self.sessions: dict[str, Session] = {}
        self.episodes: list[Episode] = []
        self.divergences = 0
        self.anonymous = 0

    def get(self, sid: str | None) -> Session:
        if sid is None:  # no id: a one-off session, never continued
            self.anonymous += 1
            return Session(id=f"anon-{self.anonymous}")
        if sid not in self.sessions:
            self.sessions[sid] = Session(id=sid)
        return self.sessions[sid]

    def end(self, sid: str, reward: float, success: bool | None = None) -> Episode:
        session = self.sessions.pop(sid)
        ep = session.episode(reward, success=success, group=len(self.episodes))
        self.episodes.append(ep)
        return ep

    def pop_episodes(self) -> list[Episode]:
        out, self.episodes = self.episodes, []
        return out
