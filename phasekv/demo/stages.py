"""The demo's units of work. Each runs in a worker process (one torch thread), calls the rooms' public
Python entry points, and writes its outputs atomically into the study layout (`phasekv.report.layout`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from pathlib import Path

import torch

from phasekv.config import ModelConfig
from phasekv.config.names import at_seed
from phasekv.demo.plan import DemoPlan
from phasekv.eval.models import load
from phasekv.eval.prompts import RetrievalPrompts
from phasekv.eval.protocols import LOOKUP, PROTOCOLS
from phasekv.io import write_json
from phasekv.report.layout import Layout
from phasekv.runtime import reuse_freed_memory

# A stage imports the room it runs (training, statistics, analyses, theory) when it runs, in its worker:
# every `phasekv` command imports this module (through `phasekv.demo`), and stays quick to start.


def _setup() -> None:
    torch.set_num_threads(1)  # two shared cores: one thread per worker process
    reuse_freed_memory()  # a spawned worker starts with glibc's defaults
    warnings.filterwarnings("ignore", message="per-group N=")  # the sampled design is chosen on purpose


def _prompts(plan: DemoPlan, em, padding: str = "prefix", per_group: int | None = None, fit=LOOKUP.fit):
    """The plan's prompts (default: the lookup) over the key/name lists the model was trained on; a per-group
    N that is not a multiple of M² is kept (sampled, moment-matched design)."""
    n = per_group or plan.per_group
    return fit(em, records=plan.records, demos=plan.demos, padding=padding, filler=plan.filler,
               modulus=plan.modulus, per_group=n, keep_n=n % plan.modulus**2 != 0, mappings=plan.mappings, seed=0)


def train_config(p: DemoPlan, arch: str, run_dir: str, device: str = "cpu"):
    """The `TrainConfig` the plan trains `arch` with on `device` (its recipe is what a seed record is matched by)."""
    from phasekv.train import TrainConfig

    own = p.training_of(arch)
    if "init_from" in own:  # a model of the plan: its run directory beside this one
        own["init_from"] = str(Path(run_dir).parent / ModelConfig.from_name(own["init_from"], preset=p.preset).alias)
    return TrainConfig(arch=arch, preset=p.preset, **own, seq_len=p.seq_len, warmup=p.warmup,
                       grad_accum=p.micro_batches, trim=p.micro_batches > 1,
                       ckpt_every=p.ckpt_every, val_every=0, out=run_dir, threads=1, progress=False, device=device,
                       data={"data": "recall", "recall": {**p.recall_of(arch), "seq_len": p.seq_len}})


def train_model(plan: dict, arch: str, run_dir: str, device: str = "cpu") -> dict:
    """Train (or resume) one model; a run with no complete checkpoint restarts from scratch. Under a launcher's
    several ranks (RANK, WORLD_SIZE in the environment) each rank calls it and rank 0 clears a stale directory
    before the ranks meet (`phasekv.train.distributed.init_dist`)."""
    from phasekv.train import train
    from phasekv.train.checkpoint import latest_checkpoint, read_trainer_state

    _setup()
    p = DemoPlan.from_dict(plan)
    last = latest_checkpoint(run_dir)
    resume = last is not None
    if not resume and Path(run_dir).exists() and os.environ.get("RANK", "0") == "0":
        shutil.rmtree(run_dir)
    cfg = train_config(p, arch, run_dir, device)
    start = read_trainer_state(last)["step"] if resume else 0
    return {**train(cfg, resume=resume), "resumed_from": start}


def retrieval(plan: dict, run_dir: str, out: str, protocol: str, padding: str, device: str = "cpu") -> dict:
    """A retrieval protocol's evaluation (`phasekv.eval.protocols`) under one padding, at the plan's sizes."""
    from phasekv.eval.run import run_retrieval

    _setup()
    p, em = DemoPlan.from_dict(plan), load(run_dir, device)
    proto = PROTOCOLS[protocol]
    return run_retrieval(proto.name, em, _prompts(p, em, padding, fit=proto.fit), out, batch_size=p.eval_batch,
                         progress=False)


def flip(plan: dict, run_dir: str, out: str, device: str = "cpu") -> dict:
    from phasekv.eval.flip import FlipConfig, run_flip

    _setup()
    p, em = DemoPlan.from_dict(plan), load(run_dir, device)
    # the flip test's lookup-style prompt, over the key/name lists the model was trained on
    cfg = LOOKUP.fit(em, records=p.records, demos=p.demos, modulus=1, per_group=1,
                        filler=2, mappings=1, seed=0)  # filler >= record length - 1 (3 with two-word keys)
    ps = RetrievalPrompts(cfg, em.tok)
    words, _, _, answer = ps.words(0)
    wrong = next(v for v in ps.mapping(0)[1] if v != answer)
    fc = FlipConfig(prompt=" ".join(words), candidates=[" " + answer, " " + wrong], lengths=p.flip_lengths)
    return run_flip(em, fc, out, progress=False)


def knockout(plan: dict, run_dir: str, out: str, device: str = "cpu") -> dict:
    from phasekv.analysis.knockout import analyze_knockout

    _setup()
    p, em = DemoPlan.from_dict(plan), load(run_dir, device)
    cfg = _prompts(p, em, "prefix", p.ko_per_group)
    return analyze_knockout(em, cfg, out, n_cal=p.n_cal, batch_size=p.eval_batch, progress=False)


def gates(plan: dict, run_dir: str, out: str, knockout_dir: str, device: str = "cpu") -> dict:
    from phasekv.analysis.gates import analyze_gates

    _setup()
    p, em = DemoPlan.from_dict(plan), load(run_dir, device)
    ko = knockout_dir if (Path(knockout_dir) / "summary.json").is_file() else None
    return analyze_gates(em, _prompts(p, em), out, n_prompts=p.gate_prompts, batch_size=p.eval_batch,
                         knockout=ko, progress=False)


def cycle(plan: dict, run_dir: str, out: str, device: str = "cpu") -> dict:
    from phasekv.analysis.cycling import analyze_cycle

    _setup()
    p, em = DemoPlan.from_dict(plan), load(run_dir, device)
    cfg = _prompts(p, em, "prefix", p.cycle_per_group)
    return analyze_cycle([em], cfg, out, deltas=p.deltas, batch_size=p.eval_batch, n_boot=p.n_boot,
                         progress=False)


def family(plan: dict, run_dir: str, out: str, grids: dict, evals: dict, device: str = "cpu") -> dict:
    """The family stage of one model (`phasekv.analysis.family`): the lookup at every grid period in `grids` under
    both paddings (reusing the plan's finished lookups `evals`: padding -> directory), the design's knockouts."""
    from phasekv.analysis.family import analyze_family

    _setup()
    p, em = DemoPlan.from_dict(plan), load(run_dir, device)
    return analyze_family(em, _prompts(p, em), out, grids=grids, evals={k: Path(v) for k, v in evals.items()},
                          ko_per_group=p.ko_per_group, batch_size=p.eval_batch, n_boot=p.n_boot, progress=False)


def theory(plan: dict, out: str) -> dict:
    from phasekv.theory import run_all

    _setup()
    return run_all(out, quick=DemoPlan.from_dict(plan).theory_quick, progress=False)


def examples(plan: dict, root: str, aliases: list[str], tokenizer_run: str) -> dict:
    """A few lookup prompts as words with the target key, its answer and the query marked, and what each
    model answered on exactly that prompt (from the lookup results)."""
    import pandas as pd

    p = DemoPlan.from_dict(plan)
    lay = Layout(root)
    em = load(tokenizer_run)
    tok = em.tok
    out = []
    for padding, residue in (("prefix", 7), ("prefix", 3), ("in-sequence", 7)):
        prompts = RetrievalPrompts(_prompts(p, em, padding), tok)
        pid = residue * prompts.design.n_per_group
        pr = prompts.prompt(pid)
        b = len(tok.prefix)
        answers = []
        for alias in aliases:
            res = lay.lookup(padding, alias) / "results.parquet"
            if res.is_file():
                row = pd.read_parquet(res).set_index("pid").loc[pid]
                answers.append({"alias": alias, "pred": str(row["pred_word"]), "correct": bool(row["correct"]),
                                "prob": float(row["prob"])})
        phases = ", ".join(f"mod {s}: {pr.target_pos % s}" for s in (4, 6, 8))
        out.append({
            "title": f"{padding} padding · target key at position {pr.target_pos} (residue {pr.residue} of "
                     f"{p.modulus}; {phases}) · answer '{pr.answer_word}' · query at position {pr.query_pos}",
            "words": pr.words, "highlight": {"target": [pr.target_pos - b], "answer": [pr.target_pos - b + 1],
                                             "query": [len(pr.words) - 1]},
            "answers": answers,
        })
    write_json(lay.examples, {"examples": out}, indent=1)
    return {"examples": len(out)}


POSTTRAINED = ("W8/S4 · 1 KV",)  # the designs the plans post-train in miniature for C11 (their seeds too)


def posttrain(plan: dict, root: str, alias: str, device: str = "cpu") -> dict:
    """Post-training in miniature (C11): the model `alias` of the study directory `root` continued with the repair's
    recipe for a quarter of its steps at a third of its peak rate (`phasekv.mitigate.posttrain`), then the plan's
    lookup under both paddings; `Layout.posttrain(alias)`/summary.json last."""
    from phasekv.mitigate import posttrain as pt
    from phasekv.train import train

    _setup()
    lay = Layout(root)
    run_dir, out = lay.run(alias), lay.posttrain(alias)
    base = pt.base_training(run_dir)
    steps = max(1, round(pt.MINIATURE * base["train"]["steps"]))
    recipe = pt.Recipe(lr=pt.MINIATURE_LR * base["train"]["lr"])
    cfg = pt.continuation(run_dir, out / "run", pt.Settings(steps=steps, every=steps, stop=False, recipe=recipe))
    train(dataclasses.replace(cfg, device=device, threads=1), resume=True)
    for padding in LOOKUP.study:
        retrieval(plan, str(out / "run"), str(lay.posttrain_lookup(alias, padding)), LOOKUP.name, padding, device)
    summary = {"model": base["name"], "base": str(run_dir), "steps": steps, "base_steps": base["train"]["steps"],
               "fraction": pt.MINIATURE, "recipe": dataclasses.asdict(cfg)}
    write_json(out / "summary.json", summary, default=str)
    return summary


SWEEPS = {"flip": flip}  # the demo stage of each protocol that is not a retrieval (`Protocol.retrieval`)


def repair(plan: dict, root: str) -> dict:
    """Every compressed model against the repair's goals (`phasekv repair`), at the plan's seeds, citing the plan's
    seed record (the same designs measured at seeds 42-49)."""
    from phasekv.mitigate.cost import Bench
    from phasekv.mitigate.repair import Goals, run_repair

    _setup()
    p = DemoPlan.from_dict(plan)
    quick = p.mode == "quick"  # steps of the training batch; a smoke run times a small one, once
    bench = Bench(batch=8 if quick else p.batch_size, seq_len=32 if quick else p.seq_len, reps=1 if quick else 5,
                  decode_context=64 if quick else 512)
    record = json.loads(Path(__file__).with_name(p.repair_record).read_text()) if p.repair_record else None
    seeds = max(p.repair_seeds, min(len(p.seeds), Goals.seeds))  # at several seeds: the seed rule, up to its 8
    return run_repair(Path(root), at_seed(p.repair_unrepaired, p.seeds[0]), bench=bench, goals=Goals(seeds=seeds),
                      record=record, progress=False)


ON_DEVICE = {train_model, retrieval, flip, knockout, gates, cycle, family, posttrain}  # the stages that take `device` (a
#   model's training, evaluations and analyses); the rest read results or time the CPU (the repair's costs)


def compare(plan: dict, evals: list[str], out: str) -> dict:
    """Cache size, training/decode cost and gap of every model side by side (`phasekv compare`)."""
    from phasekv.mitigate.compare import compare as compare_models

    _setup()
    return compare_models([Path(e) for e in evals], out=Path(out), protocol="prefix")
