"""Model files: `config.json` + `model.safetensors` (no pickle). Writes are atomic (`phasekv.io`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from phasekv.config import ModelConfig
from phasekv.errors import CheckpointError
from phasekv.io import atomic_write, write_text
from phasekv.model.manifest import MANIFEST_FILE, verify_manifest

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


def save_model(model, directory) -> None:
    directory = Path(directory)
    (directory / MANIFEST_FILE).unlink(missing_ok=True)  # a checkpoint's checksums no longer hold
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    atomic_write(directory / WEIGHTS_FILE, lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    write_text(directory / CONFIG_FILE, model.config.to_json())


def read_config(directory) -> ModelConfig:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: no model config (expected a directory written by PhaseLM.save)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return ModelConfig.from_dict(data, source=str(path))


def read_weights(path: Path, map_location="cpu") -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path}: weights file missing")
    try:
        return load_file(str(path), device=str(map_location))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable safetensors ({' '.join(str(exc).split())})") from None


def load_state(model, state: dict[str, torch.Tensor], source: str) -> None:
    """Load `state` into `model`, failing with the first missing, unexpected or mis-shaped tensor named."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{source}: weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)}, config expects {tuple(expected[name].shape)}"
            )
    model.load_state_dict(state)


def load_model(directory, build: Callable[[ModelConfig], torch.nn.Module], map_location="cpu"):
    """`build(config)` (`PhaseLM.load`: the class) with the weights of a `save_model` directory."""
    directory = Path(directory)
    verify_manifest(directory)  # checkpoints carry sha256 checksums; other directories have none
    config = read_config(directory)
    model = build(config)
    load_state(model, read_weights(directory / WEIGHTS_FILE, map_location), str(directory / WEIGHTS_FILE))
    return model.to(map_location)
