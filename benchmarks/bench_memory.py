"""Peak memory of one compressed attention layer's forward (W8/S8 · 1 KV, n_local 16) at T = 16K: the blockwise
path against the dense-mask reference (`attend` over `Grid.mask`), with full causal SDPA for context.

Layer shape: the `tiny` preset's attention (d_model 64, 4 query heads of 32 dims, 1 KV head), batch 1: the
reference materialises (heads, T, n + T) fp32 scores twice (~10 GB at 16K), the `small` preset's 8 heads
would need ~20 GB. Forward under no_grad (inference). Each figure comes from a fresh process: on CPU the
resident-set high-water mark above the resident set before the forward (inputs and weights already
allocated), on CUDA the allocator's peak above what was allocated before.
"""

from __future__ import annotations

import argparse
import json

import torch
from common import add_common_args, gib, header, in_subprocess, mem_available, peak_bytes, setup

from phasekv import ModelConfig
from phasekv.attention import blockwise
from phasekv.attention.attention import Attention

VARIANTS = {"blockwise": ("w8s8-1kv", "blockwise"), "reference": ("w8s8-1kv", "reference"),
            "full SDPA": ("full-1kv", "blockwise")}


def reference_need(cfg: ModelConfig, T: int, itemsize: int) -> int:
    """Bytes the dense reference holds at its peak: two (H, T, n + T) score tensors and the bool mask."""
    n = T // cfg.stride
    return 2 * cfg.n_heads * T * (n + T) * itemsize + T * (n + T)


def measure_one(variant: str, T: int, preset: str, device, dtype) -> int:
    name, backend = VARIANTS[variant]
    torch.manual_seed(0)
    attn = Attention(ModelConfig.from_name(name, preset=preset), 0).to(device=device, dtype=dtype)
    h = torch.randn(1, T, attn.cfg.d_model, device=device, dtype=dtype)
    pos = torch.arange(T, device=device)

    def forward():
        with torch.no_grad(), blockwise.use_backend(backend):
            attn(h, pos)

    return peak_bytes(forward, device)


def main(argv: list[str] | None = None) -> None:
    p = add_common_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--length", type=int, default=16384)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--one", choices=list(VARIANTS), help=argparse.SUPPRESS)  # child process: one measurement
    args = p.parse_args(argv)
    device, dtype = setup(args)
    if args.one:
        print(json.dumps({"peak": measure_one(args.one, args.length, args.preset, device, dtype)}))
        return
    cfg = ModelConfig.from_name("w8s8-1kv", preset=args.preset)
    header(f"peak memory: attention layer forward at T={args.length}, W8/S8 · 1 KV, preset {args.preset} "
           f"({cfg.n_heads}x{cfg.head_dim} query heads), batch 1, no_grad", args,
           "each figure from a fresh process; ratio = against the dense-mask reference")
    peaks = {}
    for variant in VARIANTS:
        need = reference_need(cfg, args.length, torch.finfo(dtype).bits // 8)
        if variant == "reference" and device.type == "cpu" and need * 1.2 > mem_available():
            print(f"{variant:>10}: skipped, needs ~{gib(need)}, MemAvailable {gib(mem_available())}")
            continue
        child = ["--one", variant, "--length", str(args.length), "--preset", args.preset, "--device", args.device,
                 "--dtype", args.dtype, "--threads", str(args.threads)]
        peaks[variant] = json.loads(in_subprocess(__file__, child).strip().splitlines()[-1])["peak"]
    ref = peaks.get("reference")
    for variant, peak in peaks.items():
        ratio = f"{peak / ref:.4f}" if ref else "n/a"
        print(f"{variant:>10}: peak {gib(peak):>12}   ratio {ratio}")
    print("target: blockwise <= 0.3x the dense-mask reference")


if __name__ == "__main__":
    main()
