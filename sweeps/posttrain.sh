#!/usr/bin/env bash
# Post-training: repairing a model that is already trained (`phasekv posttrain`), and post-training in miniature
# (claim C11). docs/results/posttrain.md reports what these commands measured. One run at a time, one thread.
#
# Bases: the demo's recipe (`phasekv.demo.stages.train_config(plan_for(False), MODEL, DIR)`, the model at seed N:
# sweeps/seed_probe.py), W8/S4 · 1 KV 600 steps, W8/S8 · 1 KV 1,000; a tiny transformers DeepSeek-V4 (CSA 4, HCA 8)
# with its record's recall recipe, 600 steps; W8/S4 · 1 KV's needle chain (`phasekv study --needle`'s stages) to
# 1,024 tokens. Seeds 100-199 (none used elsewhere in the project).
#
# CHOICE (seeds 100 and 101 only, W8/S4 · 1 KV): the continuation's rate, held constant after a 20-step warmup, half
# the records adjacent, no curriculum, the base's batch. Seed 100: 1e-3 flat at step 400 (checked every 100); 3e-3
# (the base's own peak) flat at 200 (every 100) and at 150 (every 50). Seed 101 at 3e-3: flat at 250 (every 50; at
# 200 prefix gap 2.4 [1.2, 3.6], not shown below δ). Fixed: the base's peak rate (3e-3 for the demo's models),
# checked every 50 steps, budget 600 (the base's own steps). C11's post-training in miniature: the same recipe at
# a third of the peak rate (1e-3, the probe's) for a quarter of the base's steps (150), the whole budget.
#
# PREDICTION, committed before any model below but the two choice seeds was fine-tuned:
# 1. W8/S4 · 1 KV (the demo's): `phasekv posttrain` reaches flat (every layout's gap upper bound below δ = 3.5 under
#    both paddings and on the held-out layout, retrieving) within its 600-step budget at EVERY seed: 8 of 8 at
#    100-107 (100 and 101 were the choice seeds) and 4 of 4 at the fresh seeds 108-111 (bases trained after this
#    commit). Steps to flat at most 300 (half the base's steps) at every seed, and more than 150 (a quarter) at
#    least at one seed (101 already is): a quarter of the base's steps is NOT enough at every seed. Against the
#    from-scratch repair at the same cache (W6/S4 · 1 KV or W8/S4 · 1 KV, 1,600 steps, flat at 12 of 12 and 8 of 8):
#    base + fine-tuning at most 900 steps.
# 2. C11 (post-training in miniature, 150 steps at 1e-3) at the same 12 seeds: the mean raised and the gap narrowed
#    (prefix, intervals apart) and the period still 4 (p < 0.05, detected period 4) at 12 of 12.
# 3. W8/S8 · 1 KV (the demo's, an eighth of the cache: two slots for the four records of an 8-token block), seeds
#    100-103, the same command with a 1,000-step budget (its base's steps): flat at NO seed; the prefix gap narrowed
#    (intervals apart) and the detected period still 8 at the last check at every seed: the study's pattern.
# 4. DeepSeek-V4 (seed 100; its CSA layer at stride 4, its HCA layer at 8: 2/4 + 2/8 = 0.75 entries per record):
#    not flat within 600 steps; its lookup gap narrowed; the CSA ratio's period test still significant.
# 5. The needle regime (W8/S4 · 1 KV's 1,024-token model, seed 100; continued on its own needle task at its stage's
#    peak rate 1e-3, checked every 100 steps, 300-step budget): not flat by the needle audit at 1,023 tokens
#    (2,048 prompts: the gap's upper bound stays above δ).
set -euo pipefail
BIN=${BIN:-.venv/bin}; R=${R:-runs/posttrain}
export OMP_NUM_THREADS=1
base() {  # MODEL SEED STEPS: a base at the demo's recipe and its lookup under both paddings
  [ -d "$R/bases/base/$4" ] || "$BIN/python" sweeps/seed_probe.py --plan demo --model "$1" --seed "$2" --set "steps=$3" \
    --out "$R/bases" --paddings prefix,in-sequence
}
for s in 100 101 102 103 104 105 106 107 108 109 110 111; do
  base "W8/S4 · 1 KV" $s 600 "w8s4-1kv-seed$s"
  "$BIN/phasekv" posttrain "$R/bases/base/w8s4-1kv-seed$s" --out "$R/w8s4/seed$s" --steps 600 --every 50 || true
  "$BIN/python" sweeps/posttrain_c11.py --bases "$R/bases" --seeds $s --out "$R/c11"  # the demo's C11 stage
done
for s in 100 101 102 103; do
  base "W8/S8 · 1 KV" $s 1000 "w8s8-1kv-seed$s"
  "$BIN/phasekv" posttrain "$R/bases/base/w8s8-1kv-seed$s" --out "$R/w8s8/seed$s" --steps 1000 --every 100 || true
done
# DeepSeek-V4: tests/hf/tiny.py's v4_config (vocab 528), the record's recall recipe (docs/results/needle.md)
mkdir -p "$R/v4"
[ -f "$R/v4/v4-config.json" ] || "$BIN/python" -c "
import sys; sys.path.insert(0, '.')
from pathlib import Path
from tests.hf.tiny import v4_config, write_config
write_config(v4_config(vocab_size=528), Path('$R/v4/v4-config.json'))"
[ -f "$R/v4/base-seed100/done.json" ] || "$BIN/phasekv" train --hf-config "$R/v4/v4-config.json" \
  --out "$R/v4/base-seed100" --seed 100 --data recall --seq-len 96 --steps 600 --batch-size 64 --lr 3e-3 --warmup 100 \
  --val-every 100 --gate-steps none --no-progress \
  --recall min_records=2,max_records=16,n_keys=32,n_values=32,key_words=1,max_prefix=24,min_distance=16,gap_prob=1.0,max_gap=4
"$BIN/phasekv" posttrain "$R/v4/base-seed100" --out "$R/v4/post-seed100" --steps 600 --every 100 || true
# the needle regime: W8/S4 · 1 KV's chain (phasekv.demo.needle's stages) at seed 100, then its 1,024-token model
"$BIN/python" -c "
from pathlib import Path
from phasekv.demo.needle import NeedlePlan
from phasekv.train.sweep import run_runs
(_, _, chain), = NeedlePlan('full', models=['W8/S4 · 1 KV · seed 100']).runs(Path('$R/needle'))
run_runs(chain, threads=1, progress=False)"
"$BIN/phasekv" posttrain "$R/needle/w8s4-1kv-seed100-1024" --out "$R/needle/post-seed100" --task needle \
  --context 1023 --per-group 256 --steps 300 --every 100 || true
