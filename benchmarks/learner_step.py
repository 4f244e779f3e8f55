"""The web quickstart's two learner steps on CPU: whole batch against microbatches, remat on/off.

``configs/web_quickstart.yaml``'s model (2 layers x 128, 4 heads, vocabulary 512) on its
shapes:

- SFT: 8 packed rows of 626 tokens (two episodes a row; the recipe's rows: max_seq_len 640
  less max_new_tokens 14), one AdamW step (the update step
  with the ``sft`` recipe, as ``jaxagent.train.sft.run_sft`` builds it). Anchor: the whole batch in one pass
  (``sft.microbatch_size: 0``); ours: 2 rows a pass, gradients summed (``microbatch_size: 2``).
- RL: the LOOP update of 64 episodes padded to 608 tokens, 2 minibatches of 32
  (``jaxagent.rl.update.make_update_step`` with the trainer's learner pass). Anchor: block
  remat, microbatches of 32 (the defaults); ours: ``rl.update.remat: false``,
  ``microbatch_size: 8``.

Both pairs compute the same loss and gradients (tests/test_expert_policy.py,
tests/test_rl_update.py); only the working set and the recompute change. On CPU the attention
scores of 8 rows x 4 heads x 626 x 626 in float32 (50 MB a layer, kept for the backward)
overflow the caches. Ceiling: the model FLOPs of the step at this process's measured fp32
matmul peak (``jaxagent.perf.roofline``). Median of ``--reps`` timed steps after a warm-up.

Usage: python benchmarks/learner_step.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models import ModelConfig, init_model
from jaxagent.rl.model_fns import model_apply_fn
from jaxagent.rl.recipes import sft_config
from jaxagent.rl.train_state import TrainState, make_optimizer
from jaxagent.rl.update import make_update_step
from jaxagent.rl.model_fns import model_logprob_fn
from jaxagent.train.config import load_config
from jaxagent.train.policy import run_optimizer
from jaxagent.perf.roofline import Roofline
from jaxagent.types import TokenBatch


def _median_s(step, carry, reps: int) -> float:
    carry = step(carry)  # compile + warm-up
    jax.block_until_ready(carry)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        carry = step(carry)
        jax.block_until_ready(carry)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sft_case(graphdef, params, micro: int, reps: int) -> tuple[float, float, int]:
    """(median s/step, loss-bearing tokens, tokens) of an SFT step of 8 x 626 packed rows (the
    recipe's own width: a width no long attention tile divides once took 11x longer)."""
    rows, t, cut = 8, 626, 352
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 478, (rows, t)), jnp.int32)
    seg = np.ones((rows, t), np.int32)
    seg[:, cut:] = 2
    pos = np.concatenate([np.arange(cut), np.arange(t - cut)])[None].repeat(rows, 0)
    mask = jnp.ones((rows, t), jnp.float32)
    config = sft_config(6e-3, 700, rows, micro)
    tx = make_optimizer(config, "wsd", 700)
    step = make_update_step(config, model_apply_fn(graphdef), tx, compute_advantages=False)
    zeros = jnp.zeros((rows, t), jnp.float32)
    batch = TokenBatch(
        tokens=tokens,
        positions=jnp.asarray(pos, jnp.int32),
        segment_ids=jnp.asarray(seg),
        loss_mask=mask,
        old_logprobs=zeros,
        advantages=zeros,
        rewards=jnp.zeros((rows,), jnp.float32),
        group_ids=jnp.arange(rows, dtype=jnp.int32),
        turn_ids=jnp.zeros((rows, t), jnp.int32),
    )
    p = jax.tree.map(jnp.array, params)
    state = TrainState.create(p, config, jax.random.key(0), optimizer=tx)
    return _median_s(lambda s: step(s, batch)[0], state, reps), rows * t, rows * t


def rl_case(graphdef, params, remat: bool, micro: int, reps: int) -> tuple[float, float, int]:
    """(median s/update, loss tokens, tokens) of the web quickstart's LOOP update."""
    config = load_config("configs/web_quickstart.yaml", [f"rl.update.microbatch_size={micro}"])
    rl, tx = config.rl_config, run_optimizer(config)
    rows, t = 64, 608
    rng = np.random.default_rng(0)
    lengths = rng.integers(250, 600, rows)  # expert episodes: 350 tokens on average
    ar = np.arange(t)[None]
    seg = (ar < lengths[:, None]).astype(np.int32)
    mask = ((rng.random((rows, t)) < 0.15) & (seg > 0)).astype(np.float32)
    batch = TokenBatch(
        tokens=jnp.asarray(rng.integers(0, 478, (rows, t)), jnp.int32),
        positions=jnp.asarray(np.broadcast_to(ar, (rows, t)), jnp.int32),
        segment_ids=jnp.asarray(seg),
        loss_mask=jnp.asarray(mask),
        old_logprobs=jnp.asarray(-6.0 * mask),
        advantages=jnp.zeros((rows, t)),
        rewards=jnp.asarray(rng.random(rows), jnp.float32),
        group_ids=jnp.asarray(np.arange(rows) // 4, jnp.int32),
        turn_ids=jnp.asarray(np.where(mask > 0, 0, -1), jnp.int32),
    )
    lean = model_logprob_fn(graphdef, remat=remat, skip_unmasked_chunks=True)
    step = make_update_step(rl, optimizer=tx, logprob_fn=lean)
    state = TrainState.create(jax.tree.map(jnp.array, params), rl, jax.random.key(0), optimizer=tx)
    return _median_s(lambda s: step(s, batch)[0], state, reps), float(mask.sum()), rows * t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    cfg = ModelConfig(
        vocab_size=512,
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=256,
        max_seq_len=640,
    )
    graphdef, params = init_model(cfg, jax.random.key(0))
    roof = Roofline.create(cfg, params)
    print(
        f"model 2 x 128, vocab 512; {jax.device_count()} CPU device(s); fp32 matmul peak "
        f"{roof.peak_flop_s / 1e9:.1f} GFLOP/s (measured)"
    )
    out = {}
    cases = {
        "sft": (
            "SFT 8 x 626 packed",
            lambda: sft_case(graphdef, params, 0, args.reps),
            lambda: sft_case(graphdef, params, 2, args.reps),
            "whole batch",
            "2-row microbatches",
        ),
        "rl": (
            "LOOP update 64 x 608",
            lambda: rl_case(graphdef, params, True, 32, args.reps),
            lambda: rl_case(graphdef, params, False, 8, args.reps),
            "remat, microbatch 32",
            "no remat, microbatch 8",
        ),
    }
    for name, (what, anchor_fn, ours_fn, a_label, o_label) in cases.items():
        anchor, loss_tokens, tokens = anchor_fn()
        ours, _, _ = ours_fn()
        rows = 8 if name == "sft" else 64
        # model FLOPs (forward + backward = 3 forward passes; remat's recompute not counted)
        flops = 3 * roof.forward_flops(tokens, tokens / rows / 2, loss_tokens)
        ceiling = flops / roof.peak_flop_s
        print(
            f"{what}: anchor ({a_label}) {anchor:.3f} s, ours ({o_label}) {ours:.3f} s, "
            f"speed-up {anchor / ours:.2f}x; roofline {ceiling:.3f} s (ours at "
            f"{ceiling / ours:.0%} of the matmul peak)"
        )
        out[name] = {
            "anchor_s": round(anchor, 4),
            "ours_s": round(ours, 4),
            "speedup": round(anchor / ours, 3),
            "roofline_s": round(ceiling, 4),
        }
    print(json.dumps({"benchmark": "learner_step", **out}))


if __name__ == "__main__":
    main()
