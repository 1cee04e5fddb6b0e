"""RoPE's leading layout equals the textbook rotate-half formula bit for bit (values and gradients)."""

import pytest
import torch

from phasekv.attention.rope import Rope, rope_angles


def rotate_half(x: torch.Tensor, pos: torch.Tensor, dims: int, theta: float) -> torch.Tensor:
    cos, sin = rope_angles(pos, dims, theta)
    cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    xr, xp = x[..., :dims], x[..., dims:]
    rotated = torch.cat([-xr[..., dims // 2 :], xr[..., : dims // 2]], -1)
    return torch.cat([xr * cos + rotated * sin, xp], -1)


@pytest.mark.parametrize("dims", [32, 16, 2])
def test_leading_rope_is_rotate_half_exactly(dims):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, 32, requires_grad=True)
    pos = torch.arange(5, 16)
    fast, ref = Rope(dims, 1e4)(x, pos), rotate_half(x, pos, dims, 1e4)
    assert torch.equal(fast, ref)
    w = torch.randn_like(ref)
    assert torch.equal(torch.autograd.grad((fast * w).sum(), x)[0], torch.autograd.grad((ref * w).sum(), x)[0])
