"""Models under evaluation: phasekv checkpoints/run dirs and Hugging Face causal LM dirs (local files).

`EvalModel.last_logits(ids)` returns the next-token logits at the last position only: phasekv models
prefill long prompts chunk by chunk through their decode cache (memory grows with the cache, not T^2),
Hugging Face models are asked for the last position's logits only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from phasekv.eval.tokens import WordTokenizer
from phasekv.train.run import open_model

PREFILL_CHUNK = 4096  # phasekv prompts longer than this are prefilled through the cache in chunks


@dataclass
class EvalModel:
    """A model under evaluation with the tokenizer its prompts are placed with: what every evaluation, analysis,
    audit and mitigation takes. `kind` says whose model it is (a PhaseLM or a transformers causal LM, scored
    alike through `last_logits`), `stride` which period to test for, `info` where it came from (written into
    every summary's provenance). Wrappers such as a phase ensemble replace `model` and keep the rest."""

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


def resolve_device(spec: str | torch.device) -> str | torch.device:
    """"auto": cuda when available, else cpu; anything else as given."""
    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec


def load(path: str | Path, device: str | torch.device = "cpu", trust_remote_code: bool = False,
         tokenizer: str | Path | None = None) -> EvalModel:
    """The EvalModel of a phasekv run dir (latest checkpoint), a `PhaseLM.save` dir or a Hugging Face causal LM
    dir, opened by the one loader (`phasekv.train.run.open_model`) as the directory holds it; device "auto"
    picks cuda when available."""
    path = Path(path)
    opened = open_model(path, device=resolve_device(device), trust_remote_code=trust_remote_code,
                        tokenizer=tokenizer)
    tok = WordTokenizer(opened.tokenizer, str(tokenizer or path))
    if opened.kind == "hf":
        cfg = opened.model.config
        info = {"path": str(path), "config": {k: v for k, v in cfg.to_dict().items()
                                              if isinstance(v, (int, float, str, bool))}}
        return EvalModel(opened.model, tok, f"{cfg.model_type}:{path.name}", "hf", _hf_stride(cfg), info)
    cfg = opened.model.config
    data = opened.train.get("data")
    recall = data.get("recall") if isinstance(data, dict) and data.get("data") == "recall" else None
    info = {"path": str(path), "weights": str(opened.weights), "config": cfg.to_dict(),
            "tokenizer": str(tokenizer or "run"), "recall": recall, "train_len": opened.train.get("seq_len")}
    return EvalModel(opened.model, tok, cfg.name, "phasekv", cfg.stride if cfg.compressed else None, info)


def _hf_stride(cfg) -> int | None:
    """Compression stride declared by an HF config (DeepSeek-V4-style `compress_ratio` etc.), if any."""
    for key in ("compress_stride", "compression_stride", "compress_ratio"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None
