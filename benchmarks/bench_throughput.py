"""Throughput at the `tiny` preset, full attention vs W8/S8 · 1 KV, interleaved in one run:
  * lookup evaluation: prompts/s of `phasekv.eval.run.evaluate` (the study's lookup prompts, 194 tokens,
    batch 32; prompt construction included, it is the same for both models);
  * training: tokens/s of one optimizer step (`phasekv.train.loop.loss_sum` forward, backward, AdamW) on
    random tokens at the TrainConfig defaults (batch 64 x 80 tokens), plus a longer-sequence row for context.
Untrained (randomly initialised) models: throughput does not depend on the weights.
"""

from __future__ import annotations

import argparse

import torch
from common import add_common_args, header, interleaved, paired_ratio, setup

from phasekv import ModelConfig, PhaseLM
from phasekv.data.tokenizer import build_word_tokenizer
from phasekv.eval.prompts import lookup_config
from phasekv.eval.run import evaluate
from phasekv.train.config import TrainConfig
from phasekv.train.loop import loss_sum

NAMES = {"full": "full-1kv", "W8/S8": "w8s8-1kv"}


def train_step(model: PhaseLM, batch: int, seq_len: int, device):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq_len + 1), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_sum(model, ids[:, :-1], ids[:, 1:], autocast=False) / (batch * seq_len)
        loss.backward()
        opt.step()

    return step


def main(argv: list[str] | None = None) -> None:
    p = add_common_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--prompts", type=int, default=128, help="lookup prompts per timed evaluation")
    p.add_argument("--reps", type=int, default=5, help="interleaved turns per measurement")
    p.add_argument("--long-seq", type=int, default=1024, help="extra training row at this sequence length (0: none)")
    args = p.parse_args(argv)
    device, dtype = setup(args)
    header("throughput: full attention vs W8/S8 · 1 KV, preset tiny", args,
           "median of interleaved repetitions; ratio = W8/S8 / full (higher is better), the median of the turns' "
           "paired ratios with its 95% bootstrap interval")
    tok = build_word_tokenizer()
    torch.manual_seed(0)
    models = {k: PhaseLM(ModelConfig.from_name(v, preset="tiny", vocab_size=tok.get_vocab_size())).to(device)
              for k, v in NAMES.items()}

    def lookup(model):
        return lambda: evaluate(model.eval(), tok, lookup_config(), pids=range(args.prompts), batch_size=32)

    t = interleaved({k: lookup(m) for k, m in models.items()}, args.reps, device)
    rate = {k: args.prompts / t[k].median for k in t}
    print(f"lookup eval   : full {rate['full']:8.1f} prompts/s | W8/S8 {rate['W8/S8']:8.1f} prompts/s | "
          f"ratio {_rate_ratio(t)}")
    tc = TrainConfig()
    for batch, seq_len in [(tc.batch_size, tc.seq_len)] + ([(8, args.long_seq)] if args.long_seq else []):
        t = interleaved({k: train_step(m.train(), batch, seq_len, device) for k, m in models.items()},
                        args.reps, device)
        rate = {k: batch * seq_len / t[k].median for k in t}
        print(f"train {batch:>3}x{seq_len:<5}: full {rate['full']:8.0f} tokens/s  | W8/S8 {rate['W8/S8']:8.0f} tokens/s  | "
              f"ratio {_rate_ratio(t)}", flush=True)
    print("target: W8/S8 training tokens/s >= 0.7x full (at the TrainConfig defaults)")


def _rate_ratio(t: dict) -> str:
    """W8/S8's rate over full attention's (full's time over W8/S8's), paired by turn, with its interval."""
    ratio, lo, hi = paired_ratio(t["full"], t["W8/S8"])
    return f"{ratio:.3f} (95% interval {lo:.3f}-{hi:.3f})"


if __name__ == "__main__":
    main()
