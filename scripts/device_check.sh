#!/usr/bin/env bash
# One-GPU device check (< 8 minutes on one H100/H200-class GPU), every result a JSON line.
#
#   bash scripts/device_check.sh            # from the repository root, on the GPU machine
#
# 1. CUDA JAX is installed (the README's install line) and sees a GPU;
# 2. the `gpu`-marked tests run, then the 8-simulated-device mesh tests stay CPU-only;
# 3. benchmarks/generate.py (jaxagent's KV-cache sampler vs transformers.generate: tok/s and
#    the ratio) and benchmarks/rl_step.py (one GRPO step vs TRL's GRPOTrainer when trl is
#    installed), each ending with one JSON line. Caveat: both benchmarks build their torch
#    models on the default torch device (CPU) as they stand; for a same-GPU comparison their
#    torch side needs a .to("cuda") (benchmarks/ owners), so the ratios printed here are
#    jaxagent-on-GPU vs torch-on-CPU until then (say so when reporting them);
# 4. the roofline: MFU of a bf16 matmul against the chip's peak from
#    jaxagent.train.roofline.CHIP_PEAKS, and compile times of the 24-layer 0.5B-shaped model.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
left() { echo $(( 470 - ($(date +%s) - START) )); }   # seconds left of the 8-minute budget
json() { python - "$@" <<'PY'
import json, sys
print(json.dumps(dict(a.split("=", 1) for a in sys.argv[1:])))
PY
}

python -c "import jax; assert jax.default_backend() == 'gpu'" 2>/dev/null || {
  python -m pip install -q -U "jax[cuda12]" || true
}
python - <<'PY'
import json, jax
d = jax.devices()[0]
print(json.dumps({"check": "backend", "backend": jax.default_backend(), "device": d.device_kind,
                  "count": jax.device_count(), "jax": jax.__version__}))
PY
python -m pip install -q -e '.[test]' >/dev/null 2>&1 || true

# gpu-marked tests (JAX_PLATFORMS unset so the GPU is used)
timeout "$(left)" env -u JAX_PLATFORMS python -m pytest -q -m gpu -p no:cacheprovider tests \
  >/tmp/device_check_gpu_tests.log 2>&1
rc=$?
json check=gpu_tests rc="$rc" tail="$(tail -1 /tmp/device_check_gpu_tests.log | tr -d '"')"

# roofline: a bf16 matmul's MFU against the table peak; compile times of the 0.5B shape
timeout "$(left)" python - <<'PY'
import json, time
import jax, jax.numpy as jnp
from jaxagent.perf.roofline import device_peaks
peak, bw, src = device_peaks(jax.devices()[:1])
n = 8192
a = jnp.ones((n, n), jnp.bfloat16)
f = jax.jit(lambda x: x @ x)
f(a).block_until_ready()
t0 = time.perf_counter()
for _ in range(10):
    out = f(a)
out.block_until_ready()
s = (time.perf_counter() - t0) / 10
print(json.dumps({"check": "matmul_mfu", "tflop_s": round(2 * n**3 / s / 1e12, 1),
                  "mfu": round(2 * n**3 / s / peak, 3), "peak_source": src}))
PY
timeout "$(left)" python benchmarks/compile_times.py 2>&1 | tail -1

# sampler vs transformers.generate on the same GPU
timeout "$(left)" env -u JAX_PLATFORMS python benchmarks/generate.py --quick 2>&1 | tail -1
# one GRPO step vs TRL (measured when trl imports; else the anchor figure, flagged)
TRL=""
python -c "import trl" 2>/dev/null && TRL="--trl-python $(command -v python)"
timeout "$(left)" env -u JAX_PLATFORMS python benchmarks/rl_step.py --steps 3 $TRL 2>&1 | tail -1
json check=done wall_s="$(( $(date +%s) - START ))"
