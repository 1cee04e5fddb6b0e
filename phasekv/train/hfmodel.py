"""Training any `transformers` causal LM with phasekv's data, loop and checkpoints (`phasekv train --hf-config
config.json`, or `--hf-model DIR` to continue from weights: a save_pretrained directory or a previous run, so
runs chain as `--init-from` chains PhaseLM runs).

The model is built with `AutoModelForCausalLM.from_config` under the run seed (fp32), or loaded from a local
safetensors directory. Each checkpoint is a `save_pretrained` directory (config.json + model.safetensors)
with the run's tokenizer saved beside it (`PreTrainedTokenizerFast.save_pretrained`), so transformers'
AutoModelForCausalLM and AutoTokenizer load the checkpoint directory with their `from_pretrained`;
optimizer.pt and trainer_state.json make it resumable like a PhaseLM checkpoint. Gate snapshots are taken
where the model has DeepSeek-V4 compressors (`phasekv.model.gates`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from phasekv.data.tokenizer import to_hf
from phasekv.errors import CheckpointError, ConfigError
from phasekv.train.checkpoint import CKPT_DIR, latest_checkpoint


@dataclass
class HFSource:
    """Where a transformers model comes from: a config (fresh weights) or a model directory (its weights)."""

    config: str | None  # config.json file (or a directory holding one): fresh weights under the run seed
    weights: str | None  # a save_pretrained directory (local safetensors)


def read_hf_config(path: str | Path):
    """A transformers config from a config.json file (or a directory holding one); one-line errors."""
    from transformers import AutoConfig  # ~2 s of import, only for Hugging Face runs

    p = Path(path)
    p = p / "config.json" if p.is_dir() else p
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--hf-config: {p} not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--hf-config: {p} is not a JSON config ({exc})") from None
    model_type = data.pop("model_type", None) if isinstance(data, dict) else None
    if not model_type:
        raise ConfigError(f"--hf-config: {p} has no model_type (expected a transformers config.json)")
    try:
        return AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--hf-config: {p}: model_type={model_type!r} is not a config transformers "
                          f"can build ({' '.join(str(exc).split())[:160]})") from None


def new_hf_model(hf_config, seed: int) -> nn.Module:
    """A fresh causal LM of `hf_config`, initialised under `seed`, in fp32."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=False)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--hf-config: model_type={hf_config.model_type!r} has no causal LM in transformers "
                          f"({' '.join(str(exc).split())[:160]})") from None
    return model.float()


def hf_weights_dir(directory: str | Path) -> Path:
    """`directory` itself (a save_pretrained directory), or a `--hf-config` / `--hf-model` run's latest complete
    checkpoint: each stage of a chain of runs continues the previous run's output."""
    p = Path(directory)
    if not (p / CKPT_DIR).is_dir():
        return p
    ckpt = latest_checkpoint(p)
    if ckpt is None:
        raise CheckpointError(f"--hf-model: {p}: training run has no complete checkpoint yet")
    return ckpt


def load_hf_model(directory: str | Path) -> nn.Module:
    """The weights of a local Hugging Face causal LM directory or of a run's latest checkpoint (safetensors only, no
    remote code), in fp32."""
    from transformers import AutoModelForCausalLM

    directory = hf_weights_dir(directory)
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, use_safetensors=True,
                                                     trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"--hf-model: {directory}: not a loadable Hugging Face causal LM "
                              f"({' '.join(str(exc).split())[:200]})") from None
    return model.float()


def hf_model(source: HFSource, seed: int, vocab_size: int) -> nn.Module:
    """The run's transformers model; its vocabulary must hold the tokenizer's `vocab_size` tokens."""
    model = load_hf_model(source.weights) if source.weights else new_hf_model(read_hf_config(source.config), seed)
    if model.config.vocab_size < vocab_size:
        raise ConfigError(f"vocab_size={model.config.vocab_size} of the Hugging Face config is smaller than the "
                          f"run's tokenizer ({vocab_size} tokens): set vocab_size >= {vocab_size}")
    return model


def hf_name(model: nn.Module, source: HFSource) -> str:
    """A run name for a transformers model: its model type and where it came from."""
    origin = Path(source.weights or source.config)
    origin = origin.parent if origin.name == "config.json" else origin
    return f"{model.config.model_type}:{origin.name}"


def hf_writer(model: nn.Module, tok, state: dict):
    """Writes a checkpoint's model files: `save_pretrained` (config.json, model.safetensors) and the
    tokenizer beside it; returns the names written."""

    def write(directory: Path) -> list[str]:
        from transformers.utils import logging

        logging.disable_progress_bar()  # no "Writing model shards" bar per checkpoint
        model.save_pretrained(directory, state_dict=state, save_original_format=False)  # names = state_dict keys
        to_hf(tok).save_pretrained(directory)
        return sorted(p.name for p in directory.iterdir() if p.is_file())

    return write


def complete_tied(model: nn.Module, state: dict) -> dict:
    """`state` read from a save_pretrained file, with the tied weights it leaves out (e.g. lm_head when the
    embeddings are tied) filled in from their source."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if not isinstance(tied, dict) or not getattr(model.config, "tie_word_embeddings", False):
        return state
    return {**state, **{k: state[src] for k, src in tied.items() if k not in state and src in state}}
