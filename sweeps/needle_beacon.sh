#!/usr/bin/env bash
# Activation Beacon (`Beacon r8 · window 32 · 1 KV`) at 1,024 tokens (docs/results/needle.md, "MoBA and Beacon at
# 1,024 tokens"): full attention's chain of `phasekv study --needle` up to its 256-token stage (the study's own
# plan and code: demo, widen, base, 256), then Beacon continuing `full-1kv-256` as a design change (--init-from
# with --arch) through the 256- and 1,024-token stages' recipes (600 steps each), then its needle audit at 1x
# (2x, 4x) the training length, and its lookup at w = 32 (546-token prompts: 190 target positions for mod 64,
# the lookup's prefix padding and the in-sequence padding the model trained with). One thread; finished trainings
# are kept (the evaluations rerun). CPU times in OUT/times.txt. ~73 CPU-minutes. Usage: sweeps/needle_beacon.sh [OUT]
set -euo pipefail
OUT=${1:-needle49}; BIN=${BIN:-.venv/bin}; R=$OUT/runs; B="Beacon r8 · window 32 · 1 KV"
export OMP_NUM_THREADS=1
t() { /usr/bin/time -a -o "$OUT/times.txt" -f "$1: %e s wall, %U s user, %S s sys, rc %x" "${@:2}"; }  # CPU per step
mkdir -p "$OUT"
t chain "$BIN/python" - "$R" <<'EOF'
import sys
from pathlib import Path
from phasekv.demo.needle import WIDE, plan_for, stage_tokenizer, widen
from phasekv.train.sweep import run_runs
plan = plan_for(False)
plan.models = ["Full attention · 1 KV"]
(_, _, chain), = plan.runs(Path(sys.argv[1]))
for run in chain[:3]:  # demo, base (widened), 256: the study's runs, the 1,024 stage left out
    init = run.options.get("init_from", "")
    if init.endswith(WIDE) and run.status() != "done":
        widen(Path(init.removesuffix(WIDE)), stage_tokenizer(run.options), Path(init))
    assert all(r["after"] != "failed" for r in run_runs([run], threads=1, progress=False))
EOF
stage() {  # OUT_NAME INIT SEQ STEPS BATCH LR VAL_SEQUENCES CURRICULUM
  [ -f "$R/$1/done.json" ] || t "$1" "$BIN/phasekv" train --init-from "$R/$2" --arch "$B" --out "$R/$1" --data needle \
    --seq-len "$3" --steps "$4" --batch-size "$5" --lr "$6" --warmup 50 --val-every 100 --val-sequences "$7" \
    --needle "queries=8,curriculum=$8" --threads 1
}
stage beacon-256 full-1kv-256 256 600 32 2e-3 128 12800   # the 256-token stage's recipe (STAGES["256"])
stage beacon-1024 beacon-256 1024 600 16 1e-3 64 1600     # the 1,024-token stage's recipe (STAGES["1024"])
for ctx in 1023 2047 4095; do  # exit 3 (a gap) or 4 (4x: no retrieval): keep going
  t "audit-$ctx" "$BIN/phasekv" audit --model "$R/beacon-1024" --task needle --context $ctx --per-group 256 --batch-size 8 \
    --out "$OUT/audit-$ctx" || echo "audit at $ctx: exit $?"
done
t audit-lookup "$BIN/phasekv" audit --model "$R/beacon-1024" --task lookup --records 64 --demos 8 --filler 400 \
  --batch-size 8 --out "$OUT/audit-lookup" || echo "lookup audit: exit $?"
t lookup-inseq "$BIN/phasekv" eval lookup --model "$R/beacon-1024" --out "$OUT/lookup-inseq-64" --records 64 --demos 8 \
  --filler 400 --modulus 64 --per-group 64 --keep-n --padding in-sequence --stride 32 --batch-size 8
