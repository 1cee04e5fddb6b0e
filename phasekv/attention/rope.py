"""Rotary position embedding on `dims` of the head dims, in one of two layouts:

- `leading` (Qwen3): the first `dims` dims, rotate-half pairs (i, i + dims/2);
- `trailing` (DeepSeek-V4): the last `dims` dims, interleaved pairs (2i, 2i + 1), as transformers'
  `modeling_deepseek_v4.apply_rotary_pos_emb`.

Queries, exact keys and compressed entries of a layer share one layout, so scores depend on relative position.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

LAYOUTS = ("leading", "trailing")


@functools.lru_cache(maxsize=64)
def _inv_freq(rot_dims: int, theta: float, device: torch.device) -> torch.Tensor:
    """theta^(-2i/r), i < r/2: computed once per (r, theta, device), not at every decode step."""
    with torch.inference_mode(False), torch.no_grad():  # a plain tensor even if first asked for in inference mode
        return 1.0 / (theta ** (torch.arange(0, rot_dims, 2, dtype=torch.float32, device=device) / rot_dims))


def rope_angles(pos: torch.Tensor, rot_dims: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (..., rot_dims / 2), one angle per rotated pair, for integer positions `pos` (...)."""
    ang = pos.to(torch.float32)[..., None] * _inv_freq(rot_dims, theta, pos.device)  # (..., rot_dims/2)
    return ang.cos(), ang.sin()


@dataclass(frozen=True)
class Rope:
    dims: int  # rotated dims (0: no RoPE)
    theta: float
    layout: str = "leading"

    def __call__(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rotate x (B, H, T, D) by positions pos (T,)."""
        if self.dims == 0:
            return x
        cos, sin = rope_angles(pos, self.dims, self.theta)  # (T, r/2)
        if self.layout == "leading":
            # rotate-half's sign sits in the (T, r) table: roll(xr) * [-sin, sin] = [-x2, x1] * [sin, sin], exactly
            cos, sin = torch.cat([cos, cos], -1).to(x.dtype), torch.cat([-sin, sin], -1).to(x.dtype)  # (T, r)
            whole = self.dims == x.shape[-1]
            xr = x if whole else x[..., : self.dims]
            out = xr * cos + xr.roll(self.dims // 2, -1) * sin
            return out if whole else torch.cat([out, x[..., self.dims :]], dim=-1)
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)  # (T, r), fp32 as in V4
        xp, xr = x[..., : -self.dims], x[..., -self.dims :]
        rotated = torch.stack([-xr[..., 1::2], xr[..., 0::2]], dim=-1).flatten(-2)  # (-x_{2i+1}, x_{2i})
        return torch.cat([xp, (xr.float() * cos + rotated.float() * sin).to(x.dtype)], dim=-1)
