"""The corpus a ChatML tokenizer (``tokenizer.kind: chatml``) is trained on.

Whole conversations as the ChatML template renders them: the system turn with the task's
tool schemas, the first observation, and (for suites with a scripted expert) the expert's
actions in ``<tool_call>`` JSON with the environment's answers as the rollout driver renders
them (``jaxagent.agents.chat.observation_after``): the results of an action with tool calls
in the tool role, the answer after one without calls a user turn, by the chat's one rule
(``Chat.makes_call``, the serve endpoint's). The BPE then learns merges for exactly the text
the policy reads and writes, which keeps episodes short for a tiny from-scratch model. The
expert and the environments run on the host, text only.
"""

from __future__ import annotations

import numpy as np

from jaxagent.agents.chat import TemplateChat, role_after
from jaxagent.agents.task_tools import tools_of_env
from jaxagent.envs.registry import EnvSpec
from jaxagent.envs.actions import to_native
from jaxagent.train.tokenizer import build_chatml_tokenizer


def chatml_corpus(config, env: EnvSpec, tasks) -> list[str]:
    """Rendered conversations of up to ``tokenizer.num_corpus_demos`` train tasks."""
    # Only the template is used: to render, and (TemplateChat) for the role of each answer.
    chat = TemplateChat(build_chatml_tokenizer(["x"], 300))
    tools_of = tools_of_env(env.name)
    rng = np.random.default_rng([config.train.seed, 11])
    n = min(len(tasks), max(config.tokenizer.num_corpus_demos, 1))
    out = [env.system_prompt] if env.system_prompt else []
    for task in tasks[:n]:
        out.append(_conversation(config, env, task, tools_of, chat, rng))
    return out


def _conversation(config, env, task, tools_of, chat, rng) -> str:
    system = [{"role": "system", "content": env.system_prompt}] if env.system_prompt else []
    e = env.make_env()
    try:
        messages = system + [{"role": "user", "content": e.reset(task)}]
        if env.make_expert is not None:
            expert = env.make_expert(task, config.sft.expert_error_rate, rng)
            for _ in range(config.rollout.max_turns):
                action = to_native(expert.act(messages[-1]["content"]), chat.syntax)
                messages.append({"role": "assistant", "content": action})
                step = e.step(action)
                if step.done:
                    break
                role = role_after(chat, chat.makes_call(action))
                messages.append({"role": role, "content": step.observation})
    finally:
        e.close()
    tools = tools_of(task) if tools_of else None
    kwargs = {"tools": tools} if tools else {}
    return chat.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
