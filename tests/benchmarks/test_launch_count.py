"""benchmarks/launch_count.py runs, and the compressed layer launches what the goals allow: its training layer and
its decode step at most 10 more than full attention's (the GPU path, counted on the CPU)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_launch_counts_meet_the_goals():
    pytest.importorskip("triton", reason="the fused kernels' launches are counted under Triton's interpreter")
    out = subprocess.run([sys.executable, "launch_count.py", "--preset", "tiny", "--tokens", "40"], cwd=BENCH,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    full, w8s8, w8s4 = (counts[n] for n in ("Full attention · 1 KV", "W8/S8 · 1 KV", "W8/S4 · 1 KV"))
    for what in ("train_layer", "decode_step"):
        assert full[what] < w8s8[what] <= full[what] + 10, what
        assert w8s4[what] <= full[what] + 10, what
    assert "train_layer" in out.stdout and "triton" in out.stdout
