"""The long-context regime's costs (`phasekv study --needle`, docs/results/needle.md):

  * the needle evaluation of one model: `phasekv.eval.run.run_retrieval` (prompt building, scoring, statistics,
    the figure) of W8/S8 · 1 KV at the `tiny` preset on the needle's prompts of 2,048 tokens, 256 prompts per
    residue mod 8 (2,048 prompts): single-core CPU-minutes (process time: what the machine's other users do not
    change) and wall-clock, against the goal of <= 5 CPU-minutes;
  * `--steps`: the training step of each model at each stage of the chain (96 x 64 recall, 256 x 32 and
    1,024 x 16 needle-format batches, the runs' own data), by the CPU time it used (`time.thread_time`), interleaved.
Untrained models: the cost does not depend on the weights (`--model DIR` times a trained one's evaluation).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from common import add_common_args, fmt_t, header, interleaved, setup

from phasekv import ModelConfig, PhaseLM
from phasekv.data import DataConfig, batch, build_stream
from phasekv.data.needle import NeedleConfig, needle_tokenizer
from phasekv.demo.needle import STAGES, NeedlePlan
from phasekv.eval.models import EvalModel, load
from phasekv.eval.prompts import needle_config
from phasekv.eval.run import run_retrieval
from phasekv.eval.tokens import WordTokenizer
from phasekv.train.build import build_optimizer
from phasekv.train.config import TrainConfig
from phasekv.train.loop import loss_sum

GOAL_CPU_MIN = 5.0


def main(argv: list[str] | None = None) -> None:
    p = add_common_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--model", default=None, help="a trained run directory (default: an untrained W8/S8 · 1 KV)")
    p.add_argument("--length", type=int, default=2048, help="prompt tokens (<bos> and the context)")
    p.add_argument("--per-group", type=int, default=256, help="prompts per residue mod 8")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per forward pass")
    p.add_argument("--steps", type=int, default=0, help="also time this many training steps per model and stage")
    args = p.parse_args(argv)
    device, _ = setup(args)
    if args.steps:
        step_times(args.steps, device)
    header(f"needle evaluation: {8 * args.per_group:,} prompts of {args.length:,} tokens", args,
           "process CPU time (all threads) and wall-clock of one run_retrieval, prompt building included")
    if args.model:
        em = load(args.model, device=device)
    else:
        tok = needle_tokenizer(NeedleConfig())
        torch.manual_seed(0)
        model = PhaseLM(ModelConfig.from_name("W8/S8 · 1 KV", preset="tiny", vocab_size=tok.get_vocab_size()))
        em = EvalModel(model.to(device).eval(), WordTokenizer(tok, "word"), model.config.name, "phasekv", 8)
    cfg = needle_config(context=args.length - 1, per_group=args.per_group)
    with tempfile.TemporaryDirectory() as out:
        cpu, wall = time.process_time(), time.perf_counter()
        s = run_retrieval("needle", em, cfg, out, batch_size=args.batch_size, interval="wilson", progress=False)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    minutes = cpu / 60
    print(f"{em.name}: {s['n_prompts']:,} prompts of {s['prompt_length']:,} tokens, batch {args.batch_size}: "
          f"{minutes:.2f} CPU-min ({s['n_prompts'] / cpu:.1f} prompts per CPU-second), {wall:.0f} s wall; "
          f"goal <= {GOAL_CPU_MIN:g} CPU-min: {'met' if minutes <= GOAL_CPU_MIN else 'missed'}")


def train_step(model: PhaseLM, opt: torch.optim.Optimizer, batches: list[dict]):
    """One optimizer step over a step's micro-batches, as the training loop takes it (the loss normalised)."""
    def run():
        for b in batches:
            (loss_sum(model, b["input_ids"], b["labels"], False) / 1000).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return run


def step_times(reps: int, device: torch.device) -> None:
    """CPU seconds per optimizer step of every model of the plan at every stage of its chain, on the stage's data."""
    tok = needle_tokenizer(NeedleConfig())
    for tag, stage in STAGES.items():
        cfg = TrainConfig.from_dict({k: v for k, v in stage.items() if k in TrainConfig.__dataclass_fields__} |
                                    {"data": DataConfig(**{k: v for k, v in stage.items() if k in DataConfig.__dataclass_fields__})})
        stream = build_stream(cfg.data, tok, cfg.seq_len, seed=0)
        micro = cfg.batch_size // cfg.grad_accum
        batches = [batch(stream, i * micro, micro) for i in range(cfg.grad_accum)]  # one step's micro-batches

        fns = {}
        for name in NeedlePlan("full").models:
            torch.manual_seed(0)
            model = PhaseLM(ModelConfig.from_name(name, preset="tiny", vocab_size=tok.get_vocab_size())).to(device)
            fns[name] = train_step(model, build_optimizer(model, cfg, device), batches)
        t = interleaved(fns, reps, device, clock=time.thread_time)
        tokens = cfg.batch_size * cfg.seq_len
        print(f"step {tag:>5} ({cfg.batch_size} x {cfg.seq_len}): " + " | ".join(
            f"{n} {fmt_t(x.median)} ({tokens / x.median / 1e3:.1f}K tok/CPU-s)" for n, x in t.items()))


if __name__ == "__main__":
    main()
