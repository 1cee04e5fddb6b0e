"""Shared pieces of the reliability suite: a tiny training setup, the CLI run in-process, file snapshots."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import torch
from safetensors.torch import load_file

from phasekv.train.checkpoint import latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]
ARCH = "W8/S8 · 1 KV"
# a run of a few hundredths of a second per step: 1 thread, tiny preset, short sequences
TINY = dict(arch=ARCH, preset="tiny", batch_size=4, seq_len=64, val_sequences=4, gate_probe=2, progress=False,
            threads=1, warmup=2, log_every=1, val_every=0, gate_steps="none")
# output files whose presence says "this command finished"
COMPLETE = {"summary.json", "results.parquet", "done.json", "model.safetensors", "index.html", "manifest.json"}


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PHASEKV_THREADS": "1"}


def run_cli(*args: str) -> tuple[int, str, str]:
    """`phasekv ARGS` through `phasekv.cli.main` in this process: (exit code, stdout, stderr)."""
    from phasekv import cli

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["phasekv", *map(str, args)]
    code = 0
    # main() mounts every room's commands on the one app; undo that afterwards so calls do not pile up
    mounted = list(cli.app.registered_commands), list(cli.app.registered_groups)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
        cli.app.registered_commands[:], cli.app.registered_groups[:] = mounted
        torch.set_num_threads(1)
    return code, out.getvalue(), err.getvalue()


def run_cli_process(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m phasekv.cli ARGS` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "phasekv.cli", *map(str, args)], cwd=cwd or ROOT, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in Path(root).rglob("*") if p.is_file()}


def weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


def losses(run_dir) -> list[tuple[int, float]]:
    import json

    rows = [json.loads(r) for r in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if r.strip()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r and "event" not in r]


def sweep_toml(steps: int, seeds: list[int]) -> str:
    """A tiny sweep file of w8s8-1kv runs; `{root}` stays a placeholder for out_root."""
    return f"""
[defaults]
preset = "tiny"
steps = {steps}
ckpt_every = 2
batch_size = 4
seq_len = 64
warmup = 2
val_every = 0
val_sequences = 4
gate_probe = 2
gate_steps = "none"
log_every = 1
progress = false
threads = 1
out_root = "{{root}}"

[[run]]
arch = "w8s8-1kv"
seeds = {seeds}
"""
