"""Training through the environment pool a user's config gets by default: the thread pool
(``env.pool.backend: thread``, the ``PoolConfig`` default) for two iterations and the process
pool for one, on the quickstart world (whose shipped config and ``tests/test_configs.py`` run
its environments inline). The quickstart world's episodes depend on the task only, so every
deterministic metric must equal the inline run's: the pool changes where the environments
run, never what the learner sees."""

import pytest

from jaxagent.train.config import load_config

from test_train import ROOT, TINY, _by_step

QS = ROOT / "configs/quickstart.yaml"
SETTINGS = [s for s in TINY if not s.startswith("train.iterations=")]


def _train(tmp_path, name, iterations, *extra):
    from jaxagent.train.trainer import Trainer

    out = tmp_path / name
    cfg = load_config(
        QS, [*SETTINGS, f"train.iterations={iterations}", f"train.out_dir={out}", *extra]
    )
    Trainer(cfg, echo=lambda s: None).run()
    return cfg, _by_step(out / "metrics.jsonl")


@pytest.fixture(scope="module")
def inline(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("inline"), "run", 2, "env.pool.backend=inline")[1]


@pytest.mark.parametrize("backend,iterations", [("thread", 2), ("process", 1)])
def test_pooled_training_equals_inline(backend, iterations, inline, tmp_path):
    cfg, pooled = _train(
        tmp_path, backend, iterations, f"env.pool.backend={backend}", "env.pool.num_envs=2"
    )
    assert cfg.env.pool.backend == backend and cfg.env.pool.num_envs == 2
    assert sorted(pooled) == list(range(iterations + 1))
    for step in range(1, iterations + 1):
        m = pooled[step]
        assert m["train/episodes"] == 4 and m["train/env_errors"] == 0, m
        # The pooled engine reports its own rollout figures (slot occupancy, waits) and the
        # last iteration of the shorter run its evaluation: the figures both runs have match.
        ref = inline[step]
        common = sorted(k for k in set(m) & set(ref) if not k.endswith("_s"))
        assert {"loss/policy", "train/success", "tokens/policy", "batch/len"} <= set(common)
        # Episodes, tokens and rewards are the same; the losses agree to float32 rounding
        # (the pooled engine's slot decode and the inline lock-step decode sum in another
        # order: their log-probs differ by ~1e-7, "mismatch/mean_abs").
        exact = {k for k in common if isinstance(ref[k], int) or k.startswith(("train/", "eval/"))}
        assert {k: m[k] for k in exact} == {k: ref[k] for k in exact}, (backend, step)
        approx = {k: pytest.approx(ref[k], rel=1e-4, abs=1e-6) for k in set(common) - exact}
        assert {k: m[k] for k in approx} == approx, (backend, step)
