"""The ``jaxagent`` command.

  jaxagent train CONFIG [key=value ...]                     train (resumes an existing run dir)
  jaxagent eval CONFIG --checkpoint RUN_DIR [key=value ...] held-out evaluation of a checkpoint
      [--out DIR] [--seeds N] [--val] [--price-input-per-mtok P] [--price-output-per-mtok P]
      (--checkpoint repeated: several training seeds; --policy expert: the scripted expert)
  jaxagent eval --compare A.json B.json                     B - A and P(B > A) of two records
  jaxagent rollout CONFIG [--checkpoint RUN_DIR] --n N      print N episodes readably
      [--render DIR]                                        (and save their frames as PNG/GIF)
  jaxagent export --checkpoint RUN_DIR --out HF_DIR         write a Hugging Face directory

Configs are YAML overlays on ``jaxagent.train.config.Config``; ``key=value`` overrides use
dotted keys (``rl.optim.learning_rate=3e-4``, ``train.seed=1``). Every input error (a
missing config file, a bad key or value, a missing or partial checkpoint, a bad ``--n``, an
unknown split) exits with status 2 and one line on stderr naming the input, the value and the
fix.
"""

from __future__ import annotations

import argparse
import json
import sys


class InputError(ValueError):
    """A command-line argument is invalid; the message names it, its value and the fix."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), raised for ``main`` to report."""

    def error(self, message: str):
        raise InputError(f"{message} (see `{self.prog} --help`)")


def _cmd_train(args) -> int:
    from jaxagent.train.classic import learner_of, run_learner
    from jaxagent.train.config import load_config
    from jaxagent.train.trainer import Trainer

    learner = learner_of(args.config)
    if learner is not None:  # a non-LLM learner (rl/classic): its own config and summary
        summary = run_learner(learner, args.config, args.overrides)
        print(json.dumps(summary), flush=True)
        return 0
    config = load_config(args.config, args.overrides)
    if config.sft.to_hf:  # SFT writes an HF directory, RL loads it (train/staged.py)
        from jaxagent.train.staged import run_sft_then_rl

        run_sft_then_rl(config)
        return 0
    Trainer(config).run()
    return 0


def _run_for(args, render_dir=None):
    """(config, run) for ``eval`` / ``rollout``: the config's tasks and settings, with the
    checkpoint's policy when one is given (else the config's untrained model)."""
    from jaxagent.train.config import load_config
    from jaxagent.train.run import build_run
    from jaxagent.train.session import load_policy

    config = load_config(args.config, args.overrides)
    policy = load_policy(args.checkpoint) if args.checkpoint else None
    return config, policy, build_run(config, policy=policy, render_dir=render_dir)


def _cmd_eval(args) -> int:
    if args.compare:
        return _cmd_compare(args)
    from jaxagent.train.classic import learner_of, run_evaluator

    if args.config is not None and (learner := learner_of(args.config)) is not None:
        if not args.checkpoint or len(args.checkpoint) != 1:
            raise InputError(f"a learner: {learner} config takes one --checkpoint RUN_DIR")
        summary = run_evaluator(learner, args.config, args.checkpoint[0], args.overrides)
        print(json.dumps(summary), flush=True)
        return 0
    import jax

    from jaxagent.agents.evaluate import evaluate
    from jaxagent.eval.protocol import EvalGroup, Prices, build_record, write_outputs
    from jaxagent.eval.provenance import provenance
    from jaxagent.eval.report import summarize
    from jaxagent.train.config import config_to_yaml, load_config
    from jaxagent.train.run import build_run, eval_key, val_key
    from jaxagent.train.session import load_policy

    if args.config is None:
        raise InputError("CONFIG is missing: pass a YAML config, or --compare A.json B.json")
    scripted = args.policy != "checkpoint"  # expert, or an imperfect scripted policy
    if not args.checkpoint and not scripted:
        raise InputError(
            "the following arguments are required: --checkpoint (a run directory written by "
            "train; or --policy expert for the config's scripted expert)"
        )
    if args.checkpoint and scripted:
        raise InputError(f"--policy {args.policy} and --checkpoint exclude each other; pass one")
    if args.seeds < 1:
        raise InputError(f"--seeds {args.seeds} must be >= 1 (the number of evaluation seeds)")
    if not 0.0 <= args.expert_error_rate <= 1.0:
        raise InputError(f"--expert-error-rate {args.expert_error_rate} must lie in [0, 1]")
    try:
        prices = Prices(args.price_input_per_mtok, args.price_output_per_mtok)
    except ValueError as err:
        raise InputError(f"--price-input-per-mtok / --price-output-per-mtok: {err}") from None
    config = load_config(args.config, args.overrides)
    method_cfg, make_expert = _method_hook(args, config)
    # One (label, loaded policy or None, training seed) per training run.
    if args.checkpoint:
        policies = [load_policy(c) for c in args.checkpoint]
        seeds = (
            [config.train.seed]
            if len(policies) == 1
            else [p.config.train.seed for p in policies]  # each run's own seed
        )
    else:
        policies, seeds = [None], [config.train.seed]
    labels = [f"seed{s}" for s in seeds]
    if len(set(labels)) < len(labels):
        labels = [f"run{i}" for i in range(len(labels))]
    groups, steps = [], []
    for label, policy, seed in zip(labels, policies, seeds):
        run = build_run(config, policy=policy)
        try:
            if policy is None:
                from jaxagent.agents.expert import ExpertTurnPolicy

                if make_expert is None and run.env.make_expert is None:
                    raise InputError(
                        f"--policy expert: env {config.env.name!r} has no scripted expert; "
                        "pass --checkpoint RUN_DIR"
                    )

                def sampler_for(s, run=run, seed=seed):
                    # The expert ignores the sampling key: evaluation seed s reseeds it.
                    return ExpertTurnPolicy(
                        make_expert or run.env.make_expert,
                        run.chat,
                        error_rate=args.expert_error_rate,
                        seed=seed + 100_003 * s,
                    )

                iteration = 0
            else:

                def sampler_for(s, run=run):
                    return run.eval_sampler

                iteration = int(policy.meta.get("iteration", 0))
            splits = [("test", run.tasks.eval, eval_key)]
            if args.val:
                if not run.tasks.val:
                    raise InputError(
                        "--val: this config has no validation tasks (eval.val_tasks=0); set "
                        "eval.val_tasks=N to evaluate in-distribution tasks"
                    )
                splits.append(("val", run.tasks.val, val_key))
            for split, tasks, key_fn in splits:
                for s in range(args.seeds):
                    # Seed 0 is the trainer's evaluation key for this checkpoint: same
                    # tasks, same samples; further seeds fold it.
                    key = key_fn(seed, iteration)
                    key = key if s == 0 else jax.random.fold_in(key, s)
                    run_eval = evaluate
                    if method_cfg is not None:  # a training-free method wraps the policy
                        from jaxagent.agents.methods.config import method_evaluator

                        run_eval = method_evaluator(method_cfg, run, key, scripted=scripted)
                    result = run_eval(
                        sampler_for(s),
                        tasks,
                        run.rollout,
                        key,
                        params=run.params,
                        samples_per_task=config.eval.samples_per_task,
                    )
                    groups.append(EvalGroup(result.episodes, label, s, split, result.seconds))
        finally:
            run.close()
        steps.append(policy.step if policy is not None else None)
    test_eps = [ep for g in groups if g.split == "test" for ep in g.episodes]
    report = summarize(test_eps)
    what = args.checkpoint[0] if args.checkpoint and len(args.checkpoint) == 1 else args.checkpoint
    step = steps[0] if len(steps) == 1 else steps
    name = args.policy if not args.checkpoint else f"checkpoint {what}"
    name += f" + {method_cfg.method}" if method_cfg is not None else ""
    print(
        f"{name} (step {step}): {report.episodes} episodes on "
        f"{config.env.name}/{config.env.eval_split}"
    )
    print(
        f"  success {report.success:.3f}  avg steps {report.avg_steps:.2f}  env errors "
        f"{report.env_errors}  failure modes {report.failure_modes}"
    )
    record = build_record(
        groups,
        prices=prices,
        provenance=provenance(
            config_yaml=config_to_yaml(config),
            model={"init_from": config.model.init_from or None, **_model_fields(config)},
            checkpoint=what,
            step=step,
            train_seeds=seeds,
            eval_seeds=list(range(args.seeds)),
            env=f"{config.env.name}/{config.env.eval_split}",
            policy=args.policy if not args.checkpoint else "checkpoint",
            extra={
                "config_name": config.name,
                "samples_per_task": config.eval.samples_per_task,
                "eval_temperature": config.eval.temperature,
                **({"expert_error_rate": args.expert_error_rate} if not args.checkpoint else {}),
                **({"method": method_cfg.as_dict()} if method_cfg is not None else {}),
            },
        ),
    )
    s = record["success"]
    out = {
        "success": report.success,
        "avg_steps": report.avg_steps,
        "env_errors": report.env_errors,
        "failure_modes": report.failure_modes,
        "episodes": report.episodes,
        "step": step,
        "ci_low": s["ci_low"],
        "ci_high": s["ci_high"],
        "iqm": s["iqm"],
        "cost_usd": record["cost_usd"],
    }
    if args.out:
        paths = write_outputs(record, args.out)
        print(f"  wrote {', '.join(str(p) for p in paths)}")
        out["out"] = str(args.out)
    print(json.dumps(out))
    return 0


def _method_hook(args, config):
    """``--method``'s config and ``--policy lookalike|argname``'s expert (agents/methods)."""
    from jaxagent.agents.methods.config import load_method
    from jaxagent.agents.methods.scripted import SCRIPTED

    make_expert = SCRIPTED.get(args.policy)
    if make_expert is not None and config.env.name != "quickstart":
        raise InputError(
            f"--policy {args.policy} is a quickstart policy; env is {config.env.name!r}"
        )
    return (load_method(args.method) if args.method else None), make_expert


def _model_fields(config) -> dict:
    import dataclasses

    return {
        k: v
        for k, v in dataclasses.asdict(config.model).items()
        if k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "value_head", "dtype")
    }


def _cmd_compare(args) -> int:
    from jaxagent.eval.compare import RecordError, compare_records, load_record
    from jaxagent.eval.tables import compare_markdown

    if args.config is not None or args.overrides or args.checkpoint or args.out:
        raise InputError(
            "--compare A.json B.json takes no CONFIG, overrides, --checkpoint or --out; pass "
            "the two eval.json files only"
        )
    a_path, b_path = args.compare
    try:
        cmp = compare_records(load_record(a_path), load_record(b_path))
    except RecordError as err:
        raise InputError(f"--compare: {err}") from None
    cmp["a"]["path"], cmp["b"]["path"] = a_path, b_path
    print(compare_markdown(cmp), end="")
    d, p = cmp["difference"], cmp["probability_of_improvement"]
    print(
        json.dumps(
            {
                "a": a_path,
                "b": b_path,
                "success_a": cmp["a"]["success"],
                "success_b": cmp["b"]["success"],
                "difference": d["value"],
                "difference_ci_low": d["ci_low"],
                "difference_ci_high": d["ci_high"],
                "prob_improvement": p["value"],
                "prob_improvement_ci_low": p["ci_low"],
                "prob_improvement_ci_high": p["ci_high"],
                "tasks": cmp["tasks"],
            }
        )
    )
    return 0


def _cmd_rollout(args) -> int:
    import jax

    from jaxagent.agents.evaluate import evaluate

    if args.n < 1:
        raise InputError(f"--n {args.n} must be >= 1 (the number of episodes to print)")
    config, _, run = _run_for(args, render_dir=args.render)
    try:
        splits = run.env.make_source().splits()
        if args.split not in splits:
            raise InputError(
                f"--split {args.split!r} is not a split of env "
                f"{config.env.name!r}; choose one of {list(splits)}"
            )
        tasks = list(run.env.make_source().tasks(args.split))[: args.n]
        sampler = run.sampler
        if args.temperature is not None:
            from jaxagent.generate import SamplingConfig
            from jaxagent.train.policy import make_turn_sampler

            sampling = SamplingConfig.create(
                max_new_tokens=config.rollout.max_new_tokens,
                temperature=args.temperature,
                stop_token_ids=run.chat.stop_ids,
            )
            sampler = make_turn_sampler(run.graphdef, sampling, run.max_len, pad_id=run.chat.pad_id)
        result = evaluate(
            sampler, tasks, run.rollout, jax.random.key(config.train.seed), params=run.params
        )
    finally:
        run.close()
    for ep in result.episodes:
        if ep.first_observation:  # what the model was shown, tools included
            ids = run.chat.prompt(run.env.system_prompt, ep.first_observation, task=ep.task)
            text = run.tokenizer.decode(ids, skip_special_tokens=False)
            print(f"prompt ({len(ids)} tokens, as the chat template rendered it):\n{text}")
        print(ep.render())
        print()
    return 0


def _cmd_export(args) -> int:
    from pathlib import Path

    from jaxagent.models import save_hf
    from jaxagent.train.session import load_policy

    policy = load_policy(args.checkpoint)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_hf(str(out), policy.model_config, policy.graphdef, policy.params)
    policy.tokenizer.save_pretrained(str(out))
    print(
        f"exported checkpoint step {policy.step} to {out} (config.json, safetensors, "
        "tokenizer with chat template): load it with transformers.AutoModelForCausalLM"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="jaxagent", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser("train", help="train from a YAML config")
    train.add_argument("config")
    train.add_argument("overrides", nargs="*", help="key=value overrides")
    ev = sub.add_parser("eval", help="evaluate a checkpoint on the held-out split")
    ev.add_argument("config", nargs="?", default=None)
    ev.add_argument("overrides", nargs="*", help="key=value overrides")
    ev.add_argument(
        "--checkpoint",
        action="append",
        default=None,
        help="a run directory written by train (repeat it for several training seeds)",
    )
    ev.add_argument(
        "--policy",
        choices=["checkpoint", "expert", "lookalike", "argname"],
        default="checkpoint",
        help="expert: evaluate the env's scripted expert instead of a checkpoint; lookalike, "
        "argname: imperfect quickstart policies (jaxagent/agents/methods/scripted.py)",
    )
    ev.add_argument(
        "--method",
        default=None,
        help="a training-free method around the policy: configs/methods/*.yaml",
    )
    ev.add_argument("--expert-error-rate", type=float, default=0.0, help="with --policy expert")
    ev.add_argument("--out", default=None, help="write eval.json, eval.md and *.png here")
    ev.add_argument("--seeds", type=int, default=1, help="evaluation seeds (sampling keys)")
    ev.add_argument(
        "--val",
        action="store_true",
        help="also evaluate the validation tasks (in distribution): the generalisation gap",
    )
    ev.add_argument("--price-input-per-mtok", type=float, default=0.0, help="USD per Mtok in")
    ev.add_argument("--price-output-per-mtok", type=float, default=0.0, help="USD per Mtok out")
    ev.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        default=None,
        help="compare two eval.json files: B - A with its interval, P(B > A)",
    )
    ro = sub.add_parser("rollout", help="print episodes readably")
    ro.add_argument("config")
    ro.add_argument("overrides", nargs="*", help="key=value overrides")
    ro.add_argument("--checkpoint", default=None, help="a run directory (default: untrained)")
    ro.add_argument("--n", type=int, default=3, help="number of episodes")
    ro.add_argument("--split", default="test", help="task split")
    ro.add_argument("--temperature", type=float, default=None)
    ro.add_argument(
        "--render", default=None, metavar="DIR", help="save a PNG per step and a GIF per episode"
    )
    ex = sub.add_parser("export", help="write a Hugging Face model directory")
    ex.add_argument("--checkpoint", required=True, help="a run directory written by train")
    ex.add_argument("--out", required=True, help="output directory")
    return parser


def _one_line(text: object) -> str:
    # Causes quoted from libraries (transformers, orbax) carry their own newlines; a script
    # reading stderr expects exactly one line.
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        args = build_parser().parse_args(argv)
    except InputError as err:
        print(_one_line(f"jaxagent {command}: {err}"), file=sys.stderr)
        return 2
    from jaxagent.train.config import ConfigError
    from jaxagent.train.guards import TrainingStopped
    from jaxagent.train.session import CheckpointError

    handlers = {
        "train": _cmd_train,
        "eval": _cmd_eval,
        "rollout": _cmd_rollout,
        "export": _cmd_export,
    }
    try:
        return handlers[args.command](args)
    except ConfigError as err:
        print(_one_line(f"jaxagent {args.command}: config error: {err}"), file=sys.stderr)
        return 2
    except (CheckpointError, InputError) as err:
        print(_one_line(f"jaxagent {args.command}: {err}"), file=sys.stderr)
        return 2
    except TrainingStopped as err:  # a guard stopped the run: one line, not a traceback
        print(_one_line(f"jaxagent {args.command}: {err}"), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
