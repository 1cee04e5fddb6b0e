"""`phasekv demo` and `phasekv study`: a plan (`phasekv.demo.plan`) end to end, resumable, with progress, then the
report. The demo runs four models (the last: the repair); the study, the paper's whole grid.

The work is a small graph of tasks (train each model; lookup under both paddings; flip; knockouts; gate
statistics after the knockouts; gate cycling; theory checks; example prompts), built here from the plan and run by
`phasekv.study` (its driver and executors). A task whose outputs exist is skipped, so re-running continues where an
interrupted demo stopped (training resumes from its latest checkpoint, evaluations from their partial results).
Tasks run in `jobs` worker processes with one torch thread each (or, `cluster`, as SLURM jobs); the longest ones
are submitted first.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import time
from pathlib import Path

import torch

from phasekv import __version__
from phasekv.attention.compressor import cyclable
from phasekv.config import ModelConfig
from phasekv.config.names import unseeded
from phasekv.demo import stages
from phasekv.demo.plan import STUDY_PRESET, DemoPlan, family_plan, gathered, plan_for, study_plan
from phasekv.errors import ConfigError, PhaseKVError
from phasekv.eval.protocols import LOOKUP, PROTOCOLS
from phasekv.io import write_json
from phasekv.report.layout import THEORY_CHECKS, Layout, done
from phasekv.study import Lock, Task, console, makespan, run_tasks, slurm
from phasekv.study.slurm import SlurmOptions


def _last_step(run_dir: Path) -> int:
    """Latest logged step of a training run (its metrics.jsonl tail)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 4096))
        lines = f.read().decode(errors="ignore").splitlines()
    for line in reversed(lines):
        try:
            return int(json.loads(line).get("step", 0))
        except (json.JSONDecodeError, ValueError, AttributeError):
            continue
    return 0


def build_tasks(root: Path, plan: DemoPlan, device: str = "cpu") -> list[Task]:
    """The plan's task graph in `root`, every model's training, evaluations and analyses on `device`."""
    lay, p = Layout(root), plan.to_dict()
    cfgs = {ModelConfig.from_name(m, preset=plan.preset).alias: ModelConfig.from_name(m, preset=plan.preset)
            for m in plan.models}
    # priority = list order: every training first (they are the critical path: replaying measured CPU times,
    # trainings-first finishes ~2 min sooner than analysing each model as soon as it is trained), then each
    # model's analyses, which fill a worker while the last model trains; the theory checks fill idle workers
    tasks = []
    for alias, cfg in cfgs.items():
        run, trained = str(lay.run(alias)), [f"train {alias}"]
        source = plan.training_of(cfg.name).get("init_from")  # a model it continues: trained first, re-run with it
        tasks.append(Task(f"train {alias}", stages.train_model, {"plan": p, "arch": cfg.name, "run_dir": run},
                          lambda run=lay.run(alias): (run / "done.json").is_file(),
                          [f"train {ModelConfig.from_name(source, preset=plan.preset).alias}"] if source else [],
                          steps=lambda run=lay.run(alias), n=plan.steps_of(cfg.name): (_last_step(run), n),
                          units=plan.steps_of(cfg.name), parallel=True))
        for proto, padding in ((q, v) for q in PROTOCOLS.values() if q.retrieval for v in q.study):
            out = lay.evaluation(proto.stage(padding)) / alias
            tasks.append(Task(f"{proto.task(padding)} {alias}", stages.retrieval,
                              {"plan": p, "run_dir": run, "out": str(out), "protocol": proto.name, "padding": padding},
                              lambda out=out: done(out), trained))
        ko = lay.analysis("knockout", alias)
        tasks.append(Task(f"knockout {alias}", stages.knockout, {"plan": p, "run_dir": run, "out": str(ko)},
                          lambda ko=ko: done(ko), trained))
        for proto in (q for q in PROTOCOLS.values() if not q.retrieval and q.study):
            out = lay.evaluation(proto.stage(None)) / alias
            tasks.append(Task(f"{proto.task(None)} {alias}", stages.SWEEPS[proto.name],
                              {"plan": p, "run_dir": run, "out": str(out)}, lambda out=out: done(out), trained))
        if cfg.compressed:
            g = lay.analysis("gates", alias)
            tasks.append(Task(f"gates {alias}", stages.gates,
                              {"plan": p, "run_dir": run, "out": str(g), "knockout_dir": str(ko)},
                              lambda g=g: done(g), [*trained, f"knockout {alias}"]))
        if cyclable(cfg):
            c = lay.analysis("cycle", alias)
            tasks.append(Task(f"cycle {alias}", stages.cycle, {"plan": p, "run_dir": run, "out": str(c)},
                              lambda c=c: done(c), trained))
    if plan.kind == "family":
        tasks += family_tasks(lay, plan, cfgs)
    else:
        tasks += posttrain_tasks(lay, plan, cfgs)
    prefix = [t for t in tasks if t.name.startswith(LOOKUP.task("prefix"))]
    tasks.append(Task("compare", stages.compare, {"plan": p, "evals": [t.kwargs["out"] for t in prefix],
                                                  "out": str(lay.compare)},
                      lambda: done(lay.compare), [t.name for t in prefix]))
    if plan.repairs():
        lookups = [t.name for t in tasks if t.name.startswith(LOOKUP.name)]
        tasks.append(Task("repair goals", stages.repair, {"plan": p, "root": str(root)},
                          lambda: (lay.repair / "goals.json").is_file(), lookups))
    tasks.append(Task("theory checks", stages.theory, {"plan": p, "out": str(lay.theory)},
                      lambda: all((lay.theory / c / "summary.json").is_file() for c in THEORY_CHECKS)))
    # trainings first, the longest (most sequences) first: it is the critical path; then in model order
    tasks.sort(key=lambda t: (0, -plan.sequences_of(t.kwargs["arch"])) if t.name.startswith("train ") else (1, 0))
    lookups = [t.name for t in tasks if t.name.startswith(LOOKUP.name)]
    tasks.append(Task("example prompts", stages.examples,
                      {"plan": p, "root": str(root), "aliases": list(cfgs), "tokenizer_run": str(lay.run(next(iter(cfgs))))},
                      lambda: lay.examples.is_file(), lookups))
    for t in (t for t in tasks if t.fn in stages.ON_DEVICE):
        t.kwargs["device"] = device
    return tasks


def family_tasks(lay: Layout, plan: DemoPlan, cfgs: dict[str, ModelConfig]) -> list[Task]:
    """The family stage of every model (`stages.family`), after its training and lookups: a design at its own
    grid periods, a baseline at its own and every design's (the same tests, where no weak spot is expected)."""
    family = {k: v for c in cfgs.values() if c.family for k, v in c.grids.items()}
    tasks = []
    for alias, cfg in cfgs.items():
        out = lay.analysis("family", alias)
        evals = {v: str(lay.lookup(v, alias)) for v in LOOKUP.study}
        tasks.append(Task(f"family {alias}", stages.family,
                          {"plan": plan.to_dict(), "run_dir": str(lay.run(alias)), "out": str(out),
                           "grids": cfg.grids if cfg.family else cfg.grids | family, "evals": evals},
                          lambda out=out: done(out),
                          [f"train {alias}", *(f"{LOOKUP.task(v)} {alias}" for v in LOOKUP.study)]))
    return tasks


def posttrain_tasks(lay: Layout, plan: DemoPlan, cfgs: dict[str, ModelConfig]) -> list[Task]:
    """Post-training in miniature (claim C11) of every model of a design in `stages.POSTTRAINED`, after its training."""
    designs = {ModelConfig.from_name(d).name for d in stages.POSTTRAINED}
    return [Task(f"posttrain {alias}", stages.posttrain, {"plan": plan.to_dict(), "root": str(lay.root), "alias": alias},
                 lambda out=lay.posttrain(alias): (out / "summary.json").is_file(), [f"train {alias}"])
            for alias, cfg in cfgs.items() if cfg.replace(seed=ModelConfig.seed).name in designs]


def rerun_names(plan: DemoPlan, rerun: list[str]) -> list[str]:
    """The paper names of the plan's models that `rerun` names (paper name or alias, `--rerun`), each once."""
    names = {ModelConfig.from_name(m, preset=plan.preset).name for m in plan.models}
    out = []
    for m in rerun:
        try:
            name = ModelConfig.from_name(m, preset=plan.preset).name
        except PhaseKVError:
            name = None
        if name not in names:
            raise ConfigError(f"--rerun {m!r} is not a model of this {plan.kind} (its models: {', '.join(plan.models)})")
        out.append(name)
    return list(dict.fromkeys(out))


def _settings_besides(plan: dict, names: list[str]) -> dict:
    """A plan's settings (`DemoPlan.to_dict`) without the `per_model` entries of the models `names` and without its
    seeds (its models as designs): what must not change when only those models are re-run or seeds are added."""
    preset = plan.get("preset", "tiny")
    own = {m: o for m, o in plan.get("per_model", {}).items()
           if ModelConfig.from_name(m, preset=preset).name not in names}
    designs = list(dict.fromkeys(unseeded(m) for m in plan.get("models", [])))
    return {**plan, "per_model": own, "models": designs, "seeds": None}


def plan_at(root: Path, plan: DemoPlan, seeds: list[int] | None = None) -> DemoPlan:
    """`plan` at the seeds the study directory `root` already holds (none there: the plan's own) with `seeds`
    (`--seed`, `--seeds`) added: one directory gathers a plan's seeds."""
    manifest = Layout(root).manifest
    held = DemoPlan.from_dict(json.loads(manifest.read_text())["plan"]).seeds if manifest.is_file() else []
    return gathered(plan, held, seeds)


def task_output(task: Task, lay: Layout) -> Path:
    """The file or directory a task writes: its `out`, a training's run directory, the repair's, the example
    prompts' and a post-training's places in the layout."""
    if task.fn is stages.train_model:
        return Path(task.kwargs["run_dir"])
    if task.fn is stages.repair:
        return lay.repair
    if task.fn is stages.examples:
        return lay.examples
    if task.fn is stages.posttrain:
        return lay.posttrain(task.kwargs["alias"])
    return Path(task.kwargs["out"])


def discard(root: Path, plan: DemoPlan, names: list[str]) -> tuple[list[str], list[str]]:
    """Delete the trainings of the models `names` and everything computed from them: every task that needs one of
    those trainings, directly or through another task (the model's evaluations and analyses; the comparison, the
    repair's goals and the example prompts, made across models), and the report. Returns (the tasks whose outputs
    are gone, the paths deleted, relative to `root`); every other output stays as it is."""
    lay, tasks = Layout(root), build_tasks(root, plan)
    stale = {f"train {ModelConfig.from_name(n, preset=plan.preset).alias}" for n in names}
    grown = True
    while grown:  # dependents of dependents: the closure over `Task.after`
        grown = False
        for t in tasks:
            if t.name not in stale and any(d in stale for d in t.after):
                stale.add(t.name)
                grown = True
    deleted = []
    for path in [task_output(t, lay) for t in tasks if t.name in stale] + [lay.report]:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        deleted.append(str(path.relative_to(root)))
    return sorted(t.name for t in tasks if t.name in stale), sorted(deleted)


def _manifest(root: Path, plan: DemoPlan, jobs: int, rerun: list[str] = ()) -> dict:
    """The manifest of `plan` in `root`: refused when the directory holds other settings, except the own settings
    (`per_model`) of the models `rerun` names (paper names), whose outputs are discarded first (`discard`); the
    discarded work is recorded under "reruns"."""
    lay = Layout(root)
    old = json.loads(lay.manifest.read_text()) if lay.manifest.is_file() else {}
    if old and _settings_besides(old.get("plan") or {}, rerun) != _settings_besides(plan.to_dict(), rerun):
        raise ConfigError(f"{root} holds a {old.get('mode', 'different')} {old.get('kind', 'demo')} with other "
                          "settings; use another --out (or delete it) to run this one")
    if old and rerun:
        before = DemoPlan.from_dict(old["plan"])
        tasks, deleted = discard(root, plan, rerun)
        changed = {m: {"before": before._own(m), "after": plan._own(m)} for m in rerun
                   if before._own(m) != plan._own(m)}
        old["tasks"] = {k: v for k, v in old.get("tasks", {}).items() if k not in tasks}
        old["reruns"] = old.get("reruns", []) + [{
            "models": list(rerun), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "settings_changed": changed, "tasks_discarded": tasks, "discarded": deleted}]
        console.print(f"[bold]rerun[/] {', '.join(rerun)}: discarded {len(deleted)} output(s) of {len(tasks)} task(s)")
    cfgs = [ModelConfig.from_name(m, preset=plan.preset) for m in plan.models]
    models = {c.alias: {"name": c.name} for c in cfgs}
    return {**old, "kind": plan.kind, "mode": plan.mode, "preset": plan.preset, "plan": plan.to_dict(), "models": models,
            "version": __version__, "threads": f"{jobs} worker process(es) × 1",
            "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, torch {torch.__version__}",
            "data": {"description": f"synthetic associative recall ({', '.join(f'{k}={v}' for k, v in plan.recall.items())}), "
                                    f"seq_len {plan.seq_len}, {plan.steps_text()}; lookup "
                                    f"prompts: {plan.records} records, {plan.demos} demonstrations, filler "
                                    f"{plan.filler}, M = {plan.modulus}, {plan.per_group} prompts per residue group"},
            "created": old.get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _write_manifest(root: Path, manifest: dict) -> None:
    write_json(Layout(root).manifest, manifest, indent=1, default=str)


def run_demo(out: str | os.PathLike = "demo_out", quick: bool = False, **runtime) -> dict:
    """Run (or resume) the demo into `out`, then render `out/report/index.html`; returns the manifest. `runtime`:
    `run_plan`'s options (seeds, jobs, progress, report, rerun, device, cluster)."""
    return run_plan(out, plan_for(quick), **runtime)


def run_study(out: str | os.PathLike = "study_out", quick: bool = False, preset: str = STUDY_PRESET,
              **runtime) -> dict:
    """Run (or resume) the whole study (the paper's grid at `preset`) into `out`, then its report; `runtime` as in
    `run_demo`."""
    return run_plan(out, study_plan(quick, preset), **runtime)


def run_family(out: str | os.PathLike = "family_out", quick: bool = False, **runtime) -> dict:
    """Run (or resume) the grid family (`family_plan`: NSA, MoBA, Activation Beacon beside full attention and
    W8/S4 · 1 KV at the demo's scale and recipe) into `out`, then its report (a section "The family"); `runtime` as
    in `run_demo`."""
    return run_plan(out, family_plan(quick), **runtime)


def check_device(device: str, local: bool) -> None:
    """`--device`: cpu, cuda or cuda:N; a CUDA device must exist here when the tasks run here (`local`)."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ConfigError(f"--device {device!r} must be cpu, cuda or cuda:N")
    if local and device != "cpu" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: no CUDA device on this machine")


def run_plan(out: str | os.PathLike, plan: DemoPlan, jobs: int | None = None, progress: bool = True,
             report: bool = True, rerun: list[str] = (), device: str = "cpu",
             cluster: SlurmOptions | None = None, seeds: list[int] | None = None) -> dict:
    """Run (or resume) `plan` into `out`, then render `out/report/index.html`; returns the manifest. `seeds`: every
    model at each of them besides the seeds `out` already holds (`plan_at`). `rerun`: models
    (paper names or aliases) to run again: their trainings and everything computed from them are discarded first
    (`discard`), every other result is kept, and their own settings (`per_model`) may differ from the directory's;
    recorded in the manifest ("reruns"). `device`: where each model is trained, evaluated and analysed. `cluster`:
    each task a SLURM job with these options (`phasekv.study.slurm`) instead of the local pool; without
    `cluster.wait` it returns once every task is queued (the report comes with a later run, once they are done)."""
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--out {root} exists and is not a directory")
    plan = plan_at(root, plan, seeds)
    for m in plan.models:  # every model is valid at the plan's backbone before anything runs
        ModelConfig.from_name(m, preset=plan.preset)
    rerun = rerun_names(plan, list(rerun))
    check_device(device, local=cluster is None)
    if cluster is not None:
        slurm.check(cluster, root, device)  # before anything is written or submitted
    root.mkdir(parents=True, exist_ok=True)
    jobs = jobs or min(2, os.cpu_count() or 1)
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    with Lock(root):
        return _run(root, plan, jobs, progress, report, rerun, device, cluster)


def _run(root: Path, plan: DemoPlan, jobs: int, progress: bool, report: bool, rerun: list[str] = (),
         device: str = "cpu", cluster: SlurmOptions | None = None) -> dict:
    manifest = _manifest(root, plan, jobs, rerun) | {"device": device, "executor": "slurm" if cluster else "local"}
    _write_manifest(root, manifest)
    tasks = build_tasks(root, plan, device)
    where = "a SLURM job per task" if cluster else f"{jobs} worker(s)"
    console.print(f"[bold]phasekv {plan.kind}[/] ({plan.mode}): {len(plan.models)} models at the {plan.preset} preset, "
                  f"{plan.steps_text()}, on {device}, {where} -> {root}")
    t0, load0 = time.time(), os.getloadavg()[0]
    timings = dict(manifest.get("tasks", {}))
    ran = []

    def record(name: str, wall: float, cpu: float) -> None:
        timings[name] = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
        ran.append(name)
        _write_manifest(root, {**manifest, "tasks": timings})

    executor = slurm.SlurmExecutor(root, cluster, plan.kind) if cluster else None
    failed = run_tasks(tasks, jobs, progress, record, plan.kind,
                       took={k: v["wall_s"] for k, v in timings.items() if isinstance(v, dict)}, executor=executor)
    if cluster and not failed and not all(t.is_done() for t in tasks):  # queued, and the driver leaves
        manifest.update(tasks=timings, failed={})
        _write_manifest(root, manifest)
        console.print(f"{plan.kind}: every task is queued on SLURM (OUT/jobs.json); `phasekv study status {root}` "
                      "shows where each stands; run this command again once they are done for the report (or with "
                      "--wait to stay until then)")
        return manifest

    def finish(wall: float) -> None:
        if ran or not manifest.get("invocations"):
            manifest["invocations"] = manifest.get("invocations", []) + [
                {"seconds": round(wall, 1), "tasks_run": len(ran),
                 "load_average": [round(load0, 1), round(os.getloadavg()[0], 1)]}]
        cpu = {k: v["cpu_s"] for k, v in timings.items() if isinstance(v, dict)}
        manifest.update(tasks=timings, failed=failed, jobs=jobs,
                        seconds=round(sum(r["seconds"] for r in manifest["invocations"]), 1),
                        cpu_seconds=round(sum(cpu.values()), 1),
                        idle_estimate_seconds=round(makespan(tasks, cpu, jobs) + cpu.get("report", 0.0), 1))
        _write_manifest(root, manifest)

    finish(time.time() - t0)
    if report:
        from phasekv.report.render import render_report  # at the end: the workers' start does not wait for it

        t1, c1 = time.time(), time.process_time()
        index = render_report(root, progress=progress)
        console.print(f"[green]✓[/] report: {index}")
        timings["report"] = {"wall_s": round(time.time() - t1, 1), "cpu_s": round(time.process_time() - c1, 1)}
        manifest["invocations"] = manifest["invocations"][:-1] if ran else manifest["invocations"]
        finish(time.time() - t0)
    wall = time.time() - t0
    console.print(f"{plan.kind} wall-clock: {wall / 60:.1f} min this run"
                  + (f", {manifest['seconds'] / 60:.1f} min in all" if len(manifest["invocations"]) > 1 else "")
                  + f"; {manifest['cpu_seconds'] / 60:.1f} min of single-core CPU time, about "
                  f"{manifest['idle_estimate_seconds'] / 60:.1f} min on an idle machine with {jobs} worker(s)")
    if failed:
        raise PhaseKVError(f"{len(failed)} {plan.kind} task(s) failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    return manifest
