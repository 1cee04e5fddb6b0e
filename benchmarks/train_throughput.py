"""Training step: one optimizer step (forward, backward, AdamW) of full attention and W8/S8 · 1 KV against a
plain reference model of the same shape (`reference_model.ReferenceLM`), measured interleaved in one run; ratios
paired by turn, with their intervals: a model's step / the reference's (goal <= 1.0 on the CPU, full attention
<= 1.05 on a GPU at 4,096 tokens) and W8/S8's / full attention's (GPU goals by length: `W8S8_GOALS`).

The step is the training loop's own (`phasekv.train.loop.loss_sum`, backward, the optimizer of
`phasekv.train.build.build_optimizer`: fused AdamW); the reference's is a plain script's (`torch.optim.AdamW`,
its default per-tensor loop on CPU). Batches are random tokens of the preset's vocabulary (throughput does not
depend on the data). `--compile BACKEND` compiles every contender's layers alike, as `phasekv train --compile`
does (`phasekv.train.distributed.compile_layers`: each block one graph, static shapes; the rest of the step
eager), where they can be captured (`capturable`; a contender that cannot runs eagerly, said so): `inductor`
(what `phasekv train --compile` runs), `cudagraphs` (CUDA graphs of the traced layers, no code generation:
seconds to compile) or `aot_eager` (the trace alone: CPU checks). `--mfu`: model FLOPs utilisation, 6 N D per step
(N the parameters that multiply: an untied input embedding's lookup excluded) over the step's time, against the
device's matmul peak measured here.
"""

from __future__ import annotations

import argparse
import json
import time

import common
import torch
import torch.nn.functional as F
from common import DTYPES, add_common_args, fmt_t, goal_verdict, header, interleaved, paired_ratio, setup
from reference_model import ReferenceLM

from phasekv import ModelConfig, PhaseLM
from phasekv.train.build import build_optimizer
from phasekv.train.config import TrainConfig
from phasekv.train.distributed import capturable, compile_layers
from phasekv.train.loop import loss_sum

SHAPES = {"tiny": (64, 96), "small": (8, 512)}  # preset: (batch, seq_len) by default; tiny = the train defaults
GOAL = 1.0  # CPU: a model's step time / the reference's, at most (issue 20)
FULL_GOAL = 1.05  # GPU: full attention's step / the reference's at 4,096 tokens, at most
W8S8_GOALS = {4096: 1.0, 16384: 0.6, 65536: 0.4}  # GPU: W8/S8's step / full attention's, at most, by tokens
REFERENCE = "reference (plain PyTorch)"
MODELS = {"reference": REFERENCE, "full": "Full attention · 1 KV", "w8s8": "W8/S8 · 1 KV"}


def make_model(arch: str, preset: str, device, compile_backend: str):
    """The model of `arch` and whether its layers were compiled."""
    torch.manual_seed(0)
    plain = arch == REFERENCE
    cfg = ModelConfig.from_name("Full attention · 1 KV" if plain else arch, preset=preset)
    model = (ReferenceLM(cfg) if plain else PhaseLM(cfg)).to(device)
    whole = bool(compile_backend) and (plain or capturable(model, device))
    if whole:
        compile_layers(model, compile_backend)
    return model, whole


def make_step(model, batch: int, seq_len: int, device, autocast: bool):
    plain = isinstance(model, ReferenceLM)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if plain else build_optimizer(model, TrainConfig(), device)
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq_len + 1), generator=g).to(device)

    def step():
        if plain:  # a plain training script's loss: logits everywhere (random tokens: all labelled)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
        else:
            loss = loss_sum(model, ids[:, :-1], ids[:, 1:], autocast)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def matmul_peak(device, dtype, n: int = 8192, reps: int = 10) -> float:
    """The device's dense matmul rate in `dtype`, FLOP/s: the best of `reps` n x n x n products."""
    n = n if device.type == "cuda" else 256
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    best = float("inf")
    for _ in range(reps + 2):
        common.sync(device)
        t = time.perf_counter()
        a @ b
        common.sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def matmul_params(model) -> int:
    """N of 6 N D: every parameter but an untied input embedding (a lookup, no multiply)."""
    embed = model.embed.weight
    head = model.lm_head.weight if getattr(model, "lm_head", None) is not None else embed
    return sum(p.numel() for p in model.parameters()) - (embed.numel() if head is not embed else 0)


def shapes_of(args) -> list[tuple[str, int, int]]:
    """(preset, batch, tokens) of each measured shape: `--shapes preset:BxT,...`, else the presets' defaults."""
    if not args.shapes:
        return [(p, *SHAPES[p]) for p in args.presets.split(",")]
    out = []
    for s in args.shapes.split(","):
        preset, bt = s.split(":")
        out.append((preset, *map(int, bt.split("x"))))
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    p = add_common_args(argparse.ArgumentParser(description=__doc__))
    p.add_argument("--reps", type=int, default=30, help="timed steps per model (turns of the round-robin)")
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--shapes", default="", help="preset:BATCHxTOKENS,... (replaces --presets)")
    p.add_argument("--models", default="reference,full,w8s8", help=f"subset of {', '.join(MODELS)}")
    p.add_argument("--compile", default="", help="compile every contender's layers alike with this torch.compile "
                   "backend (inductor, cudagraphs, aot_eager); default: eager")
    p.add_argument("--mfu", action="store_true", help="also print each step's model FLOPs utilisation")
    p.add_argument("--json", default="", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    device, dtype = setup(args)
    header("training step: full attention and W8/S8 · 1 KV vs a plain reference model of the same shape", args,
           "one optimizer step = forward + backward + AdamW; median of interleaved steps (CPU time of the one "
           "thread on CPU); ratio = the median over turns of a step's time / the reference's in the same turn, with "
           f"its 95% bootstrap interval; layers {f'compiled alike ({args.compile})' if args.compile else 'eager'}")
    autocast = device.type == "cuda" and args.dtype == "bf16"
    peak = matmul_peak(device, DTYPES[args.dtype] if device.type == "cuda" else torch.float32) if args.mfu else None
    if peak:
        print(f"measured matmul peak: {peak / 1e12:.1f} TFLOP/s ({args.dtype if device.type == 'cuda' else 'fp32'})")
    archs = [MODELS[m] for m in args.models.split(",")]
    rows = []
    for preset, B, T in shapes_of(args):
        models = {a: make_model(a, preset, device, args.compile) for a in archs}
        steps = {a: make_step(m, B, T, device, autocast) for a, (m, _) in models.items()}
        for a, (_, whole) in list(models.items()):  # a contender that fails compiled is timed eagerly, said so
            try:
                steps[a]()
            except Exception as e:
                if not whole:
                    raise
                print(f"{preset:10s} {a:26s} FAILED compiled ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                      "timed eagerly", flush=True)
                models[a] = make_model(a, preset, device, "")
                steps[a] = make_step(models[a][0], B, T, device, autocast)
        single_cpu = device.type == "cpu" and torch.get_num_threads() == 1  # CPU time: robust to a busy machine
        t = interleaved(steps, args.reps, device, warmup=3 if args.compile else 1,
                        clock=time.thread_time if single_cpu else time.perf_counter)
        for a, (model, whole) in models.items():
            row = {"preset": preset, "model": a, "batch": B, "seq_len": T, "step_s": t[a].median,
                   "tokens_per_s": B * T / t[a].median, "compiled": args.compile if whole else "",
                   "samples_s": list(t[a].samples)}
            line = (f"{preset:10s} {a:26s} batch {B} x {T}: {fmt_t(t[a].median)}/step (best {fmt_t(t[a].best)})  "
                    f"{B * T / t[a].median:10,.0f} tokens/s" + ("" if whole or not args.compile else "  (eager: "
                                                                   "its layers cannot be captured here)"))
            for base, goal in ((REFERENCE, step_goal(device, a, T)), (MODELS["full"], W8S8_GOALS.get(T))):
                if a == base or base not in t or (base == MODELS["full"] and a != MODELS["w8s8"]):
                    continue
                ratio, lo, hi = paired_ratio(t[a], t[base])
                what = "reference" if base == REFERENCE else "full"
                verdict = goal_verdict(lo, hi, goal) if goal and (device.type == "cuda" or base == REFERENCE) else ""
                line += f"  {ratio:.3f}x {what} (95% interval {lo:.3f}-{hi:.3f}" + \
                        (f"; goal <= {goal}: {verdict})" if verdict else ")")
                row[f"ratio_to_{what}"] = {"ratio": ratio, "interval": [lo, hi], "goal": goal, "verdict": verdict}
            if peak and a != REFERENCE:
                row["mfu"] = 6 * matmul_params(model) * B * T / t[a].median / peak
                line += f"  MFU {row['mfu']:.1%} (6 N D, N = {matmul_params(model) / 1e6:.0f}M)"
            print(line, flush=True)
            rows.append(row)
        del models, steps
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def step_goal(device, arch: str, T: int) -> float | None:
    """A model's step / the reference's at most: GOAL on the CPU; on a GPU, full attention's FULL_GOAL at 4,096."""
    if device.type == "cpu":
        return GOAL
    return FULL_GOAL if arch == MODELS["full"] and T == 4096 else None


if __name__ == "__main__":
    main()
