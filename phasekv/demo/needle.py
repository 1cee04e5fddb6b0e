"""`phasekv study --needle`: the long-context regime, the needle test on models that can pass it.

Each model of the plan is trained as a chain of runs, each continuing the one before (`init_from`): the demo's
96-token recall over the needle's words (two-animal keys, every animal and name), then the needle's own task
(`phasekv.data.needle`) at 256 and at 1,024 tokens, its records grown from 1 to the test's density. Then, per
model, `phasekv eval needle` at 1x, 2x and 4x the training length (N prompts per residue mod 8, Wilson intervals,
the periodicity test at the compressed models' stride, 8 for full attention) and `phasekv audit --task needle`
at the training length. Writes OUT/runs/, OUT/eval/needle-<context>/<alias>/, OUT/audit/<alias>/,
OUT/needle.json (every summary and verdict) and OUT/needle.md (the controls' table). Resumable: finished runs and
evaluations are kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from phasekv.config import ModelConfig
from phasekv.eval.models import load
from phasekv.eval.prompts import needle_config
from phasekv.eval.run import json_default, run_retrieval
from phasekv.io import write_json
from phasekv.mitigate.audit import run_audit
from phasekv.mitigate.repair import Goals
from phasekv.train.sweep import SweepRun, run_runs

console = Console(stderr=True)

BASE = {"data": "recall", "seq_len": 96, "steps": 1000, "batch_size": 64, "grad_accum": 4, "trim": True,
        "lr": 3e-3, "warmup": 100,
        "recall": {"min_records": 2, "max_records": 16, "n_keys": 0, "n_values": 0, "key_words": 2, "max_prefix": 24,
                   "min_distance": 16, "gap_prob": 1.0, "max_gap": 4, "curriculum": 25600}}
# the demo's recipe (records spaced out, grown from 1 over 400 steps) over the needle's words: every animal and
# name, two-animal keys; from scratch at 1,024 tokens the needle's task stayed at chance (docs/results/needle.md)
STAGES = {
    "base": BASE,
    "256": {"data": "needle", "seq_len": 256, "steps": 600, "batch_size": 32, "lr": 2e-3, "warmup": 50,
            "val_every": 100, "val_sequences": 128, "needle": {"queries": 8, "curriculum": 12800}},
    "1024": {"data": "needle", "seq_len": 1024, "steps": 600, "batch_size": 16, "lr": 1e-3, "warmup": 50,
             "val_every": 100, "val_sequences": 64, "needle": {"queries": 8, "curriculum": 1600}},
}  # each stage continues the one before; records grow from 1 over the first 400 (256) and 100 (1,024) steps
QUICK = {  # the same path at tiny budgets: the plumbing, not the effect
    "base": {**BASE, "steps": 4, "batch_size": 8, "grad_accum": 1, "warmup": 2, "val_sequences": 8,
             "gate_steps": "none", "recall": {**BASE["recall"], "curriculum": 16}},
    "128": {"data": "needle", "seq_len": 128, "steps": 3, "batch_size": 4, "lr": 2e-3, "warmup": 1,
            "val_sequences": 8, "gate_steps": "none", "needle": {"queries": 2, "curriculum": 8}},
}


@dataclass
class NeedlePlan:
    mode: str  # "full" | "quick"
    models: list[str] = field(default_factory=lambda: ["W8/S8 · 1 KV", "Full attention · 1 KV", "W8/S4 · 1 KV"])
    stages: dict = field(default_factory=lambda: STAGES)  # tag -> `phasekv train` options, in training order
    lengths: tuple[int, ...] = (1, 2, 4)  # needle contexts, multiples of the last stage's training length
    per_group: int = 256  # needle prompts per residue mod 8 (a multiple of 64: exact moment matching)
    audit_per_group: int = 64  # the audit's own needle prompts per residue (its default)
    eval_batch: int = 8  # prompts per forward pass
    control_stride: int = 8  # period the full-attention control is tested at (the compressed models' largest)
    max_gap: float = 10.0  # the audit's threshold (its default)

    @property
    def train_len(self) -> int:
        return list(self.stages.values())[-1]["seq_len"]

    def runs(self, root: Path) -> list[tuple[str, str, list[SweepRun]]]:
        """(model, its alias, its chain of runs) for every model: run k of a chain starts from run k-1's weights."""
        chains = []
        for model in self.models:
            alias, chain = ModelConfig.from_name(model).alias, []
            for tag, options in self.stages.items():
                init = {"init_from": str(chain[-1].out)} if chain else {}
                chain.append(SweepRun(f"{model} [{tag}]", f"{alias}-{tag}",
                                      {"arch": model, "preset": "tiny", **options, **init,
                                       "out": str(root / f"{alias}-{tag}")}))
            chains.append((model, alias, chain))
        return chains


def plan_for(quick: bool) -> NeedlePlan:
    if not quick:
        return NeedlePlan("full")
    return NeedlePlan("quick", models=["W8/S8 · 1 KV", "Full attention · 1 KV"], stages=QUICK, lengths=(1, 2),
                      per_group=8)


def run_needle(out: Path, quick: bool = False, threads: int = 1, progress: bool = True,
               plan: NeedlePlan | None = None) -> dict:
    """Train each model's chain, then its needle tests and audit, model by model (finished runs, evaluations and
    audits are kept); returns (and writes) OUT/needle.json and OUT/needle.md."""
    plan, out = plan or plan_for(quick), Path(out)
    rows, audits = [], {}
    for model, alias, chain in plan.runs(out / "runs"):
        if any(r["after"] == "failed" for r in run_runs(chain, threads=threads, progress=progress)):
            raise SystemExit(1)
        em = load(chain[-1].out, device="cpu")
        for k in plan.lengths:
            ctx = k * plan.train_len - 1  # prompts of k training lengths: <bos> and the context
            where = out / "eval" / f"needle-{ctx}" / alias
            s = _kept(where / "summary.json") or run_retrieval(
                "needle", em, needle_config(context=ctx, per_group=plan.per_group, keep_n=quick), where,
                batch_size=plan.eval_batch, interval="wilson", stride=em.stride or plan.control_stride,
                progress=progress)
            rows.append(control_row(model, ctx, s))
        where = out / "audit" / alias
        audits[model] = _kept(where / "audit.json") or run_audit(
            em, where, task="needle", context=plan.train_len - 1, per_group=plan.audit_per_group,
            max_gap=plan.max_gap, batch_size=plan.eval_batch, progress=progress)
    result = {"mode": plan.mode, "train_len": plan.train_len, "stages": plan.stages, "controls": rows,
              "audits": {m: {k: a[k] for k in ("verdict", "exit_code", "gap", "gap_ci", "detected_period",
                                                "period_p_value", "mean", "chance")} for m, a in audits.items()}}
    write_json(out / "needle.json", result, default=json_default)
    (out / "needle.md").write_text(table(rows, audits), encoding="utf-8")
    console.print(table(rows, audits))
    return result


def _kept(path: Path) -> dict | None:
    """A finished evaluation's summary or audit's verdict, if there is one."""
    return json.loads(path.read_text()) if path.is_file() else None


def control_row(model: str, context: int, s: dict) -> dict:
    """One line of the controls' table from a needle summary."""
    p = s.get("periodicity", {}).get("p_value")
    return {"model": model, "context": context, "prompts": s["n_prompts"], "mean": s["mean"], "worst": s["worst"],
            "best": s["best"], "gap": s["gap"], "gap_ci": s["gap_ci"], "period": s["detected_period"],
            "stride": s.get("stride"), "p": p, "flat": flat(s),
            "beyond_training_length": bool(s.get("beyond_training_length"))}


def flat(s: dict) -> bool:
    """Flat by the repair's rule (`phasekv.mitigate.repair.Goals`): the periodicity test at the stride does not
    reject (p > min_p) and the detected period is 1."""
    p = s.get("periodicity", {}).get("p_value")
    return p is not None and p > Goals.min_p and s["detected_period"] == 1


def table(rows: list[dict], audits: dict[str, dict]) -> str:
    """The controls' table (markdown) and the audit verdicts."""
    lines = ["| model | context | prompts | mean | worst | best | gap [95%] | period | p at S | flat |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = "" if r["p"] is None else f"{r['p']:.4f} (S={r['stride']})"
        lines.append(f"| {r['model']} | {r['context']:,}{' (beyond training)' if r['beyond_training_length'] else ''} "
                     f"| {r['prompts']:,} | {r['mean']:.1f} | {r['worst']:.1f} | {r['best']:.1f} | {r['gap']:.1f} "
                     f"[{r['gap_ci'][0]:.1f}, {r['gap_ci'][1]:.1f}] | {r['period']} | {p} | "
                     f"{'yes' if r['flat'] else 'no'} |")
    lines += ["", "| model | audit verdict (exit) | gap [95%] | period | p | mean | chance |", "|---|---|---|---|---|---|---|"]
    for m, a in audits.items():
        p = "" if a["period_p_value"] is None else f"{a['period_p_value']:.4f}"
        lines.append(f"| {m} | {a['verdict']} ({a['exit_code']}) | {a['gap']:.1f} [{a['gap_ci'][0]:.1f}, "
                     f"{a['gap_ci'][1]:.1f}] | {a['detected_period']} | {p} | {a['mean']:.1f} | {a['chance']:.1f} |")
    return "\n".join(lines) + "\n"
