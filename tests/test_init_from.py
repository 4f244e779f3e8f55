"""``model.init_from`` end to end on a locally built Hugging Face directory (a random Qwen2
model, a ChatML BPE tokenizer with the project's tool template), as a user with a downloaded
checkpoint runs it: ``jaxagent train`` runs one shrunken LOOP iteration on the quickstart world
and on BFCL from the directory's weights and tokenizer, ``jaxagent rollout`` prints the prompt
the template rendered (tools included), and PPO on the loaded model gets a fresh value head."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxagent.agents.chat import TemplateChat
from jaxagent.cli.main import main
from jaxagent.envs.registry import get_env_spec
from jaxagent.models import load_hf
from jaxagent.train.chatml_corpus import chatml_corpus
from jaxagent.train.config import load_config
from jaxagent.train.local_hf import LocalModelSpec, build_local_hf_dir
from jaxagent.train.run import split_tasks
from jaxagent.train.tokenizer import CHATML_TEMPLATE

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

SHRINK = [
    "rollout.tasks_per_iteration=2",
    "rollout.samples_per_task=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=8",
    "rollout.max_observation_chars=200",
    "rl.update.minibatch_size=4",
    "eval.num_tasks=2",
    "eval.every=1",
    "train.iterations=1",
    "train.checkpoint_every=1",
    "train.progress=none",
    "train.tensorboard=false",
    "train.plot=false",
    "env.backend=inline",
]
QUICK = ["env.options.num_train=12", "env.options.num_test=2", "eval.val_tasks=0"]
BFCL = ["env.options.limit=4", "rl.lora.rank=2", "model.max_seq_len=4096"]


def _corpus(path, overrides):
    config = load_config(path, overrides + ["tokenizer.num_corpus_demos=12"])
    env = get_env_spec(config.env.name, config.env.options)
    return chatml_corpus(config, env, split_tasks(config, env).train)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A Qwen2 directory whose BPE saw quickstart conversations."""
    corpus = _corpus(f"{CONFIGS}/quickstart.yaml", QUICK)
    spec = LocalModelSpec(max_position_embeddings=1024, vocab_size=1024)
    return build_local_hf_dir(tmp_path_factory.mktemp("hf") / "qwen2", corpus, spec)


@pytest.fixture(scope="module")
def hf_dir_bfcl(tmp_path_factory):
    """One whose BPE also saw BFCL's tool schemas (they are rendered in every prompt)."""
    pytest.importorskip("bfcl_eval")
    corpus = _corpus(f"{CONFIGS}/quickstart.yaml", QUICK) + _corpus(
        f"{CONFIGS}/loop_bfcl.yaml", BFCL
    )
    spec = LocalModelSpec(max_position_embeddings=4096, vocab_size=1536)
    return build_local_hf_dir(tmp_path_factory.mktemp("hf") / "qwen2", corpus, spec)


def _last_json(out: str) -> dict:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def _train(config, overrides, tmp_path, capsys):
    assert main(["train", config, *overrides, f"train.out_dir={tmp_path}/run"]) == 0
    summary = _last_json(capsys.readouterr().out)
    assert {"success_before_rl", "success_after_rl", "wall_s"} <= set(summary)
    from jaxagent.train.metrics_log import read_jsonl

    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    it1 = [r for r in records if r["step"] == 1 and "loss/total" in r]
    assert it1 and np.isfinite(it1[0]["loss/total"]), records
    return it1[0]


def _leaves_equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.slow  # ~25 s alone, minutes under contention; run by scripts/nightly.sh
def test_train_quickstart_from_init_from_uses_the_directory(hf_dir, tmp_path, capsys):
    over = SHRINK + QUICK + [f"model.init_from={hf_dir}", "sft.enabled=false"]
    rec = _train(f"{CONFIGS}/quickstart.yaml", over, tmp_path, capsys)
    assert rec["train/episodes"] == 4
    from jaxagent.train.session import load_policy

    policy = load_policy(tmp_path / "run", step=0)
    # The tokenizer and template are the directory's (not the config's word tokenizer), and
    # the weights RL started from are the directory's, bit for bit.
    assert policy.tokenizer.chat_template == CHATML_TEMPLATE
    assert len(policy.tokenizer) == load_hf(str(hf_dir))[0].vocab_size
    assert _leaves_equal(policy.params, load_hf(str(hf_dir))[2])


@pytest.mark.slow  # 4k-token prompts (BFCL's tool schemas); run by scripts/nightly.sh
def test_train_bfcl_from_init_from(hf_dir_bfcl, tmp_path, capsys):
    over = SHRINK + BFCL + [f"model.init_from={hf_dir_bfcl}"]
    rec = _train(f"{CONFIGS}/loop_bfcl.yaml", over, tmp_path, capsys)
    assert rec["train/episodes"] == 4


def test_rollout_prints_the_rendered_prompt_with_tools(hf_dir, capsys):
    over = QUICK + ["env.backend=inline", "rollout.max_new_tokens=8", "rollout.max_turns=1"]
    assert main(["rollout", f"{CONFIGS}/quickstart.yaml", f"model.init_from={hf_dir}", *over]) == 0
    out = capsys.readouterr().out
    assert "as the chat template rendered it" in out
    prompt = out.split("as the chat template rendered it):\n", 1)[1]
    assert prompt.startswith('<|im_start|>system\nTools:\n<tools>\n{"name": ')
    assert "<|im_start|>user\ntask : " in prompt and "<|im_start|>assistant\n" in prompt
    # A missing directory is a one-line config error naming the key.
    assert main(["rollout", f"{CONFIGS}/quickstart.yaml", "model.init_from=/nonexistent"]) == 2
    assert "model.init_from='/nonexistent' is not a directory" in capsys.readouterr().err


def test_ppo_on_a_loaded_model_gets_a_fresh_value_head(hf_dir):
    from jaxagent.models import apply_model
    from jaxagent.train.run import build_run

    config = load_config(f"{CONFIGS}/ppo_tools.yaml", QUICK + [f"model.init_from={hf_dir}"])
    assert config.model.value_head
    run = build_run(config)
    try:
        assert isinstance(run.chat, TemplateChat) and run.chat.syntax == "hermes"
        params = dict(run.params)
        assert run.model_config.value_head and "value_kernel" in params
        kernel = np.asarray(params.pop("value_kernel"))
        assert np.all(np.isfinite(kernel)) and kernel.std() > 0  # initialised, not zeros
        assert float(params.pop("value_bias")) == 0.0
        _, _, loaded = load_hf(str(hf_dir))  # the rest is the directory's weights
        assert _leaves_equal(params, loaded)
        tokens = np.asarray([run.chat.prompt("", "task : x", run.tasks.train[0])], np.int32)
        pos = np.arange(tokens.shape[1], dtype=np.int32)[None]
        out = apply_model(run.graphdef, run.params, tokens, pos, np.ones_like(tokens))
        assert out.values is not None and np.all(np.isfinite(np.asarray(out.values)))
    finally:
        run.close()


@pytest.mark.slow  # two stages end to end; run by scripts/nightly.sh
def test_sft_to_hf_then_rl_loads_the_sft_directory(tmp_path, capsys):
    from jaxagent.train.config import load_config as load
    from jaxagent.train.session import load_policy

    over = (
        SHRINK
        + QUICK
        + [
            "env.options.num_train=40",
            "eval.val_tasks=4",
            "sft.num_demos=8",
            "sft.steps=3",
            "sft.batch_size=2",
            "tokenizer.num_corpus_demos=20",
            "tokenizer.vocab_size=1024",
            "model.hidden_size=32",
            "model.num_layers=1",
            "model.intermediate_size=64",
            "model.max_seq_len=512",
        ]
    )
    rec = _train(f"{CONFIGS}/quickstart_chatml.yaml", over, tmp_path, capsys)
    assert rec["train/episodes"] == 4
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["wall_s"] == pytest.approx(summary["sft_wall_s"] + summary["rl_wall_s"], abs=0.2)
    rl = load(run / "config.yaml")
    assert rl.model.init_from == str(run / "sft_hf") and not rl.sft.enabled
    # RL started from the SFT stage's HF directory, bit for bit, with its tokenizer.
    start = load_policy(run, step=0)
    assert _leaves_equal(start.params, load_hf(str(run / "sft_hf"))[2])
    assert start.tokenizer.chat_template == CHATML_TEMPLATE
