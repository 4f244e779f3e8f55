"""Success around each LOOP update on a shortened loop_bfcl: the batch's own entries before and
after the update (re-sampled), and 8 train entries no update sees, with the update's KL, clip
fractions, entropy and sampler/learner mismatch. The figures of docs/results/loop_bfcl.md
("The cause: the step size at this length") and their raw record
docs/results/loop_bfcl_step_size.jsonl come from

    python experiments/loop_bfcl_step_size.py /tmp/fA 4 rl.optim.learning_rate=0.0003
    python experiments/loop_bfcl_step_size.py /tmp/fB 4  # the config: 3e-5

(argv: run directory, iterations, config overrides). It drives the trainer's own phases
(SFT from ``sft.cache_dir``, ``Trainer.iteration``, ``Trainer._collect``) one at a time.
"""

import sys, json, time, numpy as np
from jaxagent.train.config import load_config
from jaxagent.train.trainer import Trainer
from jaxagent.rl.train_state import begin_sampling

out, iters = sys.argv[1], int(sys.argv[2])
over = [
    "sft.steps=300",
    "sft.cache_dir=runs/sft_cache",
    "eval.every=0",
    "eval.num_tasks=10",
    "train.checkpoint_every=0",
    "train.progress=none",
    "train.seed=0",
    f"train.out_dir={out}",
    "train.tensorboard=false",
    "train.plot=false",
] + sys.argv[3:]
cfg = load_config("configs/loop_bfcl.yaml", over)
tr = Trainer(cfg, echo=lambda s: print(s, flush=True))

tr._t_run, tr._wall_offset = tr._t_init, 0.0
state, start, history, extra, _ = tr._start_or_resume()
drawn = {t.id for i in range(iters) for t in tr.collector.tasks(i)}
probe = [t for t in tr.built.tasks.train if t.id not in drawn][:8]  # train tasks no update sees
rows = []


def success(params, tasks, it_key):
    sampler, spec = tr.collector._lanes[0]
    d = tr.collector._episodes(params, it_key, tasks, tasks, 0, None, sampler, spec)
    return float(np.mean([ep.success for ep in d.episodes]))


for it in range(iters):
    t0 = time.time()
    tasks = tr.collector.tasks(it)
    assert not set(t.id for t in tasks) & set(t.id for t in probe)
    if it == 0:
        params, _ = begin_sampling(state)
        probe_before = success(params, probe, 5000)
        print(json.dumps({"it": 0, "probe": probe_before}), flush=True)
    state, m = tr.iteration(state, it)
    params, _ = begin_sampling(state)
    same_after = success(params, tasks, 9000 + it)
    probe_after = success(params, probe, 7000 + it)
    r = {
        "it": it + 1,
        "same_before": m["train/success"],
        "same_after": same_after,
        "probe_after": probe_after,
        **{
            k: round(float(m[k]), 5)
            for k in (
                "entropy/mean",
                "kl/approx_old_new",
                "clip/low_frac",
                "clip/high_frac",
                "mismatch/mean_abs",
                "mismatch/max_abs",
                "optim/grad_norm",
                "guard/no_tokens",
                "samples/kept_frac",
                "batch/len",
            )
            if k in m
        },
        "s": round(time.time() - t0),
    }
    rows.append(r)
    print(json.dumps(r), flush=True)
tr.close()
