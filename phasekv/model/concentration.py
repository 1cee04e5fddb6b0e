"""Gate concentration (docs: Explain the weak phases; the paper's Figure 4): how many window offsets a compressor gate effectively uses.

For gate weights alpha over the W offsets of many windows:

    static      = exp(H(E[alpha]))      entropy of the gate averaged over windows
    per_window  = E[exp(H(alpha))]      average over windows of each window's own effective number

Both lie in [1, W]: 1 = one offset, W = uniform. A gate that gives each offset the same score in every
window has static == per_window (the diagonal of the paper's Figure 4); a gate whose windows concentrate on
content-dependent offsets has per_window well below static (uniform on average, sharp per window).
Used by the training loop's gate snapshots (`gates.jsonl`) and by the mechanism analyses.
"""

from __future__ import annotations

import torch


def entropy(p: torch.Tensor, dim: int) -> torch.Tensor:
    """Shannon entropy (nats) of probability vectors along `dim` (0 log 0 = 0)."""
    return -torch.special.xlogy(p, p).sum(dim)


def concentration(alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Static and per-window effective numbers of offsets of gate weights `alpha`.

    alpha: (..., W, n_kv, G) as returned by `CompressorBranch.gate_scores` (leading dims = windows,
    e.g. (B, n_entries)); G = 1 for scalar gates, d_head for vector gates (averaged over channels).
    Returns (static, per_window), each (n_kv,) in [1, W].
    """
    a = alpha.detach().double().flatten(0, -4)  # (N windows, W, n_kv, G)
    static = entropy(a.mean(0), dim=0).exp()  # (n_kv, G)
    per_window = entropy(a, dim=1).exp().mean(0)  # (n_kv, G)
    return static.mean(-1).float(), per_window.mean(-1).float()
