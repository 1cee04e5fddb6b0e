#!/usr/bin/env bash
# One prepared GPU run of the phasekv benchmarks (bf16) on one H100/H200, on the machine's own python3 as it is: its
# CUDA torch and packages, phasekv from this tree (PYTHONPATH), no venv, no pip, no network.
#   bash benchmarks/gpu.sh [OUT_FILE]       (default: $OUT/gpu-results.txt, else benchmarks/gpu-results.txt)
#   PYTHON=/path/to/python bash benchmarks/gpu.sh     (another interpreter)
#   COMPILE=inductor bash benchmarks/gpu.sh           (layers compiled as `phasekv train --compile` does: minutes of
#                                                      compiling; default cudagraphs: the layers traced and captured)
#   SMOKE=1 bash benchmarks/gpu.sh OUT_FILE           (a CPU dry run at tiny sizes: every command, nothing measured)
# Sections, each under its own time limit (seconds; 8 minutes in all, the CPU's demo beside them), each followed by
# its wall time:
#   env     gpu_env.py: a one-line error naming a missing package
#   check   gpu_check.py: the fused compressor and attention, the fused decode update and a layer compiled whole
#           against the references (fp32), and in bf16
#   train   train_throughput.py, every contender's layers compiled alike ($COMPILE): the whole training step of
#           full attention against a plain reference model (small 8 x 4,096, qwen3-0.6b 1 x 4,096, with MFU) and of
#           W8/S8 · 1 KV against full attention (4K, 16K, 64K tokens)
#   layer   bench_attention.py: the layer alone, W8/S8 against full attention at 4K and 16K, eager and compiled whole
#   decode  bench_decode.py: the CUDA-graph step against eager, then batch 1 at 32K
#   demo    `phasekv demo --device cuda` end to end, then (verdicts) its claim verdicts against a CPU demo's, run
#           beside the other sections from the start (on cores 8-15 where taskset is): demo_verdicts.py
# The figures go to OUT_FILE and, machine-readable, to OUT_FILE's .json beside it; only a complete run replaces
# them (one with a failed section leaves OUT_FILE.partial and exits 1).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT_FILE="${1:-${OUT:+$OUT/gpu-results.txt}}"
OUT_FILE="${OUT_FILE:-benchmarks/gpu-results.txt}"
JSON="${OUT_FILE%.txt}.json"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
WORK="$(mktemp -d)"
trap 'kill "$(cat "$WORK/cpu-demo.pid" 2>/dev/null)" 2>/dev/null; rm -rf "$WORK"' EXIT
mkdir -p "$(dirname "$OUT_FILE")"

if [ -n "${SMOKE:-}" ]; then  # tiny sizes on the CPU, the fused kernels under Triton's interpreter
  export TRITON_INTERPRET=1
  DEVICE=cpu DTYPE=fp32 ENV_ARGS=(--cpu) CHECK_ARGS=(--smoke) COMPILE=aot_eager DEMO_ARGS=(--quick) JOBS=2
  SHAPES=tiny:2x64 LONG=tiny:1x128 LENGTHS=128 PRESET=tiny CONTEXT=300 GRAPH_CHECK=64 REPS=2
  LIMIT=(900 900 900 900 900)  # a loaded 2-core machine: the interpreter and two quick demos
else
  DEVICE=cuda DTYPE=bf16 ENV_ARGS=() CHECK_ARGS=() COMPILE="${COMPILE:-cudagraphs}" DEMO_ARGS=() JOBS=8
  SHAPES=small:8x4096,qwen3-0.6b:1x4096 LONG=small:1x16384,small:1x65536 LENGTHS=4096,16384 PRESET=small
  CONTEXT=32768 GRAPH_CHECK=2048 REPS=5
  LIMIT=(80 140 55 40 135)  # check train layer decode demo, and verdicts 20: 470 s; the CPU demo beside them
fi
ON=(--device "$DEVICE" --dtype "$DTYPE")
"$PY" benchmarks/gpu_env.py "${ENV_ARGS[@]}" > "$WORK/env.txt" 2>&1 || { tail -1 "$WORK/env.txt" >&2; exit 2; }

PIN=() CPU_PIN=()  # the sections on cores 0-7, the CPU's demo beside them on 8-15, where taskset is
command -v taskset > /dev/null && [ "$(nproc)" -ge 16 ] && PIN=(taskset -c 0-7) CPU_PIN=(taskset -c 8-15)

section() {  # NAME LIMIT_S COMMAND...: run, print its wall time, note a failure
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo
  echo "## $name (limit $limit s)"
  timeout --kill-after=10 "$limit" "${PIN[@]}" "$@"
  rc=$?
  echo "## $name: $((SECONDS - t0)) s wall$([ $rc -eq 0 ] || echo ", FAILED (exit $rc$([ $rc -eq 124 ] && echo ': over its limit'))")"
  [ $rc -eq 0 ] || echo "$name" >> "$WORK/failed"
}

# the decode section in one process: the CUDA-graph step against eager, then batch 1 at the target's context
DECODE="import sys; sys.path[:0] = ['benchmarks']; import bench_decode
try:
    bench_decode.main(['--device', '$DEVICE', '--graph-check', '$GRAPH_CHECK', '--preset', '$PRESET']); failed = False
except SystemExit as e:
    print(e); failed = True
bench_decode.main(['--device', '$DEVICE', '--dtype', '$DTYPE', '--contexts', '$CONTEXT', '--batch', '1', '--graph',
                   '--preset', '$PRESET', '--reps', '20', '--json', '$WORK/decode.json'])
sys.exit(failed)"
TRAIN="'$PY' benchmarks/train_throughput.py ${ON[*]} --shapes $SHAPES --compile $COMPILE --mfu --reps $REPS \
  --json '$WORK/train.json' && '$PY' benchmarks/train_throughput.py ${ON[*]} --shapes $LONG --models full,w8s8 \
  --compile $COMPILE --reps $REPS --json '$WORK/train-long.json'"

sections() {
  local start=$SECONDS
  echo "# phasekv GPU benchmarks · $(date -u '+%Y-%m-%d %H:%M UTC') · commit ${PHASEKV_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}${SMOKE:+ · SMOKE: a CPU dry run}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
  echo
  echo "## env"
  cat "$WORK/env.txt"
  timeout 480 "${CPU_PIN[@]}" "$PY" -m phasekv demo --device cpu --jobs "$JOBS" --no-progress --out "$WORK/demo-cpu" \
    "${DEMO_ARGS[@]}" > "$WORK/demo-cpu.log" 2>&1 &  # the CPU's demo, beside the sections from the start
  local cpu_demo=$!
  echo "$cpu_demo" > "$WORK/cpu-demo.pid"
  PHASEKV_TRITON_TUNE=0 section check "${LIMIT[0]}" "$PY" benchmarks/gpu_check.py --device "$DEVICE" \
    --backends blockwise,triton --names 3 --compile "$COMPILE" "${CHECK_ARGS[@]}"
  section train "${LIMIT[1]}" bash -c "$TRAIN"
  section layer "${LIMIT[2]}" "$PY" benchmarks/bench_attention.py "${ON[@]}" --preset "$PRESET" --train-lengths \
    "$LENGTHS" --fwd-lengths "" --backends triton --compile "$COMPILE" --reps "$REPS" --warmup 3 --json "$WORK/layer.json"
  section decode "${LIMIT[3]}" "$PY" -c "$DECODE"
  section demo "${LIMIT[4]}" "$PY" -m phasekv demo --device "$DEVICE" --no-progress --out "$WORK/demo-gpu" "${DEMO_ARGS[@]}"
  wait "$cpu_demo" || { echo "the CPU demo failed or ran past its limit:"; tail -5 "$WORK/demo-cpu.log"; }
  section verdicts 20 "$PY" benchmarks/demo_verdicts.py "$WORK/demo-cpu" "$WORK/demo-gpu" --json "$WORK/demo.json"
  echo
  echo "all sections: $((SECONDS - start)) s wall"
}

sections 2>&1 | tee "$WORK/results.txt"
"$PY" - "$WORK" > "$WORK/results.json" <<'EOF'
import json, pathlib, sys
work = pathlib.Path(sys.argv[1])
print(json.dumps({p.stem: json.loads(p.read_text()) for p in sorted(work.glob("*.json")) if p.stem != "results"},
                 indent=1))
EOF
if [ -s "$WORK/failed" ]; then
  cp "$WORK/results.txt" "$OUT_FILE.partial"
  cp "$WORK/results.json" "$JSON.partial"
  echo "incomplete run (failed: $(tr '\n' ' ' < "$WORK/failed")): figures in $OUT_FILE.partial; $OUT_FILE left as it was" >&2
  exit 1
fi
mv "$WORK/results.txt" "$OUT_FILE"   # only a complete run replaces the figures
mv "$WORK/results.json" "$JSON"
echo "figures written to $OUT_FILE and $JSON"
