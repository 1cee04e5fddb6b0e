"""The fused compressor (`triton_compressor`, under Triton's interpreter on a CPU) equals the reference
`Compressor.entries`: entries, and the gradients of the hidden states and of every parameter, for every variant of
the parallel path."""

import pytest
import torch

from phasekv import ModelConfig
from phasekv.attention.attention import Attention

TINY = dict(preset="tiny", vocab_size=61, n_layers=2, d_model=48, n_heads=4, head_dim=16, d_ff=48)  # d: 1.5 tiles
VARIANTS = [  # each part of a name once at least: W = S, W > S, W = 2S (V4's leading window), every gate and option
    "W8/S8 · 1 KV", "W8/S4 · 2 KV · phase bands", "W8/S4 · 1 KV · vector gates · staggered windows",
    "W8/S8 · 1 KV · uniform averaging · no RoPE", "W6/S6 · 1 KV · tied K/V · post-norm",
    "W8/S4 · 1 KV · shared payload · no gate bias", "W8/S4 · 2 KV · staggered heads",
    "W6/S3 · 2 KV · staggered heads · grid jitter", "W8/S8 · 1 KV · RoPE on 4 dims · no Q/K norm",
    "DeepSeek-style kernel", "W8/S4 · 1 KV · V4 compressor", "W8/S8 · 2 KV · V4 compressor · no slot bias · staggered windows",
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
    h = torch.randn(2, 37, 48)  # 37: windows of W > S overlap, the last ones incomplete
    shift = torch.tensor([1, attn.cfg.stride - 1]) if attn.cfg.grid_jitter else None
    ref, up, g_ref = outputs(attn, h, shift, fused=False)
    fused, _, g_fused = outputs(attn, h, shift, fused=True, up=up)
    for a, b in zip(fused, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert g_fused.keys() == g_ref.keys()
    for n, g in g_ref.items():
        torch.testing.assert_close(g_fused[n], g, atol=2e-5, rtol=1e-4, msg=n)


DECODE = ["W8/S8 · 1 KV", "W8/S4 · 2 KV · staggered heads", "W8/S8 · 1 KV · uniform averaging · tied K/V · post-norm",
          "W6/S3 · 1 KV · vector gates · no Q/K norm", "W8/S4 · 1 KV · V4 compressor", "W5/S2 · 1 KV · uncompressed tail"]


@torch.no_grad()
def decoded(model, ids, prompt: int, backend: str, static_until: int = 0):
    """Logits of ids (B, T) on `backend`: a prompt chunk, then one token per step (statically up to
    `static_until`, eagerly after)."""
    from phasekv.attention import blockwise
    from phasekv.model.graph import StaticDecoder

    cache = model.new_cache(ids.shape[0])
    with blockwise.use_backend(backend):
        out = [model(ids[:, :prompt], cache=cache)]
        dec = StaticDecoder(model, cache, capacity=static_until) if static_until else None
        for t in range(prompt, ids.shape[1]):
            out.append(dec(ids[:, t : t + 1]) if t < static_until else model(ids[:, t : t + 1], cache=cache))
    return torch.cat(out, 1)


@pytest.mark.parametrize("name", DECODE)
def test_fused_decode_update_equals_reference(name):
    """The decode step's merge and entry in one kernel, eager steps through every phase and several windows."""
    pytest.importorskip("triton", reason="the triton package is not installed")
    from phasekv import PhaseLM

    model = PhaseLM(ModelConfig.from_name(name, **(TINY | {"n_layers": 1}))).eval()
    ids = torch.randint(0, 61, (2, 30))
    torch.testing.assert_close(decoded(model, ids, 9, "triton"), decoded(model, ids, 9, "reference"), atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("phases", [16, 1])
def test_fused_static_step_equals_reference(phases, monkeypatch):
    """The static step (what a CUDA graph captures) on the fused kernel, the phase known on the host (one graph per
    phase) or computed on the device (one graph)."""
    pytest.importorskip("triton", reason="the triton package is not installed")
    from phasekv import PhaseLM
    from phasekv.model import graph

    monkeypatch.setattr(graph, "MAX_PHASES", phases)
    model = PhaseLM(ModelConfig.from_name("W8/S4 · 2 KV · staggered heads", **(TINY | {"n_layers": 1}))).eval()
    ids = torch.randint(0, 61, (2, 30))
    torch.testing.assert_close(decoded(model, ids, 9, "triton", static_until=30),
                               decoded(model, ids, 9, "reference"), atol=1e-5, rtol=1e-5)
