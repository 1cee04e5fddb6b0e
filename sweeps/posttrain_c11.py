"""Claim C11 at several seeds, as the demo reads it: each base (a sweeps/seed_probe.py run and its two lookups) laid
out as a study directory, post-trained in miniature by the demo's own stage (`phasekv.demo.stages.posttrain`: a
quarter of its steps at a third of its peak rate, half the records adjacent; then the lookup under both paddings),
and the claim's verdict over every seed (`phasekv.report.posttrain.c11`).

    python sweeps/posttrain_c11.py --bases runs/posttrain/bases --model w8s4-1kv --seeds 100 101 --out runs/posttrain/c11
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from phasekv.demo import stages
from phasekv.demo.plan import plan_for
from phasekv.report import load_study
from phasekv.report.layout import Layout
from phasekv.report.posttrain import c11, pairs


def link(target: Path, at: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    if not at.exists():
        at.symlink_to(target.resolve(), target_is_directory=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bases", type=Path, required=True)  # sweeps/seed_probe.py's --out
    ap.add_argument("--model", default="w8s4-1kv")
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    lay, plan = Layout(a.out), plan_for(False).to_dict()
    for seed in a.seeds:
        alias = f"{a.model}-seed{seed}"
        link(a.bases / "base" / alias, lay.run(alias))
        for padding in ("prefix", "in-sequence"):
            link(a.bases / "base" / "eval" / padding / alias, lay.lookup(padding, alias))
        if not (lay.posttrain(alias) / "summary.json").is_file():
            stages.posttrain(plan, str(lay.run(alias)), str(lay.posttrain(alias)))
    v = c11(pairs(load_study(a.out)))
    print(json.dumps(v.to_dict(), indent=1, default=str))


if __name__ == "__main__":
    main()
