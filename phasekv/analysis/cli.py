"""`phasekv analyze knockout|gates|cycle`: the mechanism analyses (docs: Explain the weak phases) from the command line."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from phasekv.errors import ConfigError

# the commands import their work (torch, models, analyses) when they run: `phasekv --help` stays fast

app = typer.Typer(help="Mechanism analyses: KV-head knockouts by phase, gate concentration, gate cycling.",
                  no_args_is_help=True)
console = Console()

MODEL_HELP = ("phasekv run dir, checkpoint / PhaseLM.save dir, or a Hugging Face decoder dir (any decoder for "
              "knockout; DeepSeek-V4 for gates and cycle).")


def _prompts(em, records: int | None, demos: int | None, padding: str, filler: int | None, modulus: int,
             per_group: int, keep_n: bool, mappings: int, seed: int):
    """Lookup prompts as `phasekv eval lookup` builds them (a recall run's words; a layout that fits it)."""
    from phasekv.eval.prompts import lookup_config

    return lookup_config(em.info, records=records, demos=demos, padding=padding, filler=filler,
                         modulus=modulus, per_group=per_group, keep_n=keep_n, mappings=mappings, seed=seed)


# shared lookup-prompt options (defaults: the study's lookup test)
RECORDS = typer.Option(None, help="Key-name records per prompt. Default, with --demos and --filler: the study's 64, "
                       "8, 48, or for a phasekv run trained on shorter sequences the longest layout that fits "
                       "them (96 tokens: 16, 4, 48).")
DEMOS = typer.Option(None, help="Demonstrations before the target key (default: see --records).")
PADDING = typer.Option("prefix", help="prefix | in-sequence padding.")
FILLER = typer.Option(None, help="Filler tokens per prompt, fixed so the query position is fixed (default: see "
                      "--records).")
MODULUS = typer.Option(24, help="Residue groups M (target position mod M).")
PER_GROUP = typer.Option(576, help="Prompts per residue group (rounded up to a multiple of M² unless --keep-n).")
KEEP_N = typer.Option(False, "--keep-n", help="Keep --per-group as given (sampled, moment-matched design).")
MAPPINGS = typer.Option(32, help="Key-name mappings (the bootstrap unit).")
SEED = typer.Option(0, help="Prompt seed (calibration prompts use another seed).")
BATCH = typer.Option(32, help="Prompts per forward pass.")
DEVICE = typer.Option("auto", help="auto | cpu | cuda.")
PROGRESS = typer.Option(True, "--progress/--no-progress", help="Show progress bars.")


@app.command("knockout")
def knockout_cmd(
    model: Path = typer.Option(..., "--model", help=MODEL_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    variant: str = typer.Option(None, help="head (each KV head; phasekv) | layer (whole attention output; any "
                                           "decoder) | compressed (the layer's compressed entries; DeepSeek-V4), "
                                           "or several comma-separated. Default: head for phasekv, "
                                           "compressed,layer for DeepSeek-V4, layer for other Hugging Face models."),
    n_cal: int = typer.Option(256, help="Calibration prompts whose mean activation replaces the knocked-out one."),
    final_tokens: int = typer.Option(1, help="Knock out at this many final tokens (the query token(s))."),
    layers: str = typer.Option(None, help="Only these layers, e.g. '0,5,9' (default: every layer)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow a Hugging Face model's code."),
    records: int = RECORDS, demos: int = DEMOS, padding: str = PADDING, filler: int = FILLER, modulus: int = MODULUS,
    per_group: int = PER_GROUP, keep_n: bool = KEEP_N, mappings: int = MAPPINGS, seed: int = SEED,
    batch_size: int = BATCH, device: str = DEVICE, progress: bool = PROGRESS,
) -> None:
    """Mean-ablate each KV head (or each layer's attention output) at the query token and measure lookup
    accuracy per residue relative to clean; writes results.parquet, summary.json, knockout_map.png."""
    from phasekv.analysis.knockout import analyze_knockout
    from phasekv.eval.models import load

    if n_cal < 1 or final_tokens < 1:
        raise ConfigError("--n-cal and --final-tokens must be >= 1")
    em = load(model, device=device, trust_remote_code=trust_remote_code)
    cfg = _prompts(em, records, demos, padding, filler, modulus, per_group, keep_n, mappings, seed)
    try:
        only = None if layers is None else [int(x) for x in layers.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--layers {layers!r}: use comma-separated layer indices like 0,5,9") from None
    s = analyze_knockout(em, cfg, out, variant, n_cal, final_tokens, batch_size, progress, only)
    console.print(f"[bold]{s['model']}[/]: clean mean {s['clean']['mean']:.1f}%, worst {s['clean']['worst']:.1f}%, "
                  f"gap {s['clean']['gap']:.1f} [{s['clean']['gap_ci'][0]:.1f}, {s['clean']['gap_ci'][1]:.1f}] pts; {s['variant']} knockouts -> {out}")
    for h in s["strongest"][:5]:
        console.print(f"  {h['unit']}: worst group {h['worst_group']} {100 * h['worst_rel_change']:+.0f}% "
                      f"(mean {100 * h['mean_rel_change']:+.0f}%)")


@app.command("gates")
def gates_cmd(
    model: Path = typer.Option(..., "--model", help="phasekv run dir (training paths from its gates.jsonl), model "
                                                    "dir, or a DeepSeek-V4 Hugging Face dir / `train --hf-config` run."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    n_prompts: int = typer.Option(256, help="Lookup prompts whose complete windows are scored."),
    knockout: Path = typer.Option(None, help="A `phasekv analyze knockout` output dir: adds the knockout column "
                                             "to the per-head panel."),
    trace: int = typer.Option(0, help="Training paths drawn: every key gate's (0) or the N most statically "
                                      "concentrated ones."),
    records: int = RECORDS, demos: int = DEMOS, padding: str = PADDING, filler: int = FILLER, modulus: int = MODULUS,
    per_group: int = PER_GROUP, keep_n: bool = KEEP_N, mappings: int = MAPPINGS, seed: int = SEED,
    batch_size: int = BATCH, device: str = DEVICE, progress: bool = PROGRESS,
) -> None:
    """Static exp(H(E[α])) and per-window E[exp(H(α))] concentration of every key/value gate, gate scores by
    phase; the concentration plane with training paths and the per-head panel figure."""
    from phasekv.analysis.gates import analyze_gates
    from phasekv.eval.models import load

    if n_prompts < 1:
        raise ConfigError("--n-prompts must be >= 1")
    em = load(model, device=device)
    cfg = _prompts(em, records, demos, padding, filler, modulus, per_group, keep_n, mappings, seed)
    s = analyze_gates(em, cfg, out, n_prompts, batch_size, knockout, trace, progress)
    console.print(f"[bold]{s['model']}[/]: gates over {s['n_prompts']} prompts -> {out}")
    for h in s["heads"]:
        if h["branch"] in ("key", "indexer"):
            console.print(f"  L{h['layer']}·KV{h['kv_head']} {h['branch']}: static {h['static']:.2f}, per window "
                          f"{h['per_window']:.2f} (of {h['window']}), peak phase {h['peak_phase']} of {h['stride']}")


def _deltas(spec: str) -> list[int]:

    try:
        if ".." in spec:
            lo, hi = (int(x) for x in spec.split(".."))
            return [d for d in range(lo, hi + 1) if d != 0]
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--delta {spec!r}: use a range like -3..3 or a list like -1,1,2") from None


@app.command("cycle")
def cycle_cmd(
    model: list[Path] = typer.Option(..., "--model", help="phasekv model with W = S or a V4 slot bias, or a "
                                                          "DeepSeek-V4 Hugging Face dir (repeat for the model x δ grid)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    delta: str = typer.Option("-3..3", help="Cycle offsets δ: a range -3..3 (0 skipped) or a list -1,1,2."),
    n_boot: int = typer.Option(2000, help="Bootstrap resamples over mappings for the R² interval."),
    records: int = RECORDS, demos: int = DEMOS, padding: str = PADDING, filler: int = FILLER, modulus: int = MODULUS,
    per_group: int = PER_GROUP, keep_n: bool = KEEP_N, mappings: int = MAPPINGS, seed: int = SEED,
    batch_size: int = BATCH, device: str = DEVICE, progress: bool = PROGRESS,
) -> None:
    """Cycle the offset-specific gate parameters by δ (payloads fixed; DeepSeek-V4: every compressor's
    position_bias), compare accuracy by phase with the prediction A_δ(r) = A_0((r-δ) mod S); R² excluding the
    boundary phase with a bootstrap 95% interval."""
    from phasekv.analysis.cycling import analyze_cycle
    from phasekv.eval.models import load

    ems = [load(m, device=device) for m in model]
    # one prompt set for the whole grid, over the first model's words
    cfg = _prompts(ems[0], records, demos, padding, filler, modulus, per_group, keep_n, mappings, seed)
    s = analyze_cycle(ems, cfg, out, _deltas(delta), batch_size, n_boot, progress)
    for g in s["grid"]:
        console.print(f"  {g['model']} δ={g['delta']:+d}: R² = {g['r2']:.2f} [{g['r2_lo']:.2f}, {g['r2_hi']:.2f}]")
    console.print(f"-> {out}")


@app.command("family")
def family_cmd(
    model: Path = typer.Option(..., "--model", help="phasekv run dir or model dir: a grid-family design (NSA, MoBA, "
                                                    "Activation Beacon) or any phasekv model."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    grids: str = typer.Option(None, help="Grid periods to test, e.g. \"d=4,l'=8\" (default: the model's own: NSA d "
                                         "and l', MoBA B, Beacon r and w, a compressor's S)."),
    ko_per_group: int = typer.Option(96, "--ko-per-group", help="Prompts per residue group of each knockout."),
    knockouts: bool = typer.Option(True, "--knockouts/--no-knockouts", help="The design's knockouts (NSA branches, "
                                   "MoBA's oracle block, Beacon's beacons per offset)."),
    n_boot: int = typer.Option(1000, help="Bootstrap resamples over mappings for the knockouts' intervals."),
    records: int = RECORDS, demos: int = DEMOS, filler: int = FILLER, modulus: int = MODULUS,
    per_group: int = PER_GROUP, keep_n: bool = KEEP_N, mappings: int = MAPPINGS, seed: int = SEED,
    batch_size: int = BATCH, device: str = DEVICE, progress: bool = PROGRESS,
) -> None:
    """The grid family's tests: lookup accuracy under both paddings at every grid period (each on a modulus its
    position design fits), the profile folded at the period, its weakest phase and periodicity p; NSA's accuracy by
    phase with only the compressed, selected or window branch open and all three; MoBA with the target's block
    forced into the selection; Beacon with each beacon of the window knocked out; NSA's branch gates by phase.
    Writes summary.json, results.parquet (knockout effects), prompts.parquet, lookup-<padding>-m<M>/."""
    from phasekv.analysis.family import analyze_family, reading
    from phasekv.eval.models import load

    if ko_per_group < 1:
        raise ConfigError("--ko-per-group must be >= 1")
    em = load(model, device=device)
    cfg = _prompts(em, records, demos, "prefix", filler, modulus, per_group, keep_n, mappings, seed)
    s = analyze_family(em, cfg, out, _grids(grids), ko_per_group=ko_per_group, batch_size=batch_size, n_boot=n_boot,
                       knockouts=knockouts, progress=progress)
    for padding in s["lookup"]:
        console.print(reading(s, padding))
    for run in (s.get("knockouts") or {}).get("runs", []):
        for c in run["conditions"]:
            console.print(f"  {c['condition']} (M = {run['modulus']}): mean {c['mean']:.1f} [{c['mean_ci'][0]:.1f}, "
                          f"{c['mean_ci'][1]:.1f}], gap {c['gap']:.1f} [{c['gap_ci'][0]:.1f}, {c['gap_ci'][1]:.1f}]"
                          + "".join(f"; {g['grid']}: weakest phase {g['weakest_phase']}"
                                    + ("" if g["p_value"] is None else f", p = {g['p_value']:.4f}")
                                    for g in c["grids"]))
    console.print(f"-> {out}")


def _grids(spec: str | None) -> dict[str, int] | None:
    """{"d": 4, "l'": 8} from "d=4,l'=8" (None: the model's own)."""
    if spec is None:
        return None
    try:
        pairs = [x.split("=") for x in spec.split(",") if x.strip()]
        return {k.strip(): int(v) for k, v in pairs}
    except ValueError:
        raise ConfigError(f"--grids {spec!r}: use name=period pairs like \"d=4,l'=8\"") from None
