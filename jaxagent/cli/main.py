"""The ``jaxagent`` command.

  jaxagent train CONFIG [key=value ...]                     train (resumes an existing run dir)
  jaxagent eval CONFIG --checkpoint RUN_DIR [key=value ...] held-out evaluation of a checkpoint
      [--out DIR] [--seeds N] [--val] [--price-input-per-mtok P] [--price-output-per-mtok P]
      (--checkpoint repeated: several training seeds; --policy expert: the scripted expert)
  jaxagent eval --compare A.json B.json                     B - A and P(B > A) of two records
  jaxagent rollout CONFIG [--checkpoint RUN_DIR] --n N      print N episodes readably
      [--render DIR]                                        (and save their frames as PNG/GIF)
  jaxagent export --checkpoint RUN_DIR --out HF_DIR         write a Hugging Face directory
  jaxagent check SUITE [--faults] [--tasks N] [--seeds N]   check a suite through the pool
  jaxagent serve CONFIG [--checkpoint RUN_DIR] [--host H] [--port P]
      [--slots S] [--decode-steps D]                        an OpenAI-compatible endpoint
      [--episodes FILE] [--keep-episodes N]                 (ended sessions' episodes out)

Configs are YAML overlays on ``jaxagent.train.config.Config``; ``key=value`` overrides use
dotted keys (``rl.optim.learning_rate=3e-4``, ``train.seed=1``). Every input error (a
missing config file, a bad key or value, a missing or partial checkpoint, a bad ``--n``, an
unknown split) exits with status 2 and one line on stderr naming the input, the value and the
fix.
"""

from __future__ import annotations

import _thread
import argparse
import json
import os
import signal
import sys
import threading

from jaxagent.errors import ConfigError, InputError


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), raised for ``main`` to report."""

    def error(self, message: str):
        raise InputError(f"{message} (see `{self.prog} --help`)")


class Interrupted(Exception):
    """Ctrl-C: the command stopped; the message says what was kept."""


def _cmd_train(args) -> int:
    from jaxagent.learners.registry import learner_of, run_learner
    from jaxagent.train.config import load_config
    from jaxagent.train.trainer import Trainer

    learner = learner_of(args.config)
    if learner is not None:  # a non-LLM learner (jaxagent/learners): its own config and summary
        summary = run_learner(learner, args.config, args.overrides)
        print(json.dumps(summary), flush=True)
        return 0
    config = load_config(args.config, args.overrides)
    if config.sft.to_hf:  # SFT writes an HF directory, RL loads it (train/staged.py)
        from jaxagent.train.staged import run_sft_then_rl

        run_sft_then_rl(config)
        return 0
    trainer = Trainer(config)
    try:
        trainer.run()
    except KeyboardInterrupt:
        _CTRL_C.caught()
        trainer.close()  # a save in flight completes: the run resumes from it
        from jaxagent.train.checkpoint import complete_steps

        steps = complete_steps(config.checkpoint_dir())
        kept = (
            f"{config.run_dir} resumes from checkpoint {steps[-1]}"
            if steps
            else f"{config.run_dir} has no checkpoint yet and starts over"
        )
        raise Interrupted(f"interrupted; {kept} when you run the same command again") from None
    finally:
        trainer.close()
    return 0


def _run_for(args, render_dir=None):
    """(config, run) for ``eval`` / ``rollout``: the config's tasks and settings, with the
    checkpoint's policy when one is given (else the config's untrained model)."""
    from jaxagent.train.config import load_config
    from jaxagent.train.run import build_run
    from jaxagent.train.session import load_policy, parse_step

    config = load_config(args.config, args.overrides)
    policy = None
    if args.checkpoint:
        policy = load_policy(args.checkpoint, parse_step(args.step))
        note_checkpoint_mismatch(args, config, policy)
    return config, policy, build_run(config, policy=policy, render_dir=render_dir)


def note_checkpoint_mismatch(args, config, policy) -> None:
    """Print (stderr) what ``checkpoint_notes`` finds: overrides the checkpoint ignores, and
    an environment other than the one it was trained on."""
    from jaxagent.train.session import checkpoint_notes

    for note in checkpoint_notes(config, policy, args.overrides):
        print(f"jaxagent {args.command}: {note}", file=sys.stderr)


def _cmd_eval(args) -> int:
    from jaxagent.cli.eval import cmd_eval

    return cmd_eval(args)


def _cmd_rollout(args) -> int:
    import jax

    from jaxagent.agents.evaluate import evaluate

    if args.n < 1:
        raise InputError(f"--n {args.n} must be >= 1 (the number of episodes to print)")
    from jaxagent.learners.registry import learner_of, run_evaluator

    if (learner := learner_of(args.config)) is not None:  # e.g. PPO on a MuJoCo task
        if not args.checkpoint:
            raise InputError(
                f"a learner: {learner} config has no untrained policy to roll out; pass "
                "--checkpoint RUN_DIR (the train.out_dir of a finished run)"
            )
        extra = [f"train.eval_episodes={args.n}"]
        if args.render:
            extra.append(f"train.render_dir={args.render}")
        summary = run_evaluator(learner, args.config, args.checkpoint, [*args.overrides, *extra])
        if args.render:
            print(f"frames of episode 0 (PNG per 4th step and a GIF): {args.render}")
        print(json.dumps(summary))
        return 0
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
            from jaxagent.sections import build
            from jaxagent.train.config import sampling_fields
            from jaxagent.train.policy import make_turn_sampler

            sampling = build(  # the rollout section at --temperature, unfiltered
                config.rollout,
                SamplingConfig,
                **sampling_fields(args.temperature),
                top_k=0,
                top_p=1.0,
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
    from jaxagent.train.session import load_policy, parse_step

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InputError(
            f"--out {args.out!r} is an existing file; pass a directory (new or existing) "
            "for the Hugging Face files"
        )
    ckpts = _run_checkpoint_dirs(Path(args.checkpoint))
    target = out.resolve()
    for ckpt in ckpts:
        if target == ckpt or ckpt in target.parents:
            raise InputError(
                f"--out {args.out!r} is inside the run's checkpoint directory {str(ckpt)!r}, "
                "where the HF files would mix with (and overwrite) its checkpoints; pass "
                "another directory, e.g. --out RUN_DIR/hf"
            )
    policy = load_policy(args.checkpoint, parse_step(args.step))
    out.mkdir(parents=True, exist_ok=True)
    save_hf(str(out), policy.model_config, policy.graphdef, policy.params)
    policy.tokenizer.save_pretrained(str(out))
    print(
        f"exported checkpoint step {policy.step} to {out} (config.json, safetensors, "
        "tokenizer with chat template): load it with transformers.AutoModelForCausalLM"
    )
    return 0


def _run_checkpoint_dirs(run_dir) -> list:
    """The run's checkpoint directories, resolved: ``RUN_DIR/checkpoints`` and, when its
    ``config.yaml`` names another (``train.checkpoint_dir``), that one too."""
    out = [(run_dir / "checkpoints").resolve()]
    cfg = run_dir / "config.yaml"
    if cfg.is_file():
        from jaxagent.train.config import load_config

        try:
            own = load_config(cfg).checkpoint_dir(run_dir)
        except Exception:  # an unreadable config is load_policy's error to report
            own = ""
        if own and "://" not in own:
            out.append(type(run_dir)(own).resolve())
    return out


def _cmd_serve(args) -> int:
    try:
        from jaxagent.serve.server import serve, state_for_run
        from jaxagent.serve.sessions import EpisodeFile, SessionStore
    except ImportError as err:
        raise InputError(
            f"serve needs the serve extra ({err.name} is missing): pip install 'jaxagent[serve]'"
        ) from None
    if args.slots < 1 or args.decode_steps < 1:
        raise InputError(
            f"--slots {args.slots} and --decode-steps {args.decode_steps} must be >= 1"
        )
    if not 0 <= args.port < 65536:
        raise InputError(f"--port {args.port} must be in 0..65535")
    if args.keep_episodes < 1:
        raise InputError(f"--keep-episodes {args.keep_episodes} must be >= 1")
    config, policy, run = _run_for(args)
    run.close()  # the server needs no environments: the harness runs them
    name = args.model_name or config.name
    state = state_for_run(
        run,
        model_id=name,
        policy_version=policy.step if policy is not None else 0,
        slots=args.slots,
        decode_steps=args.decode_steps,
        seed=config.train.seed,
    )
    episodes = args.episodes if args.episodes is not None else config.harness.episodes_out
    state.store = SessionStore(
        reward_fn=config.harness.reward_fn(),  # POST .../end without a reward
        keep=args.keep_episodes,
        out=EpisodeFile(episodes) if episodes else None,
    )
    print(
        f"jaxagent serve: model {name!r} on http://{args.host}:{args.port}/v1 "
        f"({args.slots} KV slots of {state.backend.capacity} tokens)"
        + (f"; episodes to {episodes}" if episodes else ""),
        file=sys.stderr,
        flush=True,
    )
    try:
        serve(state, args.host, args.port)
    except KeyboardInterrupt:
        _CTRL_C.caught()
        raise Interrupted(_serve_kept(state.store, episodes)) from None
    finally:
        if state.store.out is not None:
            state.store.out.close()  # every line is flushed as written: nothing is lost
    return 0


def _serve_kept(store, episodes: str) -> str:
    """What an interrupted server kept: the ended sessions' episodes (in the file, when
    there is one) and the open sessions that were never ended (their turns are dropped)."""
    n, left = store.ended_total, len(store.sessions)
    if episodes:
        kept = f"the episodes of {_count(n, 'ended session')} are in {episodes}"
    else:
        kept = f"{_count(n, 'session')} ended; no episodes written (--episodes FILE keeps them)"
    if left:
        kept += f"; {_count(left, 'open session')} never ended (not kept)"
    return f"interrupted; {kept}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _cmd_check(args) -> int:
    from jaxagent.cli.check import cmd_check

    return cmd_check(args)


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
        "argname: imperfect quickstart policies (jaxagent/envs/tools/quickstart/scripted.py)",
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
    from jaxagent.cli.check import add_parser as add_check

    add_check(sub)
    sv = sub.add_parser("serve", help="serve the policy behind an OpenAI-compatible API")
    sv.add_argument("config")
    sv.add_argument("overrides", nargs="*", help="key=value overrides")
    sv.add_argument("--checkpoint", default=None, help="a run directory (default: untrained)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--slots", type=int, default=16, help="KV-cache rows (conversations kept)")
    sv.add_argument("--decode-steps", type=int, default=8, help="decode steps per device call")
    sv.add_argument(
        "--episodes",
        default=None,
        metavar="FILE",
        help="append every ended session's episode to FILE as a JSON line "
        "(default: harness.episodes_out)",
    )
    sv.add_argument(
        "--keep-episodes",
        type=int,
        default=1024,
        help="ended sessions kept for GET /v1/sessions/{id}/episode (the oldest evicted)",
    )
    sv.add_argument(
        "--model-name", default=None, help="the model id clients name (default: the config's name)"
    )
    for p in (ev, ro, ex, sv):
        p.add_argument(
            "--step",
            default="latest",
            help="which checkpoint of the run: latest (default), best (best validation "
            "success, the one the trainer keeps), or a step number",
        )
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, with ``key=value`` overrides accepted anywhere after the command
    (``jaxagent eval CONFIG --checkpoint RUN train.seed=1``, as the usage shows): argparse
    stops collecting a positional list at the first flag, so what it leaves over and looks
    like an override is one."""
    args, extra = build_parser().parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("-") or "=" not in a]
    if unknown:
        raise InputError(
            f"unrecognized arguments: {' '.join(unknown)} (see `jaxagent {args.command} --help`)"
        )
    if extra:
        if not hasattr(args, "overrides"):
            raise InputError(
                f"{args.command} takes no key=value overrides (got {' '.join(extra)}); it "
                "uses the checkpoint's own config"
            )
        args.overrides = [*args.overrides, *extra]
    return args


def _one_line(text: object) -> str:
    # Causes quoted from libraries (transformers, orbax) carry their own newlines; a script
    # reading stderr expects exactly one line.
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        args = parse_args(argv)
    except InputError as err:
        print(_one_line(f"jaxagent {command}: {err}"), file=sys.stderr)
        return 2
    from jaxagent.train.checkpoint import CheckpointError
    from jaxagent.train.guards import TrainingStopped

    handlers = {
        "train": _cmd_train,
        "eval": _cmd_eval,
        "rollout": _cmd_rollout,
        "export": _cmd_export,
        "check": _cmd_check,
        "serve": _cmd_serve,
    }
    try:
        with _CTRL_C:
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
    except (KeyboardInterrupt, Interrupted) as err:
        _CTRL_C.caught()
        _quiet_shutdown()
        _stop_ray()
        what = str(err) if isinstance(err, Interrupted) else "interrupted"
        print(_one_line(f"jaxagent {args.command}: {what}"), file=sys.stderr)
        _exit_now(130)
        return 130


class _CtrlCDelivery:
    """SIGINT raises ``KeyboardInterrupt`` on the main thread, as Python's own handler does,
    and raises it again every second until a handler has caught it: Python drops an exception
    raised inside a garbage-collection callback or a ``__del__`` ("Exception ignored in ..."),
    and JAX runs one on every collection (``_xla_gc_callback``), so a Ctrl-C that lands there
    would otherwise be lost and the run go on to its end."""

    def __init__(self):
        self._caught = threading.Event()
        self._retrying = False
        self._previous = None
        self._hook = sys.unraisablehook

    def __enter__(self):
        self._caught.clear()
        self._retrying = False
        if threading.current_thread() is threading.main_thread():
            try:
                self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            except (ValueError, OSError):  # an embedding that owns its signals
                self._previous = None
        # The dropped interrupt is raised again (below): Python's report of it, a traceback
        # above the command's one line, says nothing the user needs.
        self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def _unraisable(self, unraisable):
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            return
        self._hook(unraisable)

    def __exit__(self, *exc):
        sys.unraisablehook = self._hook
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        self._caught.set()  # no re-delivery after the command returned
        return False

    def caught(self) -> None:
        self._caught.set()

    def _on_sigint(self, signum, frame):
        if self._previous is signal.SIG_IGN:  # started with Ctrl-C ignored (nohup, `&`)
            return
        if not self._retrying:
            self._retrying = True
            threading.Thread(target=self._redeliver, name="ctrl-c", daemon=True).start()
        raise KeyboardInterrupt

    def _redeliver(self):
        while not self._caught.wait(1.0):
            _thread.interrupt_main()


_CTRL_C = _CtrlCDelivery()


def _quiet_shutdown() -> None:
    """After an interrupt, library threads (orbax's savers, the pool's) may still be
    unwinding; their tracebacks would bury the one line that says what happened."""
    import logging

    threading.excepthook = lambda *_: None
    logging.getLogger("absl").setLevel(logging.CRITICAL)


def _stop_ray() -> None:
    """A run whose pool started its own Ray instance stops it: the ``os._exit`` below skips
    Ray's exit hook, and the instance's agents would outlive the command."""
    from jaxagent.pool.ray_backend import shutdown

    try:
        shutdown()
    except Exception:  # noqa: BLE001 -- already half torn down by the signal: exit anyway
        pass


def _exit_now(status: int) -> None:
    """End the process with ``status`` without the interpreter's teardown. After an
    interrupt, threads are still inside native calls: an overlapped rollout's producer or a
    harness's server in an XLA computation, which CPython ends at exit with
    ``pthread_exit`` when it next takes the GIL, and a forced unwind through C++ that meets
    a ``catch (...)`` aborts the process ("FATAL: exception not rethrown", status 134); and
    with none of those, tearing down the runtime under a computation still running has
    segfaulted (status 139). Everything worth keeping is written by now (the trainer closed
    its checkpointer and its logs), so the streams are flushed and the process leaves."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
