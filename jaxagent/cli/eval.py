"""``jaxagent eval``: held-out evaluation of checkpoints or scripted policies (the evaluation
protocol, ``jaxagent.eval.protocol``), agent methods wrapped around them (``--method``), and
``--compare A.json B.json``. Split from ``cli.py``, which parses the arguments and reports
errors (an ``InputError`` raised here exits 2 with one line)."""

from __future__ import annotations

import json
import sys

from jaxagent.errors import InputError


def cmd_eval(args) -> int:
    if args.compare:
        return _cmd_compare(args)
    from jaxagent.learners.registry import learner_of, run_evaluator

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
    from jaxagent.train.session import checkpoint_notes, load_policy, parse_step

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
        step = parse_step(args.step)
        policies = [load_policy(c, step) for c in args.checkpoint]
        for policy in policies:
            for note in checkpoint_notes(config, policy, args.overrides):
                print(f"jaxagent eval: {note}", file=sys.stderr)
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
        f"{report.env_errors}  failure modes {report.failures_text()}"
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
        "failure_details": report.failure_details,
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
    from jaxagent.envs.tools.quickstart.scripted import SCRIPTED

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
