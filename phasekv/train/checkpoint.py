"""Training checkpoints, written atomically (`phasekv.io.atomic_dir`), and the layout of a run directory.

A run directory:

    config.json        training config + model config + tokenizer summary + versions
    tokenizer.json     the run's tokenizer
    metrics.jsonl      one JSON object per logged step / validation
    gates.jsonl        gate concentration snapshots (one row per step, layer, KV head, branch)
    checkpoints/step_00000500/   config.json + model.safetensors (a `PhaseLM.save` directory, loadable alone;
                                 for a transformers model a `save_pretrained` directory with its tokenizer),
                                 optimizer.pt, trainer_state.json (step, data position, RNG states)
    done.json          written when the run reached its last step

A checkpoint is written into `checkpoints/.tmp-step_N/` and renamed to `step_N` only when complete, so a
crash mid-write leaves the previous checkpoint untouched and the temp directory is ignored (and removed
by the next save). Each checkpoint's `manifest.json` holds the sha256 of its files; the run's latest
checkpoint is the newest complete `step_*` directory whose files match it (a corrupt one is skipped
with a warning naming the bad file).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import safetensors.torch
import torch

from phasekv.errors import CheckpointError
from phasekv.io import atomic_dir, remove_dir
from phasekv.model.io import CONFIG_FILE, WEIGHTS_FILE
from phasekv.model.manifest import verify_manifest, write_manifest

CKPT_DIR = "checkpoints"
STATE_FILE, OPTIM_FILE = "trainer_state.json", "optimizer.pt"
_STEP = re.compile(r"step_(\d+)$")


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CKPT_DIR / f"step_{step:08d}"


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    out = [p for p in root.iterdir() if p.is_dir() and _STEP.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(out, key=lambda p: int(_STEP.match(p.name).group(1)))


def latest_checkpoint(run_dir: str | os.PathLike, verify: bool = True) -> Path | None:
    """Newest complete checkpoint; with `verify`, the newest whose files match its manifest (falls back past
    corrupt ones with a warning; CheckpointError when checkpoints exist but none is intact)."""
    ckpts = list_checkpoints(run_dir)
    if not verify:
        return ckpts[-1] if ckpts else None
    bad = []
    for ckpt in reversed(ckpts):
        try:
            verify_manifest(ckpt)
            return ckpt
        except CheckpointError as exc:
            bad.append(str(exc))
            warnings.warn(f"{exc}; skipping checkpoint {ckpt.name}, falling back to the previous one", stacklevel=2)
    if bad:
        raise CheckpointError(f"{Path(run_dir)}: no intact checkpoint ({'; '.join(bad)})")
    return None


def phaselm_writer(model_state: dict, model_config_json: str) -> Callable[[Path], list[str]]:
    """Writes a PhaseLM checkpoint's model files (weights, config); returns their names."""
    state = {k: v.detach().contiguous().cpu() for k, v in model_state.items()}

    def write(directory: Path) -> list[str]:
        safetensors.torch.save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
        (directory / CONFIG_FILE).write_text(model_config_json)
        return [WEIGHTS_FILE, CONFIG_FILE]

    return write


def save_checkpoint(run_dir: Path, step: int, write_model: Callable[[Path], list[str]], optim_state: dict,
                    trainer_state: dict, keep: int = 2) -> Path:
    """Write one checkpoint atomically (`phasekv.io.atomic_dir`): the model files (`write_model(dir)` returns
    their names), optimizer, trainer state, manifest; then prune to the newest `keep`."""
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a crash mid-write
        shutil.rmtree(stale, ignore_errors=True)
    final = step_dir(run_dir, step)
    try:
        with atomic_dir(final) as tmp:
            model_files = write_model(tmp)
            torch.save(optim_state, tmp / OPTIM_FILE)
            (tmp / STATE_FILE).write_text(json.dumps(trainer_state))  # marks the checkpoint complete
            write_manifest(tmp, [*model_files, OPTIM_FILE, STATE_FILE])  # sha256 of what is on disk
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        prev = latest_checkpoint(run_dir, verify=False)  # the partial write is already removed (space freed)
        raise OSError(errno.ENOSPC, f"no space left on device while writing checkpoint {final.name}; "
                      f"the previous checkpoint ({prev.name if prev else 'none'}) is intact", str(root)) from exc
    for old in list_checkpoints(run_dir)[:-keep]:
        remove_dir(old)
    return final


def read_trainer_state(ckpt: Path) -> dict:
    try:
        return json.loads((ckpt / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{ckpt / STATE_FILE}: unreadable trainer state ({exc})") from None


def read_optimizer(ckpt: Path) -> dict:
    try:
        return torch.load(ckpt / OPTIM_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{ckpt / OPTIM_FILE}: unreadable optimizer state ({exc})") from None
