"""The serve tests' shared set-up (``tests/test_serve*.py`` import it).

- ``policy``: a tiny random model over the word tokenizer of ``test_rollout``'s scripted
  world (chat, graphdef, params, sampling), once a test module;
- ``server``: that policy behind the real app on localhost (``ServerThread``), two KV slots;
  ``start_server(policy, **options)`` starts another (``build_state``'s options: an episodes
  file, another budget or slot count);
- ``client_of(srv)``: the real ``openai`` client pointed at it;
- ``ScriptedBackend``: a backend answering each turn with the next scripted text, for the
  tool-call format over a ChatML template without a model that writes calls.
"""

import threading

import jax
import openai
import pytest
from test_rollout import WORDS

from jaxagent.agents.chat import ChatFormat
from jaxagent.agents.rollout import Budget
from jaxagent.generate import SamplingConfig
from jaxagent.models import ModelConfig, init_model
from jaxagent.serve.backend import BackendStats, Result
from jaxagent.serve.server import ServerThread, build_state
from jaxagent.train.tokenizer import build_word_tokenizer

SYSTEM = "one two"
N = 6  # tokens per turn
BUDGET = Budget(max_turns=4, max_new_tokens=N, max_total_tokens=200)
MAX_SEQ_LEN = 256


@pytest.fixture(scope="module")
def policy():
    tok = build_word_tokenizer(WORDS)
    chat = ChatFormat(tok)
    cfg = ModelConfig.test(vocab_size=len(tok), max_seq_len=MAX_SEQ_LEN)
    graphdef, params = init_model(cfg, jax.random.key(0))
    sampling = SamplingConfig(max_new_tokens=N, temperature=1.0, stop_token_ids=chat.stop_ids)
    return chat, graphdef, params, sampling


def start_server(policy, **options) -> ServerThread:
    """``policy`` (the fixture's tuple) served on a free port, its device programs ready;
    ``options`` override ``build_state``'s (two slots, three decode steps, ``BUDGET``)."""
    chat, graphdef, params, sampling = policy
    settings = {
        "max_total_tokens": BUDGET.max_total_tokens,
        "max_seq_len": MAX_SEQ_LEN,
        "model_id": "tiny",
        "slots": 2,  # three conversations at once: one is always evicted
        "decode_steps": 3,
        **options,
    }
    state = build_state(chat=chat, graphdef=graphdef, params=params, sampling=sampling, **settings)
    srv = ServerThread(state)
    state.backend.wait_ready()
    return srv


@pytest.fixture(scope="module")
def server(policy):
    srv = start_server(policy)
    yield srv
    srv.close()


def client_of(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)


class ScriptedBackend:
    """Answers every turn with the next scripted text (its ids + the end-of-turn id): the
    tool-call format is tested without training a model to write calls."""

    def __init__(self, chat, texts):
        self.chat, self.texts = chat, list(texts)
        self.max_new_tokens, self.capacity = 128, 2048
        self.stats = BackendStats()
        self.contexts = []

    def sampling_for(self, temperature, top_p):
        return None

    def next_row(self):
        return 0

    def submit(self, job):
        ids = self.chat.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
        ids = [*ids, self.chat.eot_id]
        self.contexts.append(list(job.context))
        lps = [-0.5] * len(ids)

        def run():
            if job.stream:
                job.emit("tokens", (ids[:2], lps[:2]))
                job.emit("tokens", (ids[2:], lps[2:]))
            job.emit("done", Result(ids, lps, "stop", 0))

        threading.Thread(target=run, daemon=True).start()

    def compile(self, regex):
        raise NotImplementedError("the scripted backend decodes no grammar")

    def release(self, session):
        pass

    def close(self):
        pass
