"""The ChatML corpus (``tokenizer.kind: chatml``) renders each expert conversation as the
rollout driver streams the same episode: an environment answer after an action with tool
calls in the tool role (``<tool_response>``), after an action without calls a user turn (the
rule of ``Chat.makes_call``, the serve endpoint's), so the BPE learns the text the policy
reads and the SFT text agrees with the episodes RL trains on."""

from pathlib import Path

import jax
import pytest

from jaxagent.agents.chat import TemplateChat
from jaxagent.agents.expert import ExpertTurnPolicy
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.envs.base import StepResult, Task
from jaxagent.envs.registry import EnvSpec
from jaxagent.train.chatml_corpus import chatml_corpus
from jaxagent.train.config import load_config
from jaxagent.train.tokenizer import build_chatml_tokenizer

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "quickstart_chatml.yaml"
CALL = 'Action : price ( item = " acme " )'  # a call: the corpus writes it as <tool_call>
PLAIN = "which item do you mean ?"  # no call: the answer that follows is a user turn
ACTIONS = [CALL, PLAIN, CALL, PLAIN, "Final : 12"]


class AskingEnv:
    """Answers the n-th action with ``answer <n>``; a ``Final`` answer ends the episode."""

    def reset(self, task):
        self.t = 0
        return f"task {task.id} : price of acme"

    def step(self, action):
        self.t += 1
        done = action.startswith("Final")
        return StepResult(f"answer {self.t}", reward=float(done), done=done, info={})

    def close(self):
        pass


class AskingExpert:
    """Calls a tool, asks the user, calls again, asks again, answers."""

    def __init__(self, task, error_rate, rng):
        del task, error_rate, rng
        self.actions = list(ACTIONS)

    def act(self, observation):
        del observation
        return self.actions.pop(0)


ENV = EnvSpec(
    name="asking",
    make_source=lambda: None,
    make_env=AskingEnv,
    system_prompt="you price items",
    make_expert=AskingExpert,
)
TASKS = [Task(id=f"t{i}", split="train", prompt="", data={}) for i in range(2)]


@pytest.fixture(scope="module")
def corpus():
    config = load_config(str(CONFIG), ["tokenizer.num_corpus_demos=2", "sft.expert_error_rate=0"])
    return chatml_corpus(config, ENV, TASKS)


def test_answer_after_a_turn_without_calls_is_a_user_turn(corpus):
    assert corpus[0] == ENV.system_prompt and len(corpus) == 3
    text = corpus[1]
    after_call = "<|im_start|>user\n<tool_response>\nanswer 1\n</tool_response><|im_end|>"
    after_plain = f"{PLAIN}<|im_end|>\n<|im_start|>user\nanswer 2<|im_end|>"
    assert after_call in text, f"the answer to a call is not a tool turn:\n{text}"
    assert after_plain in text, f"the answer after a turn without calls is not a user turn:\n{text}"
    assert text.count("<tool_response>") == 2 and text.count("<tool_call>") == 2


def test_corpus_is_the_driver_stream_of_the_same_episode(corpus):
    """The expert's episodes through the rollout driver (``ExpertTurnPolicy``, as SFT records
    demonstrations) decode to exactly the corpus's conversations."""
    chat = TemplateChat(build_chatml_tokenizer(["x"], 300))  # the corpus's template
    budget = Budget(max_turns=6, max_new_tokens=64, max_total_tokens=4096)
    spec = RolloutSpec(chat, ENV.system_prompt, budget, InlineRunner(ENV.make_env))
    policy = ExpertTurnPolicy(ENV.make_expert, chat, error_rate=0.0, seed=0)
    eps, _ = collect_episodes(
        policy, None, TASKS, samples_per_task=1, spec=spec, key=jax.random.key(0)
    )
    for ep, conversation in zip(eps, corpus[1:], strict=True):
        assert len(ep.turns) == len(ACTIONS)
        stream = chat.tokenizer.decode(ep.tokens, skip_special_tokens=False)
        # The template's newline after the last <|im_end|> (the driver stops at <|im_end|>).
        assert conversation == stream + "\n"
