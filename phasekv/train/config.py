"""Training configuration: one dataclass, saved as the run's `config.json` and reloaded on `--resume`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from phasekv.config import format_overrides, parse_overrides
from phasekv.data.sources import DataConfig
from phasekv.errors import ConfigError


@dataclass
class TrainConfig:
    """Everything that defines a training run; saved as `DIR/config.json` and reloaded on `--resume`. Each
    field is a `phasekv train` option, and its comment is that option's help."""

    # --- what to train ---
    arch: str | None = None  # paper name or ASCII alias (`w8s8-1kv`); default W8/S8 · 1 KV, or --init-from's model
    preset: str = "tiny"  # backbone preset (tiny | tiny-8h | cpu-study | small | qwen3-0.6b)
    backbone: dict = field(default_factory=dict)  # overrides of the preset's backbone fields
    data: DataConfig = field(default_factory=DataConfig)  # recall (default), corpus, or a mixture
    out: str = "runs/run"  # run directory (config, tokenizer, metrics, gates, checkpoints)
    init_from: str | None = None  # start from these weights (run dir or model dir); fresh optimizer and data
    seed: int | None = None  # model init (and data, unless --data-seed); None = the seed in the model name (42 by default)
    data_seed: int | None = None  # data order and held-out sequences apart from the weights' seed; None = the run seed
    hf_config: str | None = None  # train a transformers causal LM of this config.json instead of --arch/--preset
    hf_model: str | None = None  # continue training this Hugging Face model directory's (or HF run's) weights, fresh optimizer
    # --- how long ---
    steps: int = 0  # optimizer steps (0: from `tokens`, else 1600: the tiny recall recipe)
    tokens: int = 0  # alternative to `steps`: total training tokens (rounded up to whole steps)
    batch_size: int = 64  # sequences per optimizer step, over all ranks and accumulation micro-steps
    grad_accum: int = 1  # micro-steps per optimizer step
    trim: bool = False  # sort each step's examples by length into its grad_accum micro-batches and cut each after
    #                     its last target: the same gradient (the model is causal) over less padding
    seq_len: int = 96  # tokens per sequence
    # --- optimizer (AdamW, linear warmup then cosine to min_lr) ---
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # learning rate at the end of the cosine decay
    warmup: int = 100  # linear warmup steps
    weight_decay: float = 0.0  # AdamW weight decay, on matrices only (not norms, biases, gate biases)
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # max global grad norm (0 = off)
    # --- bookkeeping ---
    log_every: int = 10  # metrics.jsonl cadence (steps)
    val_every: int = 250  # validation cadence (steps; 0 = only at the end)
    val_sequences: int = 256  # held-out sequences per validation
    ckpt_every: int = 250  # checkpoint cadence (steps; the last step is always saved)
    keep_checkpoints: int = 2  # complete checkpoints kept (the newest ones)
    gate_steps: str = "log"  # gate snapshot steps: "log" (log-spaced, from step 1), "none", or "1,10,100"
    gate_probe: int = 32  # probe sequences of the gate snapshots
    # --- runtime ---
    device: str = "auto"  # auto | cpu | cuda
    compile: bool = False  # torch.compile: each layer captured whole at static shapes where it can be, else the model
    fsdp: bool = False  # FSDP2 (fully_shard) instead of DDP under torchrun
    threads: int = 0  # torch CPU threads (0 = torch default)
    logger: str = "none"  # none | tensorboard | wandb (extra logging, when installed)
    progress: bool = True  # rich progress bar (rank 0)

    def __post_init__(self):
        if isinstance(self.data, dict):
            self.data = DataConfig(**self.data)
        self.backbone = parse_overrides(self.backbone, "--set")
        for f in ("batch_size", "grad_accum", "seq_len", "log_every", "keep_checkpoints", "gate_probe",
                  "val_sequences"):
            if getattr(self, f) < 1:
                raise ConfigError(f"{f}={getattr(self, f)} must be >= 1")
        for f in ("steps", "tokens", "warmup", "val_every", "ckpt_every", "threads"):
            if getattr(self, f) < 0:
                raise ConfigError(f"{f}={getattr(self, f)} must be >= 0")
        if sum(x is not None for x in (self.hf_config, self.hf_model, self.init_from)) > 1:
            raise ConfigError("give one of --hf-config, --hf-model and --init-from")
        if self.backbone and (self.hf_config or self.hf_model or self.init_from):
            raise ConfigError(f"--set {format_overrides(self.backbone)}: --init-from, --hf-config and --hf-model "
                              "bring their own backbone")
        if self.steps and self.tokens:
            raise ConfigError("give --steps or --tokens, not both")
        if not self.lr > 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"need lr > 0 and 0 <= min_lr <= lr, got lr={self.lr}, min_lr={self.min_lr}")
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"batch_size={self.batch_size} must be a multiple of grad_accum={self.grad_accum}")
        if self.logger not in ("none", "tensorboard", "wandb"):
            raise ConfigError(f"logger={self.logger!r} must be none, tensorboard or wandb")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device={self.device!r} must be auto, cpu or cuda")
        self.gate_schedule()  # validates gate_steps

    @property
    def total_steps(self) -> int:
        if self.steps:
            return self.steps
        if self.tokens:
            return math.ceil(self.tokens / (self.batch_size * self.seq_len))
        return 1600

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine down to min_lr."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        span = max(self.total_steps - self.warmup, 1)
        frac = min((step - self.warmup) / span, 1.0)
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * frac))

    def gate_schedule(self) -> set[int]:
        """Steps (counted after that many updates) at which gates are snapshotted."""
        n, spec = self.total_steps, self.gate_steps.strip().lower()
        if spec in ("none", ""):
            return set()
        if spec == "log":
            return {int(s) for s in np.unique(np.round(np.logspace(0, math.log10(max(n, 1)), 24)))} | {n}
        try:
            steps = {int(s) for s in spec.split(",") if s.strip()}
        except ValueError:
            raise ConfigError(f"gate_steps={self.gate_steps!r}: use 'log', 'none' or comma-separated steps") from None
        return {s for s in steps if 1 <= s <= n}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown training option(s): {', '.join(sorted(unknown))}")
        return cls(**d)
