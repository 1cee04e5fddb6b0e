"""`phasekv eval lookup|needle|flip`: phase-aware evaluation from the command line."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from phasekv.errors import ConfigError
from phasekv.eval.report import print_summary

# the commands import their work (torch, models, prompts) when they run: `phasekv --help` stays fast

app = typer.Typer(help="Phase-aware evaluation: accuracy per residue group with intervals, gap and period.",
                  no_args_is_help=True)
console = Console()

MODEL_HELP = "A phasekv run directory (latest checkpoint), a PhaseLM.save directory or a Hugging Face causal LM directory."
PADDING_HELP = "prefix: all records shift together; in-sequence: random gaps between records (distractor phases vary)."
PER_GROUP_HELP = "Prompts per residue group N; exact mean/variance matching needs a multiple of M^2 (else rounded up)."


def model_from_flags(model: Path | None, server: str | None, served_model: str | None, concurrency: int,
                     device: str, trust_remote_code: bool, tokenizer: Path | None, press: str | None = None):
    """The EvalModel of --model (`phasekv.eval.models.load`), or of the model served at --server
    (`phasekv.eval.engine.connect`): exactly one of the two; under --press (`phasekv.eval.press`), its spec
    parsed before the model loads."""
    if press is not None:
        from phasekv.eval.press import parse_press, with_press

        spec = parse_press(press)
        return with_press(model_from_flags(model, server, served_model, concurrency, device, trust_remote_code,
                                           tokenizer), spec)
    if (model is None) == (server is None):
        raise ConfigError("give --model DIR, or --server URL with --served-model NAME (one of the two)")
    if server is not None:
        from phasekv.eval.engine import connect

        return connect(server, served_model, tokenizer=tokenizer, trust_remote_code=trust_remote_code,
                       concurrency=concurrency)
    from phasekv.eval.models import load

    return load(model, device=device, trust_remote_code=trust_remote_code, tokenizer=tokenizer)


COMMON = {
    "model": typer.Option(None, "--model", help=MODEL_HELP + " Or --server."),
    "out": typer.Option(..., "--out", help="Output directory (results.parquet, summary.json, accuracy.png)."),
    "seed": typer.Option(0, help="Seed of mappings, positions and filler."),
    "stride": typer.Option(None, help="Stride S for the period tests (default: the model's)."),
    "device": typer.Option("auto", help="cpu, cuda, cuda:N or auto."),
    "tokenizer": typer.Option(None, help="Tokenizer file/dir (default: the model's)."),
    "trust_remote_code": typer.Option(False, "--trust-remote-code", help="Allow a HF model's own code."),
    "fresh": typer.Option(False, "--fresh", help="Ignore partial results of an interrupted run."),
    "words": typer.Option(None, help="Prompt words: lists (the shipped animal, name and filler lists), vocab (the "
                          "tokenizer's own single-token words) or auto (the lists when enough of their words are "
                          "single tokens, else the vocabulary). Default: as a recall run's data, else auto."),
}
PRESS = typer.Option(None, "--press", help="Evaluate under a kvpress KV-cache press (a Hugging Face model; kvpress's "
                     "own environment, make kvpress-venv): each prompt's context compressed at prefill, its "
                     "question after it uncompressed. E.g. snapkv:0.5, streaming:0.5, knorm:0.5, keydiff:0.5, "
                     "chunk(knorm,8):0.75, chunkkv(snapkv,8):0.5 (PRESS:RATIO, the share of context KV pairs "
                     "dropped); the stride defaults to its chunk length.")
ENGINE = {  # a model served by an inference engine instead of --model (phasekv.eval.engine)
    "server": typer.Option(None, "--server", help="Evaluate the model an inference engine serves at this address "
                           "(vLLM's OpenAI-compatible server, e.g. http://127.0.0.1:8000) instead of --model."),
    "served_model": typer.Option(None, "--served-model", help="With --server: the served model's name; its "
                                 "tokenizer is --tokenizer or the directory the server loaded."),
    "concurrency": typer.Option(8, "--concurrency", help="With --server: requests in flight (--batch-size prompts "
                                "each)."),
}


@app.command()
def lookup(
    model: Path = COMMON["model"],
    out: Path = COMMON["out"],
    padding: str = typer.Option("prefix", help=PADDING_HELP),
    per_group: int = typer.Option(576, "--per-group", help=PER_GROUP_HELP),
    keep_n: bool = typer.Option(False, "--keep-n", help="Keep a non-multiple N: sample an exactly matched design "
                                "distribution and report the achieved spread instead of rounding up."),
    modulus: int = typer.Option(24, help="Residue groups M: target key position mod M."),
    records: int = typer.Option(None, help="Records (animal key, name) per prompt. Default, with --demos and "
                                "--filler: the study's 64, 8, 48, or for a phasekv run trained on shorter "
                                "sequences the longest layout that fits them (96 tokens: 16, 4, 48)."),
    demos: int = typer.Option(None, help="Demonstrations before the target key (default: see --records)."),
    filler: int = typer.Option(None, help="Filler tokens per prompt, fixed so the query position is fixed "
                               "(default: see --records)."),
    mappings: int = typer.Option(32, help="Key-name mappings (bootstrap unit), each used at every residue."),
    marker: str = typer.Option(None, help="Token between records and demonstrations (default none, as in the study)."),
    n_keys: int = typer.Option(None, "--n-keys", help="Use only the first N animal keys (0 = all; default: what a "
                               "phasekv recall run was trained on, else all)."),
    n_values: int = typer.Option(None, "--n-values", help="Use only the first N names (0 = all; default as --n-keys)."),
    words: str = COMMON["words"], seed: int = COMMON["seed"], stride: int = COMMON["stride"], device: str = COMMON["device"],
    tokenizer: Path = COMMON["tokenizer"], trust_remote_code: bool = COMMON["trust_remote_code"],
    fresh: bool = COMMON["fresh"], server: str = ENGINE["server"], served_model: str = ENGINE["served_model"],
    concurrency: int = ENGINE["concurrency"],
    interval: str = typer.Option("bootstrap", help="Per-group intervals: bootstrap (over mappings) or wilson."),
    batch_size: int = typer.Option(32, "--batch-size", help="Prompts per forward pass."),
    ensemble: int = typer.Option(1, "--ensemble", help="Phase ensembling: average the answer log-probabilities "
                                 "over K shifts spread over 0..S-1 (K forward passes per prompt; 1 = plain)."),
    press: str = PRESS,
) -> None:
    """Animal-to-name lookup: R records, D demonstrations, the target key; top-1 accuracy per residue."""
    from phasekv.eval.ensemble import phase_ensemble
    from phasekv.eval.prompts import lookup_config

    if ensemble != 1 and (server is not None or press is not None):
        raise ConfigError("--ensemble needs the model in process (--model) without --press")
    em = model_from_flags(model, server, served_model, concurrency, device, trust_remote_code, tokenizer, press)
    cfg = lookup_config(em.info, records=records, demos=demos, padding=padding, filler=filler,
                        modulus=modulus, per_group=per_group, keep_n=keep_n, mappings=mappings, seed=seed,
                        marker=marker, n_keys=n_keys, n_values=n_values, words=words)
    _check_stride(stride, modulus)
    if ensemble != 1:
        em = phase_ensemble(em, ensemble, stride)
    _retrieve("lookup", em, cfg, out, batch_size, interval, stride, fresh)


@app.command()
def needle(
    model: Path = COMMON["model"],
    out: Path = COMMON["out"],
    context: int = typer.Option(131072, help="Context tokens per prompt (special tokens not counted)."),
    records: int = typer.Option(None, help="Four-token key-value records in the context (default: the study's "
                                "density, 16,000 per 131,072 tokens of --context: 125 at 1,024)."),
    padding: str = typer.Option("in-sequence", help=PADDING_HELP),
    per_group: int = typer.Option(256, "--per-group", help=PER_GROUP_HELP),
    keep_n: bool = typer.Option(False, "--keep-n", help="Keep a non-multiple N (sampled design, spread reported)."),
    modulus: int = typer.Option(8, help="Residue groups M: target key position mod M."),
    demos: int = typer.Option(2, help="Demonstration records before the query."),
    separator: str = typer.Option("auto", help="Token ending each record ('auto': first single token of ; , . | and)."),
    mappings: int = typer.Option(16, help="Key-value mappings (bootstrap unit)."),
    words: str = COMMON["words"],
    interval: str = typer.Option("wilson", help="Per-group intervals: wilson or bootstrap (over mappings)."),
    batch_size: int = typer.Option(1, "--batch-size", help="Prompts per forward pass."),
    seed: int = COMMON["seed"], stride: int = COMMON["stride"], device: str = COMMON["device"],
    tokenizer: Path = COMMON["tokenizer"], trust_remote_code: bool = COMMON["trust_remote_code"],
    fresh: bool = COMMON["fresh"], server: str = ENGINE["server"], served_model: str = ENGINE["served_model"],
    concurrency: int = ENGINE["concurrency"], press: str = PRESS,
) -> None:
    """Position-matched needle test: one target key near the middle of a long context of records."""
    from phasekv.eval.prompts import needle_config

    cfg = needle_config(context=context, records=records, padding=padding, per_group=per_group, keep_n=keep_n,
                        modulus=modulus, demos=demos, mappings=mappings, seed=seed, separator=separator, words=words)
    if records is None:
        console.print(f"needle: {cfg.records} records in {context} tokens (the study's density, 16,000 per 131,072; "
                      "--records to choose)")
    em = model_from_flags(model, server, served_model, concurrency, device, trust_remote_code, tokenizer, press)
    _check_stride(stride, modulus)
    _retrieve("needle", em, cfg, out, batch_size, interval, stride, fresh)


@app.command()
def presses(
    model: Path = typer.Option(..., "--model", help="A Hugging Face causal LM directory (e.g. `phasekv export` of a "
                               "full-attention run)."),
    out: Path = typer.Option(..., "--out", help="Directory: OUT/presses/presses.json, presses.md and one "
                             "evaluation per padding and press (`phasekv report OUT` shows the table)."),
    press: list[str] = typer.Option(None, "--press", help="A press without its ratio, repeatable (default: snapkv, "
                                    "streaming, knorm, chunkkv(snapkv,4), chunkkv(snapkv,8), chunk(knorm,8))."),
    ratios: str = typer.Option("0.5,0.75", help="Comma-separated compression ratios, each press at each."),
    per_group: int = typer.Option(576, "--per-group", help=PER_GROUP_HELP),
    batch_size: int = typer.Option(32, "--batch-size", help="Prompts per forward pass (a press that reads its "
                                   "batch-mates runs one prompt per pass)."),
    device: str = COMMON["device"], trust_remote_code: bool = COMMON["trust_remote_code"],
) -> None:
    """The press table in one go (kvpress's environment): the lookup under both paddings, uncompressed and under
    every press at every ratio; mean, worst, best and gap with intervals, detected period, power at periods 4
    and 8."""
    from phasekv.eval.presses import TABLE, check_presses, markdown, run_presses

    specs = check_presses(press) if press else TABLE
    try:
        rs = tuple(float(r) for r in ratios.split(",") if r.strip())
    except ValueError:
        raise ConfigError(f"--ratios {ratios!r}: expected numbers like 0.5,0.75") from None
    em = model_from_flags(model, None, None, 1, device, trust_remote_code, None)
    table = run_presses(em, out, specs, rs, per_group=per_group, batch_size=batch_size)

    console.print(markdown(table))
    console.print(f"wrote {out}/presses/presses.json, presses.md and the evaluations beside them")


def _retrieve(task: str, em, cfg, out: Path, batch_size: int, interval: str, stride: int | None,
              fresh: bool) -> None:
    """Run a lookup/needle evaluation and print its summary (rank 0 of a torchrun job only)."""
    from phasekv.eval.run import run_retrieval

    summary = run_retrieval(task, em, cfg, out, batch_size=batch_size, interval=interval, stride=stride,
                            resume=not fresh)
    if summary is None:  # non-zero torchrun rank
        return
    print_summary(summary, console)
    console.print(f"wrote {out}/results.parquet, summary.json, accuracy.png")


@app.command()
def flip(
    model: Path = COMMON["model"],
    out: Path = typer.Option(..., "--out", help="Output directory (results.parquet, summary.json, flip.png)."),
    prompt: str = typer.Option(None, help="Prompt text (default: a short lookup prompt from the shipped words)."),
    candidates: str = typer.Option(None, help="Comma-separated continuations incl. leading spaces, e.g. ' 8, 32'."),
    families: str = typer.Option("words,repeat:the,repeat:=,repeat:,", help="Filler families: words, repeat:X."),
    lengths: int = typer.Option(16, help="Filler lengths per family (one token more each)."),
    start: int = typer.Option(0, help="First filler length."),
    records: int = typer.Option(8, help="Records of the default prompt."),
    seed: int = typer.Option(0, help="Seed of the default prompt and the word filler."),
    stride: int = typer.Option(None, help="Stride S of the pattern (default: the model's)."),
    device: str = COMMON["device"], tokenizer: Path = COMMON["tokenizer"],
    trust_remote_code: bool = COMMON["trust_remote_code"],
    server: str = ENGINE["server"], served_model: str = ENGINE["served_model"],
    concurrency: int = ENGINE["concurrency"],
    press: str = typer.Option(None, "--press", help="As for lookup; the question left uncompressed is the prompt's "
                              "last token."),
) -> None:
    """Filler sweep: P(candidate) as filler grows one token at a time; counts rankings periodic in L mod S."""
    from phasekv.eval.flip import FlipConfig, run_flip

    cands = None if candidates is None else [c for c in candidates.split(",") if c.strip()]
    fams = [f for f in _split_families(families) if f]
    cfg = FlipConfig(prompt=prompt, candidates=cands, families=fams, lengths=lengths, start=start, records=records,
                     seed=seed)
    em = model_from_flags(model, server, served_model, concurrency, device, trust_remote_code, tokenizer, press)
    print_flip(run_flip(em, cfg, out, stride=stride))
    console.print(f"wrote {out}/results.parquet, summary.json, flip.png")


def print_flip(s: dict) -> None:
    console.print(f"[bold]{s['model']}[/] · candidates {s['candidates']} · S={s['stride']}")
    for fam, f in s["families"].items():
        line = " ".join(str(s["candidates"].index(w)) for w in f["winners"])
        extra = f" · follow {f['follow']}/{len(f['winners'])}" if "follow" in f else ""
        console.print(f"  {fam:>14}: winners by length {line}{extra}")
    for fam, why in s["skipped_families"].items():
        console.print(f"  [yellow]skipped {fam}[/]: {why}")
    if s["follow_pattern"] is not None:
        console.print(f"{s['follow_pattern']} of {s['rankings']} rankings follow a pattern in L mod {s['stride']}"
                      f"{' (the winner switches with the phase)' if s['switching'] else ' (one winner throughout)'}")


def _split_families(spec: str) -> list[str]:
    """Split on commas, keeping 'repeat:,' (a comma as the repeated unit) intact."""
    out, cur = [], ""
    for ch in spec:
        if ch == "," and cur and not cur.endswith(":"):
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


def _check_stride(stride: int | None, modulus: int) -> None:
    if stride is not None and (stride < 1 or modulus % stride):
        raise ConfigError(f"--stride {stride} must divide --modulus {modulus}")


def export_command(
    model: Path = typer.Option(..., "--model", help="A full-attention phasekv run, checkpoint or PhaseLM.save "
                               "directory."),
    out: Path = typer.Option(..., "--out", help="Output directory (config.json, model.safetensors, tokenizer)."),
) -> None:
    """Export a full-attention model as a Hugging Face Qwen3 directory (transformers, vLLM, SGLang load it) that
    carries the run's evaluation metadata, so `phasekv eval`/`audit` build the run's prompts for it."""
    from phasekv.eval.export import export

    export(model, out)
    console.print(f"wrote {out}/ (config.json with the evaluation metadata, model.safetensors, tokenizer files)")


def export_tasks_command(
    out: Path = typer.Argument(..., help="Directory for the tasks (TASK.yaml and TASK.jsonl each; files of the same "
                               "names are replaced): `lm_eval --include_path DIR --tasks ...`."),
    model: Path = typer.Option(..., "--model", help=MODEL_HELP + " Its tokenizer and training data decide "
                               "the prompts."),
    tasks: str = typer.Option("phasekv_lookup_prefix,phasekv_lookup_inseq,phasekv_needle", "--tasks",
                              help="Comma-separated: phasekv_lookup_prefix, phasekv_lookup_inseq, phasekv_needle."),
    context: int = typer.Option(None, help="Needle context tokens (default: what fits the model, as `phasekv "
                                "audit` chooses)."),
    per_group: int = typer.Option(None, "--per-group", help="Prompts per residue group (default: lookup 576, "
                                  "needle 64)."),
    modulus: int = typer.Option(None, help="Residue groups M (default: lookup 24, needle 8)."),
    records: int = typer.Option(None, help="Records per prompt (default: as `phasekv eval` chooses for the model)."),
    demos: int = typer.Option(None, help="Demonstrations before the target key."),
    filler: int = typer.Option(None, help="Lookup filler tokens per prompt."),
    mappings: int = typer.Option(None, help="Key-name mappings (bootstrap unit; default: lookup 32, needle 16)."),
    seed: int = COMMON["seed"], tokenizer: Path = COMMON["tokenizer"],
    trust_remote_code: bool = COMMON["trust_remote_code"],
) -> None:
    """Write phasekv's lookup and needle tests as lm-evaluation-harness tasks.

    The prompts are token for token those `phasekv eval` builds for --model's tokenizer and training data (give
    the directory lm-eval will load, or a run with the same tokenizer); scored by loglikelihood: acc is
    full-vocabulary top-1 of the answer token. Example: phasekv export-tasks tasks/ --model runs/w8s8, then lm_eval --include_path tasks/ --tasks
    phasekv_lookup_prefix --log_samples --output_path out/ and phasekv analyze lm-eval out/."""
    from phasekv.eval.harness import export_tasks, task
    from phasekv.eval.models import load

    names = [task(t.strip()).name for t in tasks.split(",") if t.strip()]  # unknown names fail before the model loads
    em = load(model, device="cpu", trust_remote_code=trust_remote_code, tokenizer=tokenizer)
    metas = export_tasks(em, out, names, context=context, per_group=per_group, modulus=modulus, records=records,
                         demos=demos, filler=filler, mappings=mappings, seed=seed)
    for name, m in metas.items():
        p = m["prompts"]
        console.print(f"{name}: {p['n_prompts']:,} prompts of {p['length']:,} tokens, residues mod "
                      f"{p['prompt_config']['modulus']}, {p['per_group']} per group")
    console.print(f"wrote {out}/: {', '.join(f'{n}.yaml, {n}.jsonl' for n in metas)}")


def lm_eval_command(ctx: typer.Context) -> None:
    """lm-evaluation-harness's command line with phasekv's model type: `--model phasekv`.

    Every option of `lm_eval`, with phasekv's model type registered: `phasekv lm-eval --model phasekv --model_args run=DIR --include_path TASKS --tasks ...`.
    lm-eval 0.4.13 finds no third-party model types by itself; this is `lm_eval` with them (the extra lm-eval)."""
    import sys

    try:
        from lm_eval.__main__ import cli_evaluate

        import phasekv.eval.lm_model  # noqa: F401  registers --model phasekv
    except ImportError as exc:
        raise ConfigError(f"lm-evaluation-harness is not installed ({exc}); pip install 'phasekv[lm-eval]'") from None
    sys.argv = ["lm_eval", *ctx.args]
    cli_evaluate()


def register(app: typer.Typer) -> None:
    app.command("export")(export_command)
    app.command("export-tasks")(export_tasks_command)
    app.command("lm-eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                             "help_option_names": []}, add_help_option=False)(lm_eval_command)
