"""`phasekv study --needle`: the long-context regime, the needle test on models that can pass it.

Each model of the plan is trained as a chain of runs, each continuing the one before (`init_from`): the demo's
96-token recall over the needle's words (two-animal keys, every animal and name), then the needle's own task
(`phasekv.data.needle`) at 256 and at 1,024 tokens, its records grown from 1 to the test's density. Then, per
model, `phasekv audit --task needle` at 1x, 2x and 4x the training length (N prompts per residue, Wilson intervals,
the period test at the model's stride, 8 for full attention: residues mod 8, or mod 16 for a stride of 8, as
`phasekv.eval.ratios` plans them). Writes OUT/runs/, OUT/needle-<context>/<alias>/ (audit.json, audit.png and the
evaluations), OUT/needle.json (every row), OUT/needle.md (the controls' table), OUT/curves.png (the training
curves) and OUT/needle.png (accuracy by residue at the training length). Resumable: finished runs and audits are
kept.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console

from phasekv.config import ModelConfig
from phasekv.config.names import DEFAULTS, at_seed, at_seeds, seed_of, unseeded
from phasekv.data.sources import data_tokenizer
from phasekv.demo.plan import gathered
from phasekv.eval.figure import PALETTE, Figure, Guide, Panel, Trace, to_png
from phasekv.eval.models import load
from phasekv.eval.report import profile_rows, residue_figure
from phasekv.eval.run import json_default
from phasekv.eval.stats import FLAT, FLAT_MARGIN
from phasekv.io import write_json
from phasekv.mitigate.audit import run_audit
from phasekv.report.load import read_jsonl
from phasekv.report.needle import kept, table
from phasekv.train.sweep import SweepRun, run_runs

console = Console(stderr=True)

BASE = {"data": "recall", "seq_len": 96, "steps": 600, "batch_size": 64, "grad_accum": 4, "trim": True,
        "lr": 3e-3, "warmup": 100, "val_every": 100,
        "recall": {"min_records": 2, "max_records": 16, "n_keys": 0, "n_values": 0, "key_words": 2, "max_prefix": 24,
                   "min_distance": 16, "gap_prob": 1.0, "max_gap": 4, "curriculum": 25600}}
# the demo's recipe (records spaced out, grown from 1 over 400 steps) over the needle's words: every animal and
# name, two-animal keys (a first probe trained W8/S8 from scratch on recall at 1,024 tokens: it stayed at chance)
DEMO = {**BASE, "steps": 2000, "recall": {**BASE["recall"], "n_keys": 32, "n_values": 32, "key_words": 1}}
# the demo's own recall and steps (the shipped lists' first 32 keys and 32 names, one-animal keys)
STAGES = {
    "demo": DEMO,
    "base": {**BASE, "widen": True},
    "256": {"data": "needle", "seq_len": 256, "steps": 600, "batch_size": 32, "lr": 2e-3, "warmup": 50,
            "val_every": 100, "val_sequences": 128, "needle": {"queries": 8, "curriculum": 12800}},
    "1024": {"data": "needle", "seq_len": 1024, "steps": 600, "batch_size": 16, "lr": 1e-3, "warmup": 50,
             "val_every": 100, "val_sequences": 64, "needle": {"queries": 8, "curriculum": 1600}},
}  # each stage continues the one before; records grow from 1 over the first 400 (base, 256) and 100 (1,024) steps.
#   Every chain binds keys to names first on the demo's recall, where each model learns it (full attention at 2,000
#   steps at every seed tried: phasekv/demo/plan.py), its vocabulary then widened to the needle's words (`widen`),
#   then the needle's words at 96 tokens and the longer stages. From the needle's words directly full attention stayed
#   on the "any name in the context" plateau (base 18.1%, 256 tokens 3.5%) and W8/S8's chain learned at 1 of 2 fresh
#   seeds (the other: base 15.8%, 256 tokens 2.4%; docs/results/needle.md, docs/results/seeds.md)
UNRECORDED_PER_GROUP = 256  # the size of every audit in a needle.json written before it recorded each audit's own
WIDE = "-wide"  # suffix of the widened copy of a run (`widen`): the next stage's init_from
QUICK_BASE = {**BASE, "steps": 4, "batch_size": 8, "grad_accum": 1, "warmup": 2, "val_sequences": 8,
              "gate_steps": "none", "recall": {**BASE["recall"], "curriculum": 16}}
QUICK = {  # the same path at tiny budgets: the plumbing, not the effect
    "demo": {**QUICK_BASE, "recall": {**QUICK_BASE["recall"], "n_keys": 32, "n_values": 32, "key_words": 1}},
    "base": {**QUICK_BASE, "widen": True},
    "128": {"data": "needle", "seq_len": 128, "steps": 3, "batch_size": 4, "lr": 2e-3, "warmup": 1,
            "val_sequences": 8, "gate_steps": "none", "needle": {"queries": 2, "curriculum": 8}},
}


@dataclass
class NeedlePlan:
    mode: str  # "full" | "quick"
    models: list[str] = field(default_factory=lambda: ["W8/S8 · 1 KV", "Full attention · 1 KV", "W8/S4 · 1 KV"])
    stages: dict = field(default_factory=lambda: STAGES)  # tag -> `phasekv train` options, in training order
    own: dict = field(default_factory=dict)  # model -> its own stages (the same last stage); none in the plan: every
    #   chain takes `stages`. A stage's "widen": True starts it from the previous run widened to its words
    lengths: tuple[int, ...] = (1, 2, 4)  # needle contexts, multiples of the last stage's training length
    per_group: int = 256  # needle prompts per residue mod 8 (a multiple of 64: exact moment matching); a stride of 8
    #                       is tested on residues mod 16 with about as many prompts (the audit's rule)
    control_per_group: int = 4096  # the same for full attention at the training length, where its claim is "flat":
    #   a model with no phase structure at all is shown flat (gap's upper bound below δ) in 9 of 40 simulated
    #   evaluations of 2,048 prompts at 75% accuracy, 24 of 40 at 97%, and 34 of 40 at 75% with 32,768 prompts
    #   (sweeps/flat_power.py); the seed-70 control (74.7%) failed with 2,048 (gap 6.4 [0.0, 16.4]) and passed with
    #   32,768 (0.0 [0.0, 0.7]). Its evaluation costs ~4 CPU-minutes at 1,024 tokens; a longer context fewer prompts
    eval_batch: int = 8  # prompts per forward pass
    continues: dict = field(default_factory=dict)
    #   model -> (another model, a stage): the model trains the stages after that one, from the other model's run of
    #   it (a design change, `phasekv train --init-from`). None in the plan: a compressed model continuing full
    #   attention's plateaued models stayed at chance (W8/S4 from its base: 2.7% held-out at 256 tokens after 300
    #   steps where W8/S8 from its own base had 45%; from its 256-token model: 0.4% at 1,024 tokens after 100)
    control_stride: int = 8  # period the full-attention control is tested at (the compressed models' largest)
    margin: float = FLAT_MARGIN  # the audit's flat margin δ (the flat rule's default)
    seeds: list[int] = field(default_factory=lambda: [DEFAULTS["seed"]])  # every chain at each seed (`--seeds`):
    #   `models` holds each model once per seed, its name carrying `· seed N` (none at 42); `own` and `continues` are
    #   keyed by the model at any seed

    def at_seeds(self, seeds: list[int]) -> NeedlePlan:
        """This plan with every model's chain at each of `seeds` (`phasekv.config.names.at_seeds`)."""
        return dataclasses.replace(self, seeds=list(seeds), models=at_seeds(self.models, seeds))

    def per_group_of(self, stride: int | None, length: int) -> int:
        """Needle prompts per residue mod 8 for a model of `stride` (None: full attention) at `length` training
        lengths: the negative control's own size at the training length."""
        return self.control_per_group if stride is None and length == 1 else self.per_group

    @property
    def train_len(self) -> int:
        return list(self.stages.values())[-1]["seq_len"]

    def runs(self, root: Path) -> list[tuple[str, str, list[SweepRun]]]:
        """(model, its alias, its chain of runs) for every model: run k of a chain starts from run k-1's weights."""
        chains = []
        for model in self.models:
            alias, chain, init = ModelConfig.from_name(model).alias, [], None
            stages = self.own.get(unseeded(model), self.stages)
            tags = list(stages)
            if unseeded(model) in self.continues:
                source, stage = self.continues[unseeded(model)]
                source = ModelConfig.from_name(at_seed(source, seed_of(model))).alias
                tags, init = tags[tags.index(stage) + 1:], root / f"{source}-{stage}"
            for tag in tags:
                options = dict(stages[tag])
                init = chain[-1].out if chain else init
                if options.pop("widen", False):
                    init = Path(f"{init}{WIDE}")
                chain.append(SweepRun(f"{model} [{tag}]", f"{alias}-{tag}",
                                      {"arch": model, "preset": "tiny", **options,
                                       **({"init_from": str(init)} if init else {}), "out": str(root / f"{alias}-{tag}")}))
            chains.append((model, alias, chain))
        return chains


def plan_for(quick: bool) -> NeedlePlan:
    if not quick:
        return NeedlePlan("full")
    return NeedlePlan("quick", models=["W8/S8 · 1 KV", "Full attention · 1 KV"], stages=QUICK, lengths=(1, 2),
                      per_group=8, control_per_group=16, continues={})


def run_needle(out: Path, quick: bool = False, threads: int = 1, progress: bool = True,
               plan: NeedlePlan | None = None, seeds: list[int] | None = None) -> dict:
    """Train each model's chain, then audit its needle at each length, model by model (finished runs and audits
    are kept); returns (and writes) OUT/needle.json, OUT/needle.md and the figures. `seeds`: every chain at each
    of them besides the seeds OUT/needle.json already holds."""
    out = Path(out)
    plan = plan or plan_for(quick)
    before = kept(out / "needle.json") or {}
    plan = gathered(plan, before.get("seeds", []), seeds)
    asked = {(r["model"], r["context"]): r.get("per_group", UNRECORDED_PER_GROUP) for r in before.get("controls", [])}
    rows, profiles, chains = [], [], plan.runs(out / "runs")
    for model, alias, chain in chains:
        for run in chain:
            init = run.options.get("init_from", "")
            if init.endswith(WIDE) and run.status() != "done":  # the previous run, widened to this one's words
                widen(Path(init.removesuffix(WIDE)), stage_tokenizer(run.options), Path(init))
            if any(r["after"] == "failed" for r in run_runs([run], threads=threads, progress=progress)):
                raise SystemExit(1)
        em = load(chain[-1].out, device="cpu")
        for k in plan.lengths:
            ctx = k * plan.train_len - 1  # prompts of k training lengths: <bos> and the context
            where, n = out / f"needle-{ctx}" / alias, plan.per_group_of(em.stride, k)
            v = kept(where / "audit.json")
            if v is None or asked.get((model, ctx), n) != n:  # none, or one of another size: (re)done
                v = run_audit(em, where, stride=None if em.stride else plan.control_stride, margin=plan.margin,
                              task="needle", per_group=n, context=ctx, batch_size=plan.eval_batch, progress=progress)
            rows.append(control_row(model, ctx, v) | {"per_group": n})
            if k == 1:
                s = json.loads((Path(v["evaluation"]) / "summary.json").read_text())
                profiles.append(profile_rows(alias, model, s, em.stride or plan.control_stride))
    result = {"mode": plan.mode, "train_len": plan.train_len, "stages": plan.stages, "seeds": plan.seeds,
              "controls": rows}
    write_json(out / "needle.json", result, default=json_default)
    (out / "needle.md").write_text(table(rows), encoding="utf-8")
    to_png(curves_figure(chains), out / "curves.png")
    to_png(residue_figure(pd.concat(profiles), "in-sequence", {}), out / "needle.png")
    console.print(table(rows))
    return result


def control_row(model: str, context: int, v: dict) -> dict:
    """One line of the controls' table from a needle audit's verdict (`phasekv.mitigate.audit.verdict`)."""
    keep = ("mean", "mean_ci", "worst", "best", "gap", "gap_ci", "detected_period", "period_p_value", "stride",
            "modulus", "n_prompts", "chance", "verdict", "exit_code", "evaluation")
    return {"model": model, "context": context, **{k: v[k] for k in keep}, "flat": v["flat"] == FLAT,
            "beyond_training_length": bool(v.get("beyond_training_length"))}


def curves_figure(chains: list[tuple[str, str, list[SweepRun]]]) -> Figure:
    """Training curves of every chain: held-out accuracy and training loss against the chain's steps, a dashed line
    where a stage (a longer sequence) begins."""
    acc, loss, guides = [], [], []
    for i, (model, alias, chain) in enumerate(chains):
        color, offset = PALETTE[i % len(PALETTE)], 0
        for run in chain:
            m = read_jsonl(run.out / "metrics.jsonl")
            if m is None:  # not trained (yet)
                continue
            val = m[m["val_accuracy"].notna()] if "val_accuracy" in m else m.iloc[:0]
            train = m[m["loss"].notna()] if "loss" in m else m.iloc[:0]
            label = model if run is chain[0] else None
            acc.append(Trace("line", (val["step"] + offset).tolist(), (100 * val["val_accuracy"]).tolist(), name=label,
                             color=color, marker="circle", size=3, model=alias))
            loss.append(Trace("line", (train["step"] + offset).tolist(), train["loss"].tolist(), color=color,
                              width=0.8, model=alias))
            offset += run.config().total_steps
            if i == 0 and run is not chain[-1]:
                guides.append(Guide(x=offset, name=None))
    return Figure([Panel(acc, title="held-out accuracy (96-token recall, then the needle's task at 256, 1,024)",
                         xlabel="step (the chain's stages one after another)", ylabel="accuracy (%)", ylim=(0, 100),
                         guides=guides, legend=True),
                   Panel(loss, title="training loss", xlabel="step", ylabel="loss", guides=guides)], size=(11, 3.6))


def stage_tokenizer(options: dict):
    """The tokenizer of a stage's data (`phasekv train` options, e.g. STAGES["base"]): the words `widen` widens to."""
    train = {k: v for k, v in options.items() if k != "widen"}  # a stage's own key, no training option
    return data_tokenizer(SweepRun("", "", {**train, "out": ""}).config().data)


def widen(source: Path, tok, out: Path) -> Path:
    """`source`'s model with the vocabulary of `tok` (a superset of its own words): every tensor kept, the embedding
    and LM-head rows of the words both know copied by word, the new words' rows as a fresh model initialises them;
    written to OUT (`PhaseLM.save` and tokenizer.json, or for a transformers run a save_pretrained directory), a model
    `phasekv train --init-from` (`--hf-model`) continues. Full attention learns the demo's recall over its 32 keys and
    names but not over the needle's 528 words (its output layer over every word; docs/results/needle.md), so its chain
    starts there and widens (DeepSeek-V4's too)."""
    from phasekv.data.tokenizer import save_tokenizer
    from phasekv.model.transformer import PhaseLM
    from phasekv.train.run import load_run

    out = Path(out)
    if (out / "tokenizer.json").is_file():
        return out
    model, old = load_run(source, hf_tokenizer=False)
    rows = [(i, old.token_to_id(w)) for w, i in tok.get_vocab().items() if old.token_to_id(w) is not None]
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(model, PhaseLM):
        _widen_phaselm(model, rows, tok.get_vocab_size()).save(out)
    else:
        _widen_hf(model, rows).save_pretrained(out)
    save_tokenizer(tok, out / "tokenizer.json")
    return out


def _moved(old, fresh, rows: list[tuple[int, int]]):
    """`fresh` (vocabulary-sized rows) with row dst := `old`'s row src for each (dst, src) of `rows`."""
    import torch

    new = fresh.detach().clone()
    new[torch.tensor([r[0] for r in rows])] = old.detach()[torch.tensor([r[1] for r in rows])]
    return new


def _widen_phaselm(model, rows: list[tuple[int, int]], vocab_size: int):
    import torch

    from phasekv.model.transformer import PhaseLM

    torch.manual_seed(model.config.seed)
    wide = PhaseLM(model.config.replace(vocab_size=vocab_size))
    new = wide.state_dict()
    for name, t in model.state_dict().items():  # vocabulary-sized (the embedding, an untied LM head) when they differ
        new[name] = t if new[name].shape == t.shape else _moved(t, new[name], rows)
    wide.load_state_dict(new)
    return wide


def _widen_hf(model, rows: list[tuple[int, int]]):
    """A transformers model's embedding and LM head (each once when tied) re-indexed by word in place; its
    vocab_size (the config's, at least every tokenizer's) is kept."""
    import torch

    from phasekv.train.build import DEFAULT_SEED
    from phasekv.train.hfmodel import new_hf_model

    fresh = new_hf_model(model.config, DEFAULT_SEED)
    pairs = {id(get(model).weight): (get(model).weight, get(fresh).weight)
             for get in (lambda m: m.get_input_embeddings(), lambda m: m.get_output_embeddings())}
    with torch.no_grad():
        for weight, fresh_weight in pairs.values():
            weight.copy_(_moved(weight, fresh_weight, rows))
    return model
