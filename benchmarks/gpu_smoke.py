"""A short GPU smoke run of the fast backends (under a minute on one H200): the `small` preset's W8/S8 attention
layer (d_model 256, 8 x 32 query heads, 1 KV head), batch 1, bf16, forward+backward at T = 4,096 and
16,384 on each backend, checked against blockwise (output and input gradient, max diff / max |blockwise|), with
the first call's time (compiles, mask building) apart from the warm median; full causal SDPA's layer beside.
Then the attention alone on each backend against causal SDPA, and the tiles the Triton kernels picked.
    python benchmarks/gpu_smoke.py [DEVICE [LENGTHS]]     (a dry run here: python benchmarks/gpu_smoke.py cpu 70)
"""

from __future__ import annotations

import functools
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from common import ROOT  # noqa: F401  (puts the repo on sys.path)

from phasekv import ModelConfig
from phasekv.attention import blockwise
from phasekv.attention.attention import Attention
from phasekv.attention.positions import Grid

BF16_TOL = 2e-2
LENGTHS = (4096, 16384)
WARM_REPS = 5


def timed(fn, device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda _: None
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def train_step(layer: Attention, backend: str, h: torch.Tensor, pos: torch.Tensor, up: torch.Tensor):
    """Forward and backward of `layer` on `backend` -> (output, input gradient)."""
    def step():
        h.grad = None
        with blockwise.use_backend(backend):
            out = layer(h, pos)
        out.backward(up)
        return out.detach(), h.grad

    return step


def main(device: str = "cuda", lengths: str = ",".join(map(str, LENGTHS))) -> None:
    dev = torch.device(device)
    torch.manual_seed(0)
    layers = {name: Attention(ModelConfig.from_name(name, preset="small"), 0).to(dev, torch.bfloat16)
              for name in ("Full attention · 1 KV", "W8/S8 · 1 KV")}
    print(f"{'layer':>22} {'backend':>9} {'T':>6} {'first s':>8} {'warm ms':>8} {'/ full':>7}  check")
    for T in map(int, lengths.split(",")):
        h = torch.randn(1, T, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
        pos = torch.arange(T, device=dev)
        up = torch.randn(1, T, 256, device=dev, dtype=torch.bfloat16)
        full_ms = None
        for name, layer in layers.items():
            for backend in ("blockwise",) if layer.compressor is None else ("blockwise", "flex", "triton"):
                step = train_step(layer, backend, h, pos, up)
                try:
                    first = timed(step, dev)
                    warm = statistics.median(timed(step, dev) for _ in range(WARM_REPS)) * 1e3
                    out, grad = step()
                except Exception as e:  # one backend failing still leaves the others' figures
                    print(f"{name:>22} {backend:>9} {T:>6} FAIL {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                    continue
                if backend == "blockwise":
                    ref = (out, grad)
                    full_ms = warm if layer.compressor is None else full_ms
                    check = "reference"
                else:
                    rel = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                              for a, b in zip((out, grad), ref, strict=True))
                    check = f"{'PASS' if rel <= BF16_TOL else 'FAIL'} max diff / max |blockwise| {rel:.1e}"
                label = backend if layer.compressor is not None else "sdpa"
                print(f"{name:>22} {label:>9} {T:>6} {first:>8.2f} {warm:>8.2f} {warm / full_ms:>7.3f}  {check}",
                      flush=True)


def backward(run, up: torch.Tensor) -> None:
    run().backward(up)


def kernels_alone(device: str = "cuda", lengths: str = ",".join(map(str, LENGTHS))) -> None:
    """The attention alone (no projections, no compressor): W8/S8's joint softmax on each backend against causal
    SDPA over the same T tokens, forward+backward, 8 query heads and 1 KV head of 32 dims, bf16, warm medians."""
    dev = torch.device(device)
    grid = Grid(8, 8, 0, 16)
    print(f"{'attention alone':>22} {'backend':>9} {'T':>6} {'warm ms':>8} {'/ sdpa':>7} {'bound':>6}")
    for T in map(int, lengths.split(",")):
        n = grid.n_complete(T)
        q, ek, ev, k, v = (torch.randn(1, h, m, 32, device=dev, dtype=torch.bfloat16, requires_grad=True)
                           for h, m in ((8, T), (1, n), (1, n), (1, T), (1, T)))
        pos = torch.arange(T, device=dev)
        up = torch.randn(1, 8, T, 32, device=dev, dtype=torch.bfloat16)
        runs = {"sdpa": functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True, enable_gqa=True)}
        runs |= {name: functools.partial(blockwise.PARALLEL[name], q, pos, ek, ev, k, v, grid)
                 for name in ("blockwise", "flex", "triton")}
        base = None
        for name, run in runs.items():
            step = functools.partial(backward, run, up)
            try:
                timed(step, dev)  # first call: compiles, autotuning
                warm = statistics.median(timed(step, dev) for _ in range(WARM_REPS)) * 1e3
            except Exception as e:
                print(f"{'':>22} {name:>9} {T:>6} FAIL {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                continue
            base = base or warm
            bound = (T / 8 + 16) / (T / 2)
            print(f"{'':>22} {name:>9} {T:>6} {warm:>8.3f} {warm / base:>7.3f} {bound:>6.3f}", flush=True)


def tuned_tiles() -> None:
    """The tiles triton.autotune picked per key (length bucket, dtypes) for each kernel."""
    from phasekv.attention import triton_kernel

    for name in ("_fwd_kernel", "_dq_kernel", "_dkv_kernel"):
        for key, config in getattr(triton_kernel, name).cache.items():
            print(f"tiles {name} {key}: {config}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
    kernels_alone(*sys.argv[1:3])
    tuned_tiles()
