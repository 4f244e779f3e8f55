#!/usr/bin/env bash
# The slow tests (marked `slow`, kept out of scripts/test.sh's default run): the larger mesh
# layouts, whole-split BFCL and HumanEval checks. Same install as the default run.
#   bash scripts/nightly.sh            # slow tests only
#   bash scripts/nightly.sh --all      # slow and default tests together
set -euo pipefail
cd "$(dirname "$0")/.."
marker="slow"
if [ "${1:-}" = "--all" ]; then
  marker="slow or not slow"
  shift
fi
# One process (-n 0): the slow tests (multi-process runs, memory bounds, learning curves)
# have only been run one at a time; `-n 2` after the script's name spreads them anyway.
exec bash scripts/test.sh -m "$marker" -n 0 "$@"
