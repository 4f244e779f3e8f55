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
import collections
import copy
import dataclasses
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

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

    def episode(
        self,
        reward: float,
        *,
        success: bool | None = None,
        group: int = 0,
        failure_mode: str | None = None,
        truncated: bool = False,
    ) -> Episode:
        """The session as a training episode; ``reward`` is the last turn's (the driver puts a
        task's final reward on the turn that ended it). ``failure_mode``: the world's label of
        a failed episode (``FailureMode``; "harness_reward" when none is reported);
        ``truncated``: the turn budget ended it (the driver's ``TRUNCATED``)."""
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
            "messages": copy.deepcopy(self.messages),
        }
        ok = bool(success) if success is not None else reward > 0
        ending = Termination.TRUNCATED if truncated else Termination.TERMINATED
        fallback = "step_budget" if truncated else "harness_reward"
        ep.finish(ending, None if ok else (failure_mode or fallback), success=ok)
        return ep


def episode_record(ep: Episode) -> dict:
    """An episode as one JSON object (a line of ``serve --episodes FILE`` /
    ``harness.episodes_out``, the body of ``GET /v1/sessions/{id}/episode``): the exact token
    trajectory a trainer needs (``tokens``, ``loss_mask``, the sampler's ``logprobs`` and each
    token's policy ``versions``; ``turn_ids``: the turn of each sampled token, -1 elsewhere),
    the outcome, and the conversation's ``messages`` as the server recorded them."""
    task = ep.task
    return {
        "session": ep.info.get("session", task.id),
        "task": {"id": task.id, "split": task.split, "prompt": task.prompt, "data": task.data},
        "group": ep.group,
        "reward": ep.reward,
        "success": ep.success,
        "termination": ep.termination.value,
        "failure_mode": ep.failure_mode,
        "error": ep.error,
        "tokens": list(ep.tokens),
        "loss_mask": list(ep.loss_mask),
        "logprobs": list(ep.logprobs),
        "versions": list(ep.versions),
        "turn_ids": list(ep.turn_ids),
        "turn_rewards": [t.reward for t in ep.turns],
        "messages": ep.info.get("messages", []),
        "divergences": ep.info.get("divergences", []),
    }


class EpisodeFile:
    """Appends episodes to ``path`` as JSON lines (``episode_record``), each line flushed as
    it is written: a reader sees whole episodes while the server runs, and a crash loses at
    most the line being written. A server restarted on the same file appends to it."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 -- closed by close()
        self._lock = threading.Lock()

    def write(self, episodes) -> None:
        lines = "".join(json.dumps(episode_record(ep)) + "\n" for ep in episodes)
        with self._lock:
            self._file.write(lines)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class SessionStore:
    """Live sessions by id, and the episodes of the ended ones: the newest ``keep`` by
    session id (``ended``; ``GET /v1/sessions/{id}/episode``), the oldest dropped beyond it
    (``evicted`` counts them) so a long-running server's memory stays bounded; ``out`` (an
    ``EpisodeFile``: ``serve --episodes FILE``) keeps every one. ``reward_fn``
    (``harness.reward``) scores a session ended without a reward."""

    def __init__(self, reward_fn=None, keep: int = 1024, out: EpisodeFile | None = None):
        if keep < 1:
            raise ValueError(f"SessionStore keeps at least one ended episode, got keep={keep}")
        self.reward_fn = reward_fn
        self.keep, self.out = keep, out
        self.sessions: dict[str, Session] = {}
        self.ended: collections.OrderedDict[str, Episode] = collections.OrderedDict()
        self.evicted = 0
        self.ended_total = 0
        self._unpopped: list[str] = []  # ended since the last ``pop_episodes``
        self.divergences = 0
        self.anonymous = 0

    @property
    def episodes(self) -> list[Episode]:
        """The kept episodes of ended sessions, oldest first."""
        return list(self.ended.values())

    def get(self, sid: str | None) -> Session:
        if sid is None:  # no id: a one-off session, never continued
            self.anonymous += 1
            return Session(id=f"anon-{self.anonymous}")
        if sid not in self.sessions:
            self.sessions[sid] = Session(id=sid)
        return self.sessions[sid]

    def end(
        self,
        sid: str,
        reward: float,
        success: bool | None = None,
        task=None,
        failure_mode: str | None = None,
    ) -> Episode:
        """End session ``sid`` as an episode with ``reward``; ``task`` (a ``Task``) replaces
        the placeholder made from its first user message."""
        session = self.sessions.pop(sid)
        ep = session.episode(
            reward, success=success, group=self.ended_total, failure_mode=failure_mode
        )
        if task is not None:
            ep.task = task
        self.ended_total += 1
        self.ended.pop(sid, None)  # a session id used again: its newest episode
        self.ended[sid] = ep
        self._unpopped.append(sid)
        del self._unpopped[: -self.keep]  # never more than the kept ones
        while len(self.ended) > self.keep:
            self.ended.popitem(last=False)
            self.evicted += 1
        if self.out is not None:
            self.out.write([ep])
        return ep

    def pop_episodes(self) -> list[Episode]:
        """The kept episodes ended since the last call (each once)."""
        sids, self._unpopped = self._unpopped, []
        return [self.ended[s] for s in dict.fromkeys(sids) if s in self.ended]
