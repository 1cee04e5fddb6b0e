"""`phasekv posttrain MODEL --out DIR`: repair a model that is already trained (`phasekv.mitigate.posttrain`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

console = Console()


def posttrain_command(
    model: Path = typer.Argument(..., help="The trained model: a phasekv run, a PhaseLM.save directory or a Hugging "
                                           "Face model directory (a DeepSeek-V4 model too). It is never modified."),
    out: Path = typer.Option(..., "--out", help="Output directory: model/ (the continuation), checks/step_N/ (the "
                                                "audits; step 0 the base), curve.png, posttrain.json."),
    steps: int = typer.Option(600, help="Step budget of the continuation."),
    every: int = typer.Option(50, help="Evaluate every this many steps."),
    stop: bool = typer.Option(True, "--stop/--no-stop", help="Stop once flat (--no-stop: train the whole budget)."),
    task: str = typer.Option("auto", help="auto (the audit's choice: lookup for phasekv recall models) | lookup | "
                                          "needle."),
    reference: Path = typer.Option(None, help="A full-attention model: flat also needs every layout's mean within 5 "
                                              "points of its mean (evaluated once, OUT/reference/)."),
    margin: float = typer.Option(None, "--margin", help="Flat: every layout's gap has its 95% upper bound below "
                                                        "this many points (default: the rule's δ)."),
    lr: float = typer.Option(None, help="Learning rate, constant after the warmup (default: the base's peak rate)."),
    warmup: int = typer.Option(20, help="Linear warmup steps."),
    batch_size: int = typer.Option(None, "--batch-size", help="Sequences per step (default: the base's)."),
    recall: str = typer.Option("gap_prob=0.5,curriculum=0", help="Changes to the base's recall data, key=value pairs "
                                                                  "(default: half the records adjacent, no curriculum)."),
    needle: str = typer.Option("curriculum=0", help="Changes to the base's needle data, key=value pairs (default: "
                                                    "no curriculum)."),
    per_group: int = typer.Option(None, "--per-group", help="Prompts per residue group (lookup 576, needle 64)."),
    context: int = typer.Option(None, help="Needle context tokens (default: what fits)."),
    seed: int = typer.Option(None, help="Data order of the continuation (default: the base's seed)."),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:N or auto."),
) -> None:
    """Continue a trained model with a phase-balanced recipe (its own data with half the records adjacent, at its own
    peak learning rate)
    and audit it every --every steps under both paddings and a held-out layout (or the needle); stop once it is
    flat by equivalence on every one (the gap's 95% upper bound below δ, and it retrieves) or at the budget.
    Refuses, in one line and writing nothing, a directory that is no model, a budget of 0 and a model that does
    not retrieve. Exit 0: flat; 3: not flat within the budget. A run that is interrupted continues when the
    command is given again.

    Example: phasekv posttrain runs/w8s4 --out runs/w8s4-post --steps 600 --every 50
    """
    from phasekv.eval.stats import FLAT_MARGIN
    from phasekv.mitigate.posttrain import Recipe, Settings, posttrain
    from phasekv.train.cli import parse_pairs

    recipe = Recipe(lr=lr, warmup=warmup, batch_size=batch_size, recall=parse_pairs(recall, "--recall"),
                    needle=parse_pairs(needle, "--needle"))
    s = Settings(steps=steps, every=every, stop=stop, task=task, margin=FLAT_MARGIN if margin is None else margin,
                 per_group=per_group, context=context, seed=seed, recipe=recipe,
                 reference=None if reference is None else str(reference))
    rec = posttrain(model, out, s, device=device, say=console.print)
    first = rec["steps_to_flat"]
    if first is None:
        console.print(f"[red]not flat[/] after {rec['checks'][-1]['step']} steps")
    else:
        frac = f" ({rec['fraction']:.2f} of the base's {rec['base_steps']} steps)" if rec["fraction"] is not None else ""
        console.print(f"[green]flat[/] at step {first}{frac}")
    console.print(f"wrote {out}/posttrain.json, curve.png, checks/ (before: {rec['before']}, after: {rec['after']})"
                  + (f", {rec['model']}/" if rec["model"] else ""))
    raise typer.Exit(0 if first is not None else 3)
