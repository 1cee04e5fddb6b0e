"""KV-head and whole-layer knockouts by phase (the paper's Figure 3; docs: Explain the weak phases).

Mean ablation at the query: for each (layer, KV head), at the final token of every lookup prompt, the
outputs z (before o_proj) of every query head that reads that KV head are replaced by their mean over
`n_cal` calibration prompts (same layout, another seed: different key-name mappings); nothing else
changes. The whole-layer variant replaces a layer's attention output at the final token(s) instead, and
works on any decoder (PhaseLM or Hugging Face). The compressed variant (transformers DeepSeek-V4 models)
hides a layer's compressed entries from the final token(s): the compressed branch alone; its default there is
both, `compressed,layer`. Accuracy per residue t mod M (and folded to phases t mod S) is compared with the
clean run: relative change (A_ko - A_clean) / A_clean.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from phasekv.analysis.common import as_eval_model, prompt_config, provenance, write_outputs
from phasekv.analysis.hooks import (
    FinalMeans,
    attention_modules,
    capture_final,
    compressed_knockout,
    compressed_layers,
    head_knockout,
    is_phaselm,
    layer_knockout,
    means,
)
from phasekv.errors import ConfigError
from phasekv.eval.prompts import PromptConfig, RetrievalPrompts
from phasekv.eval.run import evaluate
from phasekv.eval.stats import gap_estimate, group_table, profile_summary
from phasekv.eval.tokens import WordTokenizer
from phasekv.progress import progress_bar

CAL_SEED = 1_000_003  # calibration prompts use prompt seed + CAL_SEED: other mappings, same layout
VARIANTS = ("head", "layer", "compressed")
Unit = tuple[int, int, str]  # (layer, kv_head or -1, variant)
REPLACED = {"head": "z of the query heads reading the KV head", "layer": "attention output",
            "compressed": "the layer's compressed entries, hidden from the final query"}  # what each variant removes


def calibration_config(cfg: PromptConfig) -> PromptConfig:
    return dataclasses.replace(cfg, seed=cfg.seed + CAL_SEED)


def spread_pids(n_total: int, n: int) -> list[int]:
    """n prompt ids spread evenly over 0..n_total-1 (every residue group alike: ids are grouped by residue)."""
    return sorted(set(np.linspace(0, n_total - 1, min(n, n_total)).round().astype(int).tolist()))


def _wordtok(tok) -> WordTokenizer:
    return tok if isinstance(tok, WordTokenizer) else WordTokenizer(tok)


@torch.no_grad()
def calibrate(model, tok, cfg: PromptConfig, n_cal: int = 256, n_final: int = 1, batch_size: int = 32) -> FinalMeans:
    """Mean attention outputs (and PhaseLM per-head z) at the final `n_final` tokens of `n_cal` calibration
    prompts (`calibration_config(cfg)`)."""
    tok = _wordtok(tok)
    cal = calibration_config(cfg)
    prompts = RetrievalPrompts(cal, tok)
    with capture_final(model, prompts.length, n_final) as acc:
        evaluate(model, tok, cal, spread_pids(len(prompts), n_cal), batch_size=batch_size)
    return means(acc)


def default_variant(model) -> str:
    """head (phasekv), compressed,layer (a transformers DeepSeek-V4 model), layer (other decoders)."""
    return "head" if is_phaselm(model) else "compressed,layer" if compressed_layers(model) else "layer"


def units(model, variant: str) -> list[Unit]:
    """(layer, kv_head, variant) of every knockout of `variant` (one or several, comma-separated), layer by
    layer; kv_head = -1 for the whole-layer and compressed-branch variants."""
    kinds = [v.strip() for v in variant.split(",")]
    for v in kinds:
        if v not in VARIANTS:
            raise ConfigError(f"knockout variant must be one of {', '.join(VARIANTS)}, got {v!r}")
    if "head" in kinds and not is_phaselm(model):
        raise ConfigError("per-KV-head knockouts need a phasekv model; use --variant layer for Hugging Face models")
    if "compressed" in kinds and (is_phaselm(model) or not compressed_layers(model)):
        raise ConfigError("compressed-branch knockouts need a transformers DeepSeek-V4 model with compressors")
    n_layers = len(attention_modules(model))
    per_layer = {"head": lambda layer: [(layer, h) for h in range(model.config.n_kv_heads)],
                 "layer": lambda layer: [(layer, -1)],
                 "compressed": lambda layer: [(layer, -1)] if layer in compressed_layers(model) else []}
    return [(layer, kv, v) for layer in range(n_layers) for v in kinds for layer, kv in per_layer[v](layer)]


def knockout(model, means_: FinalMeans, unit: Unit):
    """The context manager of one knockout unit."""
    layer, kv_head, variant = unit
    if variant == "compressed":
        return compressed_knockout(model, layer, means_.length, means_.n_final)
    return layer_knockout(model, layer, means_) if kv_head < 0 else head_knockout(model, layer, kv_head, means_)


@torch.no_grad()
def run_knockouts(model, tok, cfg: PromptConfig, variant: str = "head", n_cal: int = 256, n_final: int = 1,
                  pids=None, batch_size: int = 32, only: list[Unit] | None = None,
                  advance: Callable[[int], None] | None = None) -> tuple[pd.DataFrame, FinalMeans]:
    """Per-prompt rows of the clean run and of every knockout (columns of `evaluate` + layer, kv_head,
    unit; the clean run has layer = kv_head = -1, unit 'clean'), and the calibration means used."""
    tok = _wordtok(tok)
    todo = units(model, variant) if only is None else only
    means_ = calibrate(model, tok, cfg, n_cal, n_final, batch_size)
    if RetrievalPrompts(cfg, tok).length != means_.length:
        raise ConfigError("calibration and evaluation prompts differ in length")
    frames = []
    for unit in [(-1, -1, "clean"), *todo]:
        if unit[0] < 0:
            rows = evaluate(model, tok, cfg, pids, batch_size=batch_size)
        else:
            with knockout(model, means_, unit):
                rows = evaluate(model, tok, cfg, pids, batch_size=batch_size)
        frames.append(rows.assign(layer=unit[0], kv_head=unit[1], unit=unit_name(*unit)))
        if advance is not None:
            advance(1)
    return pd.concat(frames, ignore_index=True), means_


def unit_name(layer: int, kv_head: int, variant: str = "layer") -> str:
    if layer < 0:
        return "clean"
    if variant == "compressed":
        return f"L{layer}·compressed"
    return f"L{layer}" if kv_head < 0 else f"L{layer}·KV{kv_head}"


def clean_summary(rows: pd.DataFrame, clean: np.ndarray, modulus: int) -> dict:
    """mean / worst / best (points) of the clean residue profile `clean`, its gap cross-fitted over the
    key-name mappings with its interval (`gap_estimate`, as every evaluation reports it) and the raw max - min."""
    c = rows[rows["unit"] == "clean"]
    hits, trials = group_table(c["target_pos"] % modulus, c["mapping"], c["correct"].astype(float), modulus)
    seen = trials.sum(0) > 0  # residues with clean prompts
    gap, ci = gap_estimate(hits[:, seen], trials[:, seen])
    out = {k: 100 * float(v) for k, v in profile_summary(clean).items()}
    return {**out, "gap_raw": out["gap"], "gap": 100 * gap, "gap_ci": [100 * float(x) for x in ci]}


def effect_table(rows: pd.DataFrame, modulus: int, stride: int | None) -> pd.DataFrame:
    """Tidy accuracy table per (unit, grouping, group): grouping 'residue' (t mod M) and, with a stride,
    'phase' (t mod S, pooled); acc, clean_acc, change (points) and rel_change = (acc - clean) / clean."""
    rows = rows.assign(correct=rows["correct"].astype(float))
    groupings = [("residue", modulus)] + ([("phase", stride)] if stride and modulus % stride == 0 else [])
    out = []
    for name, mod in groupings:
        g = rows.assign(group=rows["target_pos"] % mod)
        t = g.groupby(["unit", "layer", "kv_head", "group"], sort=False)["correct"].agg(["sum", "count"]).reset_index()
        t["acc"] = t["sum"] / t["count"]
        clean = t[t["unit"] == "clean"].set_index("group")["acc"]
        t["clean_acc"] = t["group"].map(clean)
        t["change"] = 100 * (t["acc"] - t["clean_acc"])
        with np.errstate(divide="ignore", invalid="ignore"):
            t["rel_change"] = np.where(t["clean_acc"] > 0, (t["acc"] - t["clean_acc"]) / t["clean_acc"], np.nan)
        out.append(t.rename(columns={"sum": "correct", "count": "n"}).assign(grouping=name, modulus=mod))
    cols = ["unit", "layer", "kv_head", "grouping", "modulus", "group", "n", "correct", "acc", "clean_acc",
            "change", "rel_change"]
    return pd.concat(out, ignore_index=True)[cols]


def strongest(table: pd.DataFrame, grouping: str = "phase", top: int = 5) -> list[dict]:
    """Knockout units ranked by phase specificity: the loss at their worst group minus their mean loss
    (relative), i.e. how much more one phase suffers than the head's average."""
    t = table[(table["grouping"] == grouping) & (table["unit"] != "clean")]
    if t.empty:
        t = table[(table["grouping"] == "residue") & (table["unit"] != "clean")]
    out = []
    for (unit, layer, kv), g in t.groupby(["unit", "layer", "kv_head"], sort=False):
        loss = -g["rel_change"].to_numpy()
        if not np.isfinite(loss).any():
            continue
        worst = int(np.nanargmax(loss))
        out.append({"unit": unit, "layer": int(layer), "kv_head": int(kv), "worst_group": int(g["group"].iloc[worst]),
                    "worst_rel_change": float(-loss[worst]), "mean_rel_change": float(-np.nanmean(loss)),
                    "specificity": float(loss[worst] - np.nanmean(loss)),
                    "profile": [round(float(x), 4) for x in g["rel_change"]]})
    return sorted(out, key=lambda d: -d["specificity"])[:top]


def analyze_knockout(em, cfg: PromptConfig | None, out, variant: str | None = None, n_cal: int = 256, n_final: int = 1,
                     batch_size: int = 32, progress: bool = True, layers: list[int] | None = None) -> dict:
    """Knockout map of a model (an EvalModel or a directory for `phasekv.eval.models.load`) on lookup prompts
    `cfg` (default: the study's lookup test): writes
    OUT/results.parquet (tidy effect table), OUT/prompts.parquet (per-prompt rows), OUT/summary.json and
    OUT/knockout_map.png; returns the summary. `layers` restricts the knockouts to those layers."""
    from phasekv.analysis.figures import knockout_map  # matplotlib on use, not at start-up

    em, cfg = as_eval_model(em), prompt_config(cfg)
    variant = variant or default_variant(em.model)
    todo = units(em.model, variant)
    if layers is not None:
        bad = sorted(set(layers) - {u[0] for u in todo})
        if bad:
            raise ConfigError(f"layers {bad} do not exist (the model has {todo[-1][0] + 1} layers)")
        todo = [u for u in todo if u[0] in set(layers)]
    stride = em.stride
    with progress_bar(progress, len(todo) + 1, f"knockouts · {em.name}") as advance:
        rows, means_ = run_knockouts(em.model, em.tok, cfg, variant, n_cal, n_final, batch_size=batch_size,
                                     only=todo, advance=advance)
    table = effect_table(rows, cfg.modulus, stride)
    clean = table[(table["unit"] == "clean") & (table["grouping"] == "residue")]["acc"].to_numpy()
    summary = {
        "analysis": "knockout", "variant": variant, "model": em.name, "modulus": cfg.modulus, "stride": stride,
        "n_prompts": int((rows["unit"] == "clean").sum()), "n_cal": means_.n, "n_final": n_final,
        "replaced": REPLACED.get(variant) or {v: REPLACED[v.strip()] for v in variant.split(",")},
        "clean": clean_summary(rows, clean, cfg.modulus),
        "strongest": strongest(table, "phase" if stride else "residue"),
        "provenance": provenance(em, cfg, calibration_seed=calibration_config(cfg).seed),
    }
    out = Path(out)
    knockout_map(table, out / "knockout_map.png", f"{em.name} · {variant} knockouts · {cfg.padding} padding")
    write_outputs(out, table, summary, prompts=rows)
    return summary
