"""One model of a plan trained at one seed with the plan's own recipe (or a change of it), then the plan's lookup:
how the seed sweeps of docs/results/seeds.md were run before the plans took `--seed`.

    python sweeps/seed_probe.py --plan demo --model "Full attention · 1 KV" --seed 60 --out runs/seeds \
        [--set steps=1600] [--recall repeat_prob=0.25] [--paddings prefix,in-sequence] [--tag NAME]

Appends one JSON line per run to OUT/results.jsonl: the recipe's changes, held-out recall every 100 steps (the
training's own validation, 256 sequences), the lookup's mean and gap with intervals and the detected period.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

from phasekv.config import ModelConfig
from phasekv.demo import stages
from phasekv.demo.plan import plan_for, study_plan


def _value(v: str):
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return v


def _pairs(items: list[str]) -> dict:
    return {k: _value(v) for k, v in (i.split("=", 1) for i in items)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", default="demo", choices=["demo", "study"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--data-seed", type=int)
    ap.add_argument("--out", default="runs/seeds")
    ap.add_argument("--set", nargs="*", default=[], help="TrainConfig fields, key=value")
    ap.add_argument("--recall", nargs="*", default=[], help="recall data fields, key=value")
    ap.add_argument("--paddings", default="prefix")
    ap.add_argument("--val-every", type=int, default=100)
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    plan = plan_for(False) if a.plan == "demo" else study_plan(False)
    stages._setup()
    cfg = ModelConfig.from_name(a.model, preset=plan.preset)
    tag = a.tag or "base"
    name = f"{cfg.alias}-seed{a.seed}" + ("" if a.data_seed is None else f"-data{a.data_seed}")
    run_dir = Path(a.out) / tag / name
    tc = stages.train_config(plan, cfg.name, str(run_dir))
    changes = _pairs(a.set)
    data = dataclasses.replace(tc.data, recall=dataclasses.replace(tc.data.recall, **_pairs(a.recall)))
    tc = dataclasses.replace(tc, seed=a.seed, data_seed=a.data_seed, val_every=a.val_every, ckpt_every=10**6,
                             gate_steps="none", data=data, **changes)
    from phasekv.train import train

    t0 = time.process_time()
    done = run_dir / "done.json"  # a finished training is kept (its evaluation is what is missing)
    trained = done.is_file()
    if not trained and run_dir.exists():  # cut off: no checkpoint is written (ckpt_every), so it starts again
        shutil.rmtree(run_dir)
    summary = json.loads(done.read_text()) if trained else train(tc)
    train_cpu = None if trained else time.process_time() - t0
    curve = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], round(100 * r["val_accuracy"], 1)) for r in curve if "val_accuracy" in r]
    row = {"plan": a.plan, "model": cfg.name, "seed": a.seed, "data_seed": a.data_seed, "tag": tag,
           "set": changes, "recall": _pairs(a.recall), "heldout": curve, "train_cpu_s": train_cpu and round(train_cpu)}
    for padding in a.paddings.split(","):
        out = Path(a.out) / tag / "eval" / padding / name
        s = stages.retrieval(plan.to_dict(), str(run_dir), str(out), "lookup", padding)
        row[padding] = {**{k: s.get(k) for k in ("mean", "mean_ci", "gap", "gap_ci", "detected_period")},
                        "p": (s.get("periodicity") or {}).get("p_value")}
    with open(Path(a.out) / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    _ = summary


if __name__ == "__main__":
    main()
