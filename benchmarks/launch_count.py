"""Kernel launches of one attention layer, counted on the CPU as the GPU path runs them: the aten operations a
training layer (forward and backward) and a one-token decode step dispatch, and the Triton kernels they launch.

A `TorchDispatchMode` sees every aten operation (the backward's too); views and empty allocations launch nothing
and are not counted. Triton launches are counted at `kernel[grid](...)` (the aten work the interpreter does to run
a kernel on the CPU is not); phasekv's custom operators are opened, so that the aten operations inside them count.
As on a GPU: the `triton` backend (the fused compressor and attention, under Triton's interpreter here), the
reference RMSNorm (PHASEKV_KERNELS=0: the fused CPU kernels are the CPU's), fp32. The layer is the `small`
preset's (d_model 256, 8 query heads of 32 dims); the decode step is the most any of S consecutive tokens
dispatches (the one completing a window included), after a prompt and a few warm-up steps.
    python benchmarks/launch_count.py [--preset small] [--names "W8/S8 · 1 KV,..."]
The last line is one JSON object {model name: {"train_layer": n, "decode_step": n}}.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from contextlib import contextmanager

import triton_cpu

triton_cpu.enable()  # before anything imports triton
os.environ["PHASEKV_KERNELS"] = "0"

import torch  # noqa: E402
from common import ROOT  # noqa: E402, F401  (puts the repo on sys.path)
from torch._library.custom_ops import _maybe_get_opdef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from phasekv import ModelConfig  # noqa: E402
from phasekv.attention import blockwise  # noqa: E402
from phasekv.attention.attention import Attention  # noqa: E402

NAMES = ("Full attention · 1 KV", "W8/S8 · 1 KV", "W8/S4 · 1 KV")
# no kernel: allocations, and views whose schema does not say so
NO_LAUNCH = {"empty.memory_format", "empty_strided", "new_empty", "new_empty_strided", "empty_like", "_unsafe_view"}
GOAL = 10  # W8/S8's counts at most full attention's + this


class Launches(TorchDispatchMode):
    """Counts the aten operations that launch a kernel (not views, not empty allocations) and Triton launches."""

    def __init__(self):
        super().__init__()
        self.aten: Counter[str] = Counter()
        self.triton = 0
        self.paused = 0  # inside a Triton launch: the interpreter's own tensor work is not the GPU's

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        opdef = _maybe_get_opdef(func) if func.namespace == "phasekv" else None
        if opdef is not None:  # a custom operator: its body's aten operations and launches count
            with self:
                return opdef._init_fn(*args, **kwargs)
        name = func._schema.name.split("::")[1] + ("" if func._overloadname == "default" else f".{func._overloadname}")
        if not self.paused and not func.is_view and name not in NO_LAUNCH:
            self.aten[name] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.aten.values()) + self.triton


@contextmanager
def counting():
    """A `Launches` mode over the block, with Triton's `kernel[grid](...)` counted where triton is installed."""
    mode = Launches()
    try:
        from triton.runtime.jit import KernelInterface
    except ImportError:
        KernelInterface = None
    original = KernelInterface and KernelInterface.__getitem__

    def getitem(kernel, grid):
        launch = original(kernel, grid)

        def counted(*args, **kwargs):
            mode.triton += 1
            mode.paused += 1
            try:
                return launch(*args, **kwargs)
            finally:
                mode.paused -= 1
        return counted

    if KernelInterface is not None:
        KernelInterface.__getitem__ = getitem
    try:
        with mode:
            yield mode
    finally:
        if KernelInterface is not None:
            KernelInterface.__getitem__ = original


def train_layer(attn: Attention, T: int) -> Launches:
    """One forward and backward of the layer over T tokens (after one untimed call: caches, tuning)."""
    h = torch.randn(1, T, attn.cfg.d_model, requires_grad=True)  # (B, T, d)
    pos, up = torch.arange(T), torch.randn(1, T, attn.cfg.d_model)
    for warm in (True, False):
        attn.zero_grad(set_to_none=True)  # as a training step: no gradient to accumulate into
        h.grad = None
        with counting() if not warm else torch.enable_grad() as c:
            attn(h, pos).backward(up)
    return c


def decode_step(attn: Attention, prompt: int, warmup: int = 3) -> Launches:
    """The most launches of S consecutive one-token steps through the layer's cache, after a prompt."""
    d, S = attn.cfg.d_model, attn.cfg.stride if attn.compressor is not None else 1
    cache = attn.new_cache()
    with torch.no_grad():
        attn(torch.randn(1, prompt, d), torch.arange(prompt), cache)
        counts = []
        for t in range(prompt, prompt + warmup + S):
            h, pos = torch.randn(1, 1, d), torch.tensor([t])
            with counting() if t >= prompt + warmup else torch.no_grad() as c:
                attn(h, pos, cache)
            counts.append(c)
    return max(counts[warmup:], key=lambda c: c.total)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small")
    p.add_argument("--names", default=",".join(NAMES))
    p.add_argument("--tokens", type=int, default=64, help="T of the training layer (launches do not depend on it)")
    p.add_argument("--verbose", action="store_true", help="also list each count's operations")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    backend = "triton" if blockwise._HAS_TRITON else "blockwise"
    print(f"launches of one attention layer, preset {args.preset}, backend {backend} (the GPU's), fp32: aten "
          "operations that launch a kernel + Triton launches")
    print(f"{'model':>24} | {'train layer (fwd+bwd)':>24} | {'decode step':>22}")
    result = {}
    for name in args.names.split(","):
        torch.manual_seed(0)
        attn = Attention(ModelConfig.from_name(name, preset=args.preset), 0)
        with blockwise.use_backend(backend):
            counts = {"train_layer": train_layer(attn, args.tokens), "decode_step": decode_step(attn.eval(), 40)}
        cells = [f"{c.total:>4} = {sum(c.aten.values()):>3} aten + {c.triton} triton" for c in counts.values()]
        print(f"{name:>24} | {cells[0]:>24} | {cells[1]:>22}")
        if args.verbose:
            for what, c in counts.items():
                print(f"{'':>24}   {what}: {dict(sorted(c.aten.items()))}")
        result[name] = {k: c.total for k, c in counts.items()}
    full, w8s8 = result.get(NAMES[0]), result.get(NAMES[1])
    if full and w8s8:
        print(f"goal: W8/S8 at most full attention's + {GOAL}: " + ", ".join(
            f"{k} {w8s8[k]} vs {full[k] + GOAL}: {'met' if w8s8[k] <= full[k] + GOAL else 'missed'}" for k in full))
    print(json.dumps(result, ensure_ascii=False))
    return result


if __name__ == "__main__":
    main()
