"""RMSNorm as in Qwen3 (computed in fp32, scaled by a learned weight)."""

from __future__ import annotations

import torch
from torch import nn

from phasekv import kernels


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) over the last dim (in fp32), times weight (broadcast against x): the fused CPU kernel where it
    applies (`phasekv.kernels.fuses_rms_norm`: float32 on CPU, one weight per channel), else the reference."""
    if kernels.fuses_rms_norm(x, weight):
        return kernels.rms_norm(x, weight, eps)
    return reference_rms_norm(x, weight, eps)


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The definition: x / rms(x) over the last dim (in fp32), times weight (broadcast against x)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
