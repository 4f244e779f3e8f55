"""Peak memory of one RL update, from XLA's own accounting of the compiled step.

For each setting we lower and compile ``update_step(state, batch)`` on abstract shapes (no
weights are allocated) and read ``compiled.memory_analysis()``:

    peak = arguments + temporaries + outputs - aliased outputs

(the state is donated, so its updated copy aliases the input and is counted once). The figure
is divided by the bytes of (params + grads + two Adam moments) = 4 x the policy's fp32 bytes,
the memory of plain fine-tuning of one model with Adam.

The model enters as ``model_logprob_fn(graphdef, skip_unmasked_chunks=True)``, the learner
pass ``jaxagent.train.Trainer`` builds (block remat ordered after the cotangent, vocabulary head
over chunks and over loss positions only, see ``jaxagent.rl.vocab_head``).

Settings (768 hidden x 12 layers, vocab 32000, fp32; batch of 8 sequences x 256 tokens,
microbatches of 4 sequences, so gradients are accumulated over 2 microbatches):

- loop: LOOP, full fine-tuning: one model copy (no critic, no reference).
- loop_one_microbatch: the same with a batch of one microbatch (4 sequences): no accumulation.
- loop_fused: loop_one_microbatch with update.fused_optimizer (two forward + backward
  passes, the optimiser applied block by block inside the second: no gradient tree).
- loop_lora: LOOP with LoRA r=16, alpha=32 (ratio against the full model's bytes too).
- grpo_ref: GRPO with the k3 KL in the loss and the reference model held in the state.
- ppo_critic: PPO with a separate critic of the same size (value head on its own trunk).

Usage: python benchmarks/update_memory.py [--layers 12] [--seq 256]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxagent.models import ModelConfig, abstract_graphdef, init_model  # noqa: E402
from jaxagent.rl.recipes import get_recipe  # noqa: E402
from jaxagent.rl.train_state import TrainState, make_optimizer  # noqa: E402
from jaxagent.rl.update import make_update_step  # noqa: E402
from jaxagent.rl.model_fns import model_logprob_fn  # noqa: E402
from jaxagent.types import TokenBatch  # noqa: E402


def critic_logprob_fn(policy_graphdef, critic_graphdef):
    """Policy log-probs from the policy, values from a separate critic (same size, value head;
    its vocabulary head is unused)."""
    policy = model_logprob_fn(policy_graphdef)
    critic = model_logprob_fn(critic_graphdef, skip_unmasked_chunks=True)

    def logprob_fn(params, tokens, positions, segment_ids, loss_mask=None):
        logp, ent, _ = policy(params["policy"], tokens, positions, segment_ids, loss_mask)
        # An all-zero mask: the critic's vocabulary head is skipped, only values are used.
        _, _, values = critic(
            params["critic"], tokens, positions, segment_ids, jnp.zeros(tokens.shape, jnp.float32)
        )
        return logp, ent, values

    return logprob_fn


def measure(name, config, logprob_fn, params_shape, batch, ref_shape=None):
    tx = make_optimizer(config)
    state = jax.eval_shape(
        lambda p, r: TrainState.create(p, config, jax.random.key(0), optimizer=tx, ref_params=r),
        params_shape,
        ref_shape,
    )
    update = make_update_step(config, optimizer=tx, logprob_fn=logprob_fn)
    compiled = update.lower(state, batch).compile()
    mem = compiled.memory_analysis()
    peak = (
        mem.argument_size_in_bytes
        + mem.temp_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
    )
    return dict(
        name=name,
        peak=peak,
        args=mem.argument_size_in_bytes,
        temp=mem.temp_size_in_bytes,
        out=mem.output_size_in_bytes,
        alias=mem.alias_size_in_bytes,
    )


def nbytes(tree) -> int:
    return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro", type=int, default=4)
    args = ap.parse_args()

    model_cfg = ModelConfig.base_768(num_layers=args.layers)
    graphdef = abstract_graphdef(model_cfg)
    params = jax.eval_shape(lambda k: init_model(model_cfg, k)[1], jax.random.key(0))
    p_bytes = nbytes(params)
    base = 4 * p_bytes  # params + grads + Adam mu + Adam nu
    b, t = args.batch, args.seq
    common = dict(update=dict(minibatch_size=b, microbatch_size=args.micro, num_epochs=1))
    print(
        f"model: hidden {model_cfg.hidden_size} x {model_cfg.num_layers} layers, vocab "
        f"{model_cfg.vocab_size}, {p_bytes / 4 / 1e6:.1f}M fp32 params = {p_bytes / 2**20:.0f} MiB"
    )
    print(
        f"batch {b} x {t} tokens, microbatches of {args.micro}; anchor (params + grads + Adam "
        f"moments) = {base / 2**20:.0f} MiB; backend {jax.default_backend()}"
    )

    apply_fn = model_logprob_fn(graphdef, skip_unmasked_chunks=True)
    results = {}
    runs = [
        ("loop", get_recipe("loop", lora={"rank": 0}, **common), apply_fn, params, None, False),
        ("loop_lora", get_recipe("loop", **common), apply_fn, params, None, False),
        ("grpo_ref", get_recipe("grpo", **common), apply_fn, params, params, False),
    ]
    critic_cfg = model_cfg.replace(value_head=True)
    critic_graphdef = abstract_graphdef(critic_cfg)
    critic = jax.eval_shape(lambda k: init_model(critic_cfg, k)[1], jax.random.key(1))
    runs.append(
        (
            "ppo_critic",
            get_recipe("ppo", kl={"mode": "none"}, **common),
            critic_logprob_fn(graphdef, critic_graphdef),
            {"policy": params, "critic": critic},
            None,
            True,
        )
    )
    # The same LOOP update with one microbatch per optimiser step (batch = microbatch): no
    # gradient accumulator, so no second gradient buffer.
    runs.insert(
        1,
        (
            "loop_one_microbatch",
            get_recipe(
                "loop", lora={"rank": 0}, update={"minibatch_size": args.micro, "num_epochs": 1}
            ),
            apply_fn,
            params,
            None,
            False,
        ),
    )
    # The same again with the optimiser fused into a second backward pass
    # (update.fused_optimizer, jaxagent.rl.fused_step): no gradient tree at all.
    runs.insert(
        2,
        (
            "loop_fused",
            get_recipe(
                "loop",
                lora={"rank": 0},
                update={"minibatch_size": args.micro, "num_epochs": 1, "fused_optimizer": True},
            ),
            apply_fn,
            params,
            None,
            False,
        ),
    )
    for name, cfg, fn, p, ref, values in runs:
        rows = args.micro if name in ("loop_one_microbatch", "loop_fused") else b
        r = measure(name, cfg, fn, p, TokenBatch.abstract(rows, t, values=values), ref)
        ratio = r["peak"] / base
        results[name] = {
            "ratio": round(ratio, 4),
            "peak_mib": round(r["peak"] / 2**20, 1),
            "args_mib": round(r["args"] / 2**20, 1),
            "temp_mib": round(r["temp"] / 2**20, 1),
        }
        extra = ""
        if name == "loop_lora":
            results[name]["ratio_vs_one_model_copy"] = round(r["peak"] / p_bytes, 4)
            extra = f"  (vs one fp32 model copy: {r['peak'] / p_bytes:.3f})"
        print(
            f"{name:19s} peak {r['peak'] / 2**20:8.1f} MiB = args {r['args'] / 2**20:.0f} + temp "
            f"{r['temp'] / 2**20:.0f} + out {r['out'] / 2**20:.0f} - alias {r['alias'] / 2**20:.0f}"
            f"  ratio vs params+grads+Adam {ratio:.3f}{extra}"
        )
    print("target: loop ratio <= 1.15")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
