"""A small study directory with planted results in the layout `phasekv demo` writes (no model is trained).

Compressed models get a weak boundary phase S-1 at every stride period; full attention is flat. Summaries
are computed with the evaluation room's real statistics (`phasekv.eval.stats.summarize`).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from phasekv.config import ModelConfig  # noqa: E402
from phasekv.eval.stats import summarize  # noqa: E402
from phasekv.report.layout import Layout  # noqa: E402

MODELS = ["full-1kv", "w8s8-1kv", "w8s4-1kv", "w8s8-1kv-uniform", "w6s6-1kv"]
M, MAPPINGS, PER_MAPPING = 24, 8, 6


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1))


def planted_accuracy(cfg: ModelConfig) -> np.ndarray:
    r = np.arange(M)
    if not cfg.compressed:  # every prompt right: flat by equivalence even at this fixture's 48 prompts per group
        return np.full(M, 1.0)
    low = 0.05 if cfg.gate == "uniform" else 0.1
    high = 0.6 if cfg.gate == "uniform" else 0.9
    return np.where(r % cfg.stride == cfg.stride - 1, low, high)


def lookup_stage(out: Path, cfg: ModelConfig, padding: str, rng: np.random.Generator) -> None:
    acc = planted_accuracy(cfg)
    rows = []
    for mapping in range(MAPPINGS):
        for r in range(M):
            for k in range(PER_MAPPING):
                pos = 48 + r + M * k
                ok = bool(rng.random() < acc[r])
                rows.append({"residue": r, "target_pos": pos, "query_pos": 300, "mapping": mapping, "correct": ok,
                             "prob": float(np.clip(acc[r] + rng.normal(0, 0.05), 0, 1)), "protocol": padding})
    df = pd.DataFrame(rows)
    s = summarize(df.residue, df.mapping, df.correct, M, cfg.stride or None, n_boot=300, n_perm=400)
    summary = {"model": cfg.name, "protocol": padding, "modulus": M, "stride": cfg.stride or None, "records": 16,
               **s.to_dict(), "provenance": {"seed": 0, "fixture": True}}
    out.mkdir(parents=True, exist_ok=True)
    df.to_parquet(out / "results.parquet", index=False)
    _write(out / "summary.json", summary)


def run_dir(out: Path, cfg: ModelConfig, rng: np.random.Generator) -> None:
    _write(out / "config.json", {"train": {"preset": "tiny", "steps": 200, "tokens": 200 * 64 * 80, "seed": 42},
                                 "model": {"name": cfg.name, **cfg.to_dict()}})
    steps = np.arange(10, 210, 10)
    with open(out / "metrics.jsonl", "w") as f:
        for s in steps:
            f.write(json.dumps({"step": int(s), "loss": float(5 * np.exp(-s / 60) + 0.5)}) + "\n")
        f.write(json.dumps({"step": 200, "val_loss": 0.61}) + "\n")
    if cfg.compressed and cfg.gate != "uniform":
        with open(out / "gates.jsonl", "w") as f:
            for s in (1, 10, 100, 200):
                for layer in range(2):
                    for branch in ("key", "value"):
                        t = np.log10(s) / np.log10(200)
                        f.write(json.dumps({"step": s, "layer": layer, "kv_head": 0, "branch": branch,
                                            "static": cfg.window - t * (cfg.window - 2 - layer),
                                            "per_window": cfg.window - t * (cfg.window - 1.5 - layer)}) + "\n")
    _write(out / "done.json", {"step": 200, "seconds": float(rng.uniform(60, 120))})


def analysis_stages(lay: Layout, alias: str, cfg: ModelConfig, rng: np.random.Generator) -> None:
    """Knockout effect tables from planted per-prompt rows (the mechanism room's `effect_table`), gate
    statistics and a cycling grid in the mechanism room's schemas."""
    from phasekv.analysis.knockout import effect_table

    acc = planted_accuracy(cfg)
    S = cfg.stride
    rows = []
    for unit, layer in (("clean", -1), ("L0", 0), ("L1", 1)):
        for r in range(M):
            # layer 1's knockout loses phase 2 (mod S) only; layer 0's costs a little everywhere
            a = acc[r] * (0.2 if (layer == 1 and S and r % S == 2) else 0.9 if layer == 0 else 1.0)
            for k in range(8):
                rows.append({"unit": unit, "layer": layer, "kv_head": 0 if layer >= 0 else -1,
                             "target_pos": 48 + r + M * k, "correct": bool(rng.random() < a)})
    out = lay.analysis("knockout", alias)
    out.mkdir(parents=True, exist_ok=True)
    effect_table(pd.DataFrame(rows), M, S or None).to_parquet(out / "results.parquet", index=False)
    _write(out / "summary.json", {"analysis": "knockout", "model": cfg.name, "modulus": M, "stride": S or None})
    if not cfg.compressed or cfg.gate == "uniform":
        return
    gates = [{"layer": layer, "kv_head": 0, "branch": branch, "phase": p, "shifted": branch == "value",
              "score_rel": 1.6 if p == 2 else 0.9, "static": 2.0 + layer, "per_window": 1.5 + layer}
             for layer in range(2) for branch in ("key", "value") for p in range(S)]
    out = lay.analysis("gates", alias)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(gates).to_parquet(out / "results.parquet", index=False)
    _write(out / "summary.json", {"analysis": "gates", "model": cfg.name})
    if cfg.window != S:
        return
    base = acc[:S]
    prof = [{"model": cfg.name, "delta": d, "phase": r, "boundary": r == S - 1, "acc0": base[r],
             "acc": float(base[(r - d) % S] - 0.03), "pred": float(base[(r - d) % S]),
             "lo": float(base[(r - d) % S] - 0.1), "hi": float(min(base[(r - d) % S] + 0.05, 1)),
             "r2": np.nan if d == 0 else 0.9 - 0.05 * abs(d), "r2_lo": np.nan if d == 0 else 0.7,
             "r2_hi": np.nan if d == 0 else 0.99} for d in range(-2, 3) for r in range(S)]
    out = lay.analysis("cycle", alias)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(prof).to_parquet(out / "results.parquet", index=False)
    _write(out / "summary.json", {"analysis": "cycle", "grid": [
        {"model": cfg.name, "delta": d, "r2": 0.9 - 0.05 * abs(d), "r2_lo": 0.7, "r2_hi": 0.99} for d in (-2, -1, 1, 2)]})


def flip_stage(out: Path, cfg: ModelConfig) -> None:
    rows, fams = [], {}
    for fam in ("words", "repeat:="):
        winners = []
        for length in range(16):
            p = 0.8 if cfg.stride and length % cfg.stride in (0, 1) else 0.3
            winners.append(" anna" if p > 0.5 else " ben")
            rows += [{"family": fam, "length": length, "candidate": " anna", "prob": p, "top": p > 0.5},
                     {"family": fam, "length": length, "candidate": " ben", "prob": 1 - p, "top": p <= 0.5}]
        fams[fam] = {"winners": winners, "follow": 16 if cfg.stride else None}
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(out / "results.parquet", index=False)
    _write(out / "summary.json", {"task": "flip", "model": cfg.name, "stride": cfg.stride or None,
                                  "candidates": [" anna", " ben"], "families": fams, "rankings": 32,
                                  "follow_pattern": 32 if cfg.stride else None, "switching": bool(cfg.stride)})


def theory_stage(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"position": [1, 2, 3], "accuracy": [1.0, 1.0, 0.0]}).to_parquet(out / "results.parquet")
    _write(out / "summary.json", {"check": "coverage: positions no head selected are weak phases",
                                  "claim_reproduced": True, "settings": [{"setting": "N=64 S=4"}]})
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.bar([1, 2, 3], [1.0, 1.0, 0.0])
    fig.savefig(out / "accuracy_by_position.png", dpi=50)
    plt.close(fig)


def compare_stage(out: Path) -> None:
    """A `phasekv compare` summary (schema phasekv.compare/1) over two of the models."""
    from phasekv.mitigate.compare import ROW_FIELDS

    rows = []
    for name, role, cache, gap in (("Full attention · 1 KV", "reference", 1.0, 5.0), ("W8/S8 · 1 KV", "baseline", 0.16, 80.0)):
        r = dict.fromkeys(ROW_FIELDS)
        r.update(label=name, model=name, role=role, cache_rel=cache, compression=1 / cache, train_cost_rel=1.1,
                 decode_cost_rel=0.9, mean=60.0, mean_ci=[55.0, 65.0], worst=10.0, worst_ci=[5.0, 15.0],
                 worst_residue=7, best=90.0, gap=gap, gap_ci=[gap - 5, gap + 5], detected_period=8, pareto=True)
        rows.append(r)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(out / "results.parquet")
    _write(out / "summary.json", {"schema": "phasekv.compare/1", "task": "lookup", "protocol": "prefix", "modulus": M,
                                  "context": 32768, "models": rows, "criteria": {"note": "fixture: no mitigations"}})


def make_study(root: Path, seed: int = 0, models: list[str] = MODELS) -> Path:
    rng = np.random.default_rng(seed)
    lay = Layout(root)
    for alias in models:
        cfg = ModelConfig.from_name(alias, preset="tiny")
        run_dir(lay.run(alias), cfg, rng)
        for padding in ("prefix", "in-sequence"):
            if padding == "prefix" or cfg.compressed:
                lookup_stage(lay.lookup(padding, alias), cfg, padding, rng)
        analysis_stages(lay, alias, cfg, rng)
        if alias in ("full-1kv", "w8s4-1kv"):
            flip_stage(lay.flip(alias), cfg)
    theory_stage(lay.theory / "coverage")
    compare_stage(lay.compare)
    words = ["the", "cat", "anna", "dog", "ben", "cat"]
    _write(lay.examples, {"examples": [{"title": "prefix padding, residue 1", "words": words,
                                        "highlight": {"target": [1], "answer": [2], "query": [5]}}]})
    _write(lay.manifest, {"mode": "fixture", "preset": "tiny", "seconds": 123.0, "threads": 1,
                          "models": {a: {} for a in models}})
    return root
