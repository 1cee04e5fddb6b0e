"""Training step: one optimizer step (forward, backward, AdamW) of full attention and W8/S8 · 1 KV against a
plain reference model of the same shape (`reference_model.ReferenceLM`), at the `tiny` and `small` presets,
measured interleaved in one run; ratio = step time / the reference's, paired by turn, with its interval
(goal <= 1.0).

The step is the training loop's own (`phasekv.train.loop.loss_sum`, backward, the optimizer of
`phasekv.train.build.build_optimizer`: fused AdamW); the reference's is a plain script's (`torch.optim.AdamW`,
its default per-tensor loop on CPU). Batches are random tokens of the preset's vocabulary (throughput does not
depend on the data).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from common import add_common_args, fmt_t, goal_verdict, header, interleaved, paired_ratio, setup
from reference_model import ReferenceLM

from phasekv import ModelConfig, PhaseLM
from phasekv.train.build import build_optimizer
from phasekv.train.config import TrainConfig
from phasekv.train.loop import loss_sum

SHAPES = {"tiny": (64, 96), "small": (8, 512)}  # preset: (batch, seq_len); tiny = the train defaults
GOAL = 1.0  # step time / the reference's, at most (issue 20)
REFERENCE = "reference (plain PyTorch)"


def make_step(arch: str, preset: str, batch: int, seq_len: int, device, autocast: bool):
    torch.manual_seed(0)
    plain = arch == REFERENCE
    cfg = ModelConfig.from_name("Full attention · 1 KV" if plain else arch, preset=preset)
    model = (ReferenceLM(cfg) if plain else PhaseLM(cfg)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if plain else build_optimizer(model, TrainConfig(), device)
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq_len + 1), generator=g).to(device)

    def step():
        if plain:  # a plain training script's loss: logits everywhere (random tokens: all labelled)
            loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
        else:
            loss = loss_sum(model, ids[:, :-1], ids[:, 1:], autocast)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main(argv: list[str] | None = None) -> None:
    p = add_common_args(argparse.ArgumentParser(description=__doc__))
    p.add_argument("--reps", type=int, default=30, help="timed steps per model (turns of the round-robin)")
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--json", default="", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    device, _ = setup(args)
    header("training step: full attention and W8/S8 · 1 KV vs a plain reference model of the same shape", args,
           "one optimizer step = forward + backward + AdamW; median of interleaved steps (CPU time of the one "
           "thread on CPU); ratio = the median over turns of a step's time / the reference's in the same turn, with "
           "its 95% bootstrap interval (goal <= 1.0)")
    autocast = device.type == "cuda" and args.dtype == "bf16"
    archs = [REFERENCE, "Full attention · 1 KV", "W8/S8 · 1 KV"]
    rows = []
    for preset in args.presets.split(","):
        B, T = SHAPES[preset]
        steps = {a: make_step(a, preset, B, T, device, autocast) for a in archs}
        single_cpu = device.type == "cpu" and torch.get_num_threads() == 1  # CPU time: robust to a busy machine
        t = interleaved(steps, args.reps, device, clock=time.thread_time if single_cpu else time.perf_counter)
        for a in archs:
            line = (f"{preset:6s} {a:26s} batch {B} x {T}: {fmt_t(t[a].median)}/step (best {fmt_t(t[a].best)})  "
                    f"{B * T / t[a].median:10,.0f} tokens/s")
            row = {"preset": preset, "model": a, "batch": B, "seq_len": T, "step_s": t[a].median,
                   "tokens_per_s": B * T / t[a].median}
            if a != REFERENCE:
                ratio, lo, hi = paired_ratio(t[a], t[REFERENCE])
                line += f"  {ratio:.3f}x reference (95% interval {lo:.3f}-{hi:.3f}; goal <= {GOAL}: " \
                        f"{goal_verdict(lo, hi, GOAL)})"
                row |= {"ratio": ratio, "interval": [lo, hi], "verdict": goal_verdict(lo, hi, GOAL)}
            print(line, flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
