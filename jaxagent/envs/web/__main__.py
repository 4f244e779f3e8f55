"""Web suites health check: replay the scripted expert (embedded sites) or solvers (MiniWoB++).

  python -m jaxagent.envs.web --check shop|booking|miniwob [--seeds N] [--workers 4]

Prints a short table and ends with one JSON line ``{"suite", "episodes", "expert_success",
"per_task", "errors", ...}``. Embedded sites: N held-out tasks (test layouts) with the expert,
plus the random and no-scroll policies and the off-viewport fraction. MiniWoB++: N seeds per
solved task through the pool with ``--workers`` browsers, with throughput and step latency.
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxagent.envs.web.check import check_embedded

SUITES = ("shop", "booking", "miniwob")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxagent.envs.web")
    parser.add_argument("--check", required=True, choices=SUITES, help="the suite to check")
    parser.add_argument("--seeds", type=int, default=None, help="tasks (embedded) or seeds a task")
    parser.add_argument("--workers", type=int, default=4, help="miniwob: browsers in the pool")
    parser.add_argument("--tasks", nargs="*", default=None, help="miniwob: task names")
    args = parser.parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        print(f"error: --seeds={args.seeds} must be >= 1", file=sys.stderr)
        return 2
    if args.check == "miniwob":
        from jaxagent.envs.web.miniwob_check import check_miniwob

        summary = check_miniwob(args.seeds or 50, workers=args.workers, tasks=args.tasks)
    else:
        summary = check_embedded(args.check, args.seeds or 200)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
