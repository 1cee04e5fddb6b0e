"""Rotary position embedding (Qwen3's rotate-half form), optionally on the first `rot_dims` dims only."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=64)
def _inv_freq(rot_dims: int, theta: float, device: torch.device) -> torch.Tensor:
    """theta^(-2i/r), i < r/2: computed once per (r, theta, device), not at every decode step."""
    with torch.inference_mode(False), torch.no_grad():  # a plain tensor even if first asked for in inference mode
        return 1.0 / (theta ** (torch.arange(0, rot_dims, 2, dtype=torch.float32, device=device) / rot_dims))


def rope_angles(pos: torch.Tensor, rot_dims: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (..., rot_dims) for integer positions `pos` (...)."""
    inv_freq = _inv_freq(rot_dims, theta, pos.device)
    ang = pos.to(torch.float32)[..., None] * inv_freq  # (..., rot_dims/2)
    ang = torch.cat([ang, ang], dim=-1)  # (..., rot_dims)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, pos: torch.Tensor, rot_dims: int, theta: float) -> torch.Tensor:
    """Rotate the first `rot_dims` dims of x (B, H, T, D) by positions pos (T,)."""
    if rot_dims == 0:
        return x
    cos, sin = rope_angles(pos, rot_dims, theta)  # (T, r)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    xr, xp = x[..., :rot_dims], x[..., rot_dims:]
    half = rot_dims // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    return torch.cat([xr * cos + rotated * sin, xp], dim=-1)
