"""The training loop behind `phasekv train` and `phasekv.train.train(...)`.

One global batch per optimizer step, read by example index (see `phasekv.data.stream`), so the data
position is `step * batch_size` and a run resumes exactly. Under torchrun every rank reads its slice
of the same global batch and the loss is normalised by the global number of target tokens, so DDP and
FSDP2 give the single-process result up to floating-point reduction order.

Around the loop, as in torchtitan: `build` (tokenizer, model, optimizer), `distributed` (process group,
device, DDP/FSDP2 wrapping), `metrics` (metrics.jsonl, gates.jsonl, TensorBoard/wandb, progress), `resume`
(config merging, state restore) and `checkpoint` (atomic checkpoints).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from phasekv.data.needle import NeedleStream
from phasekv.data.recall import RecallStream, recall_accuracy
from phasekv.data.sources import build_stream
from phasekv.data.stream import IGNORE, MixtureStream, batch, by_length
from phasekv.data.tokenizer import describe, save_tokenizer
from phasekv.errors import ConfigError, PhaseKVError
from phasekv.io import write_json
from phasekv.provenance import versions
from phasekv.train import checkpoint as ck
from phasekv.train.build import build_optimizer, model_and_tokenizer
from phasekv.train.config import TrainConfig
from phasekv.train.coverage import CoverageProbe
from phasekv.train.distributed import Dist, eager, full_state, init_dist, no_sync, pick_device, wrap
from phasekv.train.gates import gate_snapshot
from phasekv.train.metrics import Clock, Logs, progress_bar
from phasekv.train.resume import resolve_config, restore


class TrainingDiverged(PhaseKVError):
    """The loss or gradient became non-finite; the run stopped and kept its last good checkpoint."""


def loss_sum(model, ids: torch.Tensor, labels: torch.Tensor, autocast: bool, hf: bool = False) -> torch.Tensor:
    """Summed next-token cross-entropy over positions with a label (`hf`: a transformers model, no cache). A
    phasekv model computes logits at the labelled positions only (`PhaseLM.forward`'s `select`)."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        if hf:
            logits, labels = model(ids, use_cache=False).logits.flatten(0, 1), labels.flatten()  # (B T, V)
        else:
            keep = labels != IGNORE  # (B, T)
            logits, labels = model(ids, select=keep), labels[keep]  # (n, V), (n,)
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="sum")


@torch.no_grad()
def validate(model: nn.Module, stream, cfg: TrainConfig, device, autocast: bool, hf: bool = False) -> dict:
    if isinstance(stream, MixtureStream):  # each source apart: the text's loss, the recall's accuracy by phase
        out: dict = {}
        for part in stream.streams:
            r = validate(model, part, cfg, device, autocast, hf)
            if isinstance(part, RecallStream):
                r["val_recall_loss"] = r.pop("val_loss")
            out.update(r)
        return out
    model.eval()
    bs = max(cfg.batch_size // cfg.grad_accum, 1)
    if isinstance(stream, RecallStream | NeedleStream):  # answers by phase
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            r = recall_accuracy(model, stream, n=cfg.val_sequences, batch_size=bs, modulus=24)
        model.train()
        return {"val_loss": r["loss"], "val_accuracy": r["accuracy"], "val_mean": r["mean"],
                "val_worst": r["worst"], "val_best": r["best"], "val_gap": r["gap"],
                "val_by_residue": r["by_residue"], "chance": r["chance"]}
    tot, n = 0.0, 0
    for s in range(0, cfg.val_sequences, bs):
        b = batch(stream, s, min(bs, cfg.val_sequences - s))
        tot += loss_sum(model, b["input_ids"].to(device), b["labels"].to(device), autocast, hf).item()
        n += int((b["labels"] != IGNORE).sum())
    model.train()
    return {"val_loss": tot / max(n, 1)}


def train(config: TrainConfig | None = None, *, resume: bool = False, until: int | None = None, **overrides) -> dict:
    """Train one model; returns the run summary (also written to `DIR/done.json`).

    `config` (a TrainConfig) and/or keyword overrides of its fields (`data`, `tokenizer`, `recall_mix`
    and `recall` go to the data config). With `resume=True` an existing run directory continues from its
    latest checkpoint, bit for bit on CPU. `until`: stop after that step with a checkpoint there (the run, its
    schedule over all its steps, resumes from it exactly; `phasekv posttrain` evaluates between such stops).
    """
    cfg, resuming = resolve_config(config, resume, overrides)
    dist = init_dist(cfg.device)
    try:
        return Trainer(cfg, resuming, dist).run(until)
    finally:
        dist.close()


class Trainer:
    """One run in progress (torchtitan's Trainer, reduced): the model and its DDP/FSDP2 wrapper, AdamW, the
    coverage probe, the data streams and the step; `run()` trains to the last step and returns the summary."""

    def __init__(self, cfg: TrainConfig, resuming: bool, dist: Dist):
        self.cfg, self.dist, self.out = cfg, dist, Path(cfg.out)
        self.device = device = pick_device(cfg.device, dist)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.autocast = device.type == "cuda"
        self.micro = cfg.batch_size // cfg.grad_accum
        if self.micro % dist.world:
            raise ConfigError(f"batch_size/grad_accum={self.micro} must be a multiple of the world size {dist.world}")
        self.run_model, tok = model_and_tokenizer(cfg, resuming)
        self.model, self.seed, self.tok = self.run_model.module, self.run_model.seed, tok
        self.data_seed = self.seed if cfg.data_seed is None else cfg.data_seed  # weights and data varied apart
        if self.run_model.hf and cfg.fsdp:
            raise ConfigError("--fsdp trains phasekv models only; train a Hugging Face model with DDP (no --fsdp)")
        self._streams(tok)
        if dist.main:
            self._write_run_files(tok)
        self.model.to(device)
        self.wrapped = wrap(self.model, cfg, dist, device)
        self.coverage = CoverageProbe(self.model) if self.run_model.coverage_reg else None  # `· coverage reg X`
        self.opt = build_optimizer(self.model, cfg, device)
        self.step, self.loss = 0, float("nan")
        if resuming:
            self.step, self.loss = restore(ck.latest_checkpoint(self.out), self.model, self.opt, device,
                                           cfg.batch_size, hf=self.run_model.hf)
        self.logs = Logs(self.out, cfg, dist.main, self.step)

    def _streams(self, tok) -> None:
        """Train, validation and gate-probe data (rank 0 tokenizes corpora first; the others reuse its shards)."""
        cfg, seed = self.cfg, self.data_seed
        if self.dist.main:
            self.train_stream = build_stream(cfg.data, tok, cfg.seq_len, seed, "train", progress=cfg.progress)
        self.dist.barrier()
        if not self.dist.main:
            self.train_stream = build_stream(cfg.data, tok, cfg.seq_len, seed, "train", progress=False)
        self.val_stream = build_stream(cfg.data, tok, cfg.seq_len, seed, "val", progress=False)
        self.probe = batch(build_stream(cfg.data, tok, cfg.seq_len, seed, "probe", progress=False), 0, cfg.gate_probe)

    def _write_run_files(self, tok) -> None:
        run = self.run_model
        self.out.mkdir(parents=True, exist_ok=True)
        save_tokenizer(tok, self.out / "tokenizer.json")
        write_json(self.out / "config.json", {"train": self.cfg.to_dict(), "model": run.config, "name": run.name,
                                              "tokenizer": describe(tok), "versions": versions("tokenizers"),
                                              "seed": self.seed, **({"init": run.init} if run.init else {})},
                   default=str)
        (self.out / "done.json").unlink(missing_ok=True)

    def train_step(self) -> dict:
        """One optimizer step over `grad_accum` micro-batches; returns its metrics row."""
        cfg, dist, device = self.cfg, self.dist, self.device
        lr = cfg.lr_at(self.step)
        for g in self.opt.param_groups:
            g["lr"] = lr
        micro_batches = self._micro_batches()
        n_tgt = dist.all_sum(torch.tensor(float(sum(int((b["labels"] != IGNORE).sum()) for b in micro_batches))))
        n_tgt = n_tgt.clamp(min=1).to(device)
        step_loss, step_reg = torch.zeros((), device=device), 0.0
        for a, b in enumerate(micro_batches):
            with no_sync(self.wrapped, cfg, dist, a == len(micro_batches) - 1):
                ls = loss_sum(self.wrapped, b["input_ids"].to(device), b["labels"].to(device), self.autocast,
                              self.run_model.hf)
                loss = ls * dist.world / n_tgt
                if self.coverage is not None:
                    reg = self.coverage.pop() / len(micro_batches)
                    loss, step_reg = loss + self.run_model.coverage_reg * reg.to(device), step_reg + float(reg.detach())
                loss.backward()
            step_loss += ls.detach() / n_tgt
        self.loss = float(dist.all_sum(step_loss))
        gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip if cfg.grad_clip else float("inf"))
        gnorm = float(gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm)
        if not (math.isfinite(self.loss) and math.isfinite(gnorm)):
            self._diverged(gnorm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return {"step": self.step, "loss": self.loss, "lr": lr, "grad_norm": gnorm,
                **({"coverage_penalty": step_reg} if self.coverage is not None else {})}

    def _micro_batches(self) -> list[dict]:
        """This rank's share of the step's global batch as `grad_accum` micro-batches: in index order, or with
        `trim` sorted by length and cut after their last target (`by_length`)."""
        cfg, dist = self.cfg, self.dist
        base, per_rank = self.step * cfg.batch_size, self.micro // dist.world
        starts = [base + a * self.micro + dist.rank * per_rank for a in range(cfg.grad_accum)]
        if not cfg.trim:
            return [batch(self.train_stream, s, per_rank) for s in starts]
        return by_length([self.train_stream.example(i) for s in starts for i in range(s, s + per_rank)], cfg.grad_accum)

    def _diverged(self, gnorm: float):
        last = ck.latest_checkpoint(self.out)
        self.logs.metrics({"step": self.step + 1, "event": "non-finite", "loss": self.loss, "grad_norm": gnorm})
        self.logs.close()
        bad, value = ("loss", self.loss) if not math.isfinite(self.loss) else ("gradient norm", gnorm)
        raise TrainingDiverged(f"step {self.step + 1}: non-finite {bad} ({value}); stopped. Last good checkpoint: "
                               f"{last or 'none'}. Try a lower --lr or a longer --warmup.")

    def save(self):
        msd, osd = full_state(self.model, self.opt)
        if self.dist.main:
            cuda = self.device.type == "cuda"
            rng = {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if cuda else None}
            ck.save_checkpoint(self.out, self.step, self.run_model.writer(msd, self.tok), {"optimizer": osd, "rng": rng},
                               {"step": self.step, "data_index": self.step * self.cfg.batch_size, "loss": self.loss,
                                "name": self.run_model.name, "total_steps": self.cfg.total_steps},
                               keep=self.cfg.keep_checkpoints)
        self.dist.barrier()

    def snapshot(self):
        with eager(self.model, self.cfg, self.device):
            rows = gate_snapshot(self.model, self.probe["input_ids"].to(self.device))
        self.logs.gates([{"step": self.step, **r} for r in rows])

    def _validate(self) -> dict:
        with eager(self.model, self.cfg, self.device):
            return validate(self.model, self.val_stream, self.cfg, self.device, self.autocast, self.run_model.hf)

    def run(self, until: int | None = None) -> dict:
        """Train to the last step (the summary, done.json) or, `until`, stop after that step (`stopped`)."""
        cfg, n_steps, gate_steps = self.cfg, self.cfg.total_steps, self.cfg.gate_schedule()
        stop = n_steps if until is None else min(until, n_steps)
        if self.step == 0 and 0 in gate_steps:
            self.snapshot()
        clock, summary = Clock(self.step, cfg.batch_size * cfg.seq_len), {}
        self.wrapped.train()
        with progress_bar(cfg.progress and self.dist.main) as bar:
            task = bar.add_task("train", total=n_steps, completed=self.step, info="")
            while self.step < stop:
                row = self.train_step()
                if self.step % cfg.log_every == 0 or self.step == n_steps:
                    row |= clock.tick(self.step)
                    self.logs.metrics(row)
                    bar.update(task, info=f"loss {self.loss:.3f}  {row['tokens_per_s']:,.0f} tok/s")
                if self.step in gate_steps:
                    self.snapshot()
                if (cfg.val_every and self.step % cfg.val_every == 0) or self.step == n_steps:
                    v = self._validate()
                    self.logs.metrics({"step": self.step, **v})
                    summary.update(v)
                if (cfg.ckpt_every and self.step % cfg.ckpt_every == 0) or self.step == n_steps:
                    self.save()
                bar.update(task, completed=self.step)
        if self.step < n_steps:
            return self.stopped()
        return self._finish(summary or self._validate(), clock)

    def stopped(self) -> dict:
        """Stopped before the last step: a checkpoint at this step, no done.json. None at step 0: torch's state-dict
        API initialises an optimizer that has no state with a step, and the run would no longer resume exactly."""
        latest = ck.latest_checkpoint(self.out)
        if self.step and (latest is None or ck.read_trainer_state(latest)["step"] != self.step):
            self.save()
        self.logs.close()
        return {"name": self.run_model.name, "stopped": self.step, "steps": self.cfg.total_steps, "final_loss": self.loss,
                "out": str(self.out), "seed": self.seed}

    def _finish(self, validation: dict, clock: Clock) -> dict:
        n_steps = self.cfg.total_steps
        summary = {"name": self.run_model.name, "steps": n_steps, "final_loss": self.loss,
                   "tokens": n_steps * clock.tokens_per_step, **clock.session(n_steps),
                   "n_params": sum(p.numel() for p in self.model.parameters()), "out": str(self.out), "seed": self.seed,
                   "data_seed": self.data_seed, "versions": versions("tokenizers"), **validation}
        if self.dist.main:
            write_json(self.out / "done.json", summary, default=str)
        self.logs.close()
        return summary
