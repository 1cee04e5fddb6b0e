"""Shared plumbing of the analyses: output files (atomic), provenance, progress bars, prompt batches."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import torch

from phasekv.eval.models import EvalModel, load
from phasekv.eval.prompts import PromptConfig, RetrievalPrompts, lookup_config
from phasekv.eval.run import versions
from phasekv.io import jsonable, write_parquet, write_text


def as_eval_model(model, device: str | None = None):
    """An EvalModel from an EvalModel or a model directory (`phasekv.eval.models.load`)."""
    if isinstance(model, EvalModel):
        return model
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return load(model, device=dev)


def prompt_config(cfg: PromptConfig | None) -> PromptConfig:
    """The study's lookup test unless a prompt config is given."""
    return lookup_config() if cfg is None else cfg


def provenance(em, cfg: PromptConfig, **extra) -> dict:
    """Seeds, versions, prompt config and model info of an analysis."""
    return {"model": em.name, "model_kind": em.kind, "model_info": em.info, "prompt_seed": cfg.seed,
            "prompt_config": cfg.to_dict(), "torch_threads": torch.get_num_threads(), "versions": versions(), **extra}


def write_outputs(out: Path, results: pd.DataFrame, summary: dict, **tables: pd.DataFrame) -> None:
    """OUT/results.parquet (+ OUT/<name>.parquet for each extra table) and OUT/summary.json, each atomic;
    summary.json is written last, so its presence marks a complete analysis."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, df in {"results": results, **tables}.items():
        write_parquet(out / f"{name}.parquet", df)
    write_text(out / "summary.json", json.dumps(jsonable(summary), indent=2, default=str))


def prompt_batches(prompts: RetrievalPrompts, pids: list[int], batch_size: int, device) -> Iterator[torch.Tensor]:
    """Token ids (B, T) of the prompts `pids`, in batches (equal lengths: no padding)."""
    for s in range(0, len(pids), batch_size):
        yield torch.tensor([prompts.prompt(p).ids for p in pids[s : s + batch_size]], dtype=torch.long, device=device)
