"""Merge lookup evaluations of more seeds of a design into the repair's seed record, without the reference runs.

`phasekv repair DIR --record FILE` needs the reference and the unrepaired model evaluated in DIR; this adds seeds
of a design the record already holds from `DIR/eval/lookup-<padding>/<alias>/summary.json` (the same training
recipe, checked), takes the step costs from the record's own benchmark of that design (an architecture's costs
do not depend on its seed), re-judges every design by the record's goals and reference (`repair.keep`) and
redraws the cache frontier (one point per design and seed). Seeds listed after the figure are marked as the
design's fresh seeds (`fresh_seeds`: first trained after the design was fixed; the verdict reports them apart):
    python sweeps/repair_merge.py runs/repair-seeds phasekv/demo/repair_seeds.json docs/repair_cache_frontier.png 50 51
"""

import json
import re
import sys
from pathlib import Path

from phasekv.config import ModelConfig
from phasekv.mitigate import repair as R

root, record_path, figure = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
fresh = {int(a) for a in sys.argv[4:]}
record = json.loads(record_path.read_text())
designs = {(d["arch"], R._key(d["recipe"])): d for d in record["designs"]}
added = []
for s in sorted((root / "eval" / "lookup-prefix").glob("*/summary.json")):
    alias = s.parent.name
    cfg = ModelConfig.from_name(json.loads(s.read_text())["model"])
    rec = R.recipe(root / "runs" / alias)
    d = designs.get((R.design_name(cfg.name), R._key(rec)))
    if d is None:
        sys.exit(f"{alias}: no design of its architecture and recipe in {record_path}")
    paddings = {}
    for p in R.PADDINGS:
        n = json.loads((root / "eval" / f"lookup-{p}" / alias / "summary.json").read_text())
        paddings[p] = {"mean": n["mean"], "mean_ci": n["mean_ci"], "gap": n["gap"], "gap_ci": n["gap_ci"],
                       "gap_raw": n.get("gap_raw"), "detected_period": n.get("detected_period"),
                       "periodicity_p": n.get("periodicity", {}).get("p_value"), "worst": n["worst"],
                       "worst_residue": min(n["groups"], key=lambda g: g["acc"])["residue"]}
    cost = d["per_seed"][0]  # the record's benchmark of this architecture
    d["per_seed"] = [m for m in d["per_seed"] if m["seed"] != cfg.seed] + [
        {"seed": cfg.seed, "train_rel": cost["train_rel"], "decode_rel": cost["decode_rel"], "paddings": paddings}]
    d["per_seed"].sort(key=lambda m: m["seed"])
    if cfg.seed in fresh:
        d["fresh_seeds"] = sorted(set(d.get("fresh_seeds", [])) | {cfg.seed})
    base, _, merged = d.get("source", record["source"]).partition("; seeds merged by sweeps/repair_merge.py: ")
    seeds = sorted({int(x) for x in re.findall(r"\d+", merged)} | {cfg.seed})
    d["source"] = base + "; seeds merged by sweeps/repair_merge.py: " + ", ".join(map(str, seeds))
    added.append(f"{cfg.name}")
# re-judge every design from its per-seed numbers (what `phasekv repair --record` does with the designs it keeps)
result = {"goals": record["goals"], "reference_numbers": record["reference_numbers"],
          "reference_model": record["reference_model"], "context": 32768, "designs": []}
R.keep(result, record)
record["designs"] = result["kept"]
R.write_json(record_path, record, default=R.json_default)
print("merged:", ", ".join(added))
for d in record["designs"]:
    w = d["worst"]
    print(f"{d['design']}: cache {d['cache_ref']:.4f}; seeds {d['seeds']}; meet but cache "
          f"{sum(m['meets_but_cache'] for m in d['per_seed'])}/{len(d['seeds'])}; worst {w['seed']} {w['padding']} "
          f"{w['gap']:.1f} [{w['gap_ci'][0]:.1f}, {w['gap_ci'][1]:.1f}]{R.fresh_text(d)}")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

models = [m | {"design": d["design"], "role": "design"} for d in record["designs"] for m in d["per_seed"]]
names = list(dict.fromkeys(m["design"] for m in models))
fig, ax = plt.subplots(figsize=(8, 5))
R.cache_panel(ax, models, names, record["goals"], record["reference"])
handles = [plt.Line2D([], [], marker="o", ls="", color=R.design_color(names, n), label=n) for n in names]
fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=6, frameon=False)
fig.suptitle("Cache against worst-seed gap, one point per design and seed (filled: every goal but the cache)",
             fontsize=9)
R.write_figure(figure, fig, dpi=R.DPI, bbox_inches="tight")
