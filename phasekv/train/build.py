"""What a run starts from, apart from the loop: its tokenizer and model (fresh under the run seed, the weights
of `--init-from`, or the checkpoint's architecture on resume; a transformers model with `--hf-config` /
`--hf-model`, see `phasekv.train.hfmodel`) and its optimizer (AdamW; weight decay on matrices only).

`--init-from` with an `--arch` of another design is a design change (`change_design`, the one rule): full
attention's weights continue as another design on the same backbone (a compressed design, NSA, MoBA or Activation
Beacon), as those papers continue a pretrained full-attention LM. Every tensor the two share is loaded; the
design's own parameters start as the design says (Beacon's beacon q/k/v as copies of the layer's q/k/v; a
compressor's payloads and gates, NSA's own modules and the beacon embedding fresh at the run seed); the run's
config.json records it under "init".
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import nn

from phasekv.attention.compressor import GATE_BIAS_NAMES
from phasekv.config import ModelConfig
from phasekv.config.names import parse_name
from phasekv.data.sources import data_tokenizer
from phasekv.data.tokenizer import load_tokenizer
from phasekv.errors import ConfigError
from phasekv.model.io import read_config
from phasekv.model.transformer import PhaseLM
from phasekv.train import checkpoint as ck
from phasekv.train.config import TrainConfig
from phasekv.train.hfmodel import HFSource, hf_model, hf_name, hf_writer, new_hf_model, read_hf_config
from phasekv.train.run import load_run

DEFAULT_SEED = ModelConfig.seed  # a transformers model's seed unless --seed is given


@dataclass
class RunModel:
    """The model a run trains, PhaseLM or transformers, with what the loop needs to name, log and save it."""

    module: nn.Module
    name: str  # PhaseLM paper name, or "<model_type>:<config or model dir>"
    seed: int  # init and data order
    config: dict  # the model config (the run's config.json "model")
    hf: bool  # a transformers model (forward takes use_cache, checkpoints are save_pretrained dirs)
    init: dict | None = None  # what --init-from started it from, when that was a design change (config.json "init")

    @property
    def coverage_reg(self) -> float:
        return 0.0 if self.hf else self.module.config.coverage_reg

    def writer(self, state: dict, tok):
        """Writes a checkpoint's model files from the full `state` (`checkpoint.save_checkpoint`)."""
        return hf_writer(self.module, tok, state) if self.hf else ck.phaselm_writer(state, self.module.config.to_json())


def phaselm_run(model: PhaseLM, cfg: TrainConfig, init: dict | None = None) -> RunModel:
    seed = model.config.seed if cfg.seed is None else cfg.seed
    return RunModel(model, model.config.name, seed, model.config.to_dict(), False, init)


def hf_run(cfg: TrainConfig, vocab_size: int, resume_from: Path | None = None) -> RunModel:
    """A transformers model: fresh from --hf-config, the weights of --hf-model, or (on resume) the checkpoint's
    config (its weights are loaded by `resume.restore`)."""
    source = HFSource(cfg.hf_config, cfg.hf_model)
    seed = DEFAULT_SEED if cfg.seed is None else cfg.seed
    model = new_hf_model(read_hf_config(resume_from), seed) if resume_from else hf_model(source, seed, vocab_size)
    return RunModel(model, hf_name(model, source), seed, model.config.to_dict(), True)


def build_model(cfg: TrainConfig, vocab_size: int) -> tuple[PhaseLM, Tokenizer | None, dict | None]:
    """A fresh model of `arch` at `preset` (init under the run seed), or the weights of `init_from` (with a design
    change when `arch` names another design: `change_design`); and the design change's record, if any."""
    if cfg.init_from:
        model, tok = load_run(cfg.init_from, hf_tokenizer=False)
        changed, init = change_design(model, cfg.arch or model.config.name, cfg.seed)
        return changed, tok, None if init is None else {"from": str(cfg.init_from), **init}
    mcfg = ModelConfig.from_name(cfg.arch or "W8/S8 · 1 KV", preset=cfg.preset, vocab_size=vocab_size, **cfg.backbone)
    if cfg.seed is not None and cfg.seed != mcfg.seed:
        if "seed" in (cfg.arch or "").lower():
            raise ConfigError(f"--seed {cfg.seed} contradicts the seed in --arch {cfg.arch!r}")
        mcfg = mcfg.replace(seed=cfg.seed)
    mcfg = mcfg.replace(max_seq_len=max(mcfg.max_seq_len, cfg.seq_len))
    torch.manual_seed(mcfg.seed)
    return PhaseLM(mcfg), None, None


def change_design(source: PhaseLM, arch: str, seed: int | None = None) -> tuple[PhaseLM, dict | None]:
    """`source` as `arch`: itself when `arch` names its model; full attention as another design on the same
    backbone (KV heads, Q/K norm and RoPE: the source's, or the name's when equal), every shared tensor loaded and the
    design's own parameters initialised as the design says under `seed` (default: the name's, else the source's),
    or a design as full attention (its own tensors dropped), with a record of the change; anything else a one-line
    error naming both models."""
    src = source.config
    target = src.full_attention().replace(**parse_name(arch))  # the backbone's attributes the name omits: the source's
    if target == src:
        return source, None
    target = target if seed is None else target.replace(seed=seed)
    designed = [c.compressed or c.family is not None for c in (src, target)]
    if all(designed):
        raise ConfigError(f"--arch {target.name!r} differs from --init-from's {src.name!r}, and a design change goes "
                          "from full attention or to it")
    bare, src_bare = target.full_attention(), src.full_attention()
    differs = next((f.name for f in dataclasses.fields(src) if f.name != "seed" and
                    getattr(bare, f.name) != getattr(src_bare, f.name)), None)
    if differs is not None:
        raise ConfigError(f"--arch {target.name!r} differs from --init-from's {src.name!r} in the backbone: "
                          f"{differs}={getattr(target, differs)!r} against {getattr(src, differs)!r}")
    torch.manual_seed(target.seed)
    model = PhaseLM(target)
    own, dropped = model.load_state_dict(source.state_dict(), strict=False)  # a design has every tensor of full
    for m in model.modules():                                                  # attention, and more
        if hasattr(m, "init_copies"):  # Activation Beacon: beacon q/k/v := the layer's q/k/v, loaded just now
            m.init_copies()
    return model, {"from_name": src.name, "design_change": f"{src.name} -> {target.name}",
                   "loaded": len(source.state_dict()) - len(dropped), "own": sorted(own), "dropped": sorted(dropped)}


def model_and_tokenizer(cfg: TrainConfig, resuming: bool) -> tuple[RunModel, Tokenizer]:
    """The run's model and tokenizer; on resume, the run's tokenizer, its latest checkpoint's architecture (the
    weights are loaded by `resume.restore`) and the design change it started with, if any."""
    out, hf = Path(cfg.out), cfg.hf_config is not None or cfg.hf_model is not None
    if resuming:
        tok, latest = load_tokenizer(out / "tokenizer.json"), ck.latest_checkpoint(out)
        if hf:
            return hf_run(cfg, 0, latest), tok
        init = json.loads((out / "config.json").read_text()).get("init")
        return phaselm_run(PhaseLM(read_config(latest)), cfg, init), tok
    tok = data_tokenizer(cfg.data) if not cfg.init_from or cfg.data.tokenizer else None
    if hf:
        return hf_run(cfg, tok.get_vocab_size()), tok
    model, init_tok, init = build_model(cfg, tok.get_vocab_size() if tok else 0)
    tok = tok or init_tok
    if tok.get_vocab_size() > model.config.vocab_size:
        raise ConfigError(f"tokenizer has {tok.get_vocab_size()} tokens, the model only {model.config.vocab_size}")
    return phaselm_run(model, cfg, init), tok


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices; none on norms, biases and gate biases."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.endswith(GATE_BIAS_NAMES) else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with the fused kernel (one op for every parameter; CUDA and CPU): on the tiny model's CPU step 0.4 ms
    against 2.1 ms for the per-tensor loop, the same update up to float rounding."""
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             fused=device.type in ("cuda", "cpu"))
