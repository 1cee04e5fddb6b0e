"""Gate cycling (the paper's Figure 6; docs: Explain the weak phases): move the gates' offset preferences, keep the payloads.

For W = S, cycling by delta sets Z~_i = Z_{(i - delta) mod W} and b~_i = b_{(i - delta) mod W} in every
compressed layer, key and value branch alike (`torch.roll` along the offset dim 0); payloads C_i stay.
The compressor variant says which parameters are offset-specific (`Compressor.cycled_params`): the paper's
Z_i and b_i; for DeepSeek-V4's compressor only the slot bias (`position_bias`, S slots: the two-half split of
a W = 2S CSA window stays), its projections are shared. On a transformers DeepSeek-V4 model the same roll
applies to the `position_bias` of every CSA and HCA compressor and of every CSA indexer's compressor;
phases are then positions mod the least common multiple of the layers' ratios (each layer's roll by delta
moves its own phases by delta too), and the boundary phase is its last.
If static gate preferences decide which phases are retrieved well, A_delta(r) ~ A_0((r - delta) mod S).
The test: R^2 (squared correlation) of predicted change A_0((r - delta) mod S) - A_0(r) against observed
change A_delta(r) - A_0(r) over the phases r other than the boundary phase, with a bootstrap 95% interval
over key-name mappings (clean and cycled runs resampled together).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from phasekv.analysis.common import as_eval_model, prompt_config, provenance, write_outputs
from phasekv.attention.compressor import cyclable
from phasekv.errors import ConfigError
from phasekv.eval.run import evaluate
from phasekv.eval.stats import bootstrap_profiles, group_table
from phasekv.model.hf import compression_layout, v4_sites
from phasekv.model.transformer import PhaseLM
from phasekv.progress import progress_bar


def check_cyclable(model) -> None:
    """Gate cycling needs offset-specific gate parameters with one row per phase: W = S (the paper's Z_i,
    b_i), or V4's S-slot bias at any window."""
    if not isinstance(model, PhaseLM):
        if not gate_params(model):
            raise ConfigError(f"{type(model).__name__}: gate cycling needs a compressed phasekv model or a "
                              f"DeepSeek-V4 model with compressors")
        return
    cfg = model.config
    if not cyclable(cfg):
        raise ConfigError(f"{cfg.name}: gate cycling needs a compressed model with offset-specific gate parameters "
                          f"and W = S (window {cfg.window}, stride {cfg.stride}) or V4's slot bias (not uniform "
                          f"averaging, nor a V4 compressor without its slot bias)")


def gate_params(model) -> list[torch.nn.Parameter]:
    """Offset-specific gate parameters of every compressed layer and branch (the variant's; every V4
    compressor's `position_bias` on a transformers model); offsets are dim 0."""
    if not isinstance(model, PhaseLM):
        return [site.module.position_bias for site in v4_sites(model)]
    return [p for block in model.layers if block.attn.compressor is not None
            for p in block.attn.compressor.cycled_params()]


def cycle_stride(model) -> int:
    """The phase period of cycling: the stride S, or the lcm of a transformers V4 model's ratios."""
    return model.config.stride if isinstance(model, PhaseLM) else compression_layout(model.config).period


@torch.no_grad()
def cycle_gates_(model, delta: int) -> None:
    """Cycle in place: Z_i <- Z_{(i - delta) mod W}, b_i <- b_{(i - delta) mod W}."""
    check_cyclable(model)
    for p in gate_params(model):
        p.copy_(torch.roll(p, delta, dims=0))


@contextmanager
def cycled(model, delta: int) -> Iterator[None]:
    """The model with its gates cycled by delta inside the block; the original parameters restored after
    (copied back, so the model is bit-for-bit the same)."""
    check_cyclable(model)
    saved = [p.detach().clone() for p in gate_params(model)]
    cycle_gates_(model, delta)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(gate_params(model), saved, strict=True):
                p.copy_(s)


def boundary_phase(model) -> int:
    """Phase of the last token of a window (S - 1 unless the grid is staggered), on layer 0's grid (a
    transformers V4 model: the last phase mod the lcm of its ratios, where every layer's windows end)."""
    if not isinstance(model, PhaseLM):
        return cycle_stride(model) - 1
    return model.layers[0].attn.grid.boundary_phase()


def predicted(acc0: np.ndarray, delta: int) -> np.ndarray:
    """A_0((r - delta) mod S) for profiles acc0 (..., S)."""
    return np.roll(acc0, delta, axis=-1)


def r_squared(acc0: np.ndarray, acc: np.ndarray, delta: int, keep: np.ndarray) -> np.ndarray:
    """Squared correlation of predicted vs observed change over the phases in `keep` (S,) bool, for
    profiles (..., S); NaN where either change is constant."""
    pred = (predicted(acc0, delta) - acc0)[..., keep]
    obs = (acc - acc0)[..., keep]
    pc = pred - pred.mean(-1, keepdims=True)
    oc = obs - obs.mean(-1, keepdims=True)
    den = np.sqrt((pc**2).sum(-1) * (oc**2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 1e-12, (pc * oc).sum(-1) / den, np.nan) ** 2


def cycling_stats(rows0, rows, stride: int, delta: int, boundary: int, n_boot: int = 2000,
                  seed: int = 0) -> dict:
    """Per-phase accuracies of the clean (rows0) and cycled (rows) runs and the R^2 with its bootstrap
    interval. rows*: per-prompt tables with `phase`, `mapping`, `correct` on the same prompts."""
    h0, t0 = group_table(rows0["phase"], rows0["mapping"], rows0["correct"], stride)
    h1, t1 = group_table(rows["phase"], rows["mapping"], rows["correct"], stride)
    if h0.shape != h1.shape:
        raise ConfigError("clean and cycled runs must evaluate the same prompts")
    acc0, acc = h0.sum(0) / t0.sum(0), h1.sum(0) / t1.sum(0)  # (S,)
    keep = np.arange(stride) != boundary
    boot = bootstrap_profiles(np.hstack([h0, h1]), np.hstack([t0, t1]), n_boot=n_boot, seed=seed)  # (B, 2S)
    r2_boot = r_squared(boot[:, :stride], boot[:, stride:], delta, keep)
    r2_boot = r2_boot[np.isfinite(r2_boot)]
    ci = np.percentile(r2_boot, [2.5, 97.5]).tolist() if r2_boot.size else [float("nan")] * 2
    acc_boot = np.percentile(boot[:, stride:], [2.5, 97.5], axis=0)  # (2, S) band of the cycled profile
    return {"acc0": acc0, "acc": acc, "pred": predicted(acc0, delta), "lo": acc_boot[0], "hi": acc_boot[1],
            "r2": float(r_squared(acc0, acc, delta, keep)), "r2_ci": ci, "n_boot": n_boot}


@torch.no_grad()
def run_cycling(model, tok, cfg, deltas, pids=None, batch_size: int = 32, n_boot: int = 2000,
                advance=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Evaluate the uncycled model and every cycle delta on lookup prompts `cfg`.

    Returns (profiles, rows): one row per (delta, phase) with acc0, acc, pred, lo, hi, r2, r2_lo, r2_hi;
    and the per-prompt rows (column delta)."""
    check_cyclable(model)
    S, boundary = cycle_stride(model), boundary_phase(model)
    frames = []
    for d in [0, *[d for d in deltas if d != 0]]:
        with cycled(model, d):
            rows = evaluate(model, tok, cfg, pids, batch_size=batch_size)
        frames.append(rows.assign(delta=d, phase=rows["target_pos"] % S))
        if advance is not None:
            advance(1)
    rows0 = frames[0]
    prof = []
    for rows in frames:
        d = int(rows["delta"].iloc[0])
        st = cycling_stats(rows0, rows, S, d, boundary, n_boot=n_boot, seed=cfg.seed)
        for r in range(S):
            prof.append({"delta": d, "phase": r, "boundary": r == boundary, "acc0": st["acc0"][r],
                         "acc": st["acc"][r], "pred": st["pred"][r], "lo": st["lo"][r], "hi": st["hi"][r],
                         "r2": st["r2"] if d else np.nan, "r2_lo": st["r2_ci"][0] if d else np.nan,
                         "r2_hi": st["r2_ci"][1] if d else np.nan})
    return pd.DataFrame(prof), pd.concat(frames, ignore_index=True)


def analyze_cycle(ems, cfg, out, deltas=(-3, -2, -1, 1, 2, 3), batch_size: int = 32, n_boot: int = 2000,
                  progress: bool = True) -> dict:
    """Gate cycling of one or more W = S phasekv models (EvalModels or directories) on lookup prompts `cfg`
    (default: the study's lookup test): writes OUT/results.parquet (model, delta, phase),
    OUT/prompts.parquet, OUT/summary.json (R^2 grid with 95% bootstrap intervals), OUT/r2_grid.png and
    OUT/cycling_<i>.png per model; returns the summary."""
    from phasekv.analysis.figures import cycling_figure, r2_grid  # matplotlib on use, not at start-up

    ems = [as_eval_model(m) for m in (ems if isinstance(ems, (list, tuple)) else [ems])]
    cfg = prompt_config(cfg)
    for em in ems:
        check_cyclable(em.model)
        if cfg.modulus % cycle_stride(em.model):
            raise ConfigError(f"{em.name}: the phase period {cycle_stride(em.model)} must divide the prompts' "
                              f"modulus {cfg.modulus} (pass --modulus)")
    if not [d for d in deltas if d != 0]:
        raise ConfigError("give at least one non-zero cycle delta")
    out = Path(out)
    profiles, prompts, models = [], [], []
    n_runs = len(ems) * (1 + len({d for d in deltas if d != 0}))
    with progress_bar(progress, n_runs, "gate cycling") as advance:
        for i, em in enumerate(ems):
            prof, rows = run_cycling(em.model, em.tok, cfg, deltas, batch_size=batch_size, n_boot=n_boot,
                                     advance=advance)
            name = em.name if em.name not in [m["model"] for m in models] else f"{em.name} ({i})"
            profiles.append(prof.assign(model=name))
            prompts.append(rows.assign(model=name))
            boundary = boundary_phase(em.model)
            cycling_figure(prof, out / f"cycling_{i}.png", f"{name} · gate cycling", boundary)
            models.append({"model": name, "boundary_phase": boundary, "figure": f"cycling_{i}.png",
                           "provenance": provenance(em, cfg)})
    results = pd.concat(profiles, ignore_index=True)
    grid = results[results["delta"] != 0].groupby(["model", "delta"], sort=False)[["r2", "r2_lo", "r2_hi"]].first()
    grid = grid.reset_index()
    r2_grid(grid, out / "r2_grid.png")
    summary = {
        "analysis": "cycle", "deltas": sorted({int(d) for d in deltas if d != 0}), "n_boot": n_boot,
        "r2": "squared correlation of predicted vs observed change per phase, boundary phase excluded; "
              "95% bootstrap interval over key-name mappings",
        "grid": grid.to_dict(orient="records"), "models": models,
        "prompt_config": cfg.to_dict(),
    }
    write_outputs(out, results, summary, prompts=pd.concat(prompts, ignore_index=True))
    return summary
