"""GPU check of the fast paths (run by gpu.sh before the benchmarks): blockwise, flex and triton parallel attention
(on triton with the fused compressor) and the cached decode (on CUDA: the fused update of the in-flight windows),
each against the dense-mask reference in fp32 (max abs diff), forward and gradients; a layer compiled whole
(`torch.compile(fullgraph=True)`, what `phasekv train --compile` runs) against the eager one; then the flex and
triton attention and the fused compressor in bf16 at the `small` preset's shapes against fp32 (relative to the
largest value). Prints PASS/FAIL lines (SKIP where a backend has no such variant) and exits 0 either way, so that one
GPU session still yields the benchmark figures.
    python benchmarks/gpu_check.py [--backends blockwise,triton] [--smoke]   (--smoke: tiny, on the CPU, fp32 only;
    TRITON_INTERPRET=1 runs the triton backend there)
"""

from __future__ import annotations

import argparse
import os

import torch
from common import ROOT  # noqa: F401  (puts the repo on sys.path)

from phasekv import ModelConfig, PhaseLM
from phasekv.attention import blockwise
from phasekv.attention.positions import Grid
from phasekv.errors import ConfigError

os.environ.setdefault("PHASEKV_TRITON_TUNE", "0")  # equality, not speed: the triton kernels' first tiles, no tuning
TOL = 1e-5
BF16_TOL = 2e-2  # bf16 keeps 8 bits: blockwise's own bf16 error is of this order (printed beside)
BACKENDS = ("blockwise", "flex", "triton")
SHAPE = dict(preset="tiny", vocab_size=61, n_layers=2, d_model=32, n_heads=8, head_dim=16, d_ff=48)
NAMES = ["W8/S8 · 1 KV", "W8/S4 · 2 KV · staggered windows", "W6/S3 · 1 KV · V4 compressor · uncompressed tail · "
         "attention sink", "W5/S2 · 1 KV · uncompressed tail", "DeepSeek-style kernel"]
# (what, grid, KV heads, sinks, holds) at the `small` preset's heads: 8 query heads of 32 dims; precision, not
# logic (the fp32 checks above cover the variants): two cases, one compile of flex
BF16_CASES = [("W8/S8 · 1 KV", Grid(8, 8, 0, 16), 1, False, False),
              ("W6/S3 · V4 · uncompressed tail · sink, entries without a token", Grid(6, 3, -3, None), 1, True,
               True)]


def run(model, ids, backend):
    model.zero_grad()
    with blockwise.use_backend(backend):
        logits = model(ids)
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def report(what: str, diff: float, tol: float = TOL, unit: str = "max abs diff") -> None:
    print(f"{'PASS' if diff <= tol else 'FAIL'} {what}: {unit} {diff:.2e}", flush=True)


def attention_grads(backend, q, pos, ek, ev, k, v, grid, sinks, holds, up):
    leaves = [x for x in (q, ek, ev, k, v, sinks) if x is not None]
    out = blockwise.PARALLEL[backend](q, pos, ek, ev, k, v, grid, sinks=sinks, holds=holds)
    return [out, *torch.autograd.grad(out, leaves, up)]


def case_grads(backend, dtype, xs, pos, grid, sinks, holds, up):
    """Output and gradients of one backend with inputs xs = (q, ek, ev, k, v) and sinks cast to dtype."""
    q, ek, ev, k, v = (x.to(dtype).requires_grad_() for x in xs)
    sinks = None if sinks is None else sinks.clone().requires_grad_()
    return attention_grads(backend, q, pos, ek, ev, k, v, grid, sinks, holds, up.to(dtype))


def check_bf16(dev: torch.device, T: int = 2500) -> None:
    """Each fast backend in bf16 against blockwise in fp32 on the same (bf16-rounded) inputs: output and the
    q, entry, k, v (and sink) gradients, max abs diff relative to the reference's largest value."""
    for what, grid, kv, sink, hold in BF16_CASES:
        torch.manual_seed(0)
        n = grid.n_complete(T)
        xs = [torch.randn(2, h, m, 32, device=dev).bfloat16() for h, m in ((8, T), (kv, n), (kv, n), (kv, T), (kv, T))]
        sinks = torch.randn(8, device=dev) if sink else None
        holds = None
        if hold:
            holds = torch.ones(2, kv, n, dtype=torch.bool, device=dev)
            holds[1, -1, :2] = False
        pos = torch.arange(T, device=dev)
        up = torch.randn(2, 8, T, 32, device=dev)

        case = (xs, pos, grid, sinks, holds, up)
        ref = case_grads("blockwise", torch.float32, *case)
        for backend in BACKENDS:
            try:
                got = case_grads(backend, torch.bfloat16, *case)
            except ConfigError as e:
                print(f"SKIP {what} · {backend} bf16: {e}")
                continue
            except Exception as e:
                print(f"FAIL {what} · {backend} bf16: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            rel = max(((a.float() - b).abs().max() / b.abs().max()).item() for a, b in zip(got, ref, strict=True))
            report(f"{what} · {backend} bf16 forward and gradients", rel, BF16_TOL, "max diff / max |ref|")


def check_compiled(dev: torch.device, backend: str) -> None:
    """A compressed layer on the triton backend compiled whole with `backend`, against the eager layer (fp32)."""
    name = "W8/S4 · 2 KV · staggered heads · attention sink"
    torch.manual_seed(0)
    block = PhaseLM(ModelConfig.from_name(name, **SHAPE)).to(dev).layers[1]
    x, pos = torch.randn(2, 300, SHAPE["d_model"], device=dev, requires_grad=True), torch.arange(300, device=dev)

    def grads(f):
        out = f(x, pos)
        return [out, *torch.autograd.grad(out.square().sum(), [x, *block.parameters()])]

    try:
        with blockwise.use_backend("triton"):
            want, got = grads(block), grads(torch.compile(block, backend=backend, fullgraph=True, dynamic=False))
        report(f"{name} · layer compiled whole ({backend}) vs eager, forward and gradients", max(
            ((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want, strict=True)), 1e-4,
            "max diff / max |eager|")  # a compiler reorders sums
    except Exception as e:
        print(f"FAIL {name} · layer compiled whole ({backend}): {type(e).__name__}: {str(e).splitlines()[0][:200]}")


def check_compressor_bf16(dev: torch.device, T: int = 4096) -> None:
    """The fused compressor under bf16 autocast (its products in bf16) against the reference in fp32, `small`
    preset: entries and the gradients of h and of every parameter, relative to the largest value."""
    for name in ("W8/S8 · 1 KV", "W8/S4 · 2 KV · staggered heads · vector gates", "W8/S4 · 1 KV · V4 compressor"):
        try:
            report(f"{name} · fused compressor bf16 entries and gradients", compressor_bf16(name, dev, T), BF16_TOL,
                   "max diff / max |ref|")
        except Exception as e:
            print(f"FAIL {name} · fused compressor bf16: {type(e).__name__}: {str(e).splitlines()[0][:200]}")


def compressor_bf16(name: str, dev: torch.device, T: int) -> float:
    """The largest difference of the fused compressor under autocast from the reference in fp32, relative."""
    from phasekv.attention.attention import Attention

    torch.manual_seed(0)
    attn = Attention(ModelConfig.from_name(name, preset="small"), 0).to(dev)
    h = torch.randn(2, T, attn.cfg.d_model, device=dev)
    outs = []
    for fused in (False, True):
        x = h.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=fused and dev.type == "cuda"), \
                blockwise.use_backend("triton"):
            ek, ev = blockwise.triton_entries(attn.compressor, x, attn.k_norm) if fused else \
                attn.compressor.entries(x, attn.k_norm)
        leaves = [x, *(p for p in attn.parameters() if p.requires_grad)]
        loss = (ek * torch.linspace(-1, 1, ek.shape[-1], device=dev)).sum() + ev.sum()  # not scale-invariant
        outs.append([ek, ev, *torch.autograd.grad(loss, leaves, allow_unused=True)])
    return max(((a.float() - b).abs().max() / b.abs().max()).item()
               for a, b in zip(outs[1], outs[0], strict=True) if b is not None)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--names", type=int, default=len(NAMES), help=f"check the first N of the {len(NAMES)} models")
    p.add_argument("--compile", default="inductor", help="the torch.compile backend of the layer compiled whole")
    p.add_argument("--smoke", action="store_true", help="tiny lengths, fp32 only (a CPU dry run)")
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device if not args.smoke else "cpu")
    T, prompt = (70, 50) if args.smoke else (2500, 1500)  # several 1024-query blocks, a short last one
    for name in NAMES[: 2 if args.smoke else args.names]:
        check_model(name, dev, args.backends.split(","), T, prompt)
    check_compiled(dev, "aot_eager" if args.smoke else args.compile)
    if not args.smoke:
        check_bf16(dev)
    check_compressor_bf16(dev, 40 if args.smoke else 4096)  # the smoke's in fp32: autocast is CUDA's
    for what, why in blockwise.FAILED.items():  # a fused kernel that fell back passed its checks as the reference
        print(f"FAIL the fused Triton {what} cannot run here, the reference ran instead: {why}")


def check_model(name: str, dev: torch.device, backends: list[str], T: int, prompt: int) -> None:
    """One model's logits and gradients on each backend against the reference, and its cached decode."""
    torch.manual_seed(0)
    model = PhaseLM(ModelConfig.from_name(name, **SHAPE)).to(dev)
    ids = torch.randint(0, 61, (2, T), device=dev)
    ref, g_ref = run(model, ids, "reference")
    for backend in backends:
        try:
            out, g = run(model, ids, backend)
            report(f"{name} · {backend} forward", (out - ref).abs().max().item())
            report(f"{name} · {backend} gradients", max((a - b).abs().max().item() for a, b in zip(g, g_ref, strict=True)))
        except ConfigError as e:  # a variant the backend does not run (flex: attention sinks)
            print(f"SKIP {name} · {backend}: {e}")
        except Exception as e:  # a backend that cannot run here is reported, not fatal to the benchmarks
            print(f"FAIL {name} · {backend}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    with torch.no_grad():
        cache = model.eval().new_cache(2)
        end = min(prompt + 100, T)
        steps = [model(ids[:, :prompt], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(prompt, end)]
        report(f"{name} · cached decode vs parallel", (torch.cat(steps, 1) - ref[:, :end]).abs().max().item())


if __name__ == "__main__":
    main()
