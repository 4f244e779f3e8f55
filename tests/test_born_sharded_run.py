"""A born-sharded run on 8 simulated CPU devices (``mesh.fsdp=8``), from a Hugging Face
directory (8 layers x 512 wide) to the end of the second iteration, and its resume.

Bound: at every sample no device holds more than its share of the train state (the bytes of
the placed params and Adam moments on that device) plus the largest single parameter (one
whole tensor: a transient the loader or an all-gather may hold) and the rollout's and
batch's own arrays (``SLACK``). Per-device bytes are the sum over every live array of the
shards it has on that device, sampled after each tensor the loader places, after the state
is made and after each iteration. A resume reads no weight from the directory at all.
"""

from __future__ import annotations

import collections
import math
from pathlib import Path

import jax
import pytest

from jaxagent.models import hf as HF
from jaxagent.train.config import load_config
from jaxagent.train.local_hf import LocalModelSpec, build_local_hf_dir
from test_born_sharded import _Recorder

pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
SPEC = LocalModelSpec(
    hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1024,
    max_position_embeddings=1024, vocab_size=512,
)  # fmt: skip
RUN = [
    "mesh.fsdp=8",
    "sft.enabled=false",
    "rollout.tasks_per_iteration=4",
    "rollout.samples_per_task=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=8",
    "rollout.max_observation_chars=200",
    "rl.update.minibatch_size=8",
    "eval.num_tasks=4",
    "eval.val_tasks=0",
    "eval.every=0",
    "train.iterations=2",
    "train.checkpoint_every=1",
    "train.progress=none",
    "train.tensorboard=false",
    "train.plot=false",
    "env.pool.backend=inline",
    "env.options.num_train=16",
    "env.options.num_test=4",
    "tokenizer.num_corpus_demos=12",
    "rollout.max_total_tokens=640",
]
SLACK = 4 << 20  # the batch, sampled tokens and scalars: a few MiB at these sizes


def per_device_bytes() -> dict:
    """Bytes of every live buffer on each device, each buffer counted once (an array made
    from another's shard, as a checkpoint save makes, aliases its memory)."""
    seen: dict = {}
    for a in jax.live_arrays():
        if a.is_deleted():
            continue
        for s in a.addressable_shards:
            buf = s.data
            seen[(s.device.id, buf.unsafe_buffer_pointer())] = buf.nbytes
    out: collections.Counter = collections.Counter()
    for (device, _), n in seen.items():
        out[device] += n
    return dict(out)


def state_share(state) -> int:
    out: collections.Counter = collections.Counter()
    for a in jax.tree.leaves(state):
        shard = math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize
        for d in a.sharding.addressable_devices:
            out[d.id] += shard
    return max(out.values())


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from jaxagent.envs.registry import get_env_spec
    from jaxagent.train.chatml_corpus import chatml_corpus
    from jaxagent.train.run import split_tasks

    config = load_config(CONFIGS / "quickstart.yaml", RUN)
    env = get_env_spec(config.env.name, config.env.options)
    corpus = chatml_corpus(config, env, split_tasks(config, env).train)
    return build_local_hf_dir(tmp_path_factory.mktemp("hf") / "qwen2", corpus, SPEC)


def test_a_run_is_born_sharded_and_resumes_without_reading_weights(hf_dir, tmp_path, monkeypatch):
    from jaxagent.train import state as S
    from jaxagent.train import trainer as T

    assert jax.device_count() == 8
    samples: list[tuple[str, dict]] = []
    real_callback = jax.make_array_from_callback

    def placed(shape, sharding, cb, *a, **k):  # the loader, one tensor at a time
        out = real_callback(shape, sharding, cb, *a, **k)
        samples.append(("load", per_device_bytes()))
        return out

    monkeypatch.setattr(jax, "make_array_from_callback", placed)
    real_iteration, real_new_state = T.Trainer.iteration, S.RunState.new
    states = []

    def iteration(self, state, it):
        state, m = real_iteration(self, state, it)
        samples.append((f"iteration {it + 1}", per_device_bytes()))
        states.append(state)
        return state, m

    def new_state(self, params):
        state = real_new_state(self, params)
        samples.append(("state made", per_device_bytes()))
        states.append(state)
        return state

    monkeypatch.setattr(T.Trainer, "iteration", iteration)
    monkeypatch.setattr(S.RunState, "new", new_state)
    out = tmp_path / "run"
    config = load_config(
        CONFIGS / "quickstart.yaml", RUN + [f"model.init_from={hf_dir}", f"train.out_dir={out}"]
    )
    trainer = T.Trainer(config, echo=lambda s: None)
    assert trainer.built.params is None or all(
        isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(trainer.built.params)
    )
    samples.append(("built", per_device_bytes()))
    trainer.run()
    share = state_share(states[-1])
    largest = max(x.nbytes for x in jax.tree.leaves(states[-1].params))
    bound = share + largest + SLACK
    whole_model = sum(x.nbytes for x in jax.tree.leaves(states[-1].params))
    worst = max(samples, key=lambda s: max(s[1].values()))
    print(
        f"share {share / 2**20:.1f} MiB a device, largest tensor {largest / 2**20:.1f} MiB, "
        f"whole model {whole_model / 2**20:.1f} MiB; worst sample {worst[0]}: "
        f"{max(worst[1].values()) / 2**20:.1f} MiB"
    )
    for phase, per_device in samples:
        assert max(per_device.values()) <= bound, (phase, per_device, bound)
    assert any(p == "load" for p, _ in samples) and any(p == "iteration 2" for p, _ in samples)
    # The loaded copy is the state's own (donated): no second model lives beside it.
    assert max(samples[-1][1].values()) < share + whole_model / 8

    # Resume: extend the finished run by one iteration; not one tensor is read from the
    # directory (the weights come from the checkpoint, born in their shards).
    recorder = _Recorder(HF.safe_open)  # a whole-tensor read fails; slice reads are listed
    monkeypatch.setattr(HF, "safe_open", recorder)
    states.clear()
    before_resume = len(samples)
    more = load_config(out / "config.yaml", ["train.iterations=3"])
    T.Trainer(more, echo=lambda s: None).run()
    assert recorder.reads == [] and len(states) == 1  # the third iteration, from checkpoint 2
    samples.append(("resumed run ended", per_device_bytes()))
    for phase, per_device in samples[before_resume:]:
        assert max(per_device.values()) <= bound, (phase, per_device, bound)
