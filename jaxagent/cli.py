"""The ``jaxagent`` command.

  jaxagent train CONFIG [key=value ...]                     train (resumes an existing run dir)
  jaxagent eval CONFIG --checkpoint RUN_DIR [key=value ...] held-out evaluation of a checkpoint
  jaxagent rollout CONFIG [--checkpoint RUN_DIR] --n N      print N episodes readably
  jaxagent export --checkpoint RUN_DIR --out HF_DIR         write a Hugging Face directory

Configs are YAML overlays on ``jaxagent.train.config.Config``; ``key=value`` overrides use
dotted keys (``rl.overrides.learning_rate=3e-4``, ``train.seed=1``). A bad key or value exits
with status 2 and a message naming the key and what is allowed.
"""

from __future__ import annotations

import argparse
import json
import sys


def _cmd_train(args) -> int:
    from jaxagent.train.config import load_config
    from jaxagent.train.trainer import Trainer

    config = load_config(args.config, args.overrides)
    Trainer(config).run()
    return 0


def _policy_for(args, overrides):
    """(config for env/eval settings, loaded policy or None)."""
    from jaxagent.train.config import load_config
    from jaxagent.train.session import load_policy

    config = load_config(args.config, overrides)
    policy = load_policy(args.checkpoint) if getattr(args, "checkpoint", None) else None
    return config, policy


def _episodes(config, policy, tasks, samples, temperature, seed, key=None):
    import jax

    from jaxagent.agents.rollout import Budget, collect_episodes
    from jaxagent.agents.sampling import SamplingParams
    from jaxagent.train.envs import get_env_spec
    from jaxagent.train.policy import make_turn_sampler
    from jaxagent.train.tokenizer import ChatFormat
    from jaxagent.train.trainer import make_runner

    spec = get_env_spec(config.env.name, config.env.options)
    if policy is None:  # an untrained policy: the run's model built from scratch
        from jaxagent.train.policy import build_model
        from jaxagent.train.tokenizer import build_word_tokenizer

        tok = build_word_tokenizer(spec.vocabulary()) if spec.vocabulary else None
        if tok is None:
            raise SystemExit("rollout without --checkpoint needs an env with a vocabulary")
        graphdef, params, mcfg = build_model(config.model, tok, jax.random.key(seed))
    else:
        tok, graphdef, params, mcfg = (policy.tokenizer, policy.graphdef, policy.params,
                                       policy.model_config)
    chat = ChatFormat(tok)
    max_len = min(config.max_total_tokens, mcfg.max_seq_len - config.rollout.max_new_tokens)
    sampling = SamplingParams(max_new_tokens=config.rollout.max_new_tokens,
                              temperature=temperature, stop_ids=chat.stop_ids,
                              pad_id=chat.pad_id)
    sampler = make_turn_sampler(graphdef, sampling, max_len, model_config=mcfg)
    runner = make_runner(config)
    try:
        eps, _ = collect_episodes(
            sampler, params, tasks, samples_per_task=samples, runner=runner, chat=chat,
            system_prompt=spec.system_prompt,
            budget=Budget(config.rollout.max_turns, config.rollout.max_new_tokens, max_len,
                          config.rollout.max_observation_chars),
            key=jax.random.key(seed) if key is None else key)
    finally:
        runner.close()
    return eps


def _split_tasks(config, split):
    from jaxagent.train.envs import get_env_spec

    spec = get_env_spec(config.env.name, config.env.options)
    return list(spec.make_source().tasks(split))


def _cmd_eval(args) -> int:
    from jaxagent.eval.report import summarize

    config, policy = _policy_for(args, args.overrides)
    tasks = _split_tasks(config, config.env.eval_split)[: config.eval.num_tasks]
    from jaxagent.train.trainer import eval_key

    # The trainer's evaluation key for this checkpoint: same tasks, same samples.
    eps = _episodes(config, policy, tasks, config.eval.samples_per_task,
                    config.eval.temperature, config.train.seed,
                    key=eval_key(config.train.seed, int(policy.meta.get("iteration", 0))))
    report = summarize(eps)
    print(f"checkpoint {args.checkpoint} (step {policy.step}): {report.episodes} episodes on "
          f"{config.env.name}/{config.env.eval_split}")
    print(f"  success {report.success:.3f}  avg steps {report.avg_steps:.2f}  env errors "
          f"{report.env_errors}  failure modes {report.failure_modes}")
    print(json.dumps({"success": report.success, "avg_steps": report.avg_steps,
                      "env_errors": report.env_errors, "failure_modes": report.failure_modes,
                      "episodes": report.episodes, "step": policy.step}))
    return 0


def _cmd_rollout(args) -> int:
    config, policy = _policy_for(args, args.overrides)
    tasks = _split_tasks(config, args.split)[: args.n]
    eps = _episodes(config, policy, tasks, 1, config.rollout.temperature
                    if args.temperature is None else args.temperature, config.train.seed)
    for ep in eps:
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
    print(f"exported checkpoint step {policy.step} to {out} (config.json, safetensors, "
          "tokenizer with chat template): load it with transformers.AutoModelForCausalLM")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxagent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
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
    args = build_parser().parse_args(argv)
    from jaxagent.train.config import ConfigError

    handlers = {"train": _cmd_train, "eval": _cmd_eval, "rollout": _cmd_rollout,
                "export": _cmd_export}
    try:
        return handlers[args.command](args)
    except ConfigError as err:
        print(f"jaxagent {args.command}: config error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
