"""Example harnesses: hand-written agent loops over the ``openai`` client, as a user writes them.

``world_harness(env_name, max_turns)`` builds ``harness(task, base_url, api_key) -> reward``
for one of jaxagent's text worlds: the world's system prompt and first observation as the
first messages, each answer's text as the world's action, each observation sent back as a
``tool`` message, until the world ends the episode, ``max_turns`` answers, or the server
refuses a context over the budget (``context_length_exceeded``: where the rollout driver
truncates). ``quickstart_harness`` is the quickstart world's, the entry point
``jaxagent.serve.examples:quickstart_harness`` (``configs/quickstart.yaml``'s 6 turns).

Through ``collect_harness_episodes`` such a loop gives exactly the built-in driver's episodes
for the same key (``tests/test_serve.py``): the harness path trains on what the driver would.
"""

from __future__ import annotations

from jaxagent.envs.base import Task
from jaxagent.envs.registry import get_env_spec


def world_harness(env_name: str, max_turns: int, options: dict | None = None):
    """A harness over the registered text world ``env_name`` (see the module docstring)."""
    spec = get_env_spec(env_name, options or {})

    def harness(task: Task, base_url: str, api_key: str) -> float:
        import openai

        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        env = spec.make_env()
        try:
            messages = [{"role": "system", "content": spec.system_prompt}]
            messages = messages if spec.system_prompt else []
            messages.append({"role": "user", "content": env.reset(task)})
            reward = 0.0
            for _ in range(max_turns):
                try:
                    r = client.chat.completions.create(model=model, messages=messages)
                except openai.BadRequestError as err:
                    if getattr(err, "code", None) == "context_length_exceeded":
                        return reward  # the budget is spent: the episode is over
                    raise
                msg = r.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                result = env.step(msg.content or "")
                reward += float(result.reward)
                if result.done:
                    return reward
                messages.append({"role": "tool", "content": result.observation})
            return reward
        finally:
            env.close()

    return harness


quickstart_harness = world_harness("quickstart", max_turns=6)
