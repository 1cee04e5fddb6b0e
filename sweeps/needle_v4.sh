#!/usr/bin/env bash
# DeepSeek-V4 (tiny transformers model, CSA ratio 4 + HCA ratio 8) on the needle at 1,024 tokens under its own record's
# recipe (docs/results/needle.md, "DeepSeek-V4 in this regime"): `tests/hf/tiny.py`'s v4_config (vocab_size=528,
# max_position_embeddings=4096) written to a json; the demo's recall at 96 tokens with the record recipe (1,600 steps
# planned, no curriculum, no --trim, no gradient accumulation), stopped once its step-500 checkpoint is written (the
# chain continues that checkpoint); widened to the needle's words (`phasekv.demo.needle.widen`); the needle's words
# at 96 tokens (300 steps, no curriculum); the needle's task at 256 tokens (300 steps, 8 queries, all records from
# the start); at 1,024 tokens (STEPS1024, default 300: 16 x 1,024 in micro-batches of 2, lr 1e-3, no curriculum,
# a checkpoint every 50 steps, glibc keeping freed memory); then its needle audit at 1,023 tokens (exit 3 on a gap:
# kept going). Each stage continues the previous run (`--hf-model RUN_DIR`: its latest checkpoint). One thread;
# finished stages are kept (rerunning skips them). CPU times in OUT/times.txt. ~47 CPU-minutes (2026-12-06: 57.6%
# held-out at 1,024 tokens, audit exit 3).
# Usage: sweeps/needle_v4.sh [OUT]
set -euo pipefail
OUT=${1:-needle_v4}; BIN=${BIN:-.venv/bin}; R=$OUT/runs; STEPS1024=${STEPS1024:-300}
export OMP_NUM_THREADS=1
t() { /usr/bin/time -a -o "$OUT/times.txt" -f "$1: %e s wall, %U s user, %S s sys, rc %x" "${@:2}"; }
mkdir -p "$R"
[ -f "$OUT/v4-config.json" ] || "$BIN/python" - "$OUT/v4-config.json" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, ".")
from tests.hf.tiny import v4_config, write_config
write_config(v4_config(vocab_size=528, max_position_embeddings=4096), Path(sys.argv[1]))
PY
REC=min_records=2,max_records=16,max_prefix=24,min_distance=16,gap_prob=1.0,max_gap=4
# demo: the record's run (runs/long/v4-record.sh), stopped once step 500's checkpoint is complete (atomic dirs)
if [ ! -d "$R/v4-demo/checkpoints/step_00000500" ]; then
  /usr/bin/time -a -o "$OUT/times.txt" -f "demo: %e s wall, %U s user, %S s sys, rc %x (stopped)" \
    "$BIN/phasekv" train --hf-config "$OUT/v4-config.json" --out "$R/v4-demo" --data recall --seq-len 96 \
    --steps 1600 --batch-size 64 --lr 3e-3 --warmup 100 --val-every 100 --ckpt-every 500 --gate-steps none \
    --recall "$REC,n_keys=32,n_values=32,key_words=1" --threads 1 --no-progress &
  tp=$!  # /usr/bin/time's pid; its child is the run
  until [ -d "$R/v4-demo/checkpoints/step_00000500" ] || ! kill -0 $tp 2>/dev/null; do sleep 2; done
  kill "$(pgrep -P $tp)" 2>/dev/null || true; wait $tp || true
fi
[ -d "$R/v4-demo/checkpoints/step_00000500" ]
"$BIN/python" - "$R" <<'PY'
import sys
from pathlib import Path
from phasekv.demo.needle import BASE, stage_tokenizer, widen
r = Path(sys.argv[1])
widen(r / "v4-demo", stage_tokenizer(BASE), r / "v4-demo-wide")  # its latest checkpoint: step 500
PY
stage() {  # OUT_NAME FROM STEPS phasekv-train-flags...
  [ -f "$R/$1/done.json" ] || t "$1" "$BIN/phasekv" train --hf-model "$R/$2" --out "$R/$1" --steps "$3" \
    --val-every 100 --gate-steps none --threads 1 --no-progress "${@:4}"
}
stage v4-base v4-demo-wide 300 --data recall --seq-len 96 --batch-size 64 --lr 3e-3 --warmup 100 \
  --recall "$REC,n_keys=0,n_values=0,key_words=2"
stage v4-256 v4-base 300 --data needle --seq-len 256 --batch-size 32 --grad-accum 4 --lr 2e-3 --warmup 50 \
  --val-sequences 128 --needle queries=8
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296  # ~half the 1,024-token step: page faults
stage v4-1024 v4-256 "$STEPS1024" --data needle --seq-len 1024 --batch-size 16 --grad-accum 8 --lr 1e-3 --warmup 50 \
  --val-sequences 64 --needle queries=8 --ckpt-every 50
t audit-1023 "$BIN/phasekv" audit --model "$R/v4-1024" --task needle --context 1023 --per-group 256 --batch-size 2 \
  --out "$OUT/audit-1023" || echo "audit at 1023: exit $?"
