#!/usr/bin/env bash
# One prepared GPU run of the phasekv benchmarks (bf16, T up to 128K) on the machine's own python3 as it is:
# its CUDA torch and packages, phasekv from this tree (PYTHONPATH), no venv, no pip, no network.
#   bash benchmarks/gpu.sh [OUT_FILE]       (default: $OUT/gpu-results.txt, else benchmarks/gpu-results.txt)
#   PYTHON=/path/to/python bash benchmarks/gpu.sh     (another interpreter)
# Sections, each under its own time limit (seconds; at most ~8.5 minutes in all; the measured run at e45cb8f took ~6.5 on one H200, compiles included)
# and followed by its wall time: env (benchmarks/gpu_env.py: a one-line error naming a missing package), check
# (gpu_check.py: the fast paths against the reference), attention (bench_attention.py, blockwise and triton in one
# process, flex in another, beside full SDPA, layers and the attention alone, every contender warmed up at every
# length), decode (the CUDA-graph step against eager, then bench_decode.py at batch 1 and 32), train
# (train_throughput.py). The figures go to OUT_FILE and, machine-readable, to OUT_FILE's .json beside it; only a
# complete run replaces them (one with a failed section leaves OUT_FILE.partial and exits 1).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT_FILE="${1:-${OUT:+$OUT/gpu-results.txt}}"
OUT_FILE="${OUT_FILE:-benchmarks/gpu-results.txt}"
JSON="${OUT_FILE%.txt}.json"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PHASEKV_KERNELS=0  # the CPU kernels: nothing to build here
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$(dirname "$OUT_FILE")"

"$PY" benchmarks/gpu_env.py > "$WORK/env.txt" 2>&1 || { tail -1 "$WORK/env.txt" >&2; exit 2; }

section() {  # NAME LIMIT_S COMMAND...: run, print its wall time, note a failure
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo
  echo "## $name (limit $limit s)"
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  echo "## $name: $((SECONDS - t0)) s wall$([ $rc -eq 0 ] || echo ", FAILED (exit $rc$([ $rc -eq 124 ] && echo ': over its limit'))")"
  [ $rc -eq 0 ] || echo "$name" >> "$WORK/failed"
}

# the decode section in one process: the CUDA-graph step against eager, then batch 1 and 32 (a failed check
# still leaves the figures, and fails the section)
DECODE="import sys; sys.path[:0] = ['benchmarks']; import bench_decode
try:
    bench_decode.main(['--device', 'cuda', '--graph-check', '2048']); failed = False
except SystemExit as e:
    print(e); failed = True
for batch in ('1', '32'):
    bench_decode.main(['--device', 'cuda', '--dtype', 'bf16', '--contexts', '32768,131072', '--batch', batch, '--graph',
                       '--reps', '20', '--json', '$WORK/decode-batch' + batch + '.json'])
sys.exit(failed)"

sections() {
  local start=$SECONDS
  echo "# phasekv GPU benchmarks · $(date -u '+%Y-%m-%d %H:%M UTC') · commit ${PHASEKV_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
  echo
  echo "## env"
  cat "$WORK/env.txt"
  section check 150 "$PY" benchmarks/gpu_check.py
  for backends_limit in blockwise,triton:130 flex:100; do  # flex apart: its compiles past its limit spare the others
    backends=${backends_limit%:*}
    section "attention $backends" "${backends_limit#*:}" "$PY" benchmarks/bench_attention.py --device cuda \
      --dtype bf16 --train-lengths 4096,16384,65536 --fwd-lengths 131072 --backends "$backends" --kernels --reps 5 \
      --warmup 2 --json "$WORK/attention-${backends/,/-}.json"
  done
  section decode 90 "$PY" -c "$DECODE"
  section train 40 "$PY" benchmarks/train_throughput.py --device cuda --dtype bf16 --presets tiny,small --reps 10 \
    --json "$WORK/train.json"
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
