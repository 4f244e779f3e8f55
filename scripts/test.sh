#!/usr/bin/env bash
# Install jaxagent with its test extra and run the test suite.
# torch==2.13.0 first: on the project's machines that is a CPU build on local disk, and it
# satisfies the test extra's torch>=2.4 without downloading a CUDA build.
# bfcl-eval is installed with --no-deps: its declared dependency list is huge and conflicts,
# while its app backends need only the standard library and mpmath.
set -euo pipefail
cd "$(dirname "$0")/.."
# System packages the tests need: a headless browser and its driver (MiniWoB++ through
# selenium) and Mesa's software OpenGL (MuJoCo's off-screen renderer, MUJOCO_GL=osmesa/egl).
# Installed only when missing; as root on a Debian-based machine (CI), else say what to run.
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ -e /usr/lib/x86_64-linux-gnu/libOSMesa.so.8 ] || ldconfig -p 2>/dev/null | grep -q libOSMesa || need+=(libosmesa6)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing system packages: ${need[*]}; install them with: sudo apt-get install ${need[*]}" >&2
    exit 1
  fi
fi
python -m pip install -q torch==2.13.0
python -m pip install -q --no-deps bfcl-eval
python -m pip install -q -e '.[test]'
# The code is kept in ruff's format (pinned in the test extra) and free of pyflakes errors.
python -m ruff format --check --quiet jaxagent tests benchmarks experiments \
  || { echo "ruff format: files above are not formatted; run: ruff format jaxagent tests benchmarks experiments" >&2; exit 1; }
python -m ruff check --quiet --select F,E9 jaxagent tests benchmarks experiments
# One pytest-xdist worker a core, at most 4 (each holds its own compiled programs and
# module fixtures); a test file stays in one worker, so its module fixtures (a trained run
# several tests read) are built once. `-n 0` after the script's name runs in one process.
set +e
python -m pytest -q -n auto --maxprocesses 4 --dist loadfile "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
