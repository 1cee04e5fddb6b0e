"""`phasekv demo --rerun MODEL`, `phasekv study --rerun MODEL` and `phasekv study --family --rerun MODEL`: that model's training and everything computed from
it run again, every other result stays byte for byte, the manifest records it."""

import dataclasses
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from phasekv.demo import cli as demo_cli
from phasekv.demo import runner
from phasekv.demo.plan import plan_for
from phasekv.errors import ConfigError
from phasekv.report import render
from phasekv.report.layout import THEORY_CHECKS, Layout


class FakeStages:
    """Stands in for `run_tasks` (whose workers run the real stages, minutes of CPU): every unfinished task writes
    outputs that make it done, stamped with the invocation, and the names of the tasks run are kept per invocation."""

    def __init__(self, root: Path):
        self.lay, self.ran = Layout(root), []

    def run_tasks(self, tasks, jobs, progress, record, label="demo", took=None, executor=None):
        self.ran.append([])
        for t in (t for t in tasks if not t.is_done()):
            for f in _outputs(t, self.lay):
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(f"{t.name} · invocation {len(self.ran)}")
            assert t.is_done(), t.name
            self.ran[-1].append(t.name)
            record(t.name, 1.0, 1.0)
        return {}


def _outputs(task, lay: Layout) -> list[Path]:
    out = runner.task_output(task, lay)
    if task.name.startswith("train "):
        return [out / "done.json", out / "model.safetensors"]
    if task.name == "theory checks":
        return [lay.theory / c / "summary.json" for c in THEORY_CHECKS]
    if task.name == "repair goals":
        return [out / "goals.json"]
    if task.name == "example prompts":
        return [out]
    return [out / "summary.json", out / "results.parquet"]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name not in ("demo.json", ".demo.lock")}


@pytest.fixture
def fake(monkeypatch, tmp_path) -> FakeStages:
    stages = FakeStages(tmp_path)
    monkeypatch.setattr(runner, "run_tasks", stages.run_tasks)
    monkeypatch.setattr(render, "render_report", lambda root, progress: _report(Path(root), len(stages.ran)))
    return stages


def _report(root: Path, invocation: int) -> Path:
    (root / "report").mkdir(exist_ok=True)
    (root / "report" / "index.html").write_text(f"report · invocation {invocation}")
    return root / "report" / "index.html"


@pytest.mark.parametrize("command,reruns,aggregates", [
    ("demo", ["W8/S4 · 1 KV", "w8s8-1kv"], ["compare", "example prompts", "repair goals"]),
    ("study", ["w8s8-8kv"], ["compare", "example prompts"]),
    ("study --family", ["MoBA B16 top 3 · 1 KV"], ["compare", "example prompts"]),
])
def test_rerun_discards_one_model_and_what_is_computed_from_it(tmp_path, fake, command, reruns, aggregates):
    app = typer.Typer()
    demo_cli.register(app)
    args = [*command.split(), "--quick", "--out", str(tmp_path), "--no-progress"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    before, first = _files(tmp_path), fake.ran[0]
    r = CliRunner().invoke(app, args + [a for m in reruns for a in ("--rerun", m)])
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "demo.json").read_text())
    aliases = [runner.ModelConfig.from_name(m, preset=manifest["preset"]).alias for m in reruns]
    own = sorted(t for t in first if t.split(" ")[-1] in aliases)  # every task of the named models
    assert len(own) >= 6 * len(aliases) and sorted(fake.ran[1]) == sorted(own + aggregates)
    after = _files(tmp_path)
    rerun_paths = set(manifest["reruns"][-1]["discarded"])
    assert {f"runs/{a}" for a in aliases} <= rerun_paths and "report" in rerun_paths
    for f, data in before.items():
        if any(f == p or f.startswith(p + "/") for p in rerun_paths):
            assert after[f] != data and b"invocation 2" in after[f]  # recomputed
        else:
            assert after[f] == data, f  # every other result byte-identical (the theory checks too)
    assert set(after) == set(before)
    rec = manifest["reruns"][-1]
    assert rec["models"] == [runner.ModelConfig.from_name(m, preset=manifest["preset"]).name for m in reruns]
    assert sorted(rec["tasks_discarded"]) == sorted(own + aggregates) and rec["settings_changed"] == {}
    assert all(t in manifest["tasks"] for t in first)  # the timings of the re-run tasks are this run's
    r = CliRunner().invoke(app, args)  # a plain resume afterwards: nothing to do
    assert r.exit_code == 0 and fake.ran[2] == []


def test_rerun_accepts_changed_settings_of_that_model_only(tmp_path, fake):
    """A model's own budget may change with --rerun of that model (recorded before and after); any other change
    is still refused, and a name not in the plan is a one-line error before anything is touched."""
    plan = plan_for(quick=True)
    runner.run_plan(tmp_path, plan, progress=False)
    longer = dataclasses.replace(plan, per_model={**plan.per_model, "W8/S8 · 1 KV": {"steps": 40}})
    with pytest.raises(ConfigError, match="other settings"):
        runner.run_plan(tmp_path, longer, progress=False)  # the budget changed, the model is not re-run
    with pytest.raises(ConfigError, match="other settings"):
        runner.run_plan(tmp_path, longer, progress=False, rerun=["W8/S4 · 1 KV"])  # another model re-run
    with pytest.raises(ConfigError, match=r"--rerun 'W4/S4 · 1 KV' is not a model of this demo"):
        runner.run_plan(tmp_path, longer, progress=False, rerun=["W4/S4 · 1 KV"])
    assert len(fake.ran) == 1
    manifest = runner.run_plan(tmp_path, longer, progress=False, rerun=["w8s8-1kv"])
    assert sorted(fake.ran[1]) == sorted(["train w8s8-1kv", "lookup prefix w8s8-1kv", "lookup in-sequence w8s8-1kv",
                                          "knockout w8s8-1kv", "flip w8s8-1kv", "gates w8s8-1kv", "cycle w8s8-1kv",
                                          "compare", "repair goals", "example prompts"])
    assert manifest["reruns"][-1]["settings_changed"] == {"W8/S8 · 1 KV": {"before": {}, "after": {"steps": 40}}}
    assert manifest["plan"]["per_model"]["W8/S8 · 1 KV"] == {"steps": 40}
    runner.run_plan(tmp_path, longer, progress=False)  # the directory now holds the new settings
    assert fake.ran[-1] == []


@pytest.mark.slow
def test_rerun_end_to_end_with_the_real_stages(tmp_path):
    """The real stages at a few steps (~40 s of CPU): W8/S8's budget changes and it is re-run; W4/S4's training,
    evaluations and analyses stay byte for byte, W8/S8's are recomputed at the new budget."""
    plan = dataclasses.replace(plan_for(quick=True), models=["W4/S4 · 1 KV", "W8/S8 · 1 KV"], per_model={}, steps=3,
                               batch_size=8, curriculum=0, warmup=1, ckpt_every=10, modulus=8, per_group=8, mappings=4,
                               ko_per_group=8, n_cal=8, gate_prompts=8, cycle_per_group=8, deltas=[1], n_boot=20,
                               flip_lengths=2, repair_unrepaired=None, repair_models=[])
    for check in THEORY_CHECKS:  # the theory checks need no model (and a minute): done already
        (Layout(tmp_path).theory / check).mkdir(parents=True)
        (Layout(tmp_path).theory / check / "summary.json").write_text("{}")
    runner.run_plan(tmp_path, plan, jobs=1, progress=False, report=False)
    before = _files(tmp_path)
    longer = dataclasses.replace(plan, per_model={"W8/S8 · 1 KV": {"steps": 4}})
    manifest = runner.run_plan(tmp_path, longer, jobs=1, progress=False, report=False, rerun=["W8/S8 · 1 KV"])
    after = _files(tmp_path)
    mtime = {str(p.relative_to(tmp_path)): p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    trained = mtime["runs/w8s8-1kv/done.json"]
    assert not manifest["failed"]
    for f, data in before.items():
        if "w8s8-1kv" not in f and not f.startswith(("compare/", "eval/examples.json")):
            assert after[f] == data, f
    assert json.loads((tmp_path / "runs/w8s8-1kv/done.json").read_text())["steps"] == 4
    assert before["runs/w8s8-1kv/done.json"] != after["runs/w8s8-1kv/done.json"]
    for stage in ("eval/lookup-prefix", "eval/lookup-in-sequence", "eval/flip", "analysis/knockout",
                  "analysis/gates", "analysis/cycle"):  # written again, after the new training
        for name in ("results.parquet", "summary.json"):
            assert mtime[f"{stage}/w8s8-1kv/{name}"] > trained, stage
    assert after["eval/lookup-prefix/w8s8-1kv/results.parquet"] != before["eval/lookup-prefix/w8s8-1kv/results.parquet"]
    ckpt = "runs/w8s8-1kv/checkpoints/"  # its last checkpoint is now step 4's
    assert {f for f in after if not f.startswith(ckpt)} == {f for f in before if not f.startswith(ckpt)}
