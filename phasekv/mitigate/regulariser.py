"""The coverage regulariser: a training penalty that keeps heads from sharing static gate preferences.

Theory (SPEC section 6): optimal compression is one-hot per head, and at eps = 0 the optimal assignments use
*distinct* positions across heads; but gradient flow has no term that pushes heads apart, so several heads
can settle on the same offset and leave other phases with no head that writes them (a weak phase). The
penalty adds the missing term. For every compressed KV head h (all layers, every learned branch) take its
static preference over phases on a batch,

    P_h(phi) = E_windows[ sum_{i : (o + i) mod S = phi} alpha_i ]      o = the head's grid offset

(offsets of the same phase pooled, so overlapping and staggered grids are compared on the absolute phase
axis), and penalise the mean pairwise overlap (key gates with key gates, value gates with value gates)

    R = mean_{h < h'} <P_h, P_h'>   in [0, 1]

which is 0 exactly when the heads' static preferences are disjoint, 1 when they all pick the same phase,
and is minimised by heads that split the phases between them. In a model with one KV head per layer the
"heads" are the layers' heads, which all compress the same windows unless the grids are staggered.
Enabled by the model attribute `· coverage reg LAMBDA` (loss = cross-entropy + LAMBDA * R).
"""

from __future__ import annotations

import torch
from torch import nn


def phase_preference(alpha: torch.Tensor, stride: int, offset: int = 0) -> torch.Tensor:
    """Static preference over phases (n_kv, S) of gate weights alpha (B, n, W, n_kv, G) of one branch."""
    p = alpha.mean(dim=(0, 1, 4))  # (W, n_kv): E[alpha] over windows, channels of vector gates averaged
    W, n_kv = p.shape
    phase = (offset + torch.arange(W, device=p.device)) % stride  # (W,) phase of each offset
    pooled = p.new_zeros(stride, n_kv).index_add(0, phase, p)  # (S, n_kv)
    return pooled.T


def overlap_penalty(pref: torch.Tensor) -> torch.Tensor:
    """Mean pairwise overlap <P_h, P_h'> over h < h' of preferences pref (n_heads, S); 0 for fewer than 2."""
    n = pref.shape[0]
    if n < 2:
        return pref.sum() * 0.0
    gram = pref @ pref.T  # (n, n)
    off_diag = gram.sum() - gram.diagonal().sum()
    return off_diag / (n * (n - 1))


class CoverageProbe:
    """Collects every compressed layer's phase preferences during the model's own forward pass.

    Usage in a training step:  probe = CoverageProbe(model);  loss = ce(model(ids)) + lam * probe.pop().
    The gate weights are recomputed from the compressor's input inside a pre-hook (a few small einsums), so
    it works under DDP/FSDP2 (parameters are gathered for the layer's forward) and with gradient.
    """

    def __init__(self, model: nn.Module):
        self.prefs: dict[str, list[torch.Tensor]] = {"key": [], "value": []}  # (n_kv, S) per layer and branch
        self.handles = []
        for layer in model.layers:
            attn = layer.attn
            if attn.compressor is not None and attn.compressor.key.gate_weight is not None:
                self.handles.append(attn.register_forward_pre_hook(self._hook(attn)))

    def _hook(self, attn):
        def pre(module, args):
            if not module.training:  # validation and gate snapshots are not part of the loss
                return
            h = args[0]  # (B, T, d): the compressor's input
            windows = attn.compressor.windows(h, attn.grid.offset)  # (B, n, W, d)
            if windows.shape[1] == 0:
                return
            for name, branch in (("key", attn.compressor.key), ("value", attn.compressor.value)):
                if branch is not None:
                    alpha = branch.gate_scores(windows)  # (B, n, W, n_kv, G)
                    self.prefs[name].append(phase_preference(alpha, attn.grid.stride, attn.grid.offset))

        return pre

    def pop(self) -> torch.Tensor:
        """Penalty R of the forward passes since the last pop, averaged over the key and value branches
        (heads are compared branch with branch); 0 when no complete window was seen."""
        terms = [overlap_penalty(torch.cat(p, 0)) for p in self.prefs.values() if p]  # (n_heads, S) each
        self.prefs = {"key": [], "value": []}
        return torch.stack(terms).mean() if terms else torch.zeros(())

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


@torch.no_grad()
def coverage_penalty(model: nn.Module, input_ids: torch.Tensor) -> float:
    """The penalty R of `model` on a batch (for reports and tests; runs the model in training mode)."""
    probe, was = CoverageProbe(model), model.training
    try:
        model.train()
        model(input_ids)
        return float(probe.pop())
    finally:
        probe.remove()
        model.train(was)
