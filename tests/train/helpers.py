"""Shared settings of the training tests: a tiny run that takes well under a second per few steps."""

import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

from phasekv.train.checkpoint import latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]
FAST = dict(preset="tiny", batch_size=4, seq_len=64, val_sequences=8, gate_probe=4, progress=False, threads=1,
            warmup=2, log_every=1)


def cli_args(opts: dict) -> list[str]:
    out = []
    for k, v in opts.items():
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else [f"--no-{k.replace('_', '-')}"] if v is False else [flag, str(v)]
    return out


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def phasekv(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phasekv.cli", *args], cwd=ROOT, env=env(),
                          capture_output=True, text=True, **kw)


def final_weights(run_dir) -> dict:
    return load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))
