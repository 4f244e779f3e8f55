"""``jaxagent check SUITE``: the one environment check, run before training on a suite.

  jaxagent check SUITE [--tasks N] [--seeds N] [--workers N] [--backend B]
                       [--faults] [--timeout S] [key=value env options]

Runs the suite's scripted expert (``EnvSpec.make_expert`` at error rate 0) and its baseline
policy (``EnvSpec.make_random``, or an empty action) on held-out tasks through the host pool
(``jaxagent.pool.episodes.run_episodes``), ``--seeds`` times each with different policy
seeds. With ``--faults`` it runs the expert once more through a pool whose envs hang, crash
and return corrupt data (``jaxagent.envs.faults``) and checks that every episode came back
exactly once, that every failed one is labelled ``env_error``, and that the pool's timeout /
crash / corrupt counters equal the injected faults: the pool's timeouts, retries and restarts
contain the failures an env will have.

The last line on stdout is one JSON object: ``suite``, ``tasks``, ``expert_success`` (null
when the suite has no expert), ``random_success``, ``env_errors`` (episodes the env failed in
the clean runs), throughput, ``faults`` when asked, the suite's own figures
(``EnvSpec.check_extras``) and ``ok``. Exit status 0 when the check held (every episode out,
no env error, the expert above the baseline, with ``--faults`` the counters matching, and no
``failed_checks`` among the suite's figures), 1 when it did not, 2 on bad input.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Any, Sequence

import numpy as np

from jaxagent.errors import ConfigError, InputError

FAULT_RATES = dict(hang=0.05, crash=0.05, corrupt=0.05)


def add_parser(sub) -> None:
    """The ``check`` subcommand of ``jaxagent`` (``jaxagent.cli.main``)."""
    ch = sub.add_parser("check", help="check a suite: expert, baseline and faults through the pool")
    ch.add_argument("suite", help="a registered env suite (quickstart, bfcl, shop, ...)")
    ch.add_argument("overrides", nargs="*", help="key=value env options (env.options keys)")
    ch.add_argument("--tasks", type=int, default=None, help="held-out tasks (default: all)")
    ch.add_argument("--seeds", type=int, default=1, help="policy seeds, each over every task")
    ch.add_argument("--workers", type=int, default=4, help="envs in the pool")
    ch.add_argument("--backend", default="process", help="a pool backend (thread, process)")
    ch.add_argument("--faults", action="store_true", help="also inject hangs/crashes/corrupt")
    ch.add_argument(
        "--timeout",
        type=float,
        default=2.0,
        help="step/reset timeout (s) of the fault run: a hang lasts twice this",
    )


@dataclasses.dataclass
class FaultReport:
    """The fault run: episodes in and out, and the pool's counters against the injected."""

    episodes_in: int
    episodes_out: int
    duplicates: int  # episodes answered more than once (must be 0)
    unlabelled_failures: int  # env failures without the env_error failure mode (must be 0)
    env_error_episodes: int
    injected: dict[str, int]
    health: dict[str, Any]

    @property
    def counters_match(self) -> bool:
        h, inj = self.health, self.injected
        return (h["timeouts"], h["crashes"], h["corrupt"]) == (
            inj["hang"],
            inj["crash"],
            inj["corrupt"],
        )

    @property
    def ok(self) -> bool:
        complete = self.episodes_out == self.episodes_in and self.duplicates == 0
        return complete and self.unlabelled_failures == 0 and self.counters_match

    def figures(self) -> dict[str, Any]:
        h = self.health
        return {
            "episodes_in": self.episodes_in,
            "episodes_out": self.episodes_out,
            "duplicates": self.duplicates,
            "unlabelled_failures": self.unlabelled_failures,
            "env_error_episodes": self.env_error_episodes,
            "injected": self.injected,
            "pool": {k: h[k] for k in ("timeouts", "crashes", "corrupt", "restarts", "retries")},
            "counters_match": self.counters_match,
            "ok": self.ok,
        }


def fault_check(env_fn, tasks, make_policy, pool_config, faults) -> FaultReport:
    """Run every task once through a pool of ``env_fn`` envs wrapped in ``FaultyEnv``."""
    from jaxagent.envs.faults import FaultLog, FaultyEnvFactory
    from jaxagent.pool import EnvPool
    from jaxagent.pool.episodes import run_episodes

    if pool_config.backend == "ray":  # actors share no memory with this process
        from jaxagent.pool.ray_backend import RayFaultLog

        log = RayFaultLog(pool_config.ray_address)
    else:
        log = FaultLog.create(pool_config.start_method)
    with EnvPool(FaultyEnvFactory(env_fn, faults, log), pool_config) as pool:
        run = run_episodes(pool, tasks, make_policy)
    ids = [e.final.episode_id for e in run.episodes]
    unlabelled = sum(
        1
        for e in run.episodes
        if e.final.info.get("env_error") and e.final.info.get("failure_mode") != "env_error"
    )
    return FaultReport(
        episodes_in=len(tasks),
        episodes_out=len(set(ids)),
        duplicates=len(ids) - len(set(ids)),
        unlabelled_failures=unlabelled,
        env_error_episodes=sum(e.final.env_error for e in run.episodes),
        injected=log.counts(),
        health=run.health,
    )


def _env_options(overrides: Sequence[str]) -> dict[str, Any]:
    import yaml

    options = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"{item!r} is not a key=value env option (e.g. viewport=6)")
        options[key] = yaml.safe_load(value)
    return options


def _pick(tasks: Sequence, n: int | None) -> list:
    """``n`` tasks drawn without replacement by a fixed seed, in split order: a split is
    often ordered by kind or level, and its first ``n`` would check one kind only."""
    tasks = list(tasks)
    if n is None or n >= len(tasks):
        return tasks
    return [tasks[i] for i in sorted(np.random.default_rng(0).permutation(len(tasks))[:n])]


def _rng(seed: int, task) -> np.random.Generator:
    # One generator per (seed, task): the policies draw the same whichever env runs the task
    # and in whatever order episodes finish, so a check repeats.
    return np.random.default_rng([seed, zlib.crc32(task.id.encode())])


class _Empty:
    def act(self, observation: str) -> str:
        del observation
        return ""


def run_check(args) -> dict[str, Any]:
    """The check's JSON record (see the module docstring); raises InputError/ConfigError."""
    from jaxagent.envs.registry import EnvFactory, EnvOptionsError, get_env_spec
    from jaxagent.pool import EnvPool, PoolConfig
    from jaxagent.pool.episodes import run_episodes

    for name in ("tasks", "seeds", "workers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name}={value} must be >= 1")
    if args.timeout <= 0:
        raise InputError(f"--timeout={args.timeout} must be > 0 seconds")
    options = _env_options(args.overrides)
    try:
        spec = get_env_spec(args.suite, options)
    except KeyError as err:
        raise InputError(str(err.args[0] if err.args else err)) from None
    except ImportError as err:  # a suite's optional package (bfcl-eval): the message says how
        raise InputError(str(err)) from None
    except (EnvOptionsError, ValueError) as err:
        raise ConfigError(str(err)) from None
    try:
        pool_config = PoolConfig(num_envs=args.workers, backend=args.backend)
    except ValueError as err:
        raise InputError(f"--backend/--workers: {err}") from None
    source = spec.make_source()
    split = "test" if "test" in source.splits() else source.splits()[-1]
    tasks = _pick(source.tasks(split), args.tasks)
    if not tasks:
        raise ConfigError(f"env {args.suite!r} has no {split!r} tasks with options {options}")
    env_fn = EnvFactory(args.suite, options)

    policies = {
        "random": lambda task, rng: (spec.make_random or (lambda t, r: _Empty()))(task, rng)
    }
    if spec.make_expert is not None:
        policies = {"expert": lambda task, rng: spec.make_expert(task, 0.0, rng), **policies}
    runs, success, env_errors, errors, groups = {}, {}, 0, [], {}
    episodes = env_steps = 0
    wall = 0.0
    with EnvPool(env_fn, pool_config) as pool:
        for name, make in policies.items():
            wins = []
            for seed in range(args.seeds):
                run = run_episodes(pool, tasks, lambda task: make(task, _rng(seed, task)).act)
                runs.setdefault(name, run)
                for e in run.episodes:
                    if e.final.env_error:
                        env_errors += 1
                        errors.append(
                            f"{name} {e.task.id}: {e.final.info.get('env_error')}: "
                            f"{e.final.info.get('env_error_detail')}"
                        )
                    wins.append(e.success)
                    if spec.task_group is not None:
                        key = str(spec.task_group(e.task))
                        groups.setdefault(name, {}).setdefault(key, []).append(e.success)
                episodes += len(run.episodes)
                env_steps += run.env_steps
                wall += run.wall_s
            success[name] = float(np.mean(wins))
        health = pool.health.snapshot()
    expert = success.get("expert")
    record: dict[str, Any] = {
        "suite": args.suite,
        "split": split,
        "tasks": len(tasks),
        "seeds": args.seeds,
        "expert_success": expert,
        "random_success": success["random"],
        "env_errors": env_errors,
        "errors": errors[:10],
        "backend": args.backend,
        "workers": args.workers,
        "episodes": episodes,
        "episodes_per_s": round(episodes / max(wall, 1e-9), 2),
        "env_steps_per_s": round(env_steps / max(wall, 1e-9), 2),
        "wall_s": round(wall, 2),
        "pool_restarts": health["restarts"],
    }
    if groups:
        record["per_group"] = {
            name: {k: round(float(np.mean(v)), 4) for k, v in sorted(g.items())}
            for name, g in groups.items()
        }
    complete = episodes == len(tasks) * args.seeds * len(policies)
    ok = complete and env_errors == 0 and (expert is None or expert > success["random"])
    if args.faults:
        make = policies["expert" if "expert" in policies else "random"]
        faults = _fault_config(args.timeout)
        fault_pool = dataclasses.replace(
            pool_config, step_timeout_s=args.timeout, reset_timeout_s=args.timeout, backoff_s=0.0
        )
        report = fault_check(env_fn, tasks, lambda t: make(t, _rng(0, t)).act, fault_pool, faults)
        record["faults"] = report.figures()
        ok = ok and report.ok
    if spec.check_extras is not None:
        record.update(spec.check_extras(tasks, runs))
        # A suite's own condition (bfcl: every entry fails without its state-changing call).
        ok = ok and not record.get("failed_checks")
    record["ok"] = bool(ok)
    return record


def _fault_config(timeout_s: float):
    from jaxagent.envs.faults import FaultConfig

    # A hang must outlive the pool's timeout (or it is no hang) but end: a thread worker's
    # hung call cannot be killed, only abandoned until it returns.
    return FaultConfig(**FAULT_RATES, hang_s=2 * timeout_s, seed=0)


def cmd_check(args) -> int:
    record = run_check(args)
    print(json.dumps(record), flush=True)
    return 0 if record["ok"] else 1
