"""Shared settings of the training tests: a tiny run that takes well under a second per few steps."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

from phasekv.train.checkpoint import latest_checkpoint, list_checkpoints

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


def kill_at_first_checkpoint(opts: dict, run: Path) -> None:
    """`phasekv train` with `opts` into `run` in a subprocess, SIGKILLed as soon as its first checkpoint exists."""
    cmd = [sys.executable, "-m", "phasekv.cli", "train", *cli_args({**opts, "out": run})]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not list_checkpoints(run) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
