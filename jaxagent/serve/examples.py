"""Example harnesses: hand-written agent loops over the ``openai`` client, as a user writes them.

``world_harness(env_name, max_turns)`` builds ``harness(task, base_url, api_key) -> reward``
for one of jaxagent's text worlds: the world's system prompt and first observation as the
first messages, each answer as the world's action, each observation sent back (after an
answer with calls a ``tool`` message answering its call, else a ``user`` message: OpenAI's
rule, which the server enforces), until the world ends the episode, ``max_turns`` answers,
or the server refuses a context over the budget (``context_length_exceeded``: where the
rollout driver truncates).

- ``quickstart_harness``: the quickstart world (``configs/quickstart.yaml``'s 6 turns), the
  entry point ``jaxagent.serve.examples:quickstart_harness``; each answer's text is the action.
  ``quickstart_chatml_harness``: the same world for ``configs/quickstart_chatml.yaml``'s
  policy, the task's tools sent as OpenAI ``tools`` and the answers' ``tool_calls`` as actions.
- ``bfcl_harness``: BFCL's multi-turn API worlds with ``configs/loop_bfcl.yaml``'s episode
  settings (``pip install --no-deps bfcl-eval``). The entry's functions go to the server as
  OpenAI ``tools`` (``bfcl_tools``: what the template renders in its tools block); an answer's
  ``tool_calls`` (the server parses the template's native syntax: Hermes ``<tool_call>``,
  Llama 3 JSON, Mistral ``[TOOL_CALLS]``) are executed against the live BFCL apps as one
  step, and the step's results go back as one ``tool`` message (answering the first call's
  id): the world reports an answer's calls together, and this is the message the built-in
  driver renders for the same step. An answer without calls ends the user's request, and the
  next request comes back as a ``user`` message, as the built-in driver renders an
  observation after an answer without calls (``jaxagent.agents.chat.observation_after``).

Through ``collect_harness_episodes`` the quickstart loop gives exactly the built-in driver's
episodes for the same key (``tests/test_serve.py``): the harness path trains on what the
driver would.
"""

from __future__ import annotations

import functools
import json

from jaxagent.agents.task_tools import bfcl_tools, quickstart_tools
from jaxagent.envs.base import Task, truncate_observation
from jaxagent.envs.registry import get_env_spec
from jaxagent.serve.harness import Outcome


def _action(message) -> str:
    """The world's action for an answer: its tool calls as JSON calls (which the worlds'
    parser reads), else its text."""
    if not message.tool_calls:
        return message.content or ""
    calls = [
        {"name": c.function.name, "arguments": json.loads(c.function.arguments or "{}")}
        for c in message.tool_calls
    ]
    return json.dumps(calls)


def world_harness(
    env_name: str,
    max_turns: int,
    options: dict | None = None,
    *,
    tools_of=None,
    max_observation_chars: int = 0,
):
    """A harness over the registered text world ``env_name`` (see the module docstring).

    Args:
      env_name, options: the world (``env.name``, ``env.options``), built at the first call.
      max_turns: answers at most (``rollout.max_turns``).
      tools_of: ``tools_of(task)`` -> OpenAI ``tools`` sent with every request, or None.
      max_observation_chars: observations cut as the driver cuts them
        (``rollout.max_observation_chars``; 0: off).
    """
    spec = functools.cache(lambda: get_env_spec(env_name, options or {}))

    def cut(text: str) -> str:  # the driver's cut, first observation included
        n = max_observation_chars
        return truncate_observation(text, n) if n else text

    def harness(task: Task, base_url: str, api_key: str) -> float:
        import openai

        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        extra = {"tools": tools_of(task)} if tools_of is not None else {}
        env = spec().make_env()
        try:
            messages = [{"role": "system", "content": spec().system_prompt}]
            messages = messages if spec().system_prompt else []
            messages.append({"role": "user", "content": cut(env.reset(task))})
            reward = 0.0
            for _ in range(max_turns):
                try:
                    r = client.chat.completions.create(model=model, messages=messages, **extra)
                except openai.BadRequestError as err:
                    if getattr(err, "code", None) == "context_length_exceeded":
                        return _budget_spent(reward)  # the episode is over
                    raise
                msg = r.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                result = env.step(_action(msg))
                reward += float(result.reward)
                if result.done:  # the world's verdict, as the driver records it
                    info = result.info
                    return Outcome(
                        reward,
                        success=bool(info.get("success", False)),
                        failure_mode=info.get("failure_mode"),
                        truncated=bool(info.get("truncated", False)),
                    )
                messages.append(_observation(msg, cut(result.observation)))
            return _budget_spent(reward)
        finally:
            env.close()

    return harness


def _observation(message, text: str) -> dict:
    """The world's observation after ``message``, the OpenAI way: the result of its calls as
    a ``tool`` message answering its first call (the world runs an answer's calls as one
    step and reports them together: the one observation the driver renders), else the
    world's next words to the model as a ``user`` message (a tool message answers a call)."""
    if message.tool_calls:
        return {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": text}
    return {"role": "user", "content": text}


def _budget_spent(reward: float) -> Outcome:
    return Outcome(reward, success=False, failure_mode="step_budget", truncated=True)


quickstart_harness = world_harness("quickstart", max_turns=6)
# configs/quickstart_chatml.yaml's policy: the task's tools sent as OpenAI tools (the template's
# tools block, as the driver renders them), its <tool_call> answers come back as tool_calls
quickstart_chatml_harness = world_harness("quickstart", max_turns=6, tools_of=quickstart_tools)
# configs/loop_bfcl.yaml's episode: compact tool list in the world's text, results cut at 300
# characters, 4 steps a user turn, 16 answers, observations cut at 300 characters
bfcl_harness = world_harness(
    "bfcl",
    max_turns=16,
    options={"tool_format": "compact", "max_result_chars": 300, "max_steps_per_turn": 4},
    tools_of=bfcl_tools,
    max_observation_chars=300,
)
