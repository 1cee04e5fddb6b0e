"""Attention layer forward+backward: compressed (W8/S8, W8/S4; n_local 16, 1 KV head) under each attention backend
vs full causal attention (`scaled_dot_product_attention(is_causal=True)`), same layer shape (the `small` preset's:
d_model 256, 8 query heads of 32 dims), batch 1, interleaved in one run. Every layer includes its projections,
QK-norm and RoPE; the compressed layers also run their compressor.

Every contender is warmed up at every length before any is timed (`--warmup` calls; the first call's time, which
holds compiles and mask building, is reported apart), then timed round-robin (`--reps` turns, medians; on CUDA each
call between device synchronisations). A backend that `blockwise.use_backend` rejects or whose first call fails is
skipped with a printed line. The FLOP lower bound is the ratio of attended keys, (T/S + n_local)/(T/2): the most
a compressed query reads against the average a causal query reads.

Throughput is the attention's own work over the layer's time (projections and compressor are not counted):
  FLOPs, forward: 4 B H D K, with K the attended query-key pairs: T^2/2 causal, T^2/(2S) + T n_local compressed
  (two matmuls of 2 FLOPs per multiply-add); forward+backward: 3.5x the forward (backward: 5 matmuls to 2).
  bytes, forward: each input read and the output written once, B D (2 H T + 2 n_kv (T + n_entries)) elements
  (queries, output; keys, values of the exact tokens and the entries); forward+backward: 2.5x (the backward reads
  q, k, v, o, do and writes dq, dk, dv).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from common import add_common_args, fmt_t, header, setup, sync

from phasekv import ModelConfig
from phasekv.attention import blockwise
from phasekv.attention.attention import Attention

MODELS = {"W8/S8": "w8s8-1kv", "W8/S4": "w8s4-1kv"}
FULL = "full"
KERNEL = "alone"  # contenders timing the attention alone (`--kernels`)
CAPTURED = "captured"  # contenders timing the layer compiled whole (`--compile`)
# W8/S8 / full at most, by (T, pass); W8/S4's target scales by its own bound: target x bound(S4) / bound(S8)
TARGETS = {(4096, "fwd+bwd"): 0.5, (16384, "fwd+bwd"): 0.35, (65536, "fwd+bwd"): 0.3, (131072, "fwd"): 0.3}
PEAK_TFLOPS, PEAK_TBS = 790.0, 4.3  # one H200, bf16 dense matmul and device copies (measured)
BWD_FLOPS, BWD_BYTES = 3.5, 2.5  # forward+backward / forward


def layer(name: str, preset: str, device, dtype) -> Attention:
    return Attention(ModelConfig.from_name(name, preset=preset), 0).to(device=device, dtype=dtype)


def bound(cfg: ModelConfig, T: int) -> float:
    """(T/S + n_local)/(T/2): attended keys of a compressed query at most, over a causal query's on average."""
    return (T / cfg.stride + cfg.local_window) / (T / 2)


def work(cfg: ModelConfig, T: int, train: bool, itemsize: int) -> tuple[float, float]:
    """The attention's FLOPs and bytes (module docstring) of one batch-1 call at T tokens."""
    H, n_kv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    pairs = T * T / 2 if not cfg.compressed else T * T / (2 * cfg.stride) + T * cfg.local_window
    entries = 0 if not cfg.compressed else T // cfg.stride
    flops = 4 * H * D * pairs * (BWD_FLOPS if train else 1)
    nbytes = D * (2 * H * T + 2 * n_kv * (T + entries)) * itemsize * (BWD_BYTES if train else 1)
    return flops, nbytes


def step(attn: Attention, backend: str, h: torch.Tensor, pos: torch.Tensor, up: torch.Tensor | None):
    """Forward (+ backward into h and the weights when `up` is given) under `backend`."""
    def call():
        with blockwise.use_backend(backend):
            if up is None:
                with torch.no_grad():
                    attn(h, pos)
            else:
                attn(h, pos).backward(up)
    return call


def kernel_step(cfg: ModelConfig, grid, backend: str | None, T: int, train: bool, device, dtype):
    """The attention alone, no projections or compressor: causal SDPA (backend None), or the backend's parallel
    path (`blockwise.<backend>_attention`) over random entries, queries, keys and values of the layer's shape."""
    H, n_kv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    make = lambda *shape: torch.randn(*shape, device=device, dtype=dtype, requires_grad=train)  # noqa: E731
    q, k, v = make(1, H, T, D), make(1, n_kv, T, D), make(1, n_kv, T, D)
    up = torch.randn(1, H, T, D, device=device, dtype=dtype) if train else None
    if backend is None:
        attend = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    else:
        fn, pos = getattr(blockwise, f"{backend}_attention"), torch.arange(T, device=device)
        ek, ev = make(1, n_kv, grid.n_complete(T), D), make(1, n_kv, grid.n_complete(T), D)
        attend = lambda: fn(q, pos, ek, ev, k, v, grid)  # noqa: E731

    def call():
        if up is None:
            with torch.no_grad():
                attend()
        else:
            attend().backward(up)
    return call


def captured(full: Attention, layers: dict, backend: str, h, pos, up, failed: set, kind: str) -> dict:
    """Full attention's layer and the compressed ones on the fused triton kernels, each compiled whole (one graph,
    static shapes: what `phasekv train --compile` captures)."""
    whole = {FULL: full} | {k: a for k, a in layers.items()}
    return {f"{k} {CAPTURED}": step(torch.compile(a, backend=backend, fullgraph=True, dynamic=False),
                                    "blockwise" if k == FULL else "triton", h, pos, up)
            for k, a in whole.items() if (f"{k} {CAPTURED}", kind) not in failed}


def timed(fn, device) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def target(name: str, T: int, kind: str, cfgs: dict) -> float | None:
    goal = TARGETS.get((T, kind))
    if goal is None:
        return None
    return goal * bound(cfgs[name], T) / bound(cfgs["W8/S8"], T)


def warm_and_time(fns: dict, reps: int, warmup: int, device, failed: set, kind: str, T: int) -> tuple[dict, dict]:
    """Every contender warmed up at this length before any is timed (one that fails, e.g. a backend that cannot run
    here, is dropped from `fns` and skipped from now on), then timed round-robin: the first call's seconds and each
    timed call's, by contender."""
    first = {}
    for name, fn in list(fns.items()):
        try:
            first[name] = timed(fn, device)
            for _ in range(warmup - 1):
                fn()
        except Exception as e:
            print(f"skip {name} at T={T}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
            del fns[name]
            failed.add((name, kind))
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            times[name].append(timed(fn, device))
    return first, times


def row(name: str, T: int, kind: str, first: float, samples: list[float], med: dict, cfgs: dict, dtype,
        device) -> dict:
    """One contender's figures at T, printed: its ratio to full attention's (the attention alone against SDPA
    alone, a captured layer against full attention's captured alike), bound, target and throughput."""
    arch = name.split(" ")[0]
    c = cfgs[arch]
    flops, nbytes = work(c, T, kind == "fwd+bwd", torch.finfo(dtype).bits // 8)
    ref = next((f"{FULL} {kind_}" for kind_ in (KERNEL, CAPTURED) if name.endswith(kind_)), FULL)
    ratio = med[name] / med[ref] if ref in med else float("nan")
    b = bound(c, T) if c.compressed else None
    goal = target(arch, T, kind, cfgs) if c.compressed else None
    verdict = "" if goal is None else ("PASS" if ratio <= goal else "MISS")
    out = {"T": T, "pass": kind, "contender": name, "first_s": first, "warm_s": med[name], "ratio": ratio, "bound": b,
           "target": goal, "verdict": verdict, "tflops": flops / med[name] / 1e12, "gbs": nbytes / med[name] / 1e9,
           "samples_s": samples}
    peak = f" {out['tflops'] / PEAK_TFLOPS:>6.1%} {out['gbs'] / 1e3 / PEAK_TBS:>6.1%}" if device.type == "cuda" else ""
    print(f"{T:>7} {kind:>7} {name:>23} | {fmt_t(first):>9} {fmt_t(med[name]):>9} {ratio:>6.3f} "
          f"{f'{b:.3f}' if c.compressed else '':>6} {'' if goal is None else f'{goal:.3f}':>6} | "
          f"{out['tflops']:>8.3g} {out['gbs']:>8.4g}{peak} | {verdict}", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = add_common_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--train-lengths", default="1024,4096,16384", help="T for forward+backward")
    p.add_argument("--fwd-lengths", default="65536", help="T for forward only")
    p.add_argument("--preset", default="small")
    p.add_argument("--backends", default="blockwise", help="comma-separated attention backends to time (one that "
                   "does not exist or fails is skipped)")
    p.add_argument("--reps", type=int, default=5, help="timed turns per length (medians)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls of every contender at every length")
    p.add_argument("--kernels", action="store_true", help="also time the attention alone (SDPA, each backend's "
                   "parallel path over random entries), no projections or compressor")
    p.add_argument("--compile", default="", help="also time full attention's layer and the compressed ones on the "
                   "triton backend compiled whole (torch.compile fullgraph, static shapes) with this backend "
                   "(inductor, cudagraphs; aot_eager: the trace alone), against each other")
    p.add_argument("--json", default="", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    if args.reps < 1 or args.warmup < 1:
        p.error(f"--reps and --warmup must be >= 1, got {args.reps} and {args.warmup}")
    device, dtype = setup(args)
    torch.manual_seed(0)
    full = layer("full-1kv", args.preset, device, dtype)
    layers = {k: layer(v, args.preset, device, dtype) for k, v in MODELS.items()}
    cfgs = {k: a.cfg for k, a in layers.items()} | {FULL: full.cfg}
    cfg = full.cfg
    header(f"attention layer: compressed (backends {args.backends}) vs full causal SDPA, preset {args.preset} "
           f"(d_model {cfg.d_model}, {cfg.n_heads}x{cfg.head_dim} query heads, 1 KV head), batch 1", args,
           f"{args.warmup} warm-up call(s) of every contender at every length, then medians of {args.reps} "
           f"interleaved turns; ratio = / full SDPA; bound = (T/S + n_local)/(T/2); TFLOP/s and GB/s: the "
           f"attention's FLOPs, 4 H D K with K = T^2/2 (causal) or T^2/(2S) + T n_local (compressed) query-key "
           f"pairs, and bytes, D (2 H T + 2 n_kv (T + T/S)) elements, each x{BWD_FLOPS} and x{BWD_BYTES} for "
           f"fwd+bwd, over the layer's time (projections and compressor not counted)" +
           (f"; peaks {PEAK_TFLOPS:.0f} TFLOP/s, {PEAK_TBS} TB/s" if device.type == "cuda" else ""))
    backends = []
    for b in args.backends.split(","):
        try:
            with blockwise.use_backend(b):
                backends.append(b)
        except Exception as e:
            print(f"skip backend {b}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    runs = [(int(t), "fwd+bwd") for t in args.train_lengths.split(",") if t] + \
           [(int(t), "fwd") for t in args.fwd_lengths.split(",") if t]
    rows, failed = [], set()
    print(f"{'T':>7} {'pass':>7} {'contender':>23} | {'first':>9} {'warm':>9} {'ratio':>6} {'bound':>6} "
          f"{'target':>6} | {'TFLOP/s':>8} {'GB/s':>8}" + (f" {'%peak':>6} {'%peak':>6}" if device.type == "cuda" else "")
          + " | verdict")
    for T, kind in runs:
        train = kind == "fwd+bwd"
        h = torch.randn(1, T, cfg.d_model, device=device, dtype=dtype, requires_grad=train)
        pos = torch.arange(T, device=device)
        up = torch.randn(1, T, cfg.d_model, device=device, dtype=dtype) if train else None
        fns = {FULL: step(full, "blockwise", h, pos, up)}
        fns |= {f"{k} {b}": step(a, b, h, pos, up) for k, a in layers.items() for b in backends
                if (f"{k} {b}", kind) not in failed}
        if args.compile:
            fns |= captured(full, layers, args.compile, h, pos, up, failed, kind)
        if args.kernels:
            fns[f"{FULL} {KERNEL}"] = kernel_step(cfg, None, None, T, train, device, dtype)
            fns |= {f"{k} {b} {KERNEL}": kernel_step(a.cfg, a.grid, b, T, train, device, dtype)
                    for k, a in layers.items() for b in backends if (f"{k} {b} {KERNEL}", kind) not in failed}
        first, times = warm_and_time(fns, args.reps, args.warmup, device, failed, kind, T)
        med = {name: statistics.median(v) for name, v in times.items()}
        rows += [row(name, T, kind, first[name], times[name], med, cfgs, dtype, device) for name in fns]
        del h, up, fns
    print("targets: W8/S8 fwd+bwd <= 0.5x full SDPA at T=4096, <= 0.35x at 16384, <= 0.3x at 65536; fwd <= 0.3x at "
          "131072; W8/S4: the same factor of its own bound")
    result = dict(device=str(device), dtype=args.dtype, preset=args.preset, backends=backends, rows=rows,
                  peaks=dict(tflops=PEAK_TFLOPS, tbs=PEAK_TBS))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
