"""What a run starts from, apart from the loop: its tokenizer and model (fresh under the run seed, the weights
of `--init-from`, or the checkpoint's architecture on resume) and its optimizer (AdamW; weight decay on
matrices only).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer

from phasekv.attention.compressor import GATE_BIAS_NAMES
from phasekv.config import ModelConfig
from phasekv.data.sources import data_tokenizer
from phasekv.data.tokenizer import load_tokenizer
from phasekv.errors import ConfigError
from phasekv.model.io import read_config
from phasekv.model.transformer import PhaseLM
from phasekv.train import checkpoint as ck
from phasekv.train.config import TrainConfig
from phasekv.train.run import load_run


def build_model(cfg: TrainConfig, vocab_size: int) -> tuple[PhaseLM, Tokenizer | None]:
    """A fresh model of `arch` at `preset` (init under the run seed), or the weights of `init_from`."""
    if cfg.init_from:
        model, tok = load_run(cfg.init_from, hf_tokenizer=False)
        if cfg.arch and ModelConfig.from_name(cfg.arch, preset=model.config.preset).name != model.config.name:
            raise ConfigError(f"--arch {cfg.arch!r} differs from --init-from's model {model.config.name!r}")
        return model, tok
    mcfg = ModelConfig.from_name(cfg.arch or "W8/S8 · 1 KV", preset=cfg.preset, vocab_size=vocab_size)
    if cfg.seed is not None and cfg.seed != mcfg.seed:
        if "seed" in (cfg.arch or "").lower():
            raise ConfigError(f"--seed {cfg.seed} contradicts the seed in --arch {cfg.arch!r}")
        mcfg = mcfg.replace(seed=cfg.seed)
    mcfg = mcfg.replace(max_seq_len=max(mcfg.max_seq_len, cfg.seq_len))
    torch.manual_seed(mcfg.seed)
    return PhaseLM(mcfg), None


def model_and_tokenizer(cfg: TrainConfig, resuming: bool) -> tuple[PhaseLM, Tokenizer]:
    """The run's model and tokenizer; on resume, the run's tokenizer and its latest checkpoint's architecture
    (the weights are loaded by `resume.restore`)."""
    out = Path(cfg.out)
    if resuming:
        tok = load_tokenizer(out / "tokenizer.json")
        return PhaseLM(read_config(ck.latest_checkpoint(out))), tok
    tok = data_tokenizer(cfg.data) if not cfg.init_from or cfg.data.tokenizer else None
    model, init_tok = build_model(cfg, tok.get_vocab_size() if tok else 0)
    tok = tok or init_tok
    if tok.get_vocab_size() > model.config.vocab_size:
        raise ConfigError(f"tokenizer has {tok.get_vocab_size()} tokens, the model only {model.config.vocab_size}")
    return model, tok


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices; none on norms, biases and gate biases."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.endswith(GATE_BIAS_NAMES) else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: PhaseLM, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             fused=device.type == "cuda")
