"""Every benchmark script runs end to end at its smallest size (they share helpers that can drift)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("args", [["train_throughput.py", "--reps", "1", "--presets", "tiny"]])
def test_benchmark_script_runs(args):
    out = subprocess.run([sys.executable, *args, "--threads", "1"], cwd=BENCH, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "throughput ratio" in out.stdout


def test_decode_benchmarks_run():
    code = ("import bench_decode; bench_decode.step_ratio(['--context', '300', '--reps', '2']); "
            "bench_decode.main(['--contexts', '300', '--reps', '2', '--preset', 'tiny'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "reference   best" in out.stdout and "model median" in out.stdout
