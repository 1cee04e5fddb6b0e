"""Gate concentration and gate scores by phase (the paper's Figures 4 and 5; docs: Explain the weak phases).

For every compressed layer, KV head and branch (key, value), over the complete windows of many prompts:

    static      exp(H(E[alpha]))    effective offsets of the window-averaged gate (1..W)
    per_window  E[exp(H(alpha))]    average effective offsets of single windows (1..W)

(one implementation: `phasekv.model.concentration`). Vector gates are measured per channel, then
averaged over channels. Offset i of a window whose grid starts at phase o sits at phase (o + i) mod S; with
overlapping windows (W > S) several offsets share a phase, and the same measures on alpha pooled by phase
are effective phases (1..S). The gate score by phase relative to uniform is E[sum of alpha over the phase's
offsets] / (its share of offsets); the value gate is shifted back one offset (its offset i counts for the
phase of i - 1), so a head that keeps a key together with its successor peaks at the same phase in both.

On a transformers DeepSeek-V4 model every CSA and HCA compressor is read (branch "key": its entry is key
and value) and every CSA indexer's compressor (branch "indexer"), each on its own grid (W = 2S for CSA,
W = S for HCA, S = the layer's compression ratio), through `phasekv.model.gates`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from phasekv.analysis.common import (
    as_eval_model,
    prompt_batches,
    prompt_config,
    provenance,
    write_outputs,
)
from phasekv.analysis.knockout import spread_pids
from phasekv.attention.compressor import learned_gates
from phasekv.attention.positions import Grid
from phasekv.errors import ConfigError, DataError
from phasekv.eval.prompts import RetrievalPrompts
from phasekv.model.concentration import concentration
from phasekv.model.gates import GateRead, gate_grids, gate_scores
from phasekv.model.transformer import PhaseLM
from phasekv.progress import progress_bar

BRANCHES = ("key", "value")
V4_BRANCHES = {"key": "CSA/HCA compressor (its entry is key and value)", "indexer": "the CSA indexer's compressor"}


def offset_phases(window: int, stride: int, grid_offset: int = 0, shift: int = 0) -> np.ndarray:
    """Phase (W,) of each window offset on a grid starting at `grid_offset` (`Grid.offset_phase`), counted
    `shift` offsets back (shift = 1 for the value gate)."""
    return Grid(window, stride, grid_offset - shift).offset_phase(torch.arange(window)).numpy()


def pool_phases(alpha: torch.Tensor, phases: np.ndarray, stride: int) -> torch.Tensor:
    """alpha (..., W, n_kv, G) -> (..., S, n_kv, G): gate mass summed over the offsets of each phase."""
    onehot = torch.zeros(len(phases), stride, dtype=alpha.dtype, device=alpha.device)
    onehot[torch.arange(len(phases)), torch.as_tensor(phases)] = 1.0  # (W, S)
    return torch.einsum("...wkg,ws->...skg", alpha, onehot)


def head_delay(model, kv: int) -> int:
    """Tokens by which KV head `kv`'s windows start before its layer's grid (staggered heads; 0 otherwise)."""
    return model.config.head_delay(kv) if isinstance(model, PhaseLM) else 0


def compressed_layers(model) -> list[int]:
    return sorted({layer for layer, _ in gate_grids(model)})


def gate_kind(model) -> str:
    """The gate kind of a model's compressors: PhaseLM's `gate`; vector for DeepSeek-V4's per-channel gates."""
    return model.config.gate if isinstance(model, PhaseLM) else "vector"


@torch.no_grad()
def collect_alpha(model, batches, progress=None) -> dict[tuple[int, str], torch.Tensor]:
    """Gate scores of every complete window of every prompt: {(layer, branch): alpha (N, W, n_kv, G)}.

    batches: iterable of input ids (B, T); scores are read inside the forward (`phasekv.model.gates`).
    """
    out: dict[tuple[int, str], list[torch.Tensor]] = {}

    def read(r: GateRead) -> None:
        out.setdefault((r.layer, r.branch), []).append(r.alpha.flatten(0, 1).double().cpu())  # (B*n, W, n_kv, G)

    with gate_scores(model, read):
        for ids in batches:
            model(ids)
            if progress is not None:
                progress(ids.shape[0])
    return {k: torch.cat(v) for k, v in out.items()}


def gate_stats(model, alphas: dict[tuple[int, str], torch.Tensor]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(heads, phases): one row per (layer, kv_head, branch) with both concentrations at the offset and
    the phase level; one row per (layer, kv_head, branch, phase) with the gate score relative to uniform."""
    grids, gate = gate_grids(model), gate_kind(model)
    heads, phases = [], []
    for (layer, branch), alpha_all in sorted(alphas.items()):
        for kv in range(alpha_all.shape[2]):  # each KV head on its own grid (staggered heads start early)
            alpha = alpha_all[:, :, kv : kv + 1]  # (N, W, 1, G)
            W, S = grids[layer, branch].window, grids[layer, branch].stride
            o = grids[layer, branch].offset - head_delay(model, kv)
            ph = offset_phases(W, S, o, shift=1 if branch == "value" else 0)
            static, per_window = concentration(alpha)  # (1,) in [1, W]
            pooled = pool_phases(alpha, offset_phases(W, S, o), S)
            static_ph, per_window_ph = concentration(pooled)  # (1,) in [1, S]
            share = np.bincount(ph, minlength=S) / W  # uniform mass of each phase
            score = pool_phases(alpha, ph, S).mean(dim=(0, 3)).numpy() / share[:, None]  # (S, 1)
            by_offset = alpha.mean(dim=(0, 3)).numpy() * W  # (W, 1), 1 = uniform
            heads.append({
                "layer": layer, "kv_head": kv, "branch": branch, "gate": gate, "window": W, "stride": S,
                "grid_offset": o, "n_windows": int(alpha.shape[0]), "channels": int(alpha.shape[3]),
                "static": float(static[0]), "per_window": float(per_window[0]),
                "static_phase": float(static_ph[0]), "per_window_phase": float(per_window_ph[0]),
                "peak_offset": int(np.argmax(by_offset[:, 0])), "peak_phase": int(np.argmax(score[:, 0])),
                "offset_scores": by_offset[:, 0].round(6).tolist(),
            })
            for p in range(S):
                phases.append({"layer": layer, "kv_head": kv, "branch": branch, "phase": p,
                               "score_rel": float(score[p, 0]), "shifted": branch == "value"})
    return pd.DataFrame(heads), pd.DataFrame(phases)


def alignment(heads: pd.DataFrame, phases: pd.DataFrame, ko: pd.DataFrame) -> list[dict]:
    """Do static gate preferences line up with knockout losses? Per KV head: the phase its key gate (and its
    shifted value gate) favours most, the phase its knockout hurts most, and the Pearson correlation across
    phases of the gate score with the knockout loss (-rel_change)."""
    out = []
    t = ko[(ko["grouping"] == "phase") & (ko["kv_head"] >= 0)]
    for h in heads[heads["branch"] == "key"].itertuples():
        loss = -t[(t["layer"] == h.layer) & (t["kv_head"] == h.kv_head)].sort_values("group")["rel_change"].to_numpy()
        if loss.size == 0:
            continue
        ok = np.isfinite(loss)
        row = {"layer": int(h.layer), "kv_head": int(h.kv_head), "static": float(h.static),
               "static_phase": float(h.static_phase),
               "ko_worst_phase": int(np.nanargmax(loss)) if ok.any() else None,
               "ko_max_loss": float(np.nanmax(loss)) if ok.any() else None}
        for b in BRANCHES:
            sc = phases[(phases["layer"] == h.layer) & (phases["kv_head"] == h.kv_head) & (phases["branch"] == b)]
            if sc.empty:
                continue
            score = sc.sort_values("phase")["score_rel"].to_numpy()
            varied = ok.sum() > 2 and score[ok].std() > 0 and loss[ok].std() > 0
            r = np.corrcoef(score[ok], loss[ok])[0, 1] if varied else np.nan
            row[f"{b}_peak_phase"] = int(np.argmax(score))
            row[f"{b}_loss_corr"] = float(r)
        out.append(row)
    return out


def grid_summary(heads: pd.DataFrame) -> dict:
    """window / stride of the model's gates (None where layers differ: DeepSeek-V4's CSA and HCA), whether
    windows overlap, and every (layer, branch)'s grid."""
    one = {c: int(heads[c].iloc[0]) if heads[c].nunique() == 1 else None for c in ("window", "stride")}
    grids = heads.drop_duplicates(["layer", "branch"])
    return {**one, "overlapping": bool((heads["window"] > heads["stride"]).any()),
            "grids": {f"L{r.layer}.{r.branch}": {"window": int(r.window), "stride": int(r.stride),
                                                 "grid_offset": int(r.grid_offset)} for r in grids.itertuples()}}


def read_gate_paths(run_dir: str | Path) -> pd.DataFrame | None:
    """Training paths from a run's `gates.jsonl` (rows: step, layer, kv_head, branch, static, per_window),
    or None when the run has none."""
    path = Path(run_dir) / "gates.jsonl"
    if not path.is_file():
        return None
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise DataError(f"{path}:{n}: not a JSON line") from None
    if not rows:
        return None
    df = pd.DataFrame(rows)
    need = {"step", "layer", "kv_head", "branch", "static", "per_window"}
    if not need <= set(df.columns):
        raise DataError(f"{path}: gate snapshots lack columns {sorted(need - set(df.columns))}")
    return df.sort_values(["layer", "kv_head", "branch", "step"]).reset_index(drop=True)


def analyze_gates(em, cfg, out, n_prompts: int = 256, batch_size: int = 32, knockout: str | Path | None = None,
                  trace: int = 0, progress: bool = True) -> dict:
    """Gate concentration and scores by phase of a phasekv model (EvalModel or directory) over the windows of
    `n_prompts` lookup prompts `cfg` (default: the study's lookup test): writes OUT/results.parquet (one row per layer, KV head, branch, phase), OUT/heads.parquet,
    OUT/summary.json, OUT/concentration_plane.png (with the training paths of every key gate, or of the `trace` most
    statically concentrated ones, when the model dir is a run with gates.jsonl) and OUT/gate_panel.png (with the
    knockout column when `knockout` names a knockout analysis dir); returns the summary."""
    from phasekv.analysis.figures import concentration_plane, head_panel  # matplotlib on use, not at start-up

    em, cfg = as_eval_model(em), prompt_config(cfg)
    model = em.model
    if not gate_grids(model):
        raise ConfigError(f"{em.name}: gate analyses need a compressed phasekv model or a DeepSeek-V4 model")
    prompts = RetrievalPrompts(cfg, em.tok)
    pids = spread_pids(len(prompts), n_prompts)
    with progress_bar(progress, len(pids), f"gates · {em.name}") as advance:
        alphas = collect_alpha(model, prompt_batches(prompts, pids, batch_size, em.device), advance)
    if not alphas:
        raise ConfigError(f"{em.name}: prompts of {prompts.length} tokens hold no complete window")
    heads, phases = gate_stats(model, alphas)
    results = phases.merge(heads.drop(columns=["offset_scores"]), on=["layer", "kv_head", "branch"])
    paths = read_gate_paths(em.info.get("path", ""))  # a run's gates.jsonl (phasekv or `train --hf-config`)
    key = heads[heads["branch"] == "key"].sort_values("static")
    traced = [tuple(map(int, x)) for x in key[["layer", "kv_head"]].to_numpy()[: trace or None]]
    ko = None
    if knockout is not None:
        kpath = Path(knockout) / "results.parquet"
        if not kpath.is_file():
            raise DataError(f"{kpath}: no knockout results (run `phasekv analyze knockout` first)")
        ko = pd.read_parquet(kpath)
    gate = gate_kind(model)
    summary = {
        "analysis": "gates", "model": em.name, **grid_summary(heads), "gate": gate,
        "n_prompts": len(pids), "n_windows": {f"L{k[0]}.{k[1]}": int(v.shape[0]) for k, v in alphas.items()},
        "vector_gates": "per channel, then averaged over channels" if gate == "vector" else None,
        "branches": None if isinstance(model, PhaseLM) else V4_BRANCHES,
        "phase_level": "static_phase / per_window_phase pool the offsets of each phase: effective phases in "
                       "[1, stride]",
        "value_shift": "value gate scores are shifted back one offset (offset i counts for phase of i - 1)",
        "heads": heads.to_dict(orient="records"),
        "training_paths": None if paths is None else {
            "steps": sorted(set(paths["step"].tolist())), "traced": [f"L{a}·KV{b}" for a, b in traced],
            "source": "the run's gates.jsonl (its probe batch); plane points: these lookup prompts"},
        "knockout": str(knockout) if knockout is not None else None,
        "alignment": alignment(heads, phases, ko) if ko is not None else None,
        "provenance": provenance(em, cfg, prompt_ids=f"{len(pids)} spread over {len(prompts)}"),
    }
    out = Path(out)
    if not isinstance(model, PhaseLM) or learned_gates(model.config):  # V4 gates are always learned
        concentration_plane(heads, paths, out / "concentration_plane.png",
                            f"{em.name} · key gates" + (" (per channel, averaged)" if gate == "vector" else ""),
                            traced)
    head_panel(heads, phases, ko, out / "gate_panel.png", f"{em.name} · gates beside knockouts")
    write_outputs(out, results, summary, heads=heads)
    return summary
