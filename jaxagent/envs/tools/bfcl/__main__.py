"""Environment health check: run before any training launch on BFCL worlds.

  python -m jaxagent.envs.tools.bfcl --list
  python -m jaxagent.envs.tools.bfcl --check multi_turn_base [--limit N] [--drop-check]

``--check`` replays every task's ground truth through the adapter and ends with one JSON line
``{"category": ..., "tasks": N, "ground_truth_success": fraction, "errors": [...]}``.
Exit status: 0 when every replay succeeds, 1 otherwise, 2 when bfcl-eval is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxagent.envs.tools.bfcl", description=__doc__.split("\n\n")[0]
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--list", action="store_true", help="categories and task counts")
    group.add_argument("--check", metavar="CATEGORY", help="replay every ground truth")
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    parser.add_argument(
        "--drop-check",
        action="store_true",
        help="also replay each task without its last state-changing call (must fail)",
    )
    args = parser.parse_args(argv)
    from jaxagent.envs.tools.bfcl import data as D

    try:
        D.require_bfcl()
    except D.BFCLMissingError as err:
        print(str(err), file=sys.stderr)
        return 2
    if args.list:
        import bfcl_eval

        categories = D.list_categories()
        print(f"bfcl-eval data at {bfcl_eval.__path__[0]}")
        print(f"{'category':32s} {'tasks':>6s}  adapter")
        for name, row in categories.items():
            mark = (
                "yes (multi-turn, stateful)" if row["multi_turn"] else "no (not a multi-turn world)"
            )
            print(f"{name:32s} {row['tasks']:6d}  {mark}")
        return 0
    from jaxagent.envs.tools.bfcl.replay import check_category

    start = time.perf_counter()
    try:
        report = check_category(args.check, limit=args.limit, drop_check=args.drop_check)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(
        f"replayed {report['tasks']} tasks of {args.check} in {time.perf_counter() - start:.1f}s",
        file=sys.stderr,
    )
    print(json.dumps(report))
    return 0 if report["ground_truth_success"] == 1.0 and not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
