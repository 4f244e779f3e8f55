"""The ``jaxagent`` command.

  jaxagent train CONFIG [key=value ...]                     train (resumes an existing run dir)
  jaxagent eval CONFIG --checkpoint RUN_DIR [key=value ...] held-out evaluation of a checkpoint
  jaxagent rollout CONFIG [--checkpoint RUN_DIR] --n N      print N episodes readably
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
    from jaxagent.train.config import load_config
    from jaxagent.train.trainer import Trainer

    config = load_config(args.config, args.overrides)
    Trainer(config).run()
    return 0


def _run_for(args):
    """(config, run) for ``eval`` / ``rollout``: the config's tasks and settings, with the
    checkpoint's policy when one is given (else the config's untrained model)."""
    from jaxagent.train.config import load_config
    from jaxagent.train.run import build_run
    from jaxagent.train.session import load_policy

    config = load_config(args.config, args.overrides)
    policy = load_policy(args.checkpoint) if args.checkpoint else None
    return config, policy, build_run(config, policy=policy)


def _cmd_eval(args) -> int:
    from jaxagent.agents.evaluate import evaluate
    from jaxagent.train.run import eval_key

    config, policy, run = _run_for(args)
    try:
        # The trainer's evaluation key for this checkpoint: same tasks, same samples.
        result = evaluate(
            run.eval_sampler,
            run.tasks.eval,
            run.rollout,
            eval_key(config.train.seed, int(policy.meta.get("iteration", 0))),
            params=run.params,
            samples_per_task=config.eval.samples_per_task,
        )
    finally:
        run.close()
    report = result.report
    print(
        f"checkpoint {args.checkpoint} (step {policy.step}): {report.episodes} episodes on "
        f"{config.env.name}/{config.env.eval_split}"
    )
    print(
        f"  success {report.success:.3f}  avg steps {report.avg_steps:.2f}  env errors "
        f"{report.env_errors}  failure modes {report.failure_modes}"
    )
    print(
        json.dumps(
            {
                "success": report.success,
                "avg_steps": report.avg_steps,
                "env_errors": report.env_errors,
                "failure_modes": report.failure_modes,
                "episodes": report.episodes,
                "step": policy.step,
            }
        )
    )
    return 0


def _cmd_rollout(args) -> int:
    import jax

    from jaxagent.agents.evaluate import evaluate

    if args.n < 1:
        raise InputError(f"--n {args.n} must be >= 1 (the number of episodes to print)")
    config, _, run = _run_for(args)
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
    ev.add_argument("config")
    ev.add_argument("overrides", nargs="*", help="key=value overrides")
    ev.add_argument("--checkpoint", required=True, help="a run directory written by train")
    ro = sub.add_parser("rollout", help="print episodes readably")
    ro.add_argument("config")
    ro.add_argument("overrides", nargs="*", help="key=value overrides")
    ro.add_argument("--checkpoint", default=None, help="a run directory (default: untrained)")
    ro.add_argument("--n", type=int, default=3, help="number of episodes")
    ro.add_argument("--split", default="test", help="task split")
    ro.add_argument("--temperature", type=float, default=None)
    ex = sub.add_parser("export", help="write a Hugging Face model directory")
    ex.add_argument("--checkpoint", required=True, help="a run directory written by train")
    ex.add_argument("--out", required=True, help="output directory")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        args = build_parser().parse_args(argv)
    except InputError as err:
        print(f"jaxagent {command}: {err}".replace("  ", " "), file=sys.stderr)
        return 2
    from jaxagent.train.config import ConfigError
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
        print(f"jaxagent {args.command}: config error: {err}", file=sys.stderr)
        return 2
    except (CheckpointError, InputError) as err:
        print(f"jaxagent {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
