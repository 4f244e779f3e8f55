"""Configs: typed loading with overrides, readable errors, and every YAML in configs/ runs.

Each ``configs/*.yaml`` is loaded and run for one shrunken iteration (tiny model, two tasks,
short budgets) end to end: collect -> advantages -> update -> eval -> checkpoint.
"""

from pathlib import Path

import pytest
import yaml

from jaxagent.train.config import Config, load_config
from jaxagent.errors import ConfigError

# ``learner:`` configs (jaxagent/learners, dispatched by learners/registry.py) have their own schema
# and their own shrunken-run tests (tests/test_dqn.py, the PPO tests).
CONFIGS = sorted(
    p
    for p in (Path(__file__).parent.parent / "configs").glob("*.yaml")
    if "learner" not in (yaml.safe_load(p.read_text()) or {})
)


def test_overrides_are_typed_and_applied():
    c = load_config(
        None,
        [
            "rl.recipe=grpo",
            "rl.optim.learning_rate=0.001",
            "rollout.samples_per_task=4",
            "env.options.num_train=50",
        ],
    )
    assert c.rl_config.name == "grpo" and c.rl_config.optim.learning_rate == 1e-3
    assert c.group_size == 4 and c.env.options == {"num_train": 50}
    assert isinstance(c, Config)
    with pytest.raises(Exception):
        c.train.seed = 3  # frozen


@pytest.mark.parametrize(
    "override, needle",
    [
        ("model.hiden_size=8", "did you mean 'hidden_size'"),
        ("trian.seed=1", "allowed keys here: ['name', 'paper', 'model'"),
        ("model.hidden_size=big", "model.hidden_size"),
        ("train.progress=fancy", "choose one of ['rich', 'tqdm', 'none']"),
        ("rl.recipe=ppo2", "choose one of"),
        ("rl.optim.lr=1", "allowed keys here: ['learning_rate'"),
        ("rl.loss.clip_eps_high=wide", "rl.loss.clip_eps_high"),
        ("rl.loss.clip_eps_low=1.5", "rl.loss.clip_eps_low=1.5"),
        ("rl.advantage.truncated=skip", "rl.advantage.truncated='skip'"),
        (
            "rl.overrides.learning_rate=1",
            "typed sections that replaced rl.overrides: rl.optim.learning_rate",
        ),
        ("env.name=atari", "choose one of ['quickstart'"),
        ("rollout.top_p=0", "rollout.top_p"),
        ("model.num_heads=3", "divisible"),
        ("seed", "key=value"),
    ],
)
def test_bad_keys_and_values_name_the_key_and_allowed_values(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert needle in str(err.value)


def test_every_config_names_its_paper_and_loads():
    assert len(CONFIGS) >= 7, [c.name for c in CONFIGS]
    for path in CONFIGS:
        c = load_config(path)
        assert c.paper, f"{path.name} must name the paper it follows (paper: ...)"
        c.rl_config


# Overrides that shrink any config to a one-iteration smoke size.
SHRINK = [
    "model.init_from=''",
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "model.max_seq_len=320",
    "tokenizer.vocab_size=320",
    "rollout.tasks_per_iteration=2",
    "rollout.samples_per_task=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=8",
    "rollout.max_observation_chars=200",
    "rl.update.minibatch_size=4",
    "rl.update.microbatch_size=0",  # a recipe's own (web: 8) need not divide 4
    "rl.data.max_sampling_rounds=2",
    "sft.num_demos=4",
    "sft.steps=2",
    "sft.batch_size=2",
    "eval.num_tasks=4",
    "eval.every=1",
    "eval.temperature=1.0",
    "train.iterations=1",
    "train.checkpoint_every=1",
    "train.progress=none",
    "train.tensorboard=false",
    "train.plot=false",
    "env.pool.backend=inline",
]
# ChatML renders the tool schemas in every prompt: a 320-token BPE cannot fit them in 320.
CONFIG_SHRINK = {
    "quickstart_chatml": ["tokenizer.vocab_size=1024", "model.max_seq_len=512"],
    # BFCL's first prompt (tool schemas) is ~320 tokens in the shrunken tokenizer: the
    # prompt-budget check refuses a budget that ends every episode before its first turn
    "loop_bfcl": ["model.max_seq_len=512"],
    "loop_bfcl_gen": ["model.max_seq_len=512"],  # the same prompt: ~350 tokens
}
ENV_SHRINK = {
    "quickstart": ["env.options.num_train=20", "env.options.num_test=4", "eval.val_tasks=4"],
    "bfcl": ["env.options.limit=6"],
    "bfcl_gen": ["env.options.num_train=20", "env.options.num_test=4", "eval.val_tasks=4"],
    "code": ["env.options.num_train=4"],
    "math": ["env.options.num_train=20", "env.options.num_test=4", "eval.val_tasks=4"],
    "dialogue": ["env.options.num_train=20", "env.options.num_test=4", "eval.val_tasks=4"],
    "shop": ["env.options.num_train=20", "env.options.num_test=4", "eval.val_tasks=4"],
    "manipulation": ["env.options.num_train=20", "env.options.num_test=4", "eval.val_tasks=4"],
}


# Recipe variants on a world another config already runs: their one-iteration runs (~30 s
# each) go to the nightly set to keep CI under its time budget; the recipes themselves are
# unit-tested (tests/test_rl_update.py, tests/test_rl_losses.py). ppo_tools (~40 s) is the
# quickstart world with PPO and a value head (tests/test_experiment_runners.py::
# test_recipe_configs_are_their_ablation_cells), the run tests/test_train.py::
# test_reference_run_trains_on_samples_and_pads_to_the_length_multiple trains in CI.
NIGHTLY_CONFIGS = {"dr_grpo_math", "rloo_tools", "rft_tools", "ppo_tools"}


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if p.stem in NIGHTLY_CONFIGS else p for p in CONFIGS],
    ids=[p.stem for p in CONFIGS],
)
def test_every_config_runs_one_shrunken_iteration(path, tmp_path):
    import jax
    import numpy as np

    from jaxagent.train.metrics_log import read_jsonl
    from jaxagent.train.trainer import Trainer

    base = load_config(path)
    if base.env.name in ("bfcl", "bfcl_gen"):
        pytest.importorskip("bfcl_eval")
    extra = ENV_SHRINK[base.env.name] + (["rl.lora.rank=2"] if base.rl_config.lora.rank else [])
    extra += CONFIG_SHRINK.get(path.stem, [])
    config = load_config(path, SHRINK + extra + [f"train.out_dir={tmp_path}/run"])
    trainer = Trainer(config, echo=lambda s: None)
    summary = trainer.run()
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    it1 = [r for r in records if r["step"] == 1 and "loss/total" in r]
    assert it1, records
    rec = it1[0]
    assert np.isfinite(rec["loss/total"])
    assert rec["train/episodes"] == 4  # no episode lost
    assert rec["eval/episodes"] == len(trainer.built.tasks.eval) * config.eval.samples_per_task
    rl = config.rl_config
    if rl.kl.mode == "loss":
        assert "kl/ref" in rec
    if rl.critic.enabled:
        assert "loss/value" in rec and np.isfinite(rec["loss/value"])
    assert set(summary) >= {"success_before_rl", "success_after_rl", "avg_steps", "wall_s"}
    assert trainer.checkpointer.all_steps()[-1] == 1
    # The update changed the policy exactly when some sample carried a gradient: kept tokens
    # with a nonzero advantage (LOOP drops groups whose rewards are all equal), or an SFT / RFT
    # target, or a critic to fit; AdamW's weight decay (DAPO) moves the weights whenever a step
    # is taken. A minibatch without a loss token takes no step at all (rl/guards.py).
    from jaxagent.train.session import load_policy

    before = load_policy(tmp_path / "run", step=0).params
    after = load_policy(tmp_path / "run", step=1).params
    changed = any(
        not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))
    )
    signal = (
        rl.loss.policy == "sft" or rl.critic.enabled or rec["adv/max"] != 0 or rec["adv/min"] != 0
    )
    assert changed == (rec["tokens/policy"] > 0 and (signal or rl.optim.weight_decay > 0)), rec


def test_recipe_preset_first_then_the_keys_the_user_set():
    from jaxagent.rl.recipes import get_recipe

    # Keys left unset follow the recipe, whichever it is and wherever it is named.
    for order in (["rl.recipe=grpo", "rl.kl.beta=0.1"], ["rl.kl.beta=0.1", "rl.recipe=grpo"]):
        rl = load_config(None, order).rl_config
        assert rl == get_recipe("grpo", kl={"beta": 0.1}), order
        assert (rl.kl.mode, rl.kl.estimator, rl.loss.clip_eps_high) == ("loss", "k3", 0.2)
    # A YAML's explicit key survives a recipe switch by override; its unset keys do not.
    c = load_config(CONFIGS[0].parent / "dapo_code.yaml", ["rl.recipe=grpo"])
    rl = c.rl_config
    assert rl.loss.clip_eps_high == 0.28  # set in the YAML
    assert rl.loss.aggregation == "seq_mean_token_mean" and rl.kl.mode == "loss"  # grpo's preset
    # The saved config (unset keys are null) reloads to the same algorithm.
    import tempfile

    from jaxagent.train.config import config_to_yaml

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(config_to_yaml(c))
    assert load_config(f.name).rl_config == rl


def test_group_size_has_one_home():
    assert load_config(None, ["rl.recipe=grpo"]).group_size == 64  # the recipe's K
    assert load_config(None, ["rl.recipe=grpo", "rollout.samples_per_task=8"]).group_size == 8
    with pytest.raises(ConfigError, match="unknown config key 'rl.update.group_size'"):
        load_config(None, ["rl.update.group_size=4"])


@pytest.mark.parametrize(
    "override", ["rollout.temperature=0.7", "rollout.top_k=20", "rollout.top_p=0.9"]
)
@pytest.mark.parametrize("recipe", ["loop", "grpo", "reinforce", "ppo"])
def test_ratio_and_on_policy_recipes_refuse_filtered_sampling(recipe, override):
    # The sampler records log-probs of the unfiltered temperature-1 distribution: any other
    # sampling makes every importance ratio (and REINFORCE's on-policy gradient) biased.
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"rl.recipe={recipe}", override])
    assert override.split("=")[0] in str(err.value)
    assert "rollout.temperature=1.0" in str(err.value)  # the fix
    # Rejection-sampling fine-tuning (an SFT loss) may sample any way it likes.
    assert load_config(None, ["rl.recipe=rft", override]).rollout
