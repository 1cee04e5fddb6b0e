"""Training throughput: tokens/s of one optimizer step (forward, backward, AdamW) of full attention vs
W8/S8 · 1 KV at the `tiny` and `small` presets, measured interleaved in one run, and their ratio.

The step is the training loop's own (`phasekv.train.loop.loss_sum` + AdamW); batches are random tokens of
the preset's vocabulary (throughput does not depend on the data).
"""

from __future__ import annotations

import argparse

import torch
from common import add_common_args, fmt_t, header, interleaved, setup

from phasekv import ModelConfig, PhaseLM
from phasekv.train.loop import loss_sum

SHAPES = {"tiny": (64, 96), "small": (8, 512)}  # preset: (batch, seq_len); tiny = the train defaults


def make_step(arch: str, preset: str, batch: int, seq_len: int, device, autocast: bool):
    torch.manual_seed(0)
    model = PhaseLM(ModelConfig.from_name(arch, preset=preset)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq_len + 1), generator=g).to(device)

    def step():
        loss = loss_sum(model, ids[:, :-1], ids[:, 1:], autocast)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    p = add_common_args(argparse.ArgumentParser(description=__doc__))
    p.add_argument("--reps", type=int, default=10, help="timed steps per model")
    p.add_argument("--presets", default="tiny,small")
    args = p.parse_args()
    device, _ = setup(args)
    header("training throughput: full attention vs W8/S8 · 1 KV", args,
           "one optimizer step = forward + backward + AdamW; median of interleaved steps")
    autocast = device.type == "cuda" and args.dtype == "bf16"
    archs = ["Full attention · 1 KV", "W8/S8 · 1 KV"]
    for preset in args.presets.split(","):
        B, T = SHAPES[preset]
        steps = {a: make_step(a, preset, B, T, device, autocast) for a in archs}
        t = interleaved(steps, args.reps, device)
        tps = {a: B * T / t[a].median for a in archs}
        for a in archs:
            print(f"{preset:6s} {a:24s} batch {B} x {T}: {fmt_t(t[a].median)}/step (best {fmt_t(t[a].best)})  {tps[a]:10,.0f} tokens/s")
        print(f"{preset:6s} W8/S8 / full attention throughput ratio: {tps[archs[1]] / tps[archs[0]]:.2f}")


if __name__ == "__main__":
    main()
