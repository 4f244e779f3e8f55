"""One full RL step on the tiny model: sample 8 prompts x 4 samples x 64 new tokens, then GRPO.

jaxagent: ``Sampler`` (prefill + while_loop decode under one jit) then the jitted GRPO
``update_step`` with TRL's GRPO defaults (group-normalised advantages, beta = 0 so no reference
model, one iteration, clip 0.2, one minibatch of 32 sequences). Throughput = completion tokens / wall time of the
whole step (sampling + update), median over steps after a compile warm-up.

Anchor: TRL 1.16 GRPOTrainer on the same model and sizes (PyTorch 2.13, CPU). With
``--trl-python PATH`` (a Python that has trl installed, e.g. a throwaway venv created with
``--system-site-packages`` so that it shares the system torch) it is measured in the same run
(this file re-run with ``--trl-worker`` under that Python); otherwise an earlier figure
measured on this machine (654 completion tokens/s, 2 cores) is printed and labelled as not
re-measured.

Usage: python benchmarks/rl_step.py [--steps 5] [--trl-python /tmp/trlvenv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROMPTS, SAMPLES, NEW, PROMPT_LEN = 8, 4, 64, 64
VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, MLP = 8192, 256, 4, 4, 2, 688  # ModelConfig.tiny()


def trl_worker(steps: int) -> None:
    """TRL GRPOTrainer on the same model and sizes (runs under a Python that has trl)."""
    import tempfile

    import datasets
    import torch
    import trl
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count())
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="t0", eos_token="t1", unk_token="t0"
    )
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            intermediate_size=MLP,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
        )
    )
    rng = torch.Generator().manual_seed(0)
    prompts = [
        " ".join(f"t{int(i)}" for i in torch.randint(3, VOCAB, (PROMPT_LEN,), generator=rng))
        for _ in range(PROMPTS)
    ]
    data = datasets.Dataset.from_dict({"prompt": prompts * (steps + 2)})

    def reward(completions, **kwargs):
        return [float(sum(int(w[1:]) % 2 == 0 for w in c.split())) / NEW for c in completions]

    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out:
        args = trl.GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=PROMPTS * SAMPLES,
            num_generations=SAMPLES,
            max_completion_length=NEW,
            max_steps=steps + 1,
            learning_rate=1e-6,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=not torch.cuda.is_available(),  # the device JAX uses, when it is a GPU
            bf16=False,
            seed=0,
            generation_kwargs={"min_new_tokens": NEW},
            shuffle_dataset=False,
        )
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[Timer()],
        )
        trainer.train()
        lengths = [
            h["completions/mean_length"]
            for h in trainer.state.log_history
            if "completions/mean_length" in h
        ]
    step = statistics.median(times[1:])
    n_tok = statistics.median(lengths[1:]) * PROMPTS * SAMPLES
    print(
        json.dumps(
            {
                "trl_version": trl.__version__,
                "step_s": step,
                "tok_s": n_tok / step,
                "completion_tokens": n_tok,
                "beta": args.beta,
                "device": "cuda" if torch.cuda.is_available() else "cpu",
            }
        )
    )


if __name__ == "__main__" and "--trl-worker" in sys.argv:
    trl_worker(int(sys.argv[sys.argv.index("--steps") + 1]))
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxagent.generate import Sampler, SamplingConfig  # noqa: E402
from jaxagent.models import ModelConfig, init_model  # noqa: E402
from jaxagent.rl.recipes import get_recipe  # noqa: E402
from jaxagent.rl.train_state import TrainState  # noqa: E402
from jaxagent.rl.update import make_update_step  # noqa: E402
from jaxagent.rl.model_fns import model_logprob_fn  # noqa: E402
from jaxagent.types import TokenBatch  # noqa: E402
from roofline import ceiling_s, decoder_shape, forward_flops, machine_peaks  # noqa: E402

TRL_ANCHOR_TOK_S = 654.0  # TRL 1.16 GRPOTrainer, same model and sizes, this machine (earlier run)


def pack(prompts: np.ndarray, out) -> TokenBatch:
    gen = jnp.arange(NEW)[None, :] < out.lengths[:, None]
    reward = jnp.mean((out.tokens % 2 == 0) * gen, axis=1)  # a rule reward: even token ids
    return TokenBatch.from_completions(
        prompts,
        out.tokens,
        out.logprobs,
        out.lengths,
        reward,
        jnp.repeat(jnp.arange(PROMPTS), SAMPLES),
    )


def run_jaxagent(steps: int) -> dict:
    cfg = ModelConfig.tiny()
    graphdef, params = init_model(cfg, jax.random.key(0))
    # TRL's GRPOConfig defaults: beta = 0 (no reference model), one iteration per batch.
    config = get_recipe(
        "grpo",
        update={"minibatch_size": PROMPTS * SAMPLES},
        optim={"learning_rate": 1e-6},
        kl={"mode": "none", "beta": 0.0},
    )
    state = TrainState.create(jax.tree.map(jnp.copy, params), config, jax.random.key(1))
    # The tiny model's activations are small: no rematerialisation (it would cost a forward).
    # The prompt half of each row carries no loss: skip its vocabulary-head chunks.
    update = make_update_step(
        config, logprob_fn=model_logprob_fn(graphdef, remat=False, skip_unmasked_chunks=True)
    )
    sampler = Sampler(graphdef)
    # Sample every row to the full length (no stop tokens), like TRL with a fixed budget.
    sampling = SamplingConfig(max_new_tokens=NEW)
    rng = np.random.default_rng(0)
    prompts = np.repeat(rng.integers(0, cfg.vocab_size, (PROMPTS, PROMPT_LEN)), SAMPLES, axis=0)
    rows = prompts.tolist()
    key = jax.random.key(2)
    times, sample_t, update_t = [], [], []
    for i in range(steps + 1):
        key, k = jax.random.split(key)
        t0 = time.perf_counter()
        out = sampler(state.model_params(), rows, sampling, k)
        jax.block_until_ready(out.tokens)
        t1 = time.perf_counter()
        state, metrics = update(state, pack(prompts, out))
        jax.block_until_ready(metrics)
        t2 = time.perf_counter()
        if i == 0:
            print(f"  warm-up step (compiles): {t2 - t0:.1f} s")
            continue
        times.append(t2 - t0)
        sample_t.append(t1 - t0)
        update_t.append(t2 - t1)
        n_tok = int(out.lengths.sum())
    step = statistics.median(times)
    return dict(
        step_s=step,
        sample_s=statistics.median(sample_t),
        update_s=statistics.median(update_t),
        completion_tokens=n_tok,
        tok_s=n_tok / step,
        loss=float(metrics["loss/total"]),
    )


def run_trl(python: str, steps: int) -> dict | None:
    try:
        proc = subprocess.run(
            [python, os.path.abspath(__file__), "--trl-worker", "--steps", str(steps)],
            capture_output=True,
            text=True,
            timeout=1500,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"  TRL run failed: {e}")
        return None
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    print("  TRL run failed:\n" + proc.stdout[-2000:] + proc.stderr[-3000:])
    return None


def step_flops(cfg) -> dict:
    """The FLOPs one RL step cannot avoid: prefill of the prompts, NEW - 1 decode steps, and
    the update's forward + backward (backward = 2 x forward) over prompt + completion, with
    vocabulary logits at the completion positions only (no recomputation counted)."""
    rows = PROMPTS * SAMPLES
    common = decoder_shape(
        layers=cfg.num_layers,
        hidden=cfg.hidden_size,
        heads=cfg.num_heads,
        kv_heads=cfg.num_kv_heads,
        mlp=cfg.intermediate_size,
        head_dim=cfg.head_dim,
        vocab=cfg.vocab_size,
    )
    prefill = forward_flops(
        **common, tokens=rows * PROMPT_LEN, mean_context=PROMPT_LEN / 2, head_positions=rows
    )
    decode = (NEW - 1) * forward_flops(
        **common, tokens=rows, mean_context=PROMPT_LEN + NEW / 2, head_positions=rows
    )
    update = 3 * forward_flops(
        **common,
        tokens=rows * (PROMPT_LEN + NEW),
        mean_context=(PROMPT_LEN + NEW) / 2,
        head_positions=rows * NEW,
    )
    return {"sample": prefill + decode, "update": update}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--trl-python", default=None, help="python with trl installed (optional)")
    args = ap.parse_args()
    cfg = ModelConfig.tiny()
    print(
        f"setup: tiny model (vocab {cfg.vocab_size}, hidden {cfg.hidden_size}, "
        f"{cfg.num_layers} layers, {cfg.num_heads} heads / {cfg.num_kv_heads} KV heads), "
        f"{PROMPTS} prompts x {SAMPLES} samples x {NEW} new tokens, prompts of {PROMPT_LEN} "
        f"tokens; GRPO as TRL's defaults (group-normalised advantages, beta 0: no reference, 1 epoch, "
        f"1 minibatch of {PROMPTS * SAMPLES}); fp32, backend {jax.default_backend()}, "
        f"{os.cpu_count()} CPUs; median of {args.steps} steps after a warm-up step"
    )
    peaks = machine_peaks()
    ours = run_jaxagent(args.steps)
    flops = step_flops(cfg)
    ceiling = ours["completion_tokens"] / ceiling_s(sum(flops.values()), 0, peaks)
    print(
        f"jaxagent: step {ours['step_s']:.3f} s (sample {ours['sample_s']:.3f} s + update "
        f"{ours['update_s']:.3f} s), {ours['completion_tokens']} completion tokens -> "
        f"{ours['tok_s']:.0f} tok/s"
    )
    print(
        f"work: sample {flops['sample'] / 1e9:.1f} GFLOP, update {flops['update'] / 1e9:.1f} "
        f"GFLOP; achieved {flops['sample'] / ours['sample_s'] / 1e9:.0f} / "
        f"{flops['update'] / ours['update_s'] / 1e9:.0f} GFLOP/s against a matmul peak of "
        f"{peaks['matmul_flop_s'] / 1e9:.0f} measured now; ceiling (all of the step at the "
        f"peak) {ceiling:.0f} tok/s"
    )
    result = {
        "jaxagent_tok_s": round(ours["tok_s"], 1),
        "step_s": round(ours["step_s"], 4),
        "sample_s": round(ours["sample_s"], 4),
        "update_s": round(ours["update_s"], 4),
        "sample_gflop": round(flops["sample"] / 1e9, 2),
        "update_gflop": round(flops["update"] / 1e9, 2),
        "matmul_peak_gflop_s": round(peaks["matmul_flop_s"] / 1e9, 1),
        "ceiling_tok_s": round(ceiling, 1),
    }
    trl = run_trl(args.trl_python, max(2, min(args.steps, 3))) if args.trl_python else None
    # A ratio only compares like with like: TRL measured in this run on the device JAX used.
    backend = jax.default_backend()
    trl_dev = trl.get("device", "cpu") if trl else None
    if trl is None:
        note = f"TRL not measured in this run (anchor {TRL_ANCHOR_TOK_S:.0f} tok/s: CPU, earlier)"
    elif {"gpu": "cuda", "cpu": "cpu"}.get(backend) != trl_dev:
        note = f"not comparable: jax on {backend}, TRL on {trl_dev}"
    else:
        note = ""
    result.update(
        jax_backend=backend,
        trl_tok_s=round(trl["tok_s"], 1) if trl else None,
        trl_device=trl_dev,
        trl_measured=trl is not None,
        trl_anchor_tok_s=TRL_ANCHOR_TOK_S,
        ratio_vs_trl=None if note else round(ours["tok_s"] / trl["tok_s"], 2),
        ceiling_ratio_vs_trl=None if note else round(ceiling / trl["tok_s"], 2),
        ratio_note=note or "same device, same run",
    )
    if trl is not None:
        print(
            f"TRL {trl.get('trl_version')} GRPOTrainer (measured now, {trl_dev}): "
            f"{trl['tok_s']:.0f} tok/s"
        )
    print(
        f"ratio vs TRL (target >= 5x): {result['ratio_vs_trl']}, ceiling "
        f"{result['ceiling_ratio_vs_trl']} ({result['ratio_note']})"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
