"""GPU check of the fast paths (run by gpu.sh before the benchmarks): blockwise and flex parallel attention and
the cached decode, each against the dense-mask reference in fp32, forward and gradients. Prints PASS/FAIL
lines and exits 0 either way, so that one GPU session still yields the benchmark figures."""

from __future__ import annotations

import sys

import torch
from common import ROOT  # noqa: F401  (puts the repo on sys.path)

from phasekv import ModelConfig, PhaseLM
from phasekv.attention import blockwise

TOL = 1e-5
SHAPE = dict(preset="tiny", vocab_size=61, n_layers=2, d_model=32, n_heads=8, head_dim=16, d_ff=48)
NAMES = ["W8/S8 · 1 KV", "W8/S4 · 2 KV · staggered windows", "W5/S2 · 1 KV · uncompressed tail", "DeepSeek-style kernel"]


def run(model, ids, backend):
    model.zero_grad()
    with blockwise.use_backend(backend):
        logits = model(ids)
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def report(what: str, diff: float) -> None:
    print(f"{'PASS' if diff <= TOL else 'FAIL'} {what}: max abs diff {diff:.2e}", flush=True)


def main(device: str = "cuda") -> None:
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(device)
    for name in NAMES:
        torch.manual_seed(0)
        model = PhaseLM(ModelConfig.from_name(name, **SHAPE)).to(dev)
        ids = torch.randint(0, 61, (2, 2500), device=dev)  # several 1024-query blocks, a short last one
        ref, g_ref = run(model, ids, "reference")
        for backend in ("blockwise", "flex"):
            try:
                out, g = run(model, ids, backend)
                report(f"{name} · {backend} forward", (out - ref).abs().max().item())
                report(f"{name} · {backend} gradients", max((a - b).abs().max().item() for a, b in zip(g, g_ref, strict=True)))
            except Exception as e:  # a backend that cannot run here is reported, not fatal to the benchmarks
                print(f"FAIL {name} · {backend}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        with torch.no_grad():
            cache = model.eval().new_cache(2)
            steps = [model(ids[:, :1500], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(1500, 1600)]
            report(f"{name} · cached decode vs parallel", (torch.cat(steps, 1) - ref[:, :1600]).abs().max().item())


if __name__ == "__main__":
    main(*sys.argv[1:2])
