"""``sft.cache_dir``: a run whose SFT inputs equal an earlier run's reuses the fitted weights
(another RL recipe after the same warm-start evaluates exactly as the first run did after
its own fit), and any change to an input the fit reads is a new entry, never a stale hit."""

from pathlib import Path

import numpy as np
import pytest

from jaxagent.train.config import load_config
from jaxagent.train.metrics_log import read_jsonl
from jaxagent.train.sft_cache import load, save, sft_key

ROOT = Path(__file__).parent.parent
TINY = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "model.max_seq_len=160",
    "env.options.num_train=40",
    "env.options.num_test=4",
    "rollout.tasks_per_iteration=4",
    "rollout.samples_per_task=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=8",
    "rl.update.minibatch_size=8",
    "sft.num_demos=8",
    "sft.steps=3",
    "sft.batch_size=2",
    "eval.num_tasks=4",
    "eval.val_tasks=0",
    "train.iterations=1",
    "train.progress=none",
    "train.tensorboard=false",
    "train.plot=false",
]


def _run(out: Path, cache: Path, *extra: str) -> dict:
    from jaxagent.train.trainer import Trainer

    config = load_config(
        ROOT / "configs/quickstart.yaml",
        TINY + [f"train.out_dir={out}", f"sft.cache_dir={cache}", *extra],
    )
    Trainer(config, echo=lambda s: None).run()
    first = {}
    for r in read_jsonl(out / "metrics.jsonl"):
        if r["step"] == 0:
            first.update(r)
    return first


# Four short trainings (~2 minutes on 2 cores): nightly; the key and the entries' round trip are
# checked in every run below.
@pytest.mark.slow
def test_second_recipe_reuses_the_fit_and_changed_inputs_miss(tmp_path):
    cache = tmp_path / "cache"
    fitted = _run(tmp_path / "loop", cache)
    assert "sft/cached" not in fitted
    assert len(list(cache.glob("*.json"))) == 1
    reused = _run(tmp_path / "grpo", cache, "rl.recipe=grpo")
    assert reused["sft/cached"] == 1.0
    # The reused weights are the fitted ones: the same evaluation before RL, token for token.
    for k in ("eval/success", "eval/avg_steps", "sft/loss"):
        assert reused[k] == fitted[k], k
    assert len(list(cache.glob("*.json"))) == 1
    # A critic's recipe too: its value head is not part of the fit.
    ppo = _run(tmp_path / "ppo", cache, "rl.recipe=ppo", "model.value_head=true")
    assert ppo["sft/cached"] == 1.0
    for k in ("eval/success", "eval/avg_steps", "sft/loss"):
        assert ppo[k] == fitted[k], k
    assert len(list(cache.glob("*.json"))) == 1
    changed = _run(tmp_path / "lr", cache, "sft.learning_rate=0.001")
    assert "sft/cached" not in changed
    assert len(list(cache.glob("*.json"))) == 2


def test_key_reads_weights_and_demonstrations_and_entries_round_trip(tmp_path):
    class Demo:
        def __init__(self, tokens, success=True):
            self.tokens, self.loss_mask, self.success = (
                tokens,
                [0] + [1] * (len(tokens) - 1),
                success,
            )

    params = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    demos = [Demo([1, 2, 3]), Demo([4, 5])]
    key = sft_key(params, demos, {"steps": 3})
    assert key == sft_key(params, demos, {"steps": 3})
    assert key != sft_key(params, demos, {"steps": 4})
    assert key != sft_key(params, [Demo([1, 2, 3]), Demo([4, 6])], {"steps": 3})
    assert key != sft_key(params, demos[:1] + [Demo([4, 5], success=False)], {"steps": 3})
    assert key != sft_key({**params, "b": np.full(3, 1e-7, np.float32)}, demos, {"steps": 3})
    assert load(str(tmp_path), key, params) is None
    fitted = {"w": np.full((2, 3), 2.0, np.float32), "b": np.arange(3, dtype=np.float32)}
    save(str(tmp_path), key, fitted, {"sft/loss": 0.5})
    got, metrics = load(str(tmp_path), key, params)
    np.testing.assert_array_equal(got["w"], fitted["w"])
    np.testing.assert_array_equal(got["b"], fitted["b"])
    assert metrics == {"sft/loss": 0.5}
    # An entry whose shapes do not fit the model is not used.
    assert load(str(tmp_path), key, {"w": np.ones((3, 2), np.float32), "b": params["b"]}) is None
    # An entry without its metrics file (a killed write) is incomplete.
    (tmp_path / f"{key}.json").unlink()
    assert load(str(tmp_path), key, params) is None


def test_a_value_head_is_left_as_initialised_so_a_critic_shares_the_fit(tmp_path):
    # SFT has no value target: AdamW's weight decay alone moved the head (a shrink of
    # lr * decay a step), so a PPO run's fit differed from LOOP's and refitted. Now the head
    # comes back as it went in, the language model's fit is the same with or without it,
    # and a run with a head reuses the entry a run without one wrote.
    import jax

    from jaxagent.agents.episode import Episode
    from jaxagent.models import ModelConfig, init_model
    from jaxagent.train.sft import Demonstrations, warm_start

    rng = np.random.default_rng(0)
    episodes = []
    for i in range(8):
        tokens = rng.integers(3, 128, int(rng.integers(8, 20))).tolist()
        episodes.append(Episode(task=None, group=i, tokens=tokens, loss_mask=[0] * 4 + [1] * (len(tokens) - 4)))  # fmt: skip
    demos = Demonstrations(episodes, 1.0)

    def fit(value_head: bool, cache: str):
        extra = [f"sft.cache_dir={cache}"] if cache else []
        config = load_config(ROOT / "configs/quickstart.yaml", TINY + extra)
        graphdef, params = init_model(
            ModelConfig.test(num_layers=1, value_head=value_head), jax.random.key(0)
        )
        start = jax.tree.map(np.asarray, params)
        out, metrics = warm_start(
            config, demos, graphdef, params, pad_id=0, max_len=48, echo=lambda s: None
        )
        return start, jax.tree.map(np.asarray, out), metrics

    head_start, head_fit, m = fit(True, "")
    assert "sft/cached" not in m
    for leaf in ("value_kernel", "value_bias"):
        np.testing.assert_array_equal(head_fit[leaf], head_start[leaf])
    plain_start, plain_fit, m = fit(False, str(tmp_path))
    assert "sft/cached" not in m and len(list(tmp_path.glob("*.json"))) == 1
    # The head changes nothing else: the same start, and the same fit, leaf for leaf.
    lm = lambda tree: {k: v for k, v in tree.items() if not k.startswith("value_")}  # noqa: E731
    jax.tree.map(np.testing.assert_array_equal, lm(head_start), plain_start)
    assert not np.array_equal(plain_fit["embed"], plain_start["embed"])  # it did train
    jax.tree.map(np.testing.assert_array_equal, lm(head_fit), plain_fit)
    # A run with a head now reuses that entry and keeps its own head.
    _, reused, m = fit(True, str(tmp_path))
    assert m["sft/cached"] == 1.0 and len(list(tmp_path.glob("*.json"))) == 1
    jax.tree.map(np.testing.assert_array_equal, lm(reused), plain_fit)
    np.testing.assert_array_equal(reused["value_kernel"], head_start["value_kernel"])
