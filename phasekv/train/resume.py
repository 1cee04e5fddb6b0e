"""Continuing a run, apart from the loop: which settings win (`resolve_config`: the saved config, with only
runtime fields and a longer run allowed to change) and the state a fresh process takes over from the latest
checkpoint (`restore`: weights, optimizer, RNG, and the step whose data position it checks).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from phasekv.data.sources import DataConfig
from phasekv.errors import CheckpointError, ConfigError
from phasekv.model.io import load_state, read_weights
from phasekv.train import checkpoint as ck
from phasekv.train.config import TrainConfig
from phasekv.train.distributed import load_full_state
from phasekv.train.hfmodel import complete_tied

RUNTIME_FIELDS = {"device", "compile", "threads", "logger", "progress", "steps", "tokens", "out",
                  "val_every", "ckpt_every", "log_every", "keep_checkpoints"}


def apply_overrides(cfg: TrainConfig, overrides: dict) -> TrainConfig:
    """`cfg` with keyword overrides of its fields; data fields (`data`, `tokenizer`, `recall`, ...) go to its
    DataConfig, and a `recall` or `needle` dict overrides single fields of that layout."""
    d = cfg.to_dict()
    data = dict(d["data"])
    for k, v in overrides.items():
        if k == "data" and isinstance(v, DataConfig):
            data = v.to_dict()
        elif k == "data" and isinstance(v, dict):
            data.update(v)
        elif k == "data":
            data["data"] = v
        elif k in ("recall", "needle") and isinstance(v, dict):
            data[k] = {**data[k], **v}
        elif k in DataConfig.__dataclass_fields__:
            data[k] = v
        elif k in TrainConfig.__dataclass_fields__:
            d[k] = v
        else:
            raise ConfigError(f"unknown training option {k!r}")
    d["data"] = data
    return TrainConfig.from_dict(d)


def resolve_config(config: TrainConfig | None, resume: bool, overrides: dict) -> tuple[TrainConfig, bool]:
    """The run's config and whether it continues a checkpoint. With `resume`, the saved config wins and
    only runtime fields (and a longer `steps`/`tokens`) may change."""
    cfg = apply_overrides(config or TrainConfig(), overrides)
    out = Path(cfg.out)
    saved_path = out / "config.json"
    if not saved_path.is_file():
        return cfg, False
    if not resume:
        raise ConfigError(f"{out} already holds a training run; pass --resume to continue it or choose another --out")
    try:
        saved = TrainConfig.from_dict(json.loads(saved_path.read_text())["train"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{saved_path}: unreadable run config ({type(exc).__name__}: {exc})") from None
    new, old = cfg.to_dict(), saved.to_dict()
    data_given = any(x in overrides for x in ("data", *DataConfig.__dataclass_fields__))
    for k, v in old.items():
        if k not in RUNTIME_FIELDS and new[k] != v and (k in overrides or (k == "data" and data_given)):
            raise ConfigError(f"--resume: {k}={new[k]!r} differs from the saved run's {v!r} ({saved_path})")
    keep = {k: new[k] for k in RUNTIME_FIELDS if k in overrides or (config is not None and new[k] != old[k])}
    return apply_overrides(saved, keep), ck.latest_checkpoint(out) is not None


def restore(ckpt: Path, model, opt: torch.optim.Optimizer, device: torch.device, batch_size: int,
            hf: bool = False) -> tuple[int, float]:
    """Load the weights, optimizer state and RNG state of `ckpt`; returns (step, its last loss). `hf`: a
    transformers model, whose save_pretrained file leaves out tied weights."""
    state = ck.read_trainer_state(ckpt)
    extra = ck.read_optimizer(ckpt)
    weights = read_weights(ckpt / ck.WEIGHTS_FILE)
    if hf:
        weights = complete_tied(model, weights)
        load_state(model, weights, str(ckpt / ck.WEIGHTS_FILE))  # every tensor present, shapes checked
    load_full_state(model, opt, weights, extra["optimizer"], strict=not hf)
    torch.set_rng_state(extra["rng"]["torch"])
    if device.type == "cuda" and extra["rng"].get("cuda") is not None:
        torch.cuda.set_rng_state(extra["rng"]["cuda"])
    step = state["step"]
    if state["data_index"] != step * batch_size:
        raise CheckpointError(f"{ckpt}: data position {state['data_index']} does not match step {step} "
                              f"at batch_size={batch_size}")
    return step, state.get("loss", float("nan"))
