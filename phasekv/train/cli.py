"""Commands `phasekv train`, `phasekv sweep ...` and `phasekv tokenizer ...`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from phasekv.train.config import TrainConfig

console = Console(stderr=True)

D = TrainConfig()
ARCH_HELP = "Model: paper name ('W8/S8 · 1 KV', 'Full attention · 8 KV') or ASCII alias ('w8s8-1kv')."


def train_command(
    arch: str = typer.Option(None, "--arch", help=ARCH_HELP + " Default: W8/S8 · 1 KV."),
    preset: str = typer.Option(None, help="Backbone preset: tiny | small | qwen3-0.6b (default tiny)."),
    out: Path = typer.Option(None, "--out", "-o", help="Run directory (config, tokenizer, metrics, gates, checkpoints)."),
    data: str = typer.Option(None, help="'recall' (synthetic associative recall, default) or .txt/.jsonl/.parquet "
                                        "files, directories or globs (comma-separated)."),
    tokenizer: str = typer.Option(None, help="tokenizer.json (or HF model dir) for text data; default: word tokenizer."),
    recall_mix: float = typer.Option(None, help="With a text corpus: fraction of synthetic recall sequences (0-1)."),
    recall: str = typer.Option(None, help="Recall layout overrides, e.g. 'min_records=4,max_records=8,min_distance=16' "
                                          "(fields of phasekv.data.RecallConfig)."),
    steps: int = typer.Option(None, help=f"Optimizer steps (default {D.total_steps})."),
    tokens: int = typer.Option(None, help="Training tokens instead of --steps."),
    batch_size: int = typer.Option(None, help=f"Sequences per optimizer step, all ranks and micro-steps together (default {D.batch_size})."),
    grad_accum: int = typer.Option(None, help=f"Gradient accumulation micro-steps per optimizer step (default {D.grad_accum})."),
    seq_len: int = typer.Option(None, help=f"Tokens per training sequence (default {D.seq_len})."),
    lr: float = typer.Option(None, help=f"Peak learning rate of AdamW (default {D.lr})."),
    min_lr: float = typer.Option(None, help=f"Final learning rate of the cosine schedule (default {D.min_lr})."),
    warmup: int = typer.Option(None, help=f"Linear warmup steps (default {D.warmup})."),
    weight_decay: float = typer.Option(None, help=f"AdamW weight decay on matrices (default {D.weight_decay})."),
    grad_clip: float = typer.Option(None, help=f"Gradient-norm clip, 0 = off (default {D.grad_clip})."),
    seed: int = typer.Option(None, help="Seed of init and data order (default: the model name's seed, 42)."),
    init_from: str = typer.Option(None, help="Continue training these weights (run dir or model dir) on --data."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out from its latest checkpoint."),
    ckpt_every: int = typer.Option(None, help=f"Checkpoint every N steps, the last step always (default {D.ckpt_every})."),
    val_every: int = typer.Option(None, help=f"Validate every N steps, 0 = only at the end (default {D.val_every})."),
    log_every: int = typer.Option(None, help=f"Append to metrics.jsonl every N steps (default {D.log_every})."),
    val_sequences: int = typer.Option(None, help=f"Held-out sequences per validation (default {D.val_sequences})."),
    keep_checkpoints: int = typer.Option(None, help=f"Complete checkpoints to keep, newest first (default {D.keep_checkpoints})."),
    gate_probe: int = typer.Option(None, help=f"Probe sequences of the gate snapshots (default {D.gate_probe})."),
    gate_steps: str = typer.Option(None, help="Gate snapshot steps: 'log' (default), 'none' or '1,10,100'."),
    device: str = typer.Option(None, help="auto | cpu | cuda."),
    compile: bool = typer.Option(None, "--compile/--no-compile", help="torch.compile the model."),
    fsdp: bool = typer.Option(None, "--fsdp/--no-fsdp", help="Under torchrun: FSDP2 (fully_shard) instead of DDP."),
    threads: int = typer.Option(None, help="torch CPU threads (0 = default)."),
    logger: str = typer.Option(None, help="Extra logging: none | tensorboard | wandb (when installed)."),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Show the progress bar."),
) -> None:
    """Train a model from scratch (default: synthetic associative recall on the tiny preset).

    Example: phasekv train --arch "W8/S8 · 1 KV" --preset tiny --steps 1600 --out runs/w8s8.
    Under `torchrun --nproc_per_node N -m phasekv train ...` it trains with DDP (or FSDP2 with --fsdp).
    """
    from phasekv.train.loop import train

    opts = {k: v for k, v in locals().items() if v is not None and k not in ("resume", "train")}
    if "out" not in opts:
        from phasekv.errors import ConfigError

        raise ConfigError("--out DIR is required (the run directory)")
    opts["out"] = str(opts["out"])
    if "recall" in opts:
        opts["recall"] = parse_pairs(opts["recall"], "--recall")
    summary = train(resume=resume, **opts)
    _print_summary(summary)


def parse_pairs(text: str, flag: str) -> dict:
    """'a=1,b=x' -> {'a': 1, 'b': 'x'} (ints, floats, true/false, else strings)."""
    from phasekv.errors import ConfigError

    out: dict = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag}: expected key=value pairs, got {part!r}")
        val: object = raw.strip()
        for conv in (int, float):
            try:
                val = conv(raw)
                break
            except ValueError:
                pass
        if isinstance(val, str) and val.lower() in ("true", "false"):
            val = val.lower() == "true"
        out[key.strip()] = val
    return out


def _print_summary(s: dict) -> None:
    line = (f"[bold]{s['name']}[/]: {s['steps']} steps, final loss {s['final_loss']:.4f}, "
            f"{s['tokens_per_s']:,.0f} tok/s")
    if "val_accuracy" in s:
        line += (f", held-out recall accuracy {100 * s['val_accuracy']:.1f}% (chance {100 * s['chance']:.1f}%), "
                 f"by residue mod 24: worst {s['val_worst']:.1f} best {s['val_best']:.1f} gap {s['val_gap']:.1f}")
    elif "val_loss" in s:
        line += f", val loss {s['val_loss']:.4f}"
    console.print(line + f" -> {s['out']}")


def register(app: typer.Typer) -> None:
    from phasekv.data.cli import app as tokenizer_app
    from phasekv.train.sweep import app as sweep_app

    app.command("train")(train_command)
    app.add_typer(sweep_app, name="sweep")
    app.add_typer(tokenizer_app, name="tokenizer")
