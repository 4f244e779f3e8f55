"""The token-in/token-out guarantee over real chat templates (ChatML, Llama 3, Mistral, one
that is not prefix-stable): the learner's row is exactly the ids the sampler was fed and
produced, and for prefix-stable templates its text is the template's rendering of the whole
conversation, the newline ChatML puts after ``<|im_end|>`` included."""

import jax
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.chat import ChatFormat, TemplateChat
from jaxagent.agents.expert import ExpertTurnPolicy
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.agents.turn_policy import HostPolicy
from jaxagent.agents.task_tools import quickstart_tools
from jaxagent.envs.registry import get_env_spec
from jaxagent.envs.tool_calls import detect_syntax
from jaxagent.train.tokenizer import build_chatml_tokenizer

# A Llama-3.1-style template written for this test: a system header, an ipython tool role,
# <|eot_id|> closing every turn and nothing after it.
LLAMA3 = (
    "{{ '<|begin_of_text|>' }}{% for m in messages %}"
    "{% set role = 'ipython' if m['role'] == 'tool' else m['role'] %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + m['content'] | trim + "
    "'<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
# Mistral-style: [INST] turns, </s> after the assistant, a tool message is an error.
MISTRAL = (
    "{{ '<s>' }}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{{ '[INST] ' + m['content'] + ' [/INST]' }}{% elif m['role'] == 'assistant' %}"
    "{{ m['content'] + '</s>' }}{% elif m['role'] == 'system' %}{{ m['content'] }}"
    "{% else %}{{ raise_exception('tool messages need a tool_call_id') }}{% endif %}"
    "{% endfor %}"
)
# Not prefix-stable: earlier assistant turns lose their text before '|' (a reasoning trace),
# the last one keeps it (as Qwen3's template does with <think>).
UNSTABLE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
    "{{ '<|im_start|>assistant\\n' + m['content'].split('|')[-1] + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def _bpe(special, eos, template, corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos,
        additional_special_tokens=[t for t in special if t != eos],
        clean_up_tokenization_spaces=False,
    )
    out.chat_template = template
    return out


CORPUS = ["task : what do 3 shares of acme cost ? Observation : 12 Final : 36"] * 4


@pytest.fixture(scope="module")
def quickstart():
    env = get_env_spec("quickstart", {"num_train": 20, "num_test": 4})
    return env, list(env.make_source().tasks("train"))[:6]


def _tokenizers():
    im = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return {
        "chatml": build_chatml_tokenizer(CORPUS, 400),
        "llama3": _bpe(
            ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
            "<|eot_id|>",
            LLAMA3,
            CORPUS,
        ),
        "mistral": _bpe(["<s>", "</s>"], "</s>", MISTRAL, CORPUS),
        "unstable": _bpe(im, "<|im_end|>", UNSTABLE, CORPUS),
    }


class Recording(HostPolicy):
    """Records what a turn policy was fed (prompts, chunks) and what it produced."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    @property
    def recompiles(self):
        return 0

    def start(self, params, prompts, key, **kw):
        out = self.inner.start(params, prompts, key, **kw)
        self.calls.append(([list(p) for p in prompts], out))
        return out

    def resume(self, params, chunks, key, **kw):
        out = self.inner.resume(params, chunks, key, **kw)
        self.calls.append(([None if c is None else list(c) for c in chunks], out))
        return out


def _messages(chat, ep):
    msgs = [{"role": "user", "content": ep.first_observation}]
    for t in ep.turns:
        msgs.append({"role": "assistant", "content": chat.decode(chat.action(t.action))})
        if t.observation:  # a call's results in the tool role; after plain text, a user turn
            role = chat.observation_role if chat.makes_call(t.action) else "user"
            msgs.append({"role": role, "content": t.observation})
    return msgs


@pytest.mark.parametrize("family", ["chatml", "llama3", "mistral", "unstable"])
def test_learner_sees_exactly_the_sampler_tokens(family, quickstart):
    env, tasks = quickstart
    tok = _tokenizers()[family]
    chat = TemplateChat(tok, tools_of=quickstart_tools if family == "chatml" else None)
    budget = Budget(max_turns=6, max_new_tokens=64, max_total_tokens=4096)
    spec = RolloutSpec(chat, "", budget, InlineRunner(env.make_env))
    policy = Recording(ExpertTurnPolicy(env.make_expert, chat, error_rate=0.5, seed=0))
    eps, _ = collect_episodes(
        policy, None, tasks, samples_per_task=1, spec=spec, key=jax.random.key(0)
    )
    batch = pack_episodes(eps, pad_id=chat.pad_id, max_len=4096, length_multiple=16)
    for row, ep in enumerate(eps):
        fed, produced = [], []
        for inputs, out in policy.calls:
            if inputs[row] is None:
                continue
            fed += inputs[row] + out.tokens[row]
            produced += [0] * len(inputs[row]) + [1] * len(out.tokens[row])
        n = len(ep.tokens)
        assert batch.tokens[row, :n].tolist() == fed == ep.tokens
        assert batch.loss_mask[row, :n].tolist() == produced
        # Every policy turn ends on the template's end-of-turn token, as the sampler stops.
        assert all(out.tokens[row][-1] == chat.eot_id for _, out in policy.calls if out.tokens[row])
        if family == "unstable":
            continue  # its re-rendering rewrites earlier turns; the stream is turn by turn
        full = tok.apply_chat_template(
            _messages(chat, ep),
            tools=chat.tools(ep.task),
            tokenize=False,
            add_generation_prompt=False,
        )
        text = tok.decode(ep.tokens, skip_special_tokens=False)
        # The stream ends on the last policy turn's <eot>; the template adds its between-turn
        # text (ChatML's "\n") only once a next turn starts.
        assert full == text + full[len(text) :] and full[len(text) :] in ("", "\n"), family


def test_chatml_chunks_tool_role_and_newline_after_im_end():
    tok = _tokenizers()["chatml"]
    chat = TemplateChat(tok)
    assert chat.eot_text == "<|im_end|>" and chat.syntax == "hermes"
    assert chat.observation_role == "tool"
    assert chat.observation_text("Observation : 12") == (
        "\n<|im_start|>user\n<tool_response>\nObservation : 12\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # Demonstrations are written as the model writes calls: <tool_call> JSON + <|im_end|>.
    ids = chat.action('Action : price ( item = " acme " )')
    assert ids[-1] == chat.eot_id
    text = chat.decode(ids)
    assert detect_syntax(text) == "hermes" and '"arguments": {"item": "acme"}' in text


def test_llama3_and_mistral_roles_and_stops():
    toks = _tokenizers()
    llama = TemplateChat(toks["llama3"])
    assert llama.eot_text == "<|eot_id|>" and llama.observation_role == "tool"
    assert llama.observation_text("obs").startswith("<|start_header_id|>ipython")
    mistral = TemplateChat(toks["mistral"])
    assert mistral.observation_role == "user"  # its template refuses a bare tool message
    assert mistral.eot_text == "</s>" and mistral.observation_text("obs") == "[INST] obs [/INST]"


def test_prompt_renders_the_task_tools_through_the_template(quickstart):
    _, tasks = quickstart
    chat = TemplateChat(_tokenizers()["chatml"], tools_of=quickstart_tools)
    text = chat.render_prompt("", "task : x", tasks[0])
    for name in tasks[0].data["tools"]:
        assert f'{{"name": "{name}", "description"' in text
    assert text.startswith("<|im_start|>system\nTools:\n<tools>\n")
    assert text.endswith("<|im_start|>user\ntask : x<|im_end|>\n<|im_start|>assistant\n")
    # The project's own template keeps its concatenative chunks (ChatFormat).
    from jaxagent.agents.chat import make_chat
    from jaxagent.train.tokenizer import build_tokenizer

    assert isinstance(make_chat(build_tokenizer(CORPUS, 300)), ChatFormat)
    assert isinstance(make_chat(_tokenizers()["llama3"]), TemplateChat)
