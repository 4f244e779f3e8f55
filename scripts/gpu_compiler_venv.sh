#!/usr/bin/env bash
# XLA's GPU compiler on a machine without a GPU, in its own virtualenv (the project's own
# environment is left as it is: plain `pip install -e .` never pulls CUDA):
#
#   bash scripts/gpu_compiler_venv.sh [VENV]        # default VENV: /work/gpuvenv
#   VENV/bin/python benchmarks/pod_plan.py --model qwen2.5-7b --topology h100:8 --phase all
#   VENV/bin/python -m pytest tests/test_pod_plan.py -q   # the deviceless GPU compiles run
#
# It installs jax[cuda12] at the project's jax version (the CUDA PJRT plugin, cuDNN and the
# CUDA libraries from PyPI: a few GB) and the project in editable mode. Nothing here needs a
# GPU: with JAX_PLATFORMS=cpu, jax.experimental.topologies.get_topology_desc(platform="cuda",
# target_config=<GpuTargetConfig text proto>) gives deviceless GPUs to compile for.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/work/gpuvenv}
JAX_VERSION=$(python -c "import jax; print(jax.__version__)")
[[ -x $VENV/bin/python ]] || python -m venv "$VENV"
"$VENV/bin/pip" install -q "jax[cuda12]==$JAX_VERSION"
"$VENV/bin/pip" install -q -e . "jax==$JAX_VERSION" pytest pytest-timeout
JAX_PLATFORMS=cpu "$VENV/bin/python" -c "import jax_plugins.xla_cuda12, jax; print('XLA:GPU compiler ready: jax', jax.__version__)"
