#!/usr/bin/env bash
# A short GPU smoke run (<= 90 s on one H200) before the measuring run of benchmarks/gpu.sh, on the machine's own
# python3 as gpu.sh runs it: the environment (benchmarks/gpu_env.py: a one-line error naming a missing package),
# the CUDA-graph decode step against the eager one, and a warm timing of one attention layer at 4,096 tokens.
#   bash benchmarks/gpu_smoke.sh [OUT_FILE]     (default: $OUT/gpu-smoke.txt, else benchmarks/gpu-smoke.txt)
#   SMOKE_BACKENDS=blockwise,triton bash benchmarks/gpu_smoke.sh      (the backends timed; flex compiles ~45 s)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT_FILE="${1:-${OUT:+$OUT/gpu-smoke.txt}}"
OUT_FILE="${OUT_FILE:-benchmarks/gpu-smoke.txt}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PHASEKV_KERNELS=0
mkdir -p "$(dirname "$OUT_FILE")"
{
  start=$SECONDS
  rc=0
  echo "# phasekv GPU smoke · $(date -u '+%Y-%m-%d %H:%M UTC')"
  timeout 30 "$PY" benchmarks/gpu_env.py || rc=2
  echo "## env: $((SECONDS - start)) s"
  if [ $rc -eq 0 ]; then
    t0=$SECONDS
    timeout 30 "$PY" benchmarks/bench_decode.py --device cuda --graph-check 1024 || rc=1
    echo "## CUDA-graph decode check: $((SECONDS - t0)) s"
    t0=$SECONDS
    timeout 40 "$PY" benchmarks/bench_attention.py --device cuda --dtype bf16 --train-lengths 4096 --fwd-lengths "" \
      --backends "${SMOKE_BACKENDS:-blockwise}" --reps 5 --warmup 2 || rc=1
    echo "## attention at 4,096: $((SECONDS - t0)) s"
  fi
  echo "smoke: $((SECONDS - start)) s wall, exit $rc"
  exit $rc
} 2>&1 | tee "$OUT_FILE"
exit "${PIPESTATUS[0]}"
