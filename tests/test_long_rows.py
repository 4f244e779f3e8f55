"""Long multi-turn rows (loop_bfcl's regime: 16 turns, up to 2,048 tokens, ``pow2`` length
buckets): the learner reads exactly what the sampler sampled.

Through the trainer's own rollout, packer and update step, a scripted world that never ends
before the turn budget gives rows of well over 1,024 tokens (the KV cache re-prefilled with an
observation after every turn, the vocabulary head chunked over more than one block of
positions). At the first minibatch of the first epoch the learner's log-probs must equal the
sampler's behaviour log-probs (importance ratio exactly 1 up to float32 rounding), every
sampled token must carry loss and no observation token may.
"""

import numpy as np
import pytest
import jax.numpy as jnp

from jaxagent.envs.base import StepResult, Task
from jaxagent.envs.registry import EnvSpec, env_names, register_env
from jaxagent.rl.model_fns import logits_logprob_fn, model_apply_fn
from jaxagent.train.config import load_config

WORDS = "ls cd mkdir touch echo file dir result error none true false one two three".split()


class Chatty:
    """Every step answers with a 60-word observation; the episode runs to the turn budget."""

    def reset(self, task):
        self.t = task.data["seed"]
        return "start " + " ".join(WORDS[(self.t + i) % len(WORDS)] for i in range(40))

    def step(self, action):
        self.t += 1
        obs = " ".join(WORDS[(self.t * 7 + i * 3) % len(WORDS)] for i in range(60))
        return StepResult(obs, 0.0, False, {"success": False, "failure_mode": None})

    def close(self):
        pass


class _Source:
    def splits(self):
        return ("train", "test")

    def tasks(self, split):
        return [Task(id=f"{split}-{i}", split=split, prompt="", data={"seed": i}) for i in range(8)]


@pytest.mark.slow  # about 3 minutes under load: rollouts of 2,000-token rows
def test_long_rows_learner_logprobs_equal_the_samplers(tmp_path):
    if "chatty" not in env_names():
        register_env(
            "chatty",
            lambda options: EnvSpec(
                name="chatty",
                make_source=_Source,
                make_env=Chatty,
                system_prompt="",
                vocabulary=lambda: WORDS + ["start"],
            ),
        )
    config = load_config(
        None,
        [
            "name=long_rows",
            "env.name=chatty",
            "env.pool.backend=inline",
            "model.hidden_size=32",
            "model.num_layers=2",
            "model.num_heads=2",
            "model.num_kv_heads=1",
            "model.intermediate_size=64",
            "model.max_seq_len=2048",
            "rollout.tasks_per_iteration=2",
            "rollout.samples_per_task=2",
            "rollout.max_turns=16",
            "rollout.max_new_tokens=48",
            "rollout.max_observation_chars=300",
            "rl.recipe=loop",
            "rl.lora.rank=0",
            "rl.update.minibatch_size=4",
            "rl.update.measure_mismatch=free",
            "rl.data.length_buckets=pow2",
            "sft.enabled=false",
            "eval.num_tasks=1",
            "train.iterations=1",
            "train.progress=none",
            "train.tensorboard=false",
            "train.plot=false",
            f"train.out_dir={tmp_path}/run",
        ],
    )
    from jaxagent.train.trainer import Trainer

    trainer = Trainer(config, echo=lambda s: None)
    try:
        params = trainer.take_initial_params()
        batch = trainer.collector.collect(0, 0, params).batch
        lengths = (batch.segment_ids > 0).sum(axis=1)
        assert lengths.min() > 1024, lengths  # long rows, over one head block of positions
        t = batch.tokens.shape[1]
        assert t & (t - 1) == 0 or t == trainer.built.max_len  # a pow2 bucket (or the cap)
        # every sampled token carries loss, and every turn's observation none: the mask
        # has one run of ones per turn
        mask = batch.loss_mask > 0
        for r in range(4):
            runs = np.flatnonzero(np.diff(mask[r].astype(int)) == 1).size + int(mask[r, 0])
            assert runs >= 8 and mask[r].sum() >= 8 * 1
            assert (batch.turn_ids[r][mask[r]] >= 0).all()
        # the plain logits path over the whole row: the behaviour log-probs exactly
        lp = logits_logprob_fn(model_apply_fn(trainer.built.graphdef))(
            params,
            jnp.asarray(batch.tokens),
            jnp.asarray(batch.positions),
            jnp.asarray(batch.segment_ids),
        )[0]
        d = np.abs(np.asarray(lp) - batch.old_logprobs)[mask]
        assert d.max() < 1e-4, d.max()
        # and the update's own (lean, chunked) forward at the first minibatch: ratio 1
        state = trainer.states.new(params)
        _, m = trainer.update_step(state, batch)
        assert float(m["mismatch/max_abs"]) < 1e-4, m["mismatch/max_abs"]
    finally:
        trainer.close()
