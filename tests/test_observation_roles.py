"""The role an observation is rendered in: after a turn with tool calls, the template's tool
role (the calls' results); after a turn without calls, a user turn, as an OpenAI client sends
it (a tool message answers a call) -- so the driver's stream is the template's rendering of
the conversation a harness sends. Over the word tokenizer's own template every observation is
a user turn, with or without calls."""

import jax
import pytest

from jaxagent.agents.chat import ChatFormat, TemplateChat, observation_after
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.agents.turn_policy import HostPolicy, TurnOutput
from jaxagent.envs.base import StepResult, Task
from jaxagent.envs.tool_calls import render_calls
from jaxagent.train.tokenizer import build_chatml_tokenizer, build_word_tokenizer

CALL = render_calls([("price", {"item": "acme"})], "hermes")
PLAIN = "which item do you mean ?"
CORPUS = [f"{CALL} {PLAIN} result 12 task"] * 4


class EchoEnv:
    """Answers every action with ``result <n>``; ends after four steps."""

    def reset(self, task):
        self.t = 0
        return "task : price of acme"

    def step(self, action):
        self.t += 1
        return StepResult(f"result {self.t}", reward=0.0, done=self.t >= 4, info={})

    def close(self):
        pass


class Scripted(HostPolicy):
    """Writes ``texts`` in turn (the chat's ids + its end of turn)."""

    recompiles = 0

    def __init__(self, chat, texts):
        self.chat, self.texts = chat, list(texts)

    def _next(self, n):
        ids = self.chat.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
        ids = [*ids, self.chat.eot_id]
        return TurnOutput([ids] * n, [[0.0] * len(ids)] * n, [True] * n)

    def start(self, params, prompts, key, **kw):
        return self._next(len(prompts))

    def resume(self, params, chunks, key, **kw):
        return self._next(len(chunks))


def _episode(chat, texts):
    spec = RolloutSpec(chat, "", Budget(max_turns=4, max_total_tokens=4096), InlineRunner(EchoEnv))
    task = Task(id="t", split="train", prompt="", data={})
    (ep,), _ = collect_episodes(
        Scripted(chat, texts), None, [task], samples_per_task=1, spec=spec, key=jax.random.key(0)
    )
    return ep


@pytest.fixture(scope="module")
def chatml():
    return TemplateChat(build_chatml_tokenizer(CORPUS, 400))


def test_chunk_after_a_turn_without_calls_is_a_user_turn(chatml):
    assert chatml.observation_role == "tool" and chatml.syntax == "hermes"
    assert chatml.makes_call(CALL) and not chatml.makes_call(PLAIN)
    assert not chatml.makes_call("<tool_call>{not json</tool_call>")  # no tool_calls served
    after_call = chatml.tokenizer.decode(observation_after(chatml, CALL, "12"))
    after_text = chatml.tokenizer.decode(observation_after(chatml, PLAIN, "12"))
    assert after_call == (
        "\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert after_text == "\n<|im_start|>user\n12<|im_end|>\n<|im_start|>assistant\n"


def test_driver_stream_is_the_openai_conversation(chatml):
    """Answers with and without calls: the episode's text is the template's rendering of the
    messages an OpenAI client sends (tool after a call, user after a plain answer)."""
    texts = [CALL, PLAIN, CALL, PLAIN]
    ep = _episode(chatml, texts)
    assert [t.action for t in ep.turns] == texts
    msgs = [{"role": "user", "content": "task : price of acme"}]
    for i, (text, turn) in enumerate(zip(texts, ep.turns)):
        msgs.append({"role": "assistant", "content": text})
        if turn.observation:
            msgs.append({"role": "tool" if i % 2 == 0 else "user", "content": turn.observation})
    full = chatml.tokenizer.apply_chat_template(msgs, tokenize=False)
    text = chatml.tokenizer.decode(ep.tokens, skip_special_tokens=False)
    assert full == text + "\n"  # the template's newline after the last <|im_end|>
    assert text.count("<tool_response>") == 2


def test_word_template_renders_every_observation_as_a_user_turn():
    words = "task : price of acme result 1 2 3 4 which item do you mean ? Action ( )".split()
    chat = ChatFormat(build_word_tokenizer(words))
    assert not chat.makes_call("Action : price ( )")
    ep = _episode(chat, ["Action : price ( )", "which item do you mean ?"] * 2)
    chunks = [chat.observation(t.observation) for t in ep.turns if t.observation]
    assert chunks[0] == observation_after(chat, "Action : price ( )", "result 1")
    assert [t.num_observation_tokens for t in ep.turns[:3]] == [len(c) for c in chunks]
    assert chat.tokenizer.decode(ep.tokens).count("<|user|>") == 4
