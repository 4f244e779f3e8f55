#!/usr/bin/env bash
# One-GPU device check: under 8 minutes on one H100/H200-class GPU, one command, every result
# ONE JSON line on stdout (also appended to $OUT/device_check.jsonl when $OUT is set).
#
#   bash scripts/device_check.sh             # from anywhere; runs from the repository root
#   bash scripts/device_check.sh --dry-run   # the plan (step, time cap, command); runs nothing
#
# Steps, most informative first, so that a short budget loses the least:
#   backend      which JAX backend and device this Python sees (installs jax[cuda12] only when
#                nvidia-smi finds a GPU that JAX does not see; the install's output is kept in
#                the step's log, its tail shown on failure)
#   deps         the test / benchmark imports (pip install -e '.[test]' only when one fails)
#   cudnn        pytest -m gpu -k cudnn: cuDNN flash attention (model.attention: cudnn, what
#                auto picks on a GPU) against the blockwise tiles, values and gradients, and
#                the tiny model's loss and gradients through it (tests/test_gpu.py)
#   gpu_tests    pytest -m gpu -s, the rest of tests/test_gpu.py (blockwise attention vs
#                reference in fp32/bf16, sampled vs teacher-forced log-probs, the bf16
#                rollout-vs-learner mismatch, whose JSON line is repeated as its own result line)
#   cpu_tests    tests/test_gpu.py without -m gpu: tests/conftest.py keeps an ordinary run on 8
#                simulated CPU devices even on a GPU machine (the gpu tests skip, saying why)
#   gpu_update   benchmarks/gpu_update.py: one LOOP update of a 1.24B model (tok/s, MFU, peak
#                memory)
#   matmul_mfu   a bf16 8192^3 matmul against the chip's table peak
#   rollout_engine  benchmarks/rollout_engine.py: the continuous-batching engine against
#                lock-step rounds, 100 ms environment latency, one repeat
#   async        benchmarks/async_training.py: synchronous vs overlapped training
#                (staleness 1), 100 ms latency, 4 iterations
#   compile_times, generate, rl_step   the benchmarks, each ending with one JSON line
#                (compile_times at 8 layers: compile time grows about linearly with depth);
#                their torch ratios are null unless torch ran on the same device in the same run
#
# Time: each step has its own cap, clamped to what is left of the budget
# (DEVICE_CHECK_BUDGET_S, default 450 s: with the last step's 10 s kill grace, under 8 minutes)
# and never under MIN_CAP_S; a step for which less than MIN_CAP_S is left is reported as
# skipped, not run. GPU-only steps are skipped (with the
# reason) when the backend is not a GPU. Logs: $OUT/device_check_logs (else a temp directory).
set -uo pipefail
cd "$(dirname "$0")/.."
# unbuffered: a step that times out still leaves its partial output in its log
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: bash scripts/device_check.sh [--dry-run]" >&2; exit 2 ;;
esac

BUDGET=${DEVICE_CHECK_BUDGET_S:-450}
MIN_CAP_S=20
START=$(date +%s)
LOGS=${OUT:+$OUT/device_check_logs}
if [[ $DRY == 0 ]]; then LOGS=${LOGS:-$(mktemp -d)}; mkdir -p "$LOGS"; fi
BACKEND=unknown
FAILED=()

left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# cap WANT -> min(WANT, left), or nothing when less than MIN_CAP_S is left
cap() {
  local want=$1 l
  l=$(left)
  (( l < MIN_CAP_S )) && return 1
  echo $(( want < l ? want : l ))
}

# emit NAME STATUS RC CAP WALL LOG [NOTE]: one JSON line (stdout and $OUT/device_check.jsonl).
# The step's last JSON line, if it printed one, is the "result" (else its last line is
# "last"); unless it succeeded, the log's last 15 lines are the "tail".
emit() {
  local line
  line=$(python3 - "$@" <<'PY'
import json, os, sys
name, status, rc, cap, wall, log = sys.argv[1:7]
note = sys.argv[7] if len(sys.argv) > 7 else ""
row = {"check": name, "status": status, "rc": None if rc == "" else int(rc),
       "cap_s": None if cap == "" else int(cap), "wall_s": None if wall == "" else int(wall)}
lines = []
if log and os.path.exists(log):
    with open(log, errors="replace") as f:
        lines = [l.rstrip("\n") for l in f if l.strip()]
    row["log"] = log
for l in reversed(lines):
    if l.lstrip().startswith("{"):
        try:
            row["result"] = json.loads(l)
            break
        except ValueError:
            pass
if lines and "result" not in row:
    row["last"] = lines[-1][-300:]
if status != "ok" and lines:
    row["tail"] = [l[-300:] for l in lines[-15:]]
if note:
    row["note"] = note
print(json.dumps(row))
PY
)
  echo "$line"
  [[ -n "${OUT:-}" ]] && echo "$line" >>"$OUT/device_check.jsonl"
  return 0
}

# step NAME WANT_S GPU_ONLY COMMAND: run COMMAND (bash) under its clamped cap, log kept.
step() {
  local name=$1 want=$2 gpu_only=$3 cmd=$4 c t0 rc status log="$LOGS/$1.log"
  if [[ $DRY == 1 ]]; then
    printf 'plan  %-13s cap<=%3ss%s  %s\n' "$name" "$want" \
      "$([[ $gpu_only == 1 ]] && echo ' (gpu only)' || echo '           ')" "$cmd"
    return 0
  fi
  if [[ $gpu_only == 1 && $BACKEND != gpu ]]; then
    emit "$name" skipped "" "" "" "" "JAX backend is '$BACKEND', not gpu"
    return 0
  fi
  if ! c=$(cap "$want"); then
    emit "$name" skipped "" "" "" "" "too little time: $(left) s left of the $BUDGET s budget, under the ${MIN_CAP_S} s minimum cap"
    return 0
  fi
  t0=$(date +%s)
  timeout --kill-after=10 "$c" bash -c "$cmd" >"$log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status=timeout ;;
    *) status=failed ;;
  esac
  emit "$name" "$status" "$rc" "$c" "$(( $(date +%s) - t0 ))" "$log"
  [[ $status == ok ]] || FAILED+=("$name")
  return 0
}

# The Python programs of the inline steps, exported for the steps' shells (the plan shows the
# commands that name them).
export PROBE_PY='import jax, json
d = jax.devices()[0]
print(json.dumps({"backend": jax.default_backend(), "device": d.device_kind,
                  "count": jax.device_count(), "jax": jax.__version__}))'
export MATMUL_PY='import json, time
import jax, jax.numpy as jnp
from jaxagent.perf.roofline import device_peaks
peak, _, src = device_peaks(jax.devices()[:1])
n = 8192
a = jnp.ones((n, n), jnp.bfloat16)
f = jax.jit(lambda x: x @ x)
f(a).block_until_ready()
t0 = time.perf_counter()
for _ in range(10):
    out = f(a)
out.block_until_ready()
s = (time.perf_counter() - t0) / 10
print(json.dumps({"tflop_s": round(2 * n**3 / s / 1e12, 1), "mfu": round(2 * n**3 / s / peak, 3),
                  "peak_source": src}))'
# jax[cuda12] is installed only where a GPU is present (nvidia-smi) and JAX does not see it
INSTALL='if ! python -c "$PROBE_PY" | grep -q "\"backend\": \"gpu\"" && command -v nvidia-smi >/dev/null; then python -m pip install --retries 1 --timeout 20 -U "jax[cuda12]" || { python -c "$PROBE_PY"; exit 3; }; fi; python -c "$PROBE_PY"'
DEPS="python -c 'import flax, optax, pytest, torch, transformers' || python -m pip install --retries 1 --timeout 20 -e '.[test]'"
CUDNN_TESTS="env -u JAX_PLATFORMS python -m pytest -q -rs -m gpu -k cudnn -p no:cacheprovider tests/test_gpu.py"
GPU_TESTS="env -u JAX_PLATFORMS python -m pytest -q -s -rs -m gpu -k 'not cudnn' -p no:cacheprovider tests/test_gpu.py"
CPU_TESTS="env -u JAX_PLATFORMS python -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py"
MATMUL='env -u JAX_PLATFORMS python -c "$MATMUL_PY"'

[[ $DRY == 1 ]] && echo "device_check plan: budget ${BUDGET}s, each step's cap clamped to what is" \
  "left (at least ${MIN_CAP_S}s, else skipped); logs in ${LOGS:-a temp directory}"
step backend 150 0 "$INSTALL"
if [[ $DRY == 0 && -f "$LOGS/backend.log" ]] && grep -q '"backend": "gpu"' "$LOGS/backend.log"; then
  BACKEND=gpu
elif [[ $DRY == 0 ]]; then
  BACKEND=$(grep -o '"backend": "[a-z]*"' "$LOGS/backend.log" 2>/dev/null | tail -1 | cut -d'"' -f4)
  BACKEND=${BACKEND:-unknown}
fi
step deps 90 0 "$DEPS"
step cudnn 60 1 "$CUDNN_TESTS"
step gpu_tests 120 1 "$GPU_TESTS"
if [[ $DRY == 0 && -f "$LOGS/gpu_tests.log" ]]; then  # the measured mismatch, as its own line
  line=$(grep -o '{"check": "bf16_mismatch".*}' "$LOGS/gpu_tests.log" | tail -1)
  if [[ -n "$line" ]]; then
    echo "$line"
    [[ -n "${OUT:-}" ]] && echo "$line" >>"$OUT/device_check.jsonl"
  fi
fi
step cpu_tests 45 0 "$CPU_TESTS"
step gpu_update 150 1 "env -u JAX_PLATFORMS python benchmarks/gpu_update.py"
step matmul_mfu 30 1 "$MATMUL"
step rollout_engine 90 1 "env -u JAX_PLATFORMS python benchmarks/rollout_engine.py --profiles latency_100ms --tasks 8 --samples 4 --repeats 1"
step async 120 1 "env -u JAX_PLATFORMS python benchmarks/async_training.py --profiles latency_100ms --modes sync,async_k1 --iterations 4"
step compile_times 90 0 "env -u JAX_PLATFORMS python benchmarks/compile_times.py --layers 8"
step generate 90 0 "env -u JAX_PLATFORMS python benchmarks/generate.py --quick --configs tiny_b8,big_b8"
step rl_step 90 0 "TRL=''; python -c 'import trl' 2>/dev/null && TRL=\"--trl-python \$(command -v python)\"; env -u JAX_PLATFORMS python benchmarks/rl_step.py --steps 3 \$TRL"
[[ $DRY == 1 ]] && exit 0
# exit status 1 when a step that ran failed or timed out (skipped steps do not count)
emit done "$([[ ${#FAILED[@]} == 0 ]] && echo ok || echo failed)" \
  "$([[ ${#FAILED[@]} == 0 ]] && echo 0 || echo 1)" "$BUDGET" \
  "$(( $(date +%s) - START ))" "" "${FAILED[*]:+failed or timed out: ${FAILED[*]}}"
[[ ${#FAILED[@]} == 0 ]]
