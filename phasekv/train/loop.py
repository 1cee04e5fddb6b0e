"""The training loop behind `phasekv train` and `phasekv.train.train(...)`.

One global batch per optimizer step, read by example index (see `phasekv.data.stream`), so the data
position is `step * batch_size` and a run resumes exactly. Under torchrun every rank reads its slice
of the same global batch and the loss is normalised by the global number of target tokens, so DDP and
FSDP2 give the single-process result up to floating-point reduction order.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from phasekv.config import ModelConfig
from phasekv.data.recall import RecallStream, recall_accuracy
from phasekv.data.sources import DataConfig, build_stream, data_tokenizer
from phasekv.data.stream import IGNORE, batch
from phasekv.data.tokenizer import describe, load_tokenizer, save_tokenizer
from phasekv.errors import CheckpointError, ConfigError, PhaseKVError
from phasekv.io import write_json, write_text
from phasekv.mitigate.regulariser import CoverageProbe
from phasekv.model.transformer import PhaseLM
from phasekv.train import checkpoint as ck
from phasekv.train.config import TrainConfig
from phasekv.train.gates import gate_snapshot

RUNTIME_FIELDS = {"device", "compile", "threads", "logger", "progress", "steps", "tokens", "out",
                  "val_every", "ckpt_every", "log_every", "keep_checkpoints"}


class TrainingDiverged(PhaseKVError):
    """The loss or gradient became non-finite; the run stopped and kept its last good checkpoint."""


# ---- distributed --------------------------------------------------------------------------------

@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            torch.distributed.all_reduce(x)
        return x

    def barrier(self):
        if self.world > 1:
            torch.distributed.barrier()


def init_dist(device: str) -> Dist:
    """Rank/world from torchrun's environment; initialises the process group (gloo on CPU, nccl on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    d = Dist(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return d


def pick_device(spec: str, dist: Dist) -> torch.device:
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("device=cuda but no CUDA device is available")
        dev = torch.device("cuda", dist.local_rank if spec == "cuda" else int(spec.split(":")[1]))
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


# ---- configuration on resume ----------------------------------------------------------------------

def _apply(cfg: TrainConfig, overrides: dict) -> TrainConfig:
    d = cfg.to_dict()
    data = dict(d["data"])
    for k, v in overrides.items():
        if k == "data" and isinstance(v, DataConfig):
            data = v.to_dict()
        elif k == "data" and isinstance(v, dict):
            data.update(v)
        elif k == "data":
            data["data"] = v
        elif k == "recall" and isinstance(v, dict):
            data["recall"] = {**data["recall"], **v}  # override single fields of the recall layout
        elif k in DataConfig.__dataclass_fields__:
            data[k] = v
        elif k in TrainConfig.__dataclass_fields__:
            d[k] = v
        else:
            raise ConfigError(f"unknown training option {k!r}")
    d["data"] = data
    return TrainConfig.from_dict(d)


def resolve_config(config: TrainConfig | None, resume: bool, overrides: dict) -> tuple[TrainConfig, bool]:
    """The run's config and whether it continues a checkpoint. With `resume`, the saved config wins and
    only runtime fields (and a longer `steps`/`tokens`) may change."""
    cfg = _apply(config or TrainConfig(), overrides)
    out = Path(cfg.out)
    saved_path = out / "config.json"
    if not saved_path.is_file():
        return cfg, False
    if not resume:
        raise ConfigError(f"{out} already holds a training run; pass --resume to continue it or choose another --out")
    try:
        saved = TrainConfig.from_dict(json.loads(saved_path.read_text())["train"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{saved_path}: unreadable run config ({type(exc).__name__}: {exc})") from None
    new = cfg.to_dict()
    for k, v in saved.to_dict().items():
        if k not in RUNTIME_FIELDS and new[k] != v and (k in overrides or (k == "data" and
                                                                        any(x in overrides for x in ("data",) + tuple(DataConfig.__dataclass_fields__)))):
            raise ConfigError(f"--resume: {k}={new[k]!r} differs from the saved run's {v!r} ({saved_path})")
    keep = {k: new[k] for k in RUNTIME_FIELDS if k in overrides or (config is not None and new[k] != saved.to_dict()[k])}
    merged = _apply(saved, keep)
    return merged, ck.latest_checkpoint(out) is not None


# ---- model ----------------------------------------------------------------------------------------

def build_model(cfg: TrainConfig, vocab_size: int) -> tuple[PhaseLM, object | None]:
    """A fresh model of `arch` at `preset` (init under the run seed), or the weights of `init_from`."""
    if cfg.init_from:
        from phasekv.train.run import load_run

        model, tok = load_run(cfg.init_from, hf_tokenizer=False)
        if cfg.arch and ModelConfig.from_name(cfg.arch, preset=model.config.preset).name != model.config.name:
            raise ConfigError(f"--arch {cfg.arch!r} differs from --init-from's model {model.config.name!r}")
        return model, tok
    mcfg = ModelConfig.from_name(cfg.arch or "W8/S8 · 1 KV", preset=cfg.preset, vocab_size=vocab_size)
    if cfg.seed is not None and cfg.seed != mcfg.seed:
        if "seed" in (cfg.arch or "").lower():
            raise ConfigError(f"--seed {cfg.seed} contradicts the seed in --arch {cfg.arch!r}")
        mcfg = mcfg.replace(seed=cfg.seed)
    mcfg = mcfg.replace(max_seq_len=max(mcfg.max_seq_len, cfg.seq_len))
    torch.manual_seed(mcfg.seed)
    return PhaseLM(mcfg), None


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.endswith("gate_bias") else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def wrap(model: PhaseLM, cfg: TrainConfig, dist: Dist, device: torch.device) -> torch.nn.Module:
    """DDP or FSDP2 under torchrun (FSDP2 shards `model` in place), then optional torch.compile."""
    wrapped: torch.nn.Module = model
    if dist.world > 1 and cfg.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    elif dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        wrapped = torch.compile(wrapped)
    return wrapped


def full_state(model: PhaseLM, opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(model: PhaseLM, opt: torch.optim.Optimizer, msd: dict, osd: dict):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd,
                   options=StateDictOptions(full_state_dict=True))


# ---- loss and evaluation --------------------------------------------------------------------------

def loss_sum(model, ids: torch.Tensor, labels: torch.Tensor, autocast: bool) -> torch.Tensor:
    """Summed next-token cross-entropy over positions with a label."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(ids)  # (B, T, V)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum")


@torch.no_grad()
def validate(model: PhaseLM, stream, cfg: TrainConfig, device, autocast: bool) -> dict:
    model.eval()
    bs = max(cfg.batch_size // cfg.grad_accum, 1)
    if isinstance(stream, RecallStream):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            r = recall_accuracy(model, stream, n=cfg.val_sequences, batch_size=bs, modulus=24)
        model.train()
        return {"val_loss": r["loss"], "val_accuracy": r["accuracy"], "val_mean": r["mean"],
                "val_worst": r["worst"], "val_best": r["best"], "val_gap": r["gap"],
                "val_by_residue": r["by_residue"], "chance": r["chance"]}
    tot, n = 0.0, 0
    for s in range(0, cfg.val_sequences, bs):
        b = batch(stream, s, min(bs, cfg.val_sequences - s))
        tot += loss_sum(model, b["input_ids"].to(device), b["labels"].to(device), autocast).item()
        n += int((b["labels"] != IGNORE).sum())
    model.train()
    return {"val_loss": tot / max(n, 1)}


# ---- logging --------------------------------------------------------------------------------------

class Logs:
    """metrics.jsonl / gates.jsonl appenders (rank 0) plus optional TensorBoard / wandb."""

    def __init__(self, out: Path, cfg: TrainConfig, main: bool, start_step: int):
        self.out, self.main, self.tb, self.wandb = out, main, None, None
        if not main:
            return
        for name in ("metrics.jsonl", "gates.jsonl"):  # drop rows logged after the checkpoint we resume from
            p = out / name
            if p.is_file():
                rows = [r for r in p.read_text().splitlines() if _row_step(r) <= start_step]
                write_text(p, "".join(r + "\n" for r in rows))
        if cfg.logger == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("logger=tensorboard needs the tensorboard package (pip install tensorboard)") from None
            self.tb = SummaryWriter(str(out / "tensorboard"))
        elif cfg.logger == "wandb":
            try:
                import wandb
            except ImportError:
                raise ConfigError("logger=wandb needs the wandb package (pip install wandb)") from None
            self.wandb = wandb.init(project="phasekv", name=out.name, dir=str(out), config=cfg.to_dict(),
                                    resume="allow")

    def _append(self, name: str, rows: list[dict]):
        with open(self.out / name, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    def metrics(self, row: dict):
        if not self.main:
            return
        self._append("metrics.jsonl", [row])
        scalars = {k: v for k, v in row.items() if isinstance(v, int | float) and k != "step"}
        if self.tb:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, row["step"])
        if self.wandb:
            self.wandb.log(scalars, step=row["step"])

    def gates(self, rows: list[dict]):
        if self.main and rows:
            self._append("gates.jsonl", rows)

    def close(self):
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


def _row_step(line: str) -> float:
    """Step of a logged row; a blank or torn row (the process was killed mid-append) sorts after every step."""
    try:
        return json.loads(line).get("step", 0)
    except (json.JSONDecodeError, AttributeError):
        return math.inf


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                    TimeRemainingColumn(), disable=not enabled)


def _versions() -> dict:
    from phasekv.provenance import versions

    return versions("tokenizers")


# ---- the loop -------------------------------------------------------------------------------------

def train(config: TrainConfig | None = None, *, resume: bool = False, **overrides) -> dict:
    """Train one model; returns the run summary (also written to `DIR/done.json`).

    `config` (a TrainConfig) and/or keyword overrides of its fields (`data`, `tokenizer`, `recall_mix`
    and `recall` go to the data config). With `resume=True` an existing run directory continues from its
    latest checkpoint, bit for bit on CPU.
    """
    cfg, resuming = resolve_config(config, resume, overrides)
    dist = init_dist(cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        return _train(cfg, resuming, dist)
    finally:
        if dist.world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _train(cfg: TrainConfig, resuming: bool, dist: Dist) -> dict:
    out = Path(cfg.out)
    device = pick_device(cfg.device, dist)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    autocast = device.type == "cuda"
    micro = cfg.batch_size // cfg.grad_accum
    if micro % dist.world:
        raise ConfigError(f"batch_size/grad_accum={micro} must be a multiple of the world size {dist.world}")
    per_rank = micro // dist.world

    # tokenizer and model
    if resuming:
        from phasekv.model.io import read_config

        tok = load_tokenizer(out / "tokenizer.json")
        model = PhaseLM(read_config(ck.latest_checkpoint(out)))  # the checkpoint's own architecture
    else:
        tok = data_tokenizer(cfg.data) if not cfg.init_from or cfg.data.tokenizer else None
        model, init_tok = build_model(cfg, tok.get_vocab_size() if tok else 0)
        tok = tok or init_tok
        if tok.get_vocab_size() > model.config.vocab_size:
            raise ConfigError(f"tokenizer has {tok.get_vocab_size()} tokens, the model only {model.config.vocab_size}")
    seed = model.config.seed if cfg.seed is None else cfg.seed
    mcfg = model.config
    n_steps = cfg.total_steps

    # data (rank 0 tokenizes corpora first; the others reuse its shards)
    if dist.main:
        train_stream = build_stream(cfg.data, tok, cfg.seq_len, seed, "train", progress=cfg.progress)
    dist.barrier()
    if not dist.main:
        train_stream = build_stream(cfg.data, tok, cfg.seq_len, seed, "train", progress=False)
    val_stream = build_stream(cfg.data, tok, cfg.seq_len, seed, "val", progress=False)
    probe = batch(build_stream(cfg.data, tok, cfg.seq_len, seed, "probe", progress=False), 0, cfg.gate_probe)

    # run directory
    if dist.main:
        out.mkdir(parents=True, exist_ok=True)
        save_tokenizer(tok, out / "tokenizer.json")
        write_json(out / "config.json", {"train": cfg.to_dict(), "model": mcfg.to_dict(), "name": mcfg.name,
                                         "tokenizer": describe(tok), "versions": _versions(), "seed": seed},
                   default=str)
        (out / "done.json").unlink(missing_ok=True)

    model.to(device)
    wrapped = wrap(model, cfg, dist, device)
    coverage = CoverageProbe(model) if mcfg.coverage_reg else None  # `· coverage reg LAMBDA` (phasekv.mitigate)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                            fused=device.type == "cuda")
    step = 0
    if resuming:
        ckpt = ck.latest_checkpoint(out)
        state = ck.read_trainer_state(ckpt)
        extra = ck.read_optimizer(ckpt)
        from phasekv.model.io import read_weights

        load_full_state(model, opt, read_weights(ckpt / ck.WEIGHTS_FILE), extra["optimizer"])
        torch.set_rng_state(extra["rng"]["torch"])
        if device.type == "cuda" and extra["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(extra["rng"]["cuda"])
        step, loss_val = state["step"], state.get("loss", float("nan"))
        if state["data_index"] != step * cfg.batch_size:
            raise CheckpointError(f"{ckpt}: data position {state['data_index']} does not match step {step} "
                                  f"at batch_size={cfg.batch_size}")
    logs = Logs(out, cfg, dist.main, step)
    gate_steps = cfg.gate_schedule()

    def save(step: int, last_loss: float):
        msd, osd = full_state(model, opt)
        if dist.main:
            rng = {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if device.type == "cuda" else None}
            ck.save_checkpoint(out, step, msd, mcfg.to_json(), {"optimizer": osd, "rng": rng},
                               {"step": step, "data_index": step * cfg.batch_size, "loss": last_loss,
                                "name": mcfg.name, "total_steps": n_steps}, keep=cfg.keep_checkpoints)
        dist.barrier()

    def snapshot(step: int):
        rows = gate_snapshot(model, probe["input_ids"].to(device))
        logs.gates([{"step": step, **r} for r in rows])

    if step == 0 and 0 in gate_steps:
        snapshot(0)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    t_start, t_last, s_last, first_step = time.time(), time.time(), step, step
    summary = {}
    if not resuming:
        loss_val = float("nan")
    wrapped.train()
    with _progress(cfg.progress and dist.main) as bar:
        task = bar.add_task("train", total=n_steps, completed=step, info="")
        while step < n_steps:
            lr = cfg.lr_at(step)
            for g in opt.param_groups:
                g["lr"] = lr
            base = step * cfg.batch_size
            micro_batches = [batch(train_stream, base + a * micro + dist.rank * per_rank, per_rank)
                             for a in range(cfg.grad_accum)]
            n_tgt = dist.all_sum(torch.tensor(float(sum(int((b["labels"] != IGNORE).sum()) for b in micro_batches))))
            step_loss = torch.zeros((), device=device)
            step_reg = 0.0
            for a, b in enumerate(micro_batches):
                sync = a == cfg.grad_accum - 1
                ctx = wrapped.no_sync() if (dist.world > 1 and not cfg.fsdp and not sync and hasattr(wrapped, "no_sync")) else _null()
                with ctx:
                    ls = loss_sum(wrapped, b["input_ids"].to(device), b["labels"].to(device), autocast)
                    loss = ls * dist.world / n_tgt.clamp(min=1).to(device)
                    if coverage is not None:
                        reg = coverage.pop() / cfg.grad_accum
                        loss, step_reg = loss + mcfg.coverage_reg * reg.to(device), step_reg + float(reg.detach())
                    loss.backward()
                step_loss += ls.detach() / n_tgt.clamp(min=1).to(device)
            loss_val = float(dist.all_sum(step_loss))
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip else float("inf"))
            gnorm = float(gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm)
            if not (math.isfinite(loss_val) and math.isfinite(gnorm)):
                last = ck.latest_checkpoint(out)
                logs.metrics({"step": step + 1, "event": "non-finite", "loss": loss_val, "grad_norm": gnorm})
                logs.close()
                raise TrainingDiverged(
                    f"step {step + 1}: non-finite {'loss' if not math.isfinite(loss_val) else 'gradient norm'} "
                    f"({loss_val if not math.isfinite(loss_val) else gnorm}); stopped. Last good checkpoint: "
                    f"{last or 'none'}. Try a lower --lr or a longer --warmup.")
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % cfg.log_every == 0 or step == n_steps:
                now = time.time()
                tps = tokens_per_step * (step - s_last) / max(now - t_last, 1e-9)
                t_last, s_last = now, step
                logs.metrics({"step": step, "loss": loss_val, "lr": lr, "grad_norm": gnorm,
                              **({"coverage_penalty": step_reg} if coverage is not None else {}),
                              "tokens": step * tokens_per_step, "tokens_per_s": tps, "elapsed_s": now - t_start})
                bar.update(task, info=f"loss {loss_val:.3f}  {tps:,.0f} tok/s")
            if step in gate_steps:
                snapshot(step)
            if (cfg.val_every and step % cfg.val_every == 0) or step == n_steps:
                v = validate(model, val_stream, cfg, device, autocast)
                logs.metrics({"step": step, **v})
                summary.update(v)
            if (cfg.ckpt_every and step % cfg.ckpt_every == 0) or step == n_steps:
                save(step, loss_val)
            bar.update(task, completed=step)
    if not summary:  # resumed a run that had already reached its last step
        summary.update(validate(model, val_stream, cfg, device, autocast))
    elapsed = time.time() - t_start
    summary = {"name": mcfg.name, "steps": n_steps, "final_loss": loss_val, "tokens": n_steps * tokens_per_step,
               "tokens_per_s": (n_steps - first_step) * tokens_per_step / max(elapsed, 1e-9),  # this session
               "elapsed_s": elapsed, "n_params": model.n_params, "out": str(out), "seed": seed,
               "versions": _versions(), **summary}
    if dist.main:
        write_json(out / "done.json", summary, default=str)
    logs.close()
    return summary


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
