"""PhaseLM: a Qwen3-shaped decoder whose attention may compress its KV cache chunk by chunk."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from phasekv.attention.beacon import interleave
from phasekv.attention.cache import PhaseCache
from phasekv.attention.compressor import CompressorBranch
from phasekv.attention.family import make_attention
from phasekv.attention.norm import RMSNorm
from phasekv.config import ModelConfig
from phasekv.errors import ConfigError
from phasekv.model.hf import from_hf, to_hf
from phasekv.model.io import load_model, save_model


class MLP(nn.Module):
    """SwiGLU."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = make_attention(cfg, layer)  # the study's Attention, or a family design's
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache=None, shift: torch.Tensor | None = None,
                last: bool = False) -> torch.Tensor:
        """x (B, T, d) -> (B, T, d), or with `last` the last position alone (B, 1, d)."""
        a = self.attn(self.attn_norm(x), pos, cache, shift, last)  # (B, T or 1, d)
        x = (x[:, -1:] if last else x) + a
        return x + self.mlp(self.mlp_norm(x))


class PhaseLM(nn.Module):
    """A Qwen3-shaped decoder (token embedding, pre-norm blocks of attention and SwiGLU, final norm, LM head)
    whose attention layers may compress their KV cache (`ModelConfig`'s compression attributes). Runs a whole
    sequence at once, or continues a decode cache (`new_cache`) chunk by chunk with the same result."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        # Activation Beacon: the beacon token's embedding, inserted after every r raw tokens (attention.beacon)
        self.beacon_embed = nn.Embedding(1, config.d_model) if config.family == "beacon" else None
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(lambda m: _init_weights(m, config))

    def forward(self, input_ids: torch.Tensor, cache: PhaseCache | None = None,
                select: torch.Tensor | None = None, last: bool = False) -> torch.Tensor:
        """input_ids (B, T) -> logits (B, T, V). With a cache, the tokens continue the cached sequence. With
        `select` (B, T) bool, only the selected positions' logits (n, V), in row-major order: a training loss
        whose labels cover few positions (recall: ~8%) skips the LM head elsewhere. With `last` (no cache), the
        last position's logits (B, V), its last layer run for that one position (an evaluation's query)."""
        B, T = input_ids.shape
        start = 0 if cache is None else cache.pos
        self._check_input(input_ids, start)
        if last and cache is not None:
            raise ConfigError("last=True runs a whole prompt: give no cache")
        pos = torch.arange(start, start + T, device=input_ids.device)  # (T,)
        x = self.embed(input_ids)  # (B, T, d)
        if self.beacon_embed is not None:  # the interleaved stream: the layers see beacon slots between raw tokens
            x, pos, raw = interleave(x, start, self.config.beacon_ratio, self.beacon_embed.weight[0])  # (B, T_s, d)
        shift = self._grid_shift(B) if cache is None else None
        short = last and self.beacon_embed is None and not _hooked(self.layers[-1])  # hooks read every position
        for i, layer in enumerate(self.layers):
            x = layer(x, pos, None if cache is None else cache.layers[i], shift, short and i == len(self.layers) - 1)
        if self.beacon_embed is not None:
            x = x[:, raw]  # (B, T, d): the raw tokens' outputs
        if cache is not None:
            cache.pos += T
        if select is not None:  # every position labelled (text): the rows in the same order, without a gather
            x = x.flatten(0, 1) if bool(select.all()) else x[select]  # (n, d)
        return self.head(x[:, -1] if last else x)  # (B, V), (B, T, V) or (n, V)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: hidden states x (..., d) -> logits (..., V)."""
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return self.norm(x) @ weight.T

    def _grid_shift(self, batch: int) -> torch.Tensor | None:
        """Grid jitter (training forward only): per sequence, a random 0..S-1 tokens by which every layer's
        windows start early; None otherwise (the fixed grid)."""
        if not (self.training and self.config.grid_jitter):
            return None
        return torch.randint(self.config.stride, (batch,), device=self.embed.weight.device)

    def _check_input(self, input_ids: torch.Tensor, start: int) -> None:
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ConfigError(f"input_ids must have shape (batch, tokens>0), got {tuple(input_ids.shape)}")
        end = start + input_ids.shape[1]
        if end > self.config.max_seq_len:
            raise ConfigError(f"sequence of {end} tokens exceeds the model's max_seq_len={self.config.max_seq_len}")
        if input_ids.min() < 0 or input_ids.max() >= self.config.vocab_size:
            raise ConfigError(f"token ids must be in [0, vocab_size={self.config.vocab_size})")

    def new_cache(self, batch_size: int) -> PhaseCache:
        """A decode cache: compressed entries + in-flight window partials + local ring per compressed layer."""
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be >= 1")
        return PhaseCache([layer.attn.new_cache() for layer in self.layers], batch_size)

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- files and interop (phasekv.model.io and .hf: they build what they are given, never import this module) ----
    def save(self, directory) -> None:
        save_model(self, directory)

    @classmethod
    def load(cls, directory, map_location: str | torch.device = "cpu") -> PhaseLM:
        return load_model(directory, cls, map_location)

    @classmethod
    def from_hf(cls, hf_model) -> PhaseLM:
        return from_hf(hf_model, cls)

    def to_hf(self, evaluation: dict | None = None):
        return to_hf(self, evaluation)


def _hooked(module: nn.Module) -> bool:
    """Whether a forward hook sits on `module` or inside it (the analyses' knockouts and captures)."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


def _init_weights(module: nn.Module, cfg: ModelConfig) -> None:
    """Normal(0, std) for every matrix (`cfg.init_std`, or fan-in scaled when None); norms start at 1, gate
    biases at 0. Fan-in scaling matters at small widths: with a flat 0.02 a width-64 model takes thousands of
    steps longer to learn associative recall."""

    def init(w: torch.Tensor, embedding: bool = False) -> None:
        if cfg.init_std is not None:
            std = cfg.init_std
        elif embedding:
            std = cfg.d_model**-0.5 if cfg.tie_embeddings else 1.0
        else:
            std = (3 * w.shape[-1]) ** -0.5  # fan_in = last dim (nn.Linear, payload C_i, gate Z_i)
        nn.init.normal_(w, std=std)

    if isinstance(module, (nn.Linear, nn.Embedding)):
        init(module.weight, embedding=isinstance(module, nn.Embedding))
    if isinstance(module, CompressorBranch):
        for w in module.own_matrices():
            init(w)
    if hasattr(module, "init_copies"):  # parameters that start as copies of the module's own (Activation Beacon's
        module.init_copies()  #             beacon projections); `apply` has initialised its children already
