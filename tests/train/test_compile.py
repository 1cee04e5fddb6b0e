"""`phasekv train --compile`: each layer captured whole (`torch.compile(fullgraph=True)`, static shapes) where it
can be. A compressed layer on the fused triton kernels (custom operators; Triton's interpreter here) traces into
one graph, forward and backward, with the eager layer's outputs and gradients."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from phasekv import ModelConfig, PhaseLM
from phasekv.attention import blockwise
from phasekv.train.config import TrainConfig
from phasekv.train.distributed import Dist, wrap

TINY = dict(preset="tiny", vocab_size=61, n_layers=2, d_model=32, n_heads=4, head_dim=16, d_ff=48)
LAYERS = ["W8/S4 · 2 KV · staggered heads · attention sink", "W6/S3 · 1 KV · V4 compressor · grid jitter"]


def block_grads(block, x, pos, shift):
    out = block(x, pos, None, shift)  # (B, T, d)
    return [out, *torch.autograd.grad((out * torch.linspace(-1, 1, out.shape[-1])).sum(), [x, *block.parameters()])]


@pytest.mark.parametrize("name", LAYERS)
def test_layer_compiles_whole(name):
    pytest.importorskip("triton", reason="the triton package is not installed")
    torch._dynamo.reset()
    model = PhaseLM(ModelConfig.from_name(name, **TINY))
    block = model.layers[1]
    x, pos = torch.randn(2, 40, 32, requires_grad=True), torch.arange(40)
    shift = torch.tensor([1, 2]) if model.config.grid_jitter else None
    counter = CompileCounterWithBackend("aot_eager")  # inductor on a CPU compiles for minutes; the trace is the point
    with blockwise.use_backend("triton"):
        eager = block_grads(block, x, pos, shift)
        compiled = block_grads(torch.compile(block, backend=counter, fullgraph=True, dynamic=False), x, pos, shift)
    assert counter.frame_count == 1  # forward and backward from one graph
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name, backend, layers", [("Full attention · 1 KV", "blockwise", True),
                                                   ("W8/S8 · 1 KV", "blockwise", False),
                                                   ("W8/S8 · 1 KV", "triton", True),
                                                   ("W8/S8 · 1 KV · coverage reg 0.1", "triton", False)])
def test_train_compile_captures_the_layers_where_it_can(name, backend, layers, monkeypatch):
    """Layers compiled whole where every one traces (full attention; compressed on the fused kernels; no coverage
    regulariser reading gates inside them), else the model as before, with graph breaks."""
    calls = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: calls.append((type(self).__name__, kw)))
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(("model", kw)) or model)
    model = PhaseLM(ModelConfig.from_name(name, **TINY))
    with blockwise.use_backend(backend):
        wrap(model, TrainConfig(compile=True), Dist(), torch.device("cpu"))
    assert calls == ([("Block", {"backend": "inductor", "fullgraph": True, "dynamic": False})] * 2 if layers else [("model", {})])
