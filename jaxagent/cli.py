"""The ``jaxagent`` command. Sub-commands are filled in by the trainer (see DESIGN.md)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxagent", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a YAML config")
    train.add_argument("config")
    train.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)
    print(f"jaxagent {args.command}: not yet available (the trainer issue adds it)")
    return 2


if __name__ == "__main__":
    sys.exit(main())
