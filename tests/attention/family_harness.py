"""The grid family's shared checks: every design's decode cache, fed any mix of chunks and single tokens, gives
the parallel forward's logits, and a hooked or `last` forward agrees with the whole one. Each design's test file
calls these with its own names (tests/attention/test_moba.py, test_beacon.py, test_nsa.py)."""

import torch

from phasekv import ModelConfig, PhaseLM

SMALL = dict(preset="tiny", vocab_size=61, n_layers=2, d_model=32, n_heads=4, head_dim=16, d_ff=48)


def small_model(name: str, **overrides) -> PhaseLM:
    return PhaseLM(ModelConfig.from_name(name, **(SMALL | overrides))).eval()


@torch.no_grad()
def decode_all(model: PhaseLM, ids: torch.Tensor, cuts) -> tuple[torch.Tensor, object]:
    """Logits of ids (B, T) fed to a fresh cache in chunks ending at `cuts` (increasing, the last = T)."""
    cache = model.new_cache(ids.shape[0])
    out, a = [], 0
    for b in cuts:
        out.append(model(ids[:, a:b], cache=cache))
        a = b
    return torch.cat(out, 1), cache


@torch.no_grad()
def assert_decode_equals_parallel(model: PhaseLM, ids: torch.Tensor, cuts, tol: float = 1e-5) -> object:
    """The cached forward over chunks `cuts` equals the parallel forward, and so does the `last` forward's
    logits; returns the cache."""
    ref = model(ids)  # (B, T, V)
    out, cache = decode_all(model, ids, cuts)
    assert (out - ref).abs().max().item() <= tol, f"decode vs parallel at cuts {list(cuts)}"
    assert (model(ids, last=True) - ref[:, -1]).abs().max().item() <= tol, "last vs parallel"
    assert cache.pos == ids.shape[1]
    return cache


def every_cut(T: int) -> list[list[int]]:
    """Token by token, a prompt then tokens, and uneven chunks."""
    return [list(range(1, T + 1)), [T // 2, *range(T // 2 + 1, T + 1)] if T > 1 else [T],
            sorted({min(T, c) for c in (3, 4, 17, 30)} | {T})]
