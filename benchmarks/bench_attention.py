"""Attention layer forward+backward: compressed (W8/S8, W8/S4; n_local 16, 1 KV head) vs full causal attention
(`scaled_dot_product_attention(is_causal=True)`), same layer shape (the `small` preset's: d_model 256, 8 query
heads of 32 dims), batch 1, interleaved in one run. Every layer includes its projections, QK-norm and RoPE;
the compressed layers also run their compressor. The FLOP lower bound is the ratio of attended keys,
(T/S + n_local)/(T/2): the most a compressed query reads against the average a causal query reads.
"""

from __future__ import annotations

import argparse

import torch
from common import add_common_args, fmt_t, header, interleaved, setup

from phasekv import ModelConfig
from phasekv.attention import blockwise
from phasekv.attention.attention import Attention

MODELS = {"full": "full-1kv", "W8/S8": "w8s8-1kv", "W8/S4": "w8s4-1kv"}


def layer(name: str, preset: str, device, dtype) -> Attention:
    cfg = ModelConfig.from_name(name, preset=preset)
    return Attention(cfg, 0).to(device=device, dtype=dtype)


def step(attn: Attention, h: torch.Tensor, pos: torch.Tensor, up: torch.Tensor | None):
    """Forward (+ backward into h and the weights when `up` is given)."""
    def forward():
        with torch.no_grad():
            attn(h, pos)

    def forward_backward():
        attn(h, pos).backward(up)

    return forward if up is None else forward_backward


def main(argv: list[str] | None = None) -> None:
    p = add_common_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--train-lengths", default="1024,4096,16384", help="T for forward+backward")
    p.add_argument("--fwd-lengths", default="65536", help="T for forward only")
    p.add_argument("--preset", default="small")
    p.add_argument("--backend", default="blockwise", choices=[b for b in blockwise.BACKENDS if b != "reference"])
    p.add_argument("--reps", default="5,3,1", help="repetitions per length (last value repeats)")
    args = p.parse_args(argv)
    device, dtype = setup(args)
    torch.manual_seed(0)
    layers = {k: layer(v, args.preset, device, dtype) for k, v in MODELS.items()}
    cfg = layers["W8/S8"].cfg
    header(f"attention layer: compressed ({args.backend}) vs full causal SDPA, preset {args.preset} "
           f"(d_model {cfg.d_model}, {cfg.n_heads}x{cfg.head_dim} query heads, 1 KV head), batch 1", args,
           "time = median of interleaved repetitions; ratio = compressed / full; bound = (T/S + n_local)/(T/2)")
    reps = [int(r) for r in args.reps.split(",")]
    runs = [(int(t), True) for t in args.train_lengths.split(",") if t] + \
           [(int(t), False) for t in args.fwd_lengths.split(",") if t]
    print(f"{'T':>7} {'pass':>8} | {'full':>9} | {'W8/S8':>9} {'ratio':>6} {'bound':>6} | {'W8/S4':>9} {'ratio':>6} {'bound':>6}")
    with blockwise.use_backend(args.backend):
        for i, (T, train) in enumerate(runs):
            h = torch.randn(1, T, cfg.d_model, device=device, dtype=dtype, requires_grad=train)
            pos = torch.arange(T, device=device)
            up = torch.randn(1, T, cfg.d_model, device=device, dtype=dtype) if train else None
            fns = {k: step(a, h, pos, up) for k, a in layers.items()}
            t = interleaved(fns, reps[min(i, len(reps) - 1)], device, warmup=1 if T <= 4096 else 0)
            row = f"{T:>7} {'fwd+bwd' if train else 'fwd':>8} | {fmt_t(t['full'].median):>9}"
            for k in ("W8/S8", "W8/S4"):
                S = layers[k].cfg.stride
                bound = (T / S + layers[k].cfg.local_window) / (T / 2)
                row += f" | {fmt_t(t[k].median):>9} {t[k].median / t['full'].median:>6.3f} {bound:>6.3f}"
            print(row, flush=True)
            del h, up, fns
    print("targets: W8/S8 fwd+bwd <= 0.5x full at T=4096, <= 0.35x at T=16384")


if __name__ == "__main__":
    main()
