"""A plain Qwen3-shaped decoder in ~100 lines of PyTorch: the yardstick of the training-step benchmark.

Same shape and the same per-layer math as a full-attention `PhaseLM` (token embedding, pre-norm blocks of
QK-normed GQA attention with rotate-half RoPE and SwiGLU, final norm, untied LM head), written the way a
minimal training script would write it (nanoGPT style): `F.rms_norm`, one RoPE table made at max_seq_len
(non-persistent buffers: `.to(device)` moves them with the weights), causal SDPA. It is not part of
phasekv; `train_throughput.py` times a phasekv step against it side by side.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from phasekv.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_table(T: int, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (T, dim) of rotate-half RoPE over the whole head."""
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # (dim/2,)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv  # (T, dim/2)
    ang = torch.cat([ang, ang], -1)  # (T, dim)
    return ang.cos(), ang.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Attention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.H, self.n_kv, self.D = c.n_heads, c.n_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.d_model, c.n_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.d_model, bias=False)
        self.q_norm, self.k_norm = RMSNorm(c.head_dim, c.norm_eps), RMSNorm(c.head_dim, c.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.H, self.D)).transpose(1, 2)  # (B, H, T, D)
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.D)).transpose(1, 2)  # (B, n_kv, T, D)
        v = self.v_proj(x).view(B, T, self.n_kv, self.D).transpose(1, 2)  # (B, n_kv, T, D)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B, H, T, D)
        return self.o_proj(z.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.up_proj = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.down_proj = nn.Linear(c.d_ff, c.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(c.d_model, c.norm_eps), Attention(c)
        self.mlp_norm, self.mlp = RMSNorm(c.d_model, c.norm_eps), MLP(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class ReferenceLM(nn.Module):
    """input_ids (B, T) -> logits (B, T, V), full causal attention."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        cos, sin = rope_table(c.max_seq_len, c.head_dim, c.rope_theta)  # (max_seq_len, D) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=(3 * m.weight.shape[-1]) ** -0.5)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[: input_ids.shape[1]], self.sin[: input_ids.shape[1]]  # (T, D) each
        x = self.embed(input_ids)  # (B, T, d)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))  # (B, T, V)
