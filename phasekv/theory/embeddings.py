"""Nearly equiangular token embeddings: |x.x' - kappa - 1{x = x'}| <= eps.

Construction (exact, any N, kappa in [0, 1), eps in [0, 1)):

    x_i = [ sqrt(1 - eps) e_i | sqrt(eps) u_i | sqrt(kappa) ]        (dimension N + D + 1)

with e_i the standard basis of R^N and u_i random unit vectors of R^D. Then

    x_i.x_j = (1 - eps) 1{i = j} + eps u_i.u_j + kappa,

so the diagonal is exactly 1 + kappa and every off-diagonal deviation eps u_i.u_j lies in
[-eps, eps] (Cauchy-Schwarz). With eps = 0 the Gram matrix is exactly kappa J + I. The shared last
coordinate is the anisotropic component kappa that every pair of tokens has in common.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from phasekv.errors import ConfigError, DataError


@dataclass(frozen=True)
class Embeddings:
    X: torch.Tensor  # (N, d) float64, one row per token
    kappa: float  # shared inner product of distinct tokens
    eps: float  # bound on the deviation from kappa J + I

    @property
    def N(self) -> int:
        return self.X.shape[0]

    @property
    def gram(self) -> torch.Tensor:
        return self.X @ self.X.T  # (N, N)

    def max_deviation(self) -> float:
        return gram_deviation(self.X, self.kappa)


def gram_deviation(X: torch.Tensor, kappa: float) -> float:
    """max_{i,j} |x_i.x_j - kappa - 1{i = j}|."""
    G = X @ X.T  # (N, N)
    target = kappa + torch.eye(X.shape[0], dtype=X.dtype)
    return float((G - target).abs().max())


def check_bound(X: torch.Tensor, kappa: float, eps: float, atol: float = 1e-9) -> float:
    """Verify the equiangularity bound; returns the measured deviation, raises DataError if it fails."""
    dev = gram_deviation(X, kappa)
    if dev > eps + atol:
        raise DataError(f"embeddings violate |x.x' - kappa - 1{{x=x'}}| <= eps: deviation {dev:.3g} > eps={eps}")
    return dev


def make_embeddings(N: int, kappa: float, eps: float = 0.0, seed: int = 0, noise_dim: int | None = None) -> Embeddings:
    """N embeddings meeting the bound with shared component kappa and deviation at most eps (checked)."""
    if N < 2:
        raise ConfigError(f"N (number of embeddings) must be >= 2, got {N}")
    if not 0.0 <= kappa < 1.0:
        raise ConfigError(f"kappa must lie in [0, 1), got {kappa}")
    if not 0.0 <= eps < 1.0:
        raise ConfigError(f"eps must lie in [0, 1), got {eps}")
    blocks = [(1.0 - eps) ** 0.5 * torch.eye(N, dtype=torch.float64)]
    if eps > 0:
        D = noise_dim or N
        g = torch.Generator().manual_seed(seed)
        U = torch.randn(N, D, generator=g, dtype=torch.float64)
        U = U / U.norm(dim=1, keepdim=True)  # unit rows: |u_i.u_j| <= 1
        blocks.append(eps**0.5 * U)
    blocks.append(torch.full((N, 1), kappa**0.5, dtype=torch.float64))
    X = torch.cat(blocks, dim=1)  # (N, N + D + 1)
    check_bound(X, kappa, eps)
    return Embeddings(X=X, kappa=kappa, eps=eps)
