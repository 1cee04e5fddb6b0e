"""Gate scores read during a model's own forward pass: the one hook that gate snapshots, the coverage
regulariser and the gate analyses share.

The scores are recomputed from the compressor's input inside a pre-hook on each compressed attention, so
the reading works under DDP and FSDP2 (parameters are gathered for the layer's forward), keeps gradients
when the forward has them, and sees exactly the windows the layer compresses.

On a transformers DeepSeek-V4 model the pre-hook sits on each HF compressor (CSA, HCA, and the CSA
indexer's, read as branch "indexer"): its input hidden states go through a PhaseLM mirror of the module
(`phasekv.model.hf.compressor_from_hf`, weights copied when the block is entered; no gradients).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from phasekv.attention.positions import Grid
from phasekv.config import ModelConfig
from phasekv.model.hf import compressor_from_hf, v4_sites


@dataclass
class GateRead:
    """The gate scores of one branch of one compressed layer in one forward pass."""

    layer: int
    branch: str  # "key" or "value"; "indexer" for a DeepSeek-V4 CSA indexer's compressor
    alpha: torch.Tensor  # (B, n, W, n_kv, G): softmax over the offsets of every window holding W tokens
    grid: Grid  # the layer's window grid (offset i sits at phase grid.offset_phase(i))
    gated: bool  # False for uniform averaging (alpha = 1/W, no gate parameters)
    training: bool  # the attention module's training flag during this forward
    delays: tuple[int, ...] = (0,)  # per KV head: its windows start this many tokens before the grid (staggered
    #                                 heads); head h's offset i sits at phase grid.offset_phase(i - delays[h])


@contextmanager
def gate_scores(model: nn.Module, on_read: Callable[[GateRead], None]) -> Iterator[None]:
    """Inside the block, every forward of `model` (a PhaseLM or a transformers DeepSeek-V4 model) calls
    `on_read` once per compressed layer and branch, in layer order, with at least one complete window."""
    phaselm = isinstance(getattr(model, "config", None), ModelConfig)
    handles = _phaselm_hooks(model, on_read) if phaselm else _hf_hooks(model, on_read)
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _phaselm_hooks(model: nn.Module, on_read: Callable[[GateRead], None]) -> list:
    def hook(layer: int):
        def pre(attn, args):
            shift = args[3] if len(args) > 3 else None  # grid jitter's per-sequence delays (training)
            reads = attn.compressor.gate_scores(args[0], shift)  # from the normed hidden states
            if reads[0][2].shape[1] == 0:
                return
            delays = attn.compressor.delays
            for name, branch, alpha in reads:
                on_read(GateRead(layer, name, alpha, attn.grid, branch.gated, attn.training, delays))

        return pre

    return [block.attn.register_forward_pre_hook(hook(i))
            for i, block in enumerate(model.layers) if block.attn.compressor is not None]


def _hf_hooks(model: nn.Module, on_read: Callable[[GateRead], None]) -> list:
    def hook(site, mirror):
        def pre(module, args):
            (_, _, alpha), = mirror.gate_scores(args[0].float())  # from the layer's normed hidden states
            if alpha.shape[1] > 0:
                on_read(GateRead(site.layer, site.branch, alpha, mirror.grid, True, module.training))

        return pre

    handles = []
    for site in v4_sites(model):
        device = next(site.module.parameters()).device
        mirror = compressor_from_hf(site.module, model.config).to(device)
        handles.append(site.module.register_forward_pre_hook(hook(site, mirror)))
    return handles


def gate_grids(model: nn.Module) -> dict[tuple[int, str], Grid]:
    """The window grid of every (layer, branch) that `gate_scores` reads on `model`."""
    if isinstance(getattr(model, "config", None), ModelConfig):
        return {(i, name): block.attn.grid for i, block in enumerate(model.layers) if block.attn.compressor is not None
                for name, _ in block.attn.compressor.named_branches()}
    return {(site.layer, site.branch): site.grid for site in v4_sites(model)}
