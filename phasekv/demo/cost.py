"""What a plan costs on GPUs before it is submitted (`phasekv study --dry-run`): each training's FLOPs at 6·N·D
(N parameters, D training tokens; the forward and backward passes of a dense transformer) turned into GPU-hours at a
stated peak and utilisation. Evaluations and analyses run forward passes over a few thousand prompts per model:
next to any real training they are small, and they are not priced."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from phasekv.config import ModelConfig
from phasekv.demo.plan import DemoPlan
from phasekv.study import Task
from phasekv.study.slurm import SlurmOptions

PAPER_TOKENS = 100e9  # training tokens per model in the paper (26 models at the Qwen3-0.6B shape)


@dataclass
class GPU:
    """The GPU the estimate assumes."""

    tflops: float = 989.0  # dense bf16 peak, TFLOP/s (an H100 SXM's)
    utilisation: float = 0.4  # share of the peak a training reaches (model FLOP utilisation)

    def hours(self, flops: float) -> float:
        return flops / (self.tflops * 1e12 * self.utilisation) / 3600


def n_params(cfg: ModelConfig) -> int:
    """Parameters of a model, counted on the meta device (nothing allocated)."""
    from phasekv.model.transformer import PhaseLM

    with torch.device("meta"):
        return PhaseLM(cfg).n_params


def training_tokens(plan: DemoPlan, model: str) -> int:
    t = plan.training_of(model)
    return t["steps"] * t["batch_size"] * plan.seq_len


def training_cost(plan: DemoPlan, gpu: GPU, tokens: float | None = None) -> dict[str, dict]:
    """{model alias: {"params", "tokens", "flops", "gpu_hours", "paper_gpu_hours"}} of every training of `plan` at its
    budget (or at `tokens` per model), and at the paper's (PAPER_TOKENS)."""
    out = {}
    for m in plan.models:
        cfg = ModelConfig.from_name(m, preset=plan.preset)
        n, d = n_params(cfg), tokens or training_tokens(plan, m)
        out[cfg.alias] = {"params": n, "tokens": d, "flops": 6.0 * n * d, "gpu_hours": gpu.hours(6.0 * n * d),
                          "paper_gpu_hours": gpu.hours(6.0 * n * PAPER_TOKENS)}
    return out


def resources_text(options: SlurmOptions | None, parallel: bool, device: str) -> str:
    """What one task's job asks for: '2 nodes x 8 GPUs (16 ranks), 60 min', '1 GPU, 60 min', '1 CPU'."""
    if options is None:
        return "1 GPU" if device.startswith("cuda") else "1 CPU (a local worker)"
    r = options.resources(parallel)
    ranks = r["nodes"] * r["ntasks_per_node"]
    gpus = f"{r['gpus_per_node']} GPU(s)" if r["gpus_per_node"] else f"{r['cpus_per_task']} CPU(s)"
    where = f"{r['nodes']} node(s) x {gpus}" + (f" ({ranks} ranks)" if ranks > 1 else "") if parallel else gpus
    return f"{where}, {r['time']} min"


def plan_table(tasks: list[Task], cost: dict[str, dict], options: SlurmOptions | None, device: str) -> list[dict]:
    """One row per task: its name, the tasks it needs, its job's resources and (a training) its GPU-hours (`cost`:
    `training_cost`)."""
    rows = []
    for t in tasks:
        alias = t.name.removeprefix("train ") if t.parallel else None
        rows.append({"task": t.name, "after": ", ".join(t.after), "resources": resources_text(options, t.parallel, device),
                     "gpu_hours": cost[alias]["gpu_hours"] if alias in cost else None})
    return rows
