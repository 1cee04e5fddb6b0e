"""The fused compressor (`triton_compressor`, under Triton's interpreter on a CPU) equals the reference
`Compressor.entries`: entries, and the gradients of the hidden states and of every parameter, for every variant of
the parallel path."""

import pytest
import torch

from phasekv import ModelConfig
from phasekv.attention.attention import Attention

TINY = dict(preset="tiny", vocab_size=61, n_layers=2, d_model=32, n_heads=4, head_dim=16, d_ff=48)
VARIANTS = [
    "W8/S8 · 1 KV", "W8/S4 · 2 KV", "W8/S4 · 1 KV · vector gates", "W8/S8 · 1 KV · uniform averaging",
    "W6/S6 · 1 KV · tied K/V · post-norm", "W8/S4 · 1 KV · shared payload", "W8/S4 · 2 KV · staggered heads",
    "W8/S4 · 1 KV · grid jitter", "W6/S3 · 2 KV · staggered heads · grid jitter", "W8/S8 · 1 KV · no RoPE",
    "W8/S8 · 1 KV · RoPE on 4 dims · no Q/K norm", "W8/S8 · 1 KV · staggered windows", "W8/S4 · 2 KV · phase bands",
    "W8/S4 · 1 KV · no gate bias · uncompressed tail", "DeepSeek-style kernel", "W8/S4 · 1 KV · V4 compressor",
    "W8/S8 · 2 KV · V4 compressor · staggered windows", "W16/S16 · 1 KV · V4 compressor · no slot bias",
]


def outputs(attn: Attention, h: torch.Tensor, shift, fused: bool, up: list[torch.Tensor] | None = None):
    """Entries, and the gradients of h and of every parameter (the `up`-weighted sum's)."""
    from phasekv.attention import triton_compressor

    attn.zero_grad(set_to_none=True)
    h = h.detach().requires_grad_()
    kv = triton_compressor.entries(attn.compressor, h, attn.k_norm, shift) if fused else \
        attn.compressor.entries(h, attn.k_norm, shift)
    up = up or [torch.randn_like(x) for x in kv]
    sum((x * u).sum() for x, u in zip(kv, up, strict=True)).backward()
    grads = {"h": h.grad} | {n: p.grad for n, p in attn.named_parameters() if p.grad is not None}
    return kv, up, grads


@pytest.mark.parametrize("name", VARIANTS)
def test_fused_compressor_equals_reference(name):
    pytest.importorskip("triton", reason="the triton package is not installed")
    attn = Attention(ModelConfig.from_name(name, **TINY), 1)  # layer 1: staggered windows start off phase 0
    for p in attn.parameters():  # norms at 1 and biases at 0 would hide their terms
        torch.nn.init.normal_(p, mean=float(p.dim() == 1), std=0.3)
    h = torch.randn(2, 37, 32)  # 37: windows of W > S overlap, the last ones incomplete
    shift = torch.tensor([1, attn.cfg.stride - 1]) if attn.cfg.grid_jitter else None
    ref, up, g_ref = outputs(attn, h, shift, fused=False)
    fused, _, g_fused = outputs(attn, h, shift, fused=True, up=up)
    for a, b in zip(fused, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert g_fused.keys() == g_ref.keys()
    for n, g in g_ref.items():
        torch.testing.assert_close(g_fused[n], g, atol=2e-5, rtol=1e-4, msg=n)
