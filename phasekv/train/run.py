"""The one model loader: every `--model` flag, `train --init-from` and the Python API open a model directory here.

`open_model` accepts
- a training run directory (`phasekv train --out DIR`): its latest complete checkpoint + `DIR/tokenizer.json`;
- a checkpoint directory (`DIR/checkpoints/step_N`) or any `PhaseLM.save` directory: its weights, and the
  `tokenizer.json` beside it (or of the run it belongs to; the word tokenizer when the vocabulary matches);
- a Hugging Face model directory (`config.json` with `model_type`): local safetensors only, no code from the
  directory unless `trust_remote_code` (an opt-in flag of the commands).

One behaviour: a directory opens as what it holds, a PhaseLM or the transformers model itself, never
converted, so an evaluation (`phasekv.eval.models.load`, behind every `--model` flag) measures the checkpoint
as published. Converting is a separate, explicit step: `load_run` (training's `--init-from`, the Python API)
promises a PhaseLM wherever one exists and converts Qwen3 checkpoints with `PhaseLM.from_hf` (same logits).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from phasekv.data.recall import RecallConfig, recall_tokenizer
from phasekv.data.tokenizer import build_word_tokenizer, load_tokenizer, to_hf
from phasekv.errors import CheckpointError
from phasekv.model.io import CONFIG_FILE
from phasekv.model.transformer import PhaseLM
from phasekv.train.checkpoint import CKPT_DIR, latest_checkpoint


@dataclass
class OpenedModel:
    """A model directory opened as it holds its model: `kind` says which of the three it was."""

    model: nn.Module  # PhaseLM (phasekv directories) or the transformers model (HF), on its device, eval mode
    tokenizer: object  # tokenizers.Tokenizer (phasekv directories) or the transformers tokenizer (HF)
    kind: str  # "run" | "phasekv" | "hf"
    weights: Path  # the directory the weights came from (a run's latest complete checkpoint)


def resolve_model_dir(path: str | os.PathLike) -> tuple[Path, str]:
    """(directory holding the weights, kind) with kind in {"run", "phasekv", "hf"}."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"model path not found or not a directory: {p}")
    if (p / CKPT_DIR).is_dir() or _config(p).get("train") is not None:
        ckpt = latest_checkpoint(p)
        if ckpt is None:
            raise CheckpointError(f"{p}: training run has no complete checkpoint yet")
        return ckpt, "hf" if "model_type" in _config(ckpt) else "run"  # a transformers run: save_pretrained dirs
    cfg = _config(p)
    if "config_version" in cfg:
        return p, "phasekv"
    if "model_type" in cfg:
        return p, "hf"
    raise CheckpointError(f"{p}: not a phasekv run, a PhaseLM.save directory or a Hugging Face model directory")


def _config(p: Path) -> dict:
    f = p / CONFIG_FILE
    if not f.is_file():
        return {}
    try:
        d = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{f}: not valid JSON ({exc})") from None
    return d if isinstance(d, dict) else {}


def _tokenizer_for(model_dir: Path, vocab_size: int):
    for cand in (model_dir, model_dir.parent.parent if model_dir.parent.name == CKPT_DIR else None):
        if cand is not None and (cand / "tokenizer.json").is_file():
            return load_tokenizer(cand / "tokenizer.json")
    default, word = recall_tokenizer(RecallConfig()), build_word_tokenizer()  # a default recall run's words, or all
    for cand in (default, word):
        if cand.get_vocab_size() == vocab_size:
            return cand
    if word.get_vocab_size() <= vocab_size:
        return word
    raise CheckpointError(f"{model_dir}: no tokenizer.json beside the weights")


# files of which a directory needs one to hold a tokenizer transformers can load (fast, sentencepiece, BPE, WordPiece)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model")


def _open_hf(path: Path, device, trust_remote_code: bool, tokenizer, hf_tokenizer: bool):
    """(transformers model, tokenizer) of a Hugging Face directory: local safetensors only, never pickle."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # slow import: only when an HF dir is opened

    source = Path(tokenizer or path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, use_safetensors=True,
                                                     trust_remote_code=trust_remote_code)
        if source.is_dir() and not any((source / f).is_file() for f in TOKENIZER_FILES):
            # the model loads, but transformers would build an empty tokenizer, and every word would then fail as
            # "not one token" (checked after the model, so a directory without loadable weights says that first)
            raise CheckpointError(f"{source}: no tokenizer in this directory (none of {', '.join(TOKENIZER_FILES)}); "
                                  "give the model's tokenizer with --tokenizer FILE_OR_DIR")
        tok = (AutoTokenizer.from_pretrained(tokenizer or path, local_files_only=True,
                                             trust_remote_code=trust_remote_code)
               if hf_tokenizer else load_tokenizer(Path(tokenizer or path / "tokenizer.json")))
    except (OSError, ValueError) as exc:
        hint = " (pass --trust-remote-code if you trust this model's code)" if "trust_remote_code" in str(exc) else ""
        raise CheckpointError(f"{path}: not a loadable Hugging Face causal LM "
                              f"({' '.join(str(exc).split())[:200]}){hint}") from None
    return model.to(device).eval(), tok


def open_model(path: str | os.PathLike, device="cpu", trust_remote_code: bool = False,
               tokenizer: str | os.PathLike | None = None, hf_tokenizer: bool | None = None) -> OpenedModel:
    """Open a run directory, checkpoint, `PhaseLM.save` directory or HF model directory (see the module doc).

    tokenizer: a tokenizer file/dir instead of the model's. hf_tokenizer: None gives the tokenizer as the
    directory holds it; True a `transformers` tokenizer, False a raw `tokenizers.Tokenizer`, either way."""
    weights, kind = resolve_model_dir(path)
    if kind == "hf":
        model, tok = _open_hf(weights, device, trust_remote_code, tokenizer, hf_tokenizer is not False)
        return OpenedModel(model, tok, kind, weights)
    model = PhaseLM.load(weights, map_location=device).eval()
    tok = load_tokenizer(tokenizer) if tokenizer is not None else _tokenizer_for(weights, model.config.vocab_size)
    return OpenedModel(model, to_hf(tok) if hf_tokenizer else tok, kind, weights)


def load_run(path: str | os.PathLike, device: str = "cpu", hf_tokenizer: bool = True):
    """(model, tokenizer) of a run directory, checkpoint, `PhaseLM.save` directory or HF model directory: a
    PhaseLM wherever one exists (Qwen3 checkpoints converted, other HF decoders as transformers models), the
    tokenizer as a `transformers.PreTrainedTokenizerFast` (or the raw `tokenizers.Tokenizer`)."""
    opened = open_model(path, device=device, hf_tokenizer=hf_tokenizer)
    model = opened.model
    if opened.kind == "hf" and getattr(model.config, "model_type", None) == "qwen3":
        model = PhaseLM.from_hf(model).to(device).eval()
    return model, opened.tokenizer
