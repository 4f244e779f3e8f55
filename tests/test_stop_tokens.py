"""Which tokens end a policy turn: every end-of-turn / end-of-message special token of the
tokenizer's chat family (Llama 3.1's <|eom_id|>, Qwen's <|endoftext|>, ...) and a model
directory's generation_config.json eos ids. A turn that ends on one of them stops there
instead of running to max_new_tokens."""

import json

import jax
import jax.numpy as jnp
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from jaxagent.agents.chat import ChatFormat, TemplateChat, make_chat, stop_ids_of
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.agents.sampling import ReferenceSampler
from jaxagent.envs.base import StepResult, Task
from jaxagent.generate import SamplingConfig
from jaxagent.train.run import generation_eos_ids
from jaxagent.train.tokenizer import build_chatml_tokenizer, build_tokenizer

CORPUS = ["task : what do 3 shares of acme cost ? Observation : 12 Final : 36"] * 4
# Llama 3.1 Instruct's layout: <|eot_id|> closes a turn (the tokenizer's eos), <|eom_id|> a
# message that awaits a tool result, <|end_of_text|> the text.
LLAMA31_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
]
LLAMA31 = (
    "{{ '<|begin_of_text|>' }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + "
    "'<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)


def _llama31():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=LLAMA31_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        additional_special_tokens=[t for t in LLAMA31_SPECIAL if t != "<|eot_id|>"],
        clean_up_tokenization_spaces=False,
    )
    out.chat_template = LLAMA31
    return out


def _ids(tok, *names):
    return {tok.convert_tokens_to_ids(n) for n in names}


def test_the_stop_set_holds_every_end_token_of_the_family():
    llama = _llama31()
    chat = make_chat(llama)
    assert isinstance(chat, TemplateChat) and chat.eot_text == "<|eot_id|>"
    want = _ids(llama, "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
    assert set(chat.stop_ids) == want  # and nothing else (no header or bos token)
    # Qwen2.5-style ChatML: <|im_end|> ends a turn, <|endoftext|> (its pad) ends the text.
    qwen = build_chatml_tokenizer(CORPUS, 400)
    chat = make_chat(qwen)
    assert set(chat.stop_ids) == _ids(qwen, "<|im_end|>", "<|endoftext|>")
    assert chat.action("Final : 36")[-1] == qwen.convert_tokens_to_ids("<|im_end|>")
    # The project's template: <|end|> alone, and demonstrations still end with it.
    ours = build_tokenizer(CORPUS, 300)
    chat = make_chat(ours)
    assert isinstance(chat, ChatFormat) and chat.stop_ids == (
        ours.convert_tokens_to_ids("<|end|>"),
    )
    assert chat.action("Final : 36")[-1] == chat.stop_ids[0]
    assert stop_ids_of(ours, 7) == tuple(sorted({7, *chat.stop_ids}))


def test_generation_config_eos_ids_join_the_stop_set(tmp_path):
    assert generation_eos_ids("") == () and generation_eos_ids(str(tmp_path)) == ()
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 9]}))
    assert generation_eos_ids(str(tmp_path)) == (5, 9)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 11}))
    assert generation_eos_ids(str(tmp_path)) == (11,)
    chat = make_chat(_llama31(), extra_stop_ids=(5, 9))
    assert {5, 9} <= set(chat.stop_ids)


class EchoEnv:
    """Three steps, whatever the action."""

    def reset(self, task):
        self.t = 0
        return "task : what do 3 shares of acme cost ?"

    def step(self, action):
        self.t += 1
        return StepResult("Observation : 12", reward=0.0, done=self.t >= 3, info={})

    def close(self):
        pass


def _forced_logits(x: int, eom: int, vocab: int):
    """A model that writes ``x`` after anything but ``x``, and <|eom_id|> after ``x``."""

    def logits_fn(params, tokens, positions, segment_ids):
        del params, positions, segment_ids
        nxt = jnp.where(tokens == x, eom, x)
        return 50.0 * jax.nn.one_hot(nxt, vocab)

    return logits_fn


@pytest.mark.parametrize("with_eom", [True, False])
def test_a_sampled_eom_ends_the_turn(with_eom):
    tok = _llama31()
    chat = TemplateChat(tok)
    eom, x = tok.convert_tokens_to_ids("<|eom_id|>"), tok.encode("acme")[0]
    stop = chat.stop_ids if with_eom else (chat.eot_id,)  # the set before <|eom_id|> was in
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0, stop_token_ids=stop)
    sampler = ReferenceSampler(_forced_logits(x, eom, len(tok)), sampling, 512)
    spec = RolloutSpec(
        chat, "", Budget(max_turns=3, max_new_tokens=8, max_total_tokens=512), InlineRunner(EchoEnv)
    )
    task = Task(id="t", split="train", prompt="", data={})
    (ep,), _ = collect_episodes(
        sampler, None, [task], samples_per_task=1, spec=spec, key=jax.random.key(0)
    )
    assert ep.num_turns == 3
    for turn in ep.turns:
        if with_eom:
            assert turn.num_action_tokens == 2 and not turn.hit_token_limit
            assert turn.action == tok.decode([x])  # the stop token is not sent to the env
        else:  # <|eom_id|> is written, and the turn runs on to max_new_tokens
            assert turn.num_action_tokens == 8 and turn.hit_token_limit
