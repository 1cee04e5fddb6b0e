"""Commands `phasekv train`, `phasekv sweep ...` and `phasekv tokenizer ...`.

`phasekv train` has one option per field of `TrainConfig` and of its `DataConfig` (`--lr`, `--data`, ...):
the help is the field's comment and the default the field's default, so the config documents its own
command line and a new field is a new option.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re

import typer
from rich.console import Console

from phasekv.config import BACKBONE_FIELDS
from phasekv.data.cli import app as tokenizer_app
from phasekv.data.sources import DataConfig
from phasekv.errors import ConfigError
from phasekv.train.config import TrainConfig
from phasekv.train.loop import train
from phasekv.train.sweep import app as sweep_app

console = Console(stderr=True)

TYPES = {"int": int, "float": float, "bool": bool}  # field annotation (less `| None`) -> option type, else str
NOTES = {  # what the command line adds to a field's comment
    "out": "(required)",
    "recall": "as key=value pairs, e.g. 'min_records=4,max_records=8,min_distance=16'",
    "needle": "as key=value pairs, e.g. 'min_records=8,queries=8,curriculum=16000' (with --data needle)",
    "backbone": f"as field=value pairs, e.g. 'n_layers=4,d_model=96' (fields: {', '.join(BACKBONE_FIELDS)})",
}
SHORT = {"out": ["-o"], "backbone": ["--set"]}  # more flags of an option


def field_comments(cls) -> dict[str, str]:
    """{field: its trailing comment} of a commented config dataclass."""
    return dict(re.findall(r"^ +(\w+): [^#\n]+#\s*(.+)$", inspect.getsource(cls), re.M))


def _option(f: dataclasses.Field, comment: str, default) -> inspect.Parameter:
    """`--field` (`--field/--no-field` for a bool), None when not given: with --resume only given options count."""
    flag = "--" + f.name.replace("_", "-")
    flags = [f"{flag}/--no-{flag[2:]}"] if f.type == "bool" else [flag] + SHORT.get(f.name, [])
    shown = NOTES.get(f.name) or (f"(default {default})" if isinstance(default, int | float | str) else "")
    opt = typer.Option(None, *flags, help=f"{comment} {shown}".strip())
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt,
                             annotation=TYPES.get(f.type.removesuffix(" | None"), str))


def train_options() -> list[inspect.Parameter]:
    """The options of `phasekv train`, in TrainConfig's order with the DataConfig fields in place of `data`."""
    comments = {**field_comments(TrainConfig), **field_comments(DataConfig)}
    defaults = {**TrainConfig().to_dict(), **DataConfig().to_dict()}
    fields = []
    for f in dataclasses.fields(TrainConfig):
        fields += dataclasses.fields(DataConfig) if f.name == "data" else [f]
    return [_option(f, comments[f.name], defaults[f.name]) for f in fields]


def train_command(resume: bool = False, **options) -> None:
    """Train a model from scratch (default: synthetic associative recall on the tiny preset).

    Example: phasekv train --arch "W8/S8 · 1 KV" --preset tiny --steps 1600 --out runs/w8s8.
    Under `torchrun --nproc_per_node N -m phasekv train ...` it trains with DDP (or FSDP2 with --fsdp).
    """
    opts = {k: v for k, v in options.items() if v is not None}
    if "out" not in opts:
        raise ConfigError("--out DIR is required (the run directory)")
    for layout in ("recall", "needle"):
        if layout in opts:
            opts[layout] = parse_pairs(opts[layout], f"--{layout}")
    summary = train(resume=resume, **opts)
    if os.environ.get("RANK", "0") == "0":  # under torchrun: one summary, from rank 0
        _print_summary(summary)


train_command.__signature__ = inspect.Signature([
    *train_options(),
    inspect.Parameter("resume", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--resume", help="Continue the run in --out from its latest checkpoint.")),
])


def parse_pairs(text: str, flag: str) -> dict:
    """'a=1,b=x' -> {'a': 1, 'b': 'x'} (ints, floats, true/false, else strings)."""
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
    if "val_recall_loss" in s:  # text with recall mixed in: the text's loss, then the recall
        line += f", val loss {s['val_loss']:.4f}"
    if "val_accuracy" in s:
        line += (f", held-out recall accuracy {100 * s['val_accuracy']:.1f}% (chance {100 * s['chance']:.1f}%), "
                 f"by residue mod 24: worst {s['val_worst']:.1f} best {s['val_best']:.1f} gap {s['val_gap']:.1f}")
    elif "val_loss" in s:
        line += f", val loss {s['val_loss']:.4f}"
    console.print(line + f" -> {s['out']}")


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
    app.add_typer(sweep_app, name="sweep")
    app.add_typer(tokenizer_app, name="tokenizer")
