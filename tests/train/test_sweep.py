"""Sweep files: expansion, skip finished runs, resume interrupted ones, cluster command lines."""

import json
import shlex
from pathlib import Path

import pytest

from phasekv.config.names import PAPER_GRID
from phasekv.errors import ConfigError
from phasekv.train import checkpoint as ck
from phasekv.train import loop, sweep
from phasekv.train.checkpoint import latest_checkpoint

from .helpers import ROOT, final_weights

SWEEP = """
[defaults]
preset = "tiny"
steps = 6
batch_size = 4
seq_len = 64
warmup = 2
ckpt_every = 2
val_every = 0
log_every = 1
val_sequences = 8
gate_steps = "none"
progress = false
out_root = "runs"

[[run]]
arch = "Full attention · 1 KV"

[[run]]
arch = "w8s8-1kv"
seeds = [42, 43]
"""


@pytest.fixture
def sweep_file(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # out_root is relative to the working directory
    p = tmp_path / "s.toml"
    p.write_text(SWEEP)
    return p


def test_expansion(sweep_file, tmp_path):
    runs = sweep.load_sweep(sweep_file)
    assert [r.name for r in runs] == ["Full attention · 1 KV", "W8/S8 · 1 KV", "W8/S8 · 1 KV · seed 43"]
    assert [str(r.out) for r in runs] == ["runs/full-1kv", "runs/w8s8-1kv", "runs/w8s8-1kv-seed43"]
    assert all(r.status() == "pending" for r in runs)
    assert runs[2].config().seed == 43 and runs[2].config().total_steps == 6


def test_skip_finished_and_resume_interrupted(sweep_file, tmp_path, monkeypatch):
    calls = []
    real_train = loop.train

    def counting_train(cfg, resume=False, **kw):
        calls.append(cfg.arch)
        return real_train(cfg, resume=resume, **kw)

    monkeypatch.setattr(loop, "train", counting_train)
    # interrupt the second run: its checkpoint at step 4 fails mid-write, so step 2 is the latest good one
    real_write = ck.save_checkpoint

    def crash(run_dir, step, *a, **k):
        if step == 4 and Path(run_dir).name == "w8s8-1kv":
            raise KeyboardInterrupt
        return real_write(run_dir, step, *a, **k)

    monkeypatch.setattr(ck, "save_checkpoint", crash)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(sweep_file)
    monkeypatch.setattr(ck, "save_checkpoint", real_write)
    runs = sweep.load_sweep(sweep_file)
    assert [r.status() for r in runs] == ["done", "partial", "pending"]
    assert latest_checkpoint(runs[1].out).name == "step_00000002"

    calls.clear()
    rows = sweep.run_sweep(sweep_file)
    assert calls == ["W8/S8 · 1 KV", "W8/S8 · 1 KV · seed 43"]  # the finished run is skipped
    assert [(r["before"], r["after"]) for r in rows] == [("done", "done"), ("partial", "done"), ("pending", "done")]
    metrics = [json.loads(x) for x in (runs[1].out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2, 3, 4, 5, 6]

    # the resumed run equals an uninterrupted one
    fresh = tmp_path / "fresh.toml"
    fresh.write_text(sweep_file.read_text().replace('out_root = "runs"', 'out_root = "fresh"'))
    sweep.run_sweep(fresh, only="w8s8-1kv")
    a, b = final_weights(runs[1].out), final_weights(Path("fresh/w8s8-1kv"))
    assert all((a[k] == b[k]).all() for k in a)

    calls.clear()
    assert [r["after"] for r in sweep.run_sweep(sweep_file)] == ["done"] * 3 and calls == []


def test_commands(sweep_file, capsys):
    from typer.testing import CliRunner

    from phasekv.cli import _mount, app

    _mount()
    res = CliRunner().invoke(app, ["sweep", "commands", str(sweep_file), "--nproc", "4"])
    assert res.exit_code == 0, res.output
    lines = [shlex.split(x) for x in res.stdout.strip().splitlines()]
    assert len(lines) == 3
    assert lines[1][:6] == ["torchrun", "--nproc_per_node", "4", "-m", "phasekv", "train"]
    assert lines[1][lines[1].index("--arch") + 1] == "W8/S8 · 1 KV" and lines[1][-1] == "--resume"
    assert lines[2][lines[2].index("--seed") + 1] == "43"
    res = CliRunner().invoke(app, ["sweep", "commands", str(sweep_file), "--nproc", "8", "--nnodes", "2", "--slurm"])
    assert res.stdout.count("sbatch --job-name") == 3 and "--rdzv-backend c10d" in res.stdout


def test_shipped_sweeps():
    paper = sweep.load_sweep(ROOT / "sweeps" / "paper.toml")
    assert [r.name for r in paper] == PAPER_GRID and len(paper) == 26
    assert sum(r.config().arch.startswith("Full attention") for r in paper) == 3
    assert {r.config().preset for r in paper} == {"qwen3-0.6b"}
    cpu = sweep.load_sweep(ROOT / "sweeps" / "cpu.toml")
    assert {r.config().preset for r in cpu} == {"tiny"} and 3 <= len(cpu) <= 6


def test_bad_sweep_files(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[[run]]\npreset = 'tiny'\n")
    with pytest.raises(ConfigError, match="no 'arch'"):
        sweep.load_sweep(p)
    p.write_text("[[run]]\narch = 'W8/S8 · 1 KV'\nbatch_sise = 3\n")
    with pytest.raises(ConfigError, match="batch_sise"):
        sweep.load_sweep(p)
    p.write_text("[[run]]\narch = 'W8/S8 · 1 KV'\n[[run]]\narch = 'w8s8-1kv'\n")
    with pytest.raises(ConfigError, match="twice"):
        sweep.load_sweep(p)
    with pytest.raises(ConfigError, match="not found"):
        sweep.load_sweep(tmp_path / "none.toml")


def test_tagged_runs_of_one_model_share_a_sweep(tmp_path, monkeypatch):
    """A per-run `tag` joins the run's name and directory: two recipes of one model (and a tagged seed list) run
    side by side, each with its own options; the model trained is the untagged arch."""
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "t.toml"
    runs = ('[[run]]\narch = "w8s8-1kv"\ntag = "lr-low"\nlr = 1e-3\nsteps = 1\n\n'
            '[[run]]\narch = "W8/S8 · 1 KV"\ntag = "lr-high"\nlr = 3e-3\nseeds = [42, 43]\nsteps = 1\n')
    p.write_text(SWEEP.split("[[run]]")[0] + runs)
    expanded = sweep.load_sweep(p)
    assert [r.name for r in expanded] == ["W8/S8 · 1 KV [lr-low]", "W8/S8 · 1 KV [lr-high]",
                                          "W8/S8 · 1 KV · seed 43 [lr-high]"]
    assert [str(r.out) for r in expanded] == ["runs/w8s8-1kv-lr-low", "runs/w8s8-1kv-lr-high",
                                              "runs/w8s8-1kv-seed43-lr-high"]
    assert sweep.train_args(expanded[0])[:2] == ["--arch", "W8/S8 · 1 KV"]
    assert [r.alias for r in sweep._select(expanded, "*-lr-high")] == ["w8s8-1kv-lr-high", "w8s8-1kv-seed43-lr-high"]
    rows = sweep.run_sweep(p, only="w8s8-1kv-lr-*")  # the two recipes of seed 42
    assert [r["after"] for r in rows] == ["done"] * 2
    lrs = [json.loads((r.out / "config.json").read_text())["train"]["lr"] for r in expanded[:2]]
    assert lrs == [1e-3, 3e-3]
    assert [r.status() for r in sweep.load_sweep(p)] == ["done", "done", "pending"]
    p.write_text(SWEEP.split("[[run]]")[0] + runs.replace("lr-high", "lr-low"))
    with pytest.raises(ConfigError, match=r"'W8/S8 · 1 KV \[lr-low\]' appears twice"):
        sweep.load_sweep(p)
    p.write_text(SWEEP.split("[[run]]")[0] + runs.replace('"lr-high"', '"LR high"'))
    with pytest.raises(ConfigError, match="run 2: tag='LR high'"):
        sweep.load_sweep(p)
