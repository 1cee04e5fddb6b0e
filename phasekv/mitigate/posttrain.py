"""`phasekv posttrain MODEL`: repair a model that is already trained, by continuing its training with a
phase-balanced recipe until it is flat (or a step budget runs out), and post-training in miniature (C11).

The continuation is one `phasekv train --init-from MODEL` run (`--hf-model` for a Hugging Face model) over the
whole budget, stopped every `every` steps at a checkpoint (`train(..., until=step)`) to evaluate it; the run
resumes from there exactly, so a command that is interrupted continues where it stopped. The recipe (`Recipe`):
the base's own data with half the records adjacent (`gap_prob` 0.5: the lookup's dense layout among the spaced-out
records the base saw; what made W8/S4 · 1 KV flat from scratch), all records from the start, AdamW at the base's own
peak rate held constant after a 20-step warmup: constant, so the model a run stopped at step s is the model of any
longer budget at s (chosen at seeds 100-101 of the demo's W8/S4 · 1 KV: flat at 150 and 250 steps at 3e-3, the
base's peak, against 400 at 1e-3; sweeps/posttrain.sh).

Each check audits the model (`phasekv.mitigate.audit.run_audit`) on every layout of its task: the lookup under
prefix and in-sequence padding and a held-out layout (half the records, the freed tokens as filler), or the
needle. The model is flat when every layout passes: it retrieves and the gap's 95% upper bound is below the
margin δ (`phasekv.eval.stats.flatness`), and, given a full-attention reference, its mean is within the repair's
5 points of the reference's (`phasekv.mitigate.repair.Goals`). Between the first and the last check a layout
that fails ends the check (the later ones are not run): the step 0 and the last check run every layout.

OUT/model/        the continuation: a phasekv run whose latest checkpoint is the fine-tuned model (`--model OUT/model`)
OUT/checks/step_N/LAYOUT/  the audit at step N (audit.json, audit.png, the evaluation); step 0 is the base
OUT/reference/LAYOUT/      the full-attention reference's audits (with --reference)
OUT/curve.png     gap (95% interval) and mean against fine-tuning steps, per layout
OUT/posttrain.json  the settings, every check's numbers, why it stopped, the steps to flat and their fraction
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from phasekv.data.sources import DataConfig
from phasekv.errors import ConfigError, DataError
from phasekv.eval.figure import PALETTE, Figure, Guide, Panel, Trace, to_png
from phasekv.eval.models import config_json, load
from phasekv.eval.protocols import LOOKUP, for_model
from phasekv.eval.run import json_default
from phasekv.eval.stats import FLAT_MARGIN
from phasekv.io import write_json
from phasekv.mitigate.audit import PASS, run_audit
from phasekv.mitigate.repair import Goals
from phasekv.train import TrainConfig, train
from phasekv.train.checkpoint import CKPT_DIR
from phasekv.train.run import resolve_model_dir

SCHEMA = "phasekv.posttrain/1"
RECORD, MODEL, CHECKS, REFERENCE, CURVE = "posttrain.json", "model", "checks", "reference", "curve.png"
MINIATURE = 0.25  # post-training in miniature (C11): the recipe for this fraction of the base's own steps,
MINIATURE_LR = 1 / 3  # at this fraction of the base's peak rate (post-training's smaller rate; the probe's 1e-3)
TASKS = ("auto", "lookup", "needle")


@dataclass(frozen=True)
class Recipe:
    """How the base is continued: its own data, sequence length and batch, with these changes."""

    lr: float | None = None  # AdamW rate, constant after the warmup (None: the base's peak rate)
    warmup: int = 20  # linear warmup steps
    batch_size: int | None = None  # sequences per step (None: the base's)
    recall: dict = field(default_factory=lambda: {"gap_prob": 0.5, "curriculum": 0})  # recall data changes: half
    #   the records adjacent, every record count from the first step (the base has learned to bind)
    needle: dict = field(default_factory=lambda: {"curriculum": 0})  # needle data changes: every record count from
    #   the first step (its filler is already split at random between the records)


@dataclass(frozen=True)
class Settings:
    """What a post-training run is; a resumed run must be given the same."""

    steps: int  # step budget of the continuation
    every: int = 50  # evaluate every this many steps
    stop: bool = True  # stop once flat (False: the whole budget, as post-training in miniature)
    task: str = "auto"  # auto (the audit's choice for the model) | lookup | needle
    margin: float = FLAT_MARGIN  # δ: flat when every layout's gap has its 95% upper bound below it
    per_group: int | None = None  # prompts per residue group (None: the protocol's, lookup 576, needle 64)
    context: int | None = None  # needle context tokens (None: what fits)
    seed: int | None = None  # data order of the continuation (None: the base's seed)
    reference: str | None = None  # a full-attention model: the mean goal (within 5 points of its mean)
    recipe: Recipe = field(default_factory=Recipe)

    def __post_init__(self):
        if self.steps < 1:
            raise ConfigError(f"--steps {self.steps}: a budget of at least one step")
        if self.every < 1:
            raise ConfigError(f"--every {self.every}: evaluate every one step or more")
        if self.task not in TASKS:
            raise ConfigError(f"--task must be {', '.join(TASKS)}, got {self.task!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def schedule(self) -> list[int]:
        """The steps checked after step 0: every `every` steps, and the budget."""
        return [*range(self.every, self.steps, self.every), self.steps]


@dataclass(frozen=True)
class Layout:
    """One evaluation of a check: a name and its prompt options (`run_audit`'s)."""

    name: str
    options: dict


def layouts(em, task: str) -> list[Layout]:
    """The evaluations of a check: the needle, or the lookup under both paddings and a held-out layout (half the
    records, the freed tokens as filler; the demo's 16 records and 48 filler give 8 and 64)."""
    if (for_model(em).name if task == "auto" else task) == "needle":
        return [Layout("needle", {"task": "needle"})]
    own = LOOKUP.fit(em)
    records = max(own.records // 2, own.demos + 1)
    held = {"padding": "in-sequence", "records": records, "demos": own.demos,
            "filler": own.filler + (own.records - records) * own.record_len}
    return [Layout(p, {"task": "lookup", "padding": p}) for p in ("prefix", "in-sequence")] + [
        Layout("held-out", {"task": "lookup", **held})]


KEPT = ("model", "mean", "mean_ci", "gap", "gap_ci", "detected_period", "period_p_value", "stride", "chance", "retrieves",
        "verdict", "exit_code", "phase_profile")


def numbers(v: dict) -> dict:
    """What a check keeps of an audit: mean and gap with intervals, period, verdict, and each compression
    ratio's test (a DeepSeek-V4 model's CSA and HCA)."""
    ratios = [{k: t[k] for k in ("ratio", "layer_types", "phase_gap", "weakest_phase", "period_p_value")}
              for t in v["ratios"]]
    return {**{k: v.get(k) for k in KEPT}, "ratios": ratios}


def check(model: Path, out: Path, s: Settings, until: Callable[[dict], bool], device: str = "cpu",
          progress: bool = False) -> dict:
    """Audit `model` on every layout into OUT/LAYOUT/, in order, ending after the first audit `until` says so
    of; {layout: its numbers}."""
    em = load(model, device)
    found = {}
    for lay in layouts(em, s.task):
        v = run_audit(em, out / lay.name, margin=s.margin, progress=progress,
                      **{"per_group": s.per_group, "context": s.context} | lay.options)
        found[lay.name] = numbers(v)
        if until(v):
            break
    return found


def flat(found: dict, names: list[str], reference: dict | None, goals: Goals = Goals()) -> bool:
    """Every layout audited and passing (retrieves, gap's upper bound below δ) and, given the reference's numbers,
    its mean within the repair's drop of the reference's."""
    return all(n in found and found[n]["exit_code"] == PASS and
               (reference is None or found[n]["mean"] >= reference[n]["mean"] - goals.max_mean_drop) for n in names)


def base_training(path: Path) -> dict:
    """The config.json of the run the base was trained in (its run directory, or the run of its checkpoint); {}
    for a model directory that has none."""
    p = Path(path)
    for d in (p, p.parent.parent if p.parent.name == CKPT_DIR else None):
        if d is not None and isinstance(config_json(d).get("train"), dict):
            return config_json(d)
    return {}


def recipe_data(data: DataConfig, r: Recipe) -> DataConfig:
    """The base's data with the recipe's changes (recall ones where it trains on recall, needle ones on the needle)."""
    d = data.to_dict()
    if data.is_recall or data.recall_mix:
        d["recall"] = {**d["recall"], **r.recall}
    if data.is_needle:
        d["needle"] = {**d["needle"], **r.needle}
    return DataConfig(**d)


def continuation(base: Path, run_dir: Path, s: Settings, progress: bool = False) -> TrainConfig:
    """The `phasekv train` run that continues `base` with the recipe: its data, length and batch (micro-batches
    and trim too), with the recipe's changes; `--init-from` a phasekv model, `--hf-model` a Hugging Face one."""
    weights, kind = resolve_model_dir(base)
    trained = base_training(base)
    t, r = trained.get("train") or {}, s.recipe
    data = DataConfig(**t["data"]) if t.get("data") else DataConfig()
    if kind == "hf" and not t and data.tokenizer is None:  # a model not trained here: its own tokenizer
        data = dataclasses.replace(data, tokenizer=str(weights))
    batch, lr = r.batch_size or t.get("batch_size", TrainConfig.batch_size), r.lr or t.get("lr", TrainConfig.lr)
    accum = t.get("grad_accum", 1) if batch % t.get("grad_accum", 1) == 0 else 1
    source = {"hf_model": str(base)} if kind == "hf" else {"init_from": str(base)}
    return TrainConfig(**source, data=recipe_data(data, r), steps=s.steps, seq_len=t.get("seq_len", TrainConfig.seq_len),
                       batch_size=batch, grad_accum=accum, trim=t.get("trim", False), lr=lr, min_lr=lr,
                       warmup=r.warmup, seed=s.seed if s.seed is not None else trained.get("seed"), val_every=0,
                       ckpt_every=s.every, gate_steps="none", out=str(run_dir), progress=progress)


def step_dir(out: Path, step: int) -> Path:
    return Path(out) / CHECKS / f"step_{step:06d}"


def refuse(base: Path, out: Path) -> None:
    """One-line refusals before anything is written: no model at `base`, or `out` inside the base."""
    resolve_model_dir(base)  # CheckpointError: not a phasekv run, PhaseLM.save or Hugging Face directory
    b, o = base.resolve(), out.resolve()
    if o == b or b in o.parents:
        raise ConfigError(f"--out {out} is inside the base {base}: the base is never modified, write elsewhere")


def first_check(base: Path, out: Path, s: Settings, device: str, progress: bool) -> dict:
    """The base's audit (step 0) on every layout, built in a temporary directory and moved to OUT only when the
    base retrieves: a base that does not is refused with nothing written."""
    tmp = Path(tempfile.mkdtemp(prefix=".posttrain-"))
    try:
        found = check(base, tmp, s, lambda v: not v["retrieves"], device=device, progress=progress)
        first = next(iter(found.items()))
        if not first[1]["retrieves"]:
            n = first[1]
            raise DataError(f"{base} does not retrieve ({first[0]}: mean {n['mean']:.1f} [{n['mean_ci'][0]:.1f}, "
                            f"{n['mean_ci'][1]:.1f}], chance {n['chance'] or 0:.1f}%): there is no phase pattern to "
                            "repair; nothing written")
        step_dir(out, 0).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(tmp), step_dir(out, 0))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return found


def start(base: Path, out: Path, s: Settings, device: str, progress: bool) -> dict:
    """OUT's record when it holds this run (it continues), else a new one after the base's check (step 0) and the
    reference's; refused when OUT holds anything else."""
    path = out / RECORD
    if path.is_file():
        rec = json.loads(path.read_text())
        if rec.get("settings") != json.loads(json.dumps(s.to_dict())) or rec.get("base") != str(base):
            raise ConfigError(f"{out} holds the post-training of {rec.get('base')} with other settings: continue it "
                              "with the same ones, or use another --out")
        return rec
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and holds no post-training run: use another --out")
    found = first_check(base, out, s, device, progress)
    reference = None if s.reference is None else check(Path(s.reference), out / REFERENCE, s, lambda v: False,
                                                       device=device, progress=progress)
    base_steps = (base_training(base).get("train") or {}).get("steps") or None
    rec = {"schema": SCHEMA, "base": str(base), "name": next(iter(found.values()))["model"], "base_steps": base_steps,
           "settings": s.to_dict(), "layouts": list(found), "reference": reference, "checks": [], "stopped": None}
    note(rec, 0, found, s)
    return rec


def note(rec: dict, step: int, found: dict, s: Settings) -> None:
    """Add the check at `step` to the record; when it ends the run (flat, or the budget), why, the audit after, the
    steps to flat and their fraction of the base's steps."""
    is_flat = flat(found, rec["layouts"], rec["reference"])
    rec["checks"].append({"step": step, "flat": is_flat, "layouts": found})
    if (is_flat and s.stop) or step == s.steps:
        first = next((c["step"] for c in rec["checks"] if c["flat"]), None)
        rec.update(stopped="flat" if is_flat and s.stop else "budget", steps_to_flat=first, before=str(step_dir(".", 0)),
                   after=str(step_dir(".", step)), model=None if step == 0 else MODEL,
                   fraction=None if first is None or not rec["base_steps"] else first / rec["base_steps"])


def posttrain(base: str | Path, out: str | Path, s: Settings, device: str = "cpu", progress: bool = True,
              say: Callable[[str], None] = print) -> dict:
    """Continue `base` with the recipe until flat or the budget (module doc); resumes a run OUT holds. Returns the
    record (OUT/posttrain.json)."""
    base, out = Path(base), Path(out)
    refuse(base, out)
    rec = start(base, out, s, device, progress)
    if not rec["checks"][1:]:
        say(check_line(rec["checks"][0], rec["layouts"]))
    cfg = continuation(base, out / MODEL, s, progress)
    rec["lr"] = cfg.lr
    while rec["stopped"] is None:
        step = next(n for n in s.schedule() if n > rec["checks"][-1]["step"])
        train(cfg, resume=True, until=step)
        last = (lambda v: False) if step == s.steps else (lambda v: v["exit_code"] != PASS)
        note(rec, step, check(out / MODEL, step_dir(out, step), s, last, device=device, progress=progress), s)
        write_json(out / RECORD, rec, default=json_default)
        say(check_line(rec["checks"][-1], rec["layouts"]))
    write_json(out / RECORD, rec, default=json_default)
    to_png(curve(rec), out / CURVE)
    return rec


def check_line(c: dict, names: list[str]) -> str:
    """'step 150: prefix mean 67.1, gap 80.9 [76.6, 85.3], period 4; in-sequence ...: not flat'."""
    parts = [f"{n} mean {x['mean']:.1f}, gap {x['gap']:.1f} [{x['gap_ci'][0]:.1f}, {x['gap_ci'][1]:.1f}], period "
             f"{x['detected_period']}" for n, x in c["layouts"].items()]
    skipped = [n for n in names if n not in c["layouts"]]
    return (f"step {c['step']}: " + "; ".join(parts) + (f" ({', '.join(skipped)} not run)" if skipped else "")
            + (": flat" if c["flat"] else ": not flat"))


def _series(rec: dict, name: str, key: str, color: str) -> list[Trace]:
    """One layout's `key` (gap or mean) against steps: its 95% band and its line, or its points alone where the
    layout was not audited at every check (a check ends at its first layout that is not flat)."""
    pts = [(c["step"], c["layouts"][name]) for c in rec["checks"] if name in c["layouts"]]
    x, y = [s for s, _ in pts], [n[key] for _, n in pts]
    if len(pts) < len(rec["checks"]):
        return [Trace("points", x, y, name=f"{name} (where audited)", color=color, marker="circle", size=5)]
    return [Trace("band", x, [n[f"{key}_ci"][0] for _, n in pts], [n[f"{key}_ci"][1] for _, n in pts], color=color,
                  alpha=0.18),
            Trace("line", x, y, name=name, color=color, marker="circle", size=3)]


def curve(rec: dict) -> Figure:
    """Left: each layout's gap with its 95% interval against fine-tuning steps, δ dashed; right: the means."""
    names, margin = rec["layouts"], rec["settings"]["margin"]
    gaps = [t for i, n in enumerate(names) for t in _series(rec, n, "gap", PALETTE[i])]
    means = [t for i, n in enumerate(names) for t in _series(rec, n, "mean", PALETTE[i])]
    end = rec["checks"][-1]["step"]
    stop = [Guide(x=rec["steps_to_flat"], dash="dot")] if rec.get("steps_to_flat") else []
    first = rec["steps_to_flat"]
    words = (f"flat at step {first}" + (f" ({first / rec['base_steps']:.2f} of the base's {rec['base_steps']} steps)"
                                         if rec["base_steps"] else "")) if first is not None else f"not flat by step {end}"
    return Figure([Panel(gaps, title=f"gap, best − worst residue (δ = {margin:g} dashed)", xlabel="fine-tuning steps",
                         ylabel="points (95% interval)", ylim=(-2, 102), guides=[Guide(y=margin), *stop], legend=True),
                   Panel(means, title="mean accuracy", xlabel="fine-tuning steps", ylabel="% (95% interval)",
                         ylim=(-2, 102), guides=stop)],
                  title=f"{rec['name']} continued (lr {rec['lr']:g}): {words}", size=(10, 3.4))
