"""Models under evaluation: phasekv checkpoints/run dirs and Hugging Face causal LM dirs (local files).

`EvalModel.last_logits(ids)` returns the next-token logits at the last position only: phasekv models
prefill long prompts chunk by chunk through their decode cache (memory grows with the cache, not T^2),
Hugging Face models are asked for the last position's logits only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from phasekv.errors import CheckpointError
from phasekv.eval.tokens import WordTokenizer

PREFILL_CHUNK = 4096  # phasekv prompts longer than this are prefilled through the cache in chunks


@dataclass
class EvalModel:
    model: torch.nn.Module
    tok: WordTokenizer
    name: str  # the paper name for phasekv models, the directory / model type for HF
    kind: str  # "phasekv" | "hf"
    stride: int | None  # compression stride S (None: full attention or unknown)
    info: dict = field(default_factory=dict)  # provenance: path, config; a phasekv run's recall data and train_len

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def last_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, T) -> logits at position T-1, (B, V), float32."""
        return last_logits(self.model, ids)


@torch.no_grad()
def last_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Next-token logits at the last position, (B, V), for a PhaseLM or a transformers causal LM."""
    if hasattr(model, "new_cache"):  # PhaseLM
        if ids.shape[1] <= PREFILL_CHUNK:
            return model(ids)[:, -1].float()  # (B, V)
        cache = model.new_cache(ids.shape[0])
        for s in range(0, ids.shape[1], PREFILL_CHUNK):
            out = model(ids[:, s : s + PREFILL_CHUNK], cache=cache)  # (B, chunk, V)
        return out[:, -1].float()
    try:
        out = model(input_ids=ids, logits_to_keep=1)
    except TypeError:  # older transformers / custom code without logits_to_keep
        out = model(input_ids=ids)
    logits = out.logits if hasattr(out, "logits") else out
    return logits[:, -1].float()


def load(path: str | Path, device: str | torch.device = "cpu", trust_remote_code: bool = False,
         tokenizer: str | Path | None = None) -> EvalModel:
    """A phasekv run dir (latest checkpoint), a `PhaseLM.save` dir, or a Hugging Face causal LM dir
    (classified by `phasekv.train.run.resolve_model_dir`, the loader behind every --model flag)."""
    from phasekv.train.run import resolve_model_dir

    model_dir, kind = resolve_model_dir(path)
    if kind == "hf":
        em = _load_hf(model_dir, device, trust_remote_code, tokenizer, name=Path(path).name)
        em.info.update(_run_info(Path(path)), path=str(path))  # a `phasekv train --hf-config` run's data
        return em
    return _load_phasekv(Path(path), model_dir, device, tokenizer)


def _load_phasekv(path: Path, weights: Path, device, tokenizer) -> EvalModel:
    from phasekv.data.tokenizer import load_tokenizer
    from phasekv.train.run import load_run

    model, tok = load_run(path, device=str(device), hf_tokenizer=False)
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
    cfg = model.config
    info = {"path": str(path), "weights": str(weights), "config": cfg.to_dict(), "tokenizer": str(tokenizer or "run"),
            "recall": None, "train_len": None, **_run_info(path)}
    return EvalModel(model, WordTokenizer(tok, str(tokenizer or path)), cfg.name, "phasekv",
                     cfg.stride if cfg.compressed else None, info)


def _run_info(path: Path) -> dict:
    """{recall, train_len} of a training run (its recall layout and sequence length), {} for a model dir."""
    train = _run_train(path)
    if not train:
        return {}
    data = train.get("data")
    recall = data.get("recall") if isinstance(data, dict) and data.get("data") == "recall" else None
    return {"recall": recall, "train_len": train.get("seq_len")}


def _run_train(path: Path) -> dict:
    """The training settings of a phasekv run (its config.json's "train": data, seq_len, ...); {} if none."""
    try:
        train = json.loads((path / "config.json").read_text()).get("train") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return train if isinstance(train, dict) else {}


def _load_hf(path: Path, device, trust_remote_code: bool, tokenizer, name: str | None = None) -> EvalModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code,
                                                     use_safetensors=True)  # weights never via pickle
        tok = AutoTokenizer.from_pretrained(tokenizer or path, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        hint = " (pass --trust-remote-code if you trust this model's code)" if "trust_remote_code" in str(exc) else ""
        raise CheckpointError(f"{path}: not a loadable Hugging Face causal LM ({' '.join(str(exc).split())[:200]}){hint}") from None
    model = model.to(device).eval()
    cfg = model.config
    stride = _hf_stride(cfg)
    info = {"path": str(path), "config": {k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool))}}
    return EvalModel(model, WordTokenizer(tok, str(tokenizer or path)), f"{cfg.model_type}:{name or path.name}", "hf", stride, info)


def _hf_stride(cfg) -> int | None:
    """Compression stride declared by an HF config (DeepSeek-V4-style `compress_ratio` etc.), if any."""
    for key in ("compress_stride", "compression_stride", "compress_ratio"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None
