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
import torch.nn.functional as F

LAYOUTS = ("leading", "trailing")
STEP_BLOCK = 1024  # positions per table of `Rope.at` (a decode step's RoPE)


def inv_freq(rot_dims: int, theta: float, device: torch.device) -> torch.Tensor:
    """theta^(-2i/r), i < r/2: computed once per (r, theta, device), not at every decode step (inside a compiled
    graph, computed in it)."""
    if torch.compiler.is_compiling():
        return _frequencies(rot_dims, theta, device)
    return _cached_inv_freq(rot_dims, theta, device)


def _frequencies(rot_dims: int, theta: float, device: torch.device) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, rot_dims, 2, dtype=torch.float32, device=device) / rot_dims))


@functools.lru_cache(maxsize=64)
def _cached_inv_freq(rot_dims: int, theta: float, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():  # a plain tensor even if first asked for in inference mode
        return _frequencies(rot_dims, theta, device)


def rope_angles(pos: torch.Tensor, rot_dims: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (..., rot_dims / 2), one angle per rotated pair, for integer positions `pos` (...)."""
    ang = pos.to(torch.float32)[..., None] * inv_freq(rot_dims, theta, pos.device)  # (..., rot_dims/2)
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
        cos, sin = (self._spread(a) for a in rope_angles(pos, self.dims, self.theta))  # (T, r)
        if self.layout == "leading":
            # rotate-half's sign sits in the table: roll(xr) * [-sin, sin] = _rotate(xr) * sin, exactly
            half = self.dims // 2
            cos, sin = cos.to(x.dtype), torch.cat([-sin[..., :half], sin[..., half:]], -1).to(x.dtype)  # (T, r)
            whole = self.dims == x.shape[-1]
            xr = x if whole else x[..., : self.dims]
            out = xr * cos + xr.roll(half, -1) * sin
            return out if whole else torch.cat([out, x[..., self.dims :]], dim=-1)
        xp, xr = x[..., : -self.dims], x[..., -self.dims :]  # fp32 as in V4
        return torch.cat([xp, (xr.float() * cos + self._rotate(xr).float() * sin).to(x.dtype)], dim=-1)

    def at(self, x: torch.Tensor, t: int | torch.Tensor) -> torch.Tensor:
        """`self(x, pos)` for x (..., D) all at the one position t, in three fused ops (the decode step):
        x cos_t + (x R) sin_t, with cos_t, sin_t over all D dims (1 and 0 on the unrotated ones) and x R the
        layout's signed pair swap. A (1,) tensor t (the static step's) is rotated from its angles on the device."""
        if self.dims == 0:
            return x
        if isinstance(t, torch.Tensor):
            return self(x.unsqueeze(-2), t).squeeze(-2)
        dtype = x.dtype if self.layout == "leading" else torch.float32  # V4 rotates in fp32
        cos, sin, R = _step_tables(self, x.shape[-1], t // STEP_BLOCK, x.device, dtype)
        y = x if x.dtype == dtype else x.to(dtype)
        out = y * cos[t % STEP_BLOCK] + (y @ R) * sin[t % STEP_BLOCK]
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def _spread(self, a: torch.Tensor) -> torch.Tensor:
        """(..., r/2) values per rotated pair -> (..., r) per rotated dim, in the layout's pairing."""
        return torch.cat([a, a], -1) if self.layout == "leading" else a.repeat_interleave(2, -1)

    def _rotate(self, xr: torch.Tensor) -> torch.Tensor:
        """Each rotated dim's signed partner: (-x_{i+r/2}, x_i) for rotate-half pairs, (-x_{2i+1}, x_{2i}) interleaved."""
        if self.layout == "leading":
            half = self.dims // 2
            return torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
        return torch.stack([-xr[..., 1::2], xr[..., 0::2]], dim=-1).flatten(-2)


@functools.lru_cache(maxsize=32)
def _step_tables(rope: Rope, D: int, block: int, device: torch.device, dtype: torch.dtype):
    """cos, sin (STEP_BLOCK, D) of the positions of block `block` over all D head dims (1 and 0 on the unrotated
    ones) and R (D, D) with x R = the rotated dims' `Rope._rotate` (0 elsewhere): what `Rope.at` reads, made
    once per block of positions."""
    with torch.inference_mode(False), torch.no_grad():  # plain tensors even if first asked for in inference mode
        pos = torch.arange(block * STEP_BLOCK, (block + 1) * STEP_BLOCK, device=device)
        cos, sin = (rope._spread(a) for a in rope_angles(pos, rope.dims, rope.theta))
        lo = 0 if rope.layout == "leading" else D - rope.dims  # first rotated dim
        pad = (lo, D - lo - rope.dims)
        cos, sin = F.pad(cos, pad, value=1.0), F.pad(sin, pad)  # (n, D)
        R = torch.zeros(D, D, device=device)
        R[lo : lo + rope.dims, lo : lo + rope.dims] = rope._rotate(torch.eye(rope.dims, device=device))
        return cos.to(dtype), sin.to(dtype), R.to(dtype)
