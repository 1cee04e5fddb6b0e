"""The coverage regulariser: a training penalty that keeps heads from sharing static gate preferences.

Theory (the paper's theory section, Theorems 1 and 2): optimal compression is one-hot per head, and at eps = 0 the optimal assignments use
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

from collections.abc import Sequence
from contextlib import ExitStack

import torch
from torch import nn

from phasekv.attention.positions import Grid
from phasekv.model.gates import GateRead, gate_scores


def phase_preference(alpha: torch.Tensor, stride: int, offset: int | Sequence[int] = 0) -> torch.Tensor:
    """Static preference over phases (n_kv, S) of gate weights alpha (B, n, W, n_kv, G) of one branch whose
    window grid starts at `offset` (or, per KV head, at offset[h]: staggered heads)."""
    p = alpha.mean(dim=(0, 1, 4))  # (W, n_kv): E[alpha] over windows, channels of vector gates averaged
    W, n_kv = p.shape
    offsets = [offset] * n_kv if isinstance(offset, int) else list(offset)
    i = torch.arange(W, device=p.device)
    phase = torch.stack([Grid(W, stride, o).offset_phase(i) for o in offsets], 1)  # (W, n_kv) phase of each offset
    pooled = p.new_zeros(stride, n_kv).scatter_add(0, phase, p)  # (S, n_kv)
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
    The gate weights come from `phasekv.model.gates.gate_scores` (recomputed from the compressor's input with
    gradient, under DDP/FSDP2 too); forwards in eval mode (validation, gate snapshots) are not part of the loss.
    """

    def __init__(self, model: nn.Module):
        self.prefs: dict[str, list[torch.Tensor]] = {"key": [], "value": []}  # (n_kv, S) per layer and branch
        self._reading = ExitStack()
        self._reading.enter_context(gate_scores(model, self._read))

    def _read(self, read: GateRead) -> None:
        if read.training and read.gated:
            offsets = [read.grid.offset - d for d in read.delays]  # where each KV head's windows start
            self.prefs[read.branch].append(phase_preference(read.alpha, read.grid.stride, offsets))

    def pop(self) -> torch.Tensor:
        """Penalty R of the forward passes since the last pop, averaged over the key and value branches
        (heads are compared branch with branch); 0 when no complete window was seen."""
        terms = [overlap_penalty(torch.cat(p, 0)) for p in self.prefs.values() if p]  # (n_heads, S) each
        self.prefs = {"key": [], "value": []}
        return torch.stack(terms).mean() if terms else torch.zeros(())

    def remove(self) -> None:
        self._reading.close()


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
