"""`phasekv compare RUNS...`, `phasekv repair DIR` and `phasekv audit --model DIR --stride S`."""

from __future__ import annotations

import datetime
import inspect
import json
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

import typer
from rich.console import Console

from phasekv.errors import ConfigError
from phasekv.eval.cli import ENGINE, PRESS, model_from_flags

if typing.TYPE_CHECKING:
    from phasekv.mitigate.results import RepairResult

console = Console()
MARGIN = typer.Option(None, "--margin", help="Flat: the gap's 95% upper bound below this many points (default: the "
                                             "rule's delta, above every upper bound full attention showed).")


def compare_command(
    runs: list[Path] = typer.Argument(..., help="Evaluation directories (`phasekv eval lookup --out DIR`), or "
                                                "directories holding exactly one evaluation of --padding."),
    out: Path = typer.Option(..., "--out", help="Output directory: summary.json, results.parquet, pareto.png."),
    padding: str = typer.Option("prefix", help="Padding protocol of the evaluations to pick under a directory."),
    reference: str = typer.Option(None, help="Full-attention model the costs are relative to (default: the "
                                             "full-attention run with the fewest KV heads)."),
    baseline: str = typer.Option(None, help="Model whose mean accuracy mitigations must match (default "
                                            "'W8/S8 · 1 KV' when compared)."),
    context: int = typer.Option(32768, help="Context length at which cache bytes per token are counted."),
    min_compression: float = typer.Option(4.0, help="Acceptance: smallest compression ratio (x full attention)."),
    max_gap_factor: float = typer.Option(2.0, help="Acceptance: largest gap as a multiple of the reference's."),
    bench_reps: int = typer.Option(5, help="Interleaved repetitions of the cost micro-benchmark (0 = skip)."),
    decode_context: int = typer.Option(512, help="Prefill length before the timed decode steps."),
) -> None:
    """Compare models and mitigations: cache size, train/decode cost, accuracy, gap, Pareto plot.

    Costs are measured here, interleaved across models (minimum over repetitions), relative to full
    attention; a phase ensemble of k shifts costs k decode passes. Example:
    phasekv compare runs/eval/full runs/eval/w8s8 runs/eval/w8s8-ens8 runs/eval/stagger --out runs/compare
    """
    from phasekv.mitigate.compare import Bench, compare, table
    from phasekv.mitigate.criteria import verdict_lines

    bench = Bench(reps=bench_reps, decode_context=decode_context)
    s = compare(runs, out, reference=reference, baseline=baseline, protocol=padding, context=context,
                min_compression=min_compression, max_gap_factor=max_gap_factor, bench=bench, progress=True)
    wide = Console(width=max(console.width, 150))  # the table has 11 columns: do not squeeze it into 80
    wide.print(table(s))
    for line in verdict_lines(s):
        wide.print(line)
    console.print(f"wrote {out}/summary.json, results.parquet, pareto.png")


def option(default, *flags: str, help: str):
    """A field of an options dataclass that is also a command-line option (`command`)."""
    return field(default=default, metadata={"option": typer.Option(default, *flags, help=help)})


def shared(opt):
    """A field whose option is defined with another command's (eval's --server, --press)."""
    return field(default=opt.default, metadata={"option": opt})


def command(options: type, run):
    """A typer command whose options are the fields of the dataclass `options` (`option`, `shared`) in their order,
    that calls `run` with them as one `options` object."""
    hints = typing.get_type_hints(options)

    def cmd(**given):
        return run(options(**given))

    cmd.__signature__ = inspect.Signature([inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name],
                                                             default=f.metadata["option"]) for f in fields(options)])
    cmd.__name__, cmd.__doc__ = run.__name__, run.__doc__
    return cmd


@dataclass(frozen=True)
class AuditOptions:
    """`phasekv audit`'s options: the model (`model_from_flags`'s), what the audit tests (`settings`: `run_audit`'s),
    where it writes, or the lm-eval output it reads instead of a model."""

    model: Path | None = option(None, "--model", help="A phasekv run/model directory or a Hugging Face causal LM "
                                "directory (or --server).")
    server: str | None = shared(ENGINE["server"])
    served_model: str | None = shared(ENGINE["served_model"])
    concurrency: int = shared(ENGINE["concurrency"])
    stride: int | None = option(None, help="Compression stride S to test for (default: every compression ratio of "
                                "the model, e.g. a DeepSeek-V4 config's CSA and HCA ratios).")
    margin: float | None = option(None, "--margin", "--max-gap", help="Flat: the gap's 95% upper bound below this "
                                  "many points (default: the rule's delta, above every upper bound full attention "
                                  "showed).")
    out: Path | None = option(None, "--out", help="Output directory (default: ./audit-<model dir name>).")
    task: str = option("auto", help="auto (lookup for phasekv models and their exports, needle otherwise) | lookup | "
                       "needle.")
    context: int | None = option(None, help="Needle context tokens (default: what fits the device and model).")
    per_group: int | None = option(None, "--per-group", help="Prompts per residue group (lookup 576, needle 64).")
    modulus: int | None = option(None, help="Residue groups M (lookup 24, needle 8).")
    records: int | None = option(None, help="Records per prompt (default: fits the model's training length).")
    demos: int | None = option(None, help="Demonstrations before the target key.")
    filler: int | None = option(None, help="Lookup filler tokens per prompt.")
    seed: int = option(0, help="Seed of mappings, positions and filler.")
    batch_size: int = option(32, "--batch-size", help="Prompts per forward pass.")
    device: str = option("auto", help="cpu, cuda, cuda:N or auto.")
    tokenizer: Path | None = option(None, help="Tokenizer file/dir (default: the model's).")
    trust_remote_code: bool = option(False, "--trust-remote-code", help="Allow a HF model's own code.")
    press: str | None = shared(PRESS)
    lm_eval: Path | None = option(None, "--lm-eval", help="Audit what lm-evaluation-harness scored instead of a model: "
                                  "the --output_path of `lm_eval ... --log_samples` over the tasks of `phasekv "
                                  "export-tasks` (--task picks the task: auto, lookup (prefix padding) or needle).")

    def settings(self) -> dict:
        """`run_audit`'s keywords: what the audit tests and with which prompts (the margin apart: its default)."""
        return {k: getattr(self, k) for k in ("stride", "task", "per_group", "modulus", "context", "records", "demos",
                                              "filler", "seed", "batch_size")}


def audit(o: AuditOptions) -> None:
    """Phase audit in one command: retrieval by residue for every compression ratio, periodicity, verdict,
    figure, so it can gate a model release in CI. Exit codes (audit.json "verdict"): 0 pass: the model retrieves
    (mean accuracy's 95% interval above twice chance and above chance + the margin) and every profile is flat by equivalence (the gap's 95%
    upper bound below --margin); 3 fail: a gap is not shown below the margin (above it, or an interval too wide
    to tell: more prompts can); 4 inconclusive: the model does not retrieve well enough for the gap to mean
    anything. The periodicity test is reported, never a veto below the margin.

    Example: phasekv audit --model runs/w8s8 --stride 8 --margin 10; phasekv audit --lm-eval lm-eval-out/
    """
    from phasekv.eval.stats import FLAT_MARGIN
    from phasekv.mitigate.audit import print_verdict, run_audit

    margin = FLAT_MARGIN if o.margin is None else o.margin
    if o.lm_eval is not None:
        if o.model is not None or o.server is not None:
            raise ConfigError("--lm-eval audits an lm-eval output directory: give it without --model/--server")
        _audit_lm_eval(o.lm_eval, o.out, o.task, o.stride, margin)
    em = model_from_flags(o.model, o.server, o.served_model, o.concurrency, o.device, o.trust_remote_code, o.tokenizer,
                          o.press)
    out = o.out or Path(f"audit-{Path(o.model).resolve().name if o.model else o.served_model}")
    v = run_audit(em, out, margin=margin, **o.settings())
    print_verdict(v, console)
    console.print(f"wrote {out}/audit.json, audit.png, {v['task']}/ · exit code {v['exit_code']}")
    raise typer.Exit(v["exit_code"])


audit_command = command(AuditOptions, audit)


def _audit_lm_eval(output: Path, out: Path | None, task: str, stride: int | None, margin: float) -> None:
    """`phasekv audit --lm-eval OUTPUT`: the verdict of one phasekv task lm-eval scored; exits with its code."""
    from phasekv.eval.harness import TASKS, read_samples
    from phasekv.mitigate.audit import audit_scored, print_verdict

    scored = {s.name: s for s in read_samples(output, stride)}
    wanted = {"auto": list(TASKS), "lookup": ["phasekv_lookup_prefix"], "needle": ["phasekv_needle"]}.get(task)
    if wanted is None:
        raise ConfigError(f"--task must be auto, lookup or needle, got {task!r}")
    name = next((n for n in wanted if n in scored), None)
    if name is None:
        raise ConfigError(f"{output}: no samples of {' or '.join(wanted)} (found {', '.join(scored)})")
    out = out or Path(f"audit-{output.resolve().name}")
    v = audit_scored(scored[name], out, margin, stride)
    print_verdict(v, console)
    console.print(f"wrote {out}/audit.json, audit.png, {v['task']}/ · exit code {v['exit_code']}")
    raise typer.Exit(v["exit_code"])


def analyze_lm_eval_command(
    output: Path = typer.Argument(..., help="The --output_path of `lm_eval ... --log_samples` over the tasks of "
                                  "`phasekv export-tasks` (any backend: hf, vllm, local-completions, phasekv)."),
    out: Path = typer.Option(None, "--out", help="Output directory: one evaluation and audit per task, OUT/TASK/ "
                             "(default: OUTPUT/phasekv)."),
    stride: int = typer.Option(None, help="Stride S of the period tests (default: every compression ratio of the "
                               "model lm-eval ran, as far as its results say)."),
    margin: float = MARGIN,
) -> None:
    """Phase audit of lm-eval's per-sample log of phasekv's tasks (`phasekv export-tasks`).

    Per task the residue profile with intervals, the gap, the periodicity test and detected period as
    `phasekv eval` prints them, and the verdict and figure of `phasekv audit` (OUT/TASK/audit.json, audit.png, and the evaluation beside them)."""
    from phasekv.eval.harness import read_samples
    from phasekv.eval.report import print_summary
    from phasekv.eval.stats import FLAT_MARGIN
    from phasekv.mitigate.audit import audit_scored, print_verdict

    out = out or output / "phasekv"
    for s in read_samples(output, stride):
        v = audit_scored(s, out / s.name, FLAT_MARGIN if margin is None else margin, stride)
        console.rule(f"{s.name} · {s.samples.name}")
        print_summary(json.loads((Path(v["evaluation"]) / "summary.json").read_text()), console)
        print_verdict(v, console)
    console.print(f"wrote {out}/: per task audit.json, audit.png and its evaluation")


def repair_command(
    directory: Path = typer.Argument(..., help="A directory laid out as a study: eval/lookup-prefix/<alias>/ and "
                                               "eval/lookup-in-sequence/<alias>/ (phasekv eval lookup --out ...)."),
    unrepaired: str = typer.Option("W8/S4 · 1 KV", help="The compressed model the designs repair (cost baseline)."),
    reference: str = typer.Option(None, help="Full-attention model of the accuracy goals (default: the "
                                             "full-attention evaluation with the fewest KV heads)."),
    context: int = typer.Option(32768, help="Context length at which cache bytes are counted."),
    bench_reps: int = typer.Option(5, help="Interleaved repetitions of the cost micro-benchmark."),
    bench_batch: int = typer.Option(64, help="Sequences per timed training step (the demo's recipe: 64)."),
    bench_seq_len: int = typer.Option(96, help="Tokens per sequence of a timed training step (the recipe: 96)."),
    decode_context: int = typer.Option(512, help="Prefill length before the timed decode steps."),
    record: Path = typer.Option(None, help="Also write the candidate designs' seed distributions, keyed by "
                                           "architecture and training recipe, to this JSON file (what the demo's "
                                           "report cites: phasekv/demo/repair_seeds.json); the designs an existing "
                                           "file holds that this run did not measure are kept, judged again by "
                                           "this run's goals."),
    margin: float = MARGIN,
    max_cache: float = typer.Option(None, "--max-cache", help="Cache goal: at most this fraction of the reference "
                                                              "full-attention model's bytes (default 1/4)."),
) -> None:
    """Check every evaluated design against the repair's goals: cache <= 1/4 of the reference's (the smallest
    full-attention model that meets the accuracy goals, the model the design replaces; the ratio to full attention
    with the same KV heads is printed beside it), flat under both paddings by equivalence (the gap's 95% upper
    bound below --margin; the periodicity test is reported, not a goal), mean within 5 points of the reference's,
    train and decode steps <= 1.5x the unrepaired model's. A design (a name without its seed) is judged by its
    seeds: repaired only when it was trained at >= 8 seeds and every one of them meets every goal; the fraction
    that do is printed with its exact 95% interval, and the worst seed is named. Writes DIR/repair/goals.json,
    frontier.png, cache.png and the two comparisons; `phasekv report DIR` shows them.

    Example: phasekv repair runs/repair-study/ --unrepaired "W8/S4 · 1 KV"
    """
    import json

    from phasekv.errors import ConfigError, DataError
    from phasekv.io import write_json
    from phasekv.mitigate.compare import Bench
    from phasekv.mitigate.repair import Goals, run_repair, seed_record
    from phasekv.provenance import git_revision

    goals = Goals(**{k: v for k, v in (("margin", margin), ("max_cache", max_cache)) if v is not None})
    if goals.margin <= 0 or goals.max_cache <= 0:
        raise ConfigError(f"--margin {goals.margin:g} and --max-cache {goals.max_cache:g} must be > 0")
    previous = None
    if record is not None and record.is_file():
        try:
            previous = json.loads(record.read_text())
        except json.JSONDecodeError as e:
            raise DataError(f"--record {record}: not JSON ({e})") from e
    bench = Bench(batch=bench_batch, seq_len=bench_seq_len, reps=bench_reps, decode_context=decode_context)
    r = run_repair(directory, unrepaired, reference=reference, context=context, bench=bench,
                   goals=goals, previous=previous)
    if record is not None:
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        write_json(record, seed_record(r, f"phasekv repair {directory}, git {git_revision() or '?'}, {when}").to_dict())
        console.print(f"wrote {record}")
    wide = Console(width=max(console.width, 150))
    wide.print(goals_table(r))
    wide.print(seeds_table(r))
    wide.print(r.verdict)
    console.print(f"wrote {directory}/repair/goals.json, frontier.png, prefix/, in-sequence/")


def goals_table(r: RepairResult):
    from rich.table import Table

    t = Table(title=f"repair goals · reference {r.reference} · unrepaired {r.unrepaired} · {r.rule}")
    for c in ("model", "cache vs ref.", "same KV", "train", "decode", "prefix gap [95%]", "p", "in-seq gap [95%]", "p",
              "misses"):
        t.add_column(c, justify="left" if c in ("model", "misses") else "right", overflow="fold")

    def f(v, d=2):
        return "-" if v is None else f"{v:.{d}f}"

    def gap(m, p):
        n = m.paddings.get(p)
        return ("-", "-") if n is None else (f"{n.gap:.1f} [{n.gap_ci[0]:.1f}, {n.gap_ci[1]:.1f}]", f(n.periodicity_p, 4))
    for m in r.models:
        t.add_row(m.label, f(m.cache_ref, 4), f(m.cache_rel, 4), f(m.train_rel), f(m.decode_rel), *gap(m, "prefix"),
                  *gap(m, "in-sequence"), "every goal met" if m.meets else "; ".join(m.misses))
    return t


def seeds_table(r: RepairResult):
    """Each candidate design's seed distribution: seeds meeting every goal, the exact interval, the worst seed."""
    from rich.table import Table

    from phasekv.mitigate.repair_text import rule_text, worst_text

    t = Table(title=f"seeds · {rule_text(r.goals.seeds)} (kept: measured by an earlier run of the record)")
    for c in ("design", "cache vs ref.", "same KV", "meeting", "95% exact", "failing seeds", "worst seed"):
        t.add_column(c, justify="left" if c in ("design", "worst seed") else "right", overflow="fold")
    for d in [*(d for d in r.designs if d.role == "design"), *(r.kept or [])]:
        lo, hi = d.rate_ci
        t.add_row(d.design + (" (kept)" if d.source is not None else ""), f"{d.cache_ref:.4f}", f"{d.cache_rel:.4f}",
                  f"{len(d.meeting_seeds)}/{len(d.seeds)}", f"{100 * lo:.0f}-{100 * hi:.0f}%",
                  ", ".join(map(str, d.failing_seeds)) or "none", "-" if d.worst is None else worst_text(d.worst))
    return t


def register(app: typer.Typer) -> None:
    from phasekv.mitigate.posttrain_cli import posttrain_command

    app.command("compare")(compare_command)
    app.command("repair")(repair_command)
    app.command("posttrain")(posttrain_command)
    app.command("audit")(audit_command)


def register_analyze(analyze: typer.Typer) -> None:
    """`phasekv analyze lm-eval`: on the analyses' sub-app, where it reads as an analysis (it gives a verdict, so
    it lives in this layer)."""
    if not any(c.name == "lm-eval" for c in analyze.registered_commands):  # the sub-app outlives a re-mount
        analyze.command("lm-eval")(analyze_lm_eval_command)
