"""`load_run`: the ONE loader behind every `--model` flag of phasekv.

Accepts
- a training run directory (`phasekv train --out DIR`): its latest complete checkpoint + `DIR/tokenizer.json`;
- a checkpoint directory (`DIR/checkpoints/step_N`) or any `PhaseLM.save` directory: its weights, and the
  `tokenizer.json` beside it (or of the run it belongs to; the word tokenizer when the vocabulary matches);
- a Hugging Face model directory (`config.json` with `model_type`): Qwen3 models convert to PhaseLM,
  other decoders come back as the transformers model itself.

Returns (model, tokenizer): the model on `device` in eval mode, the tokenizer as a
`transformers.PreTrainedTokenizerFast` (the same type an HF model directory gives), or the raw
`tokenizers.Tokenizer` with `hf_tokenizer=False`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from phasekv.data.recall import RecallConfig, recall_tokenizer
from phasekv.data.tokenizer import build_word_tokenizer, load_tokenizer, to_hf
from phasekv.errors import CheckpointError
from phasekv.model.io import CONFIG_FILE, load_model
from phasekv.train.checkpoint import CKPT_DIR, latest_checkpoint


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


def load_run(path: str | os.PathLike, device: str = "cpu", hf_tokenizer: bool = True):
    """(model, tokenizer) of a run directory, checkpoint, `PhaseLM.save` directory or HF model directory."""
    model_dir, kind = resolve_model_dir(path)
    if kind == "hf":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from phasekv.model.transformer import PhaseLM

        try:  # local safetensors only: no download, no pickle, no code from the directory
            hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, use_safetensors=True,
                                                      trust_remote_code=False)
            tok = (AutoTokenizer.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False)
                   if hf_tokenizer else load_tokenizer(model_dir / "tokenizer.json"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{model_dir}: not a loadable Hugging Face causal LM "
                                  f"({' '.join(str(exc).split())[:200]})") from None
        model = PhaseLM.from_hf(hf) if getattr(hf.config, "model_type", None) == "qwen3" else hf
        return model.to(device).eval(), tok
    model = load_model(model_dir, map_location=device).eval()
    tok = _tokenizer_for(model_dir, model.config.vocab_size)
    return model, (to_hf(tok) if hf_tokenizer else tok)
