"""Every benchmark script runs end to end at its smallest size (they share helpers that can drift)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("args, says", [(["train_throughput.py", "--reps", "1", "--presets", "tiny"], "x reference"),
                                        (["train_throughput.py", "--reps", "1", "--shapes", "tiny:2x32", "--models",
                                          "reference,full", "--compile", "aot_eager", "--mfu"], "MFU"),
                                        (["needle_eval.py", "--length", "128", "--per-group", "8"], "CPU-min")])
def test_benchmark_script_runs(args, says):
    out = subprocess.run([sys.executable, *args, "--threads", "1"], cwd=BENCH, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert says in out.stdout


def test_demo_cost_reads_demo_json(tmp_path):
    demo = {"mode": "full", "threads": "2 worker process(es) × 1", "cpu_seconds": 1260.0, "seconds": 700.0,
            "idle_estimate_seconds": 650.0, "invocations": [{"seconds": 700.0, "load_average": [0.1, 2.0]}],
            "tasks": {"train full-1kv": {"wall_s": 300.0, "cpu_s": 290.0}, "lookup prefix full-1kv": {"wall_s": 20.0,
                                                                                                  "cpu_s": 15.0}}}
    (tmp_path / "demo.json").write_text(json.dumps(demo))
    out = subprocess.run([sys.executable, "demo_cost.py", "--demo", str(tmp_path / "demo.json")], cwd=BENCH,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "21.0 single-core CPU-minutes" in out.stdout and "full-1kv 290 s" in out.stdout


def test_decode_benchmarks_run():
    code = ("import bench_decode; bench_decode.step_ratio(['--context', '300', '--reps', '2']); "
            "bench_decode.main(['--contexts', '300', '--reps', '2', '--preset', 'tiny', '--graph']); "
            "bench_decode.main(['--graph-check', '40', '--preset', 'tiny'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "reference   best" in out.stdout and "median | model" in out.stdout and "| graph" in out.stdout
    assert out.stdout.count("PASS static decode") == 3 and "FAIL" not in out.stdout


def test_interleaved_bursts_leave_out_each_turns_cold_first_step():
    """A contender whose first step after another contender's pays a refill (a cold cache) is timed at its warm
    steps when run in bursts, at the cold ones when steps alternate singly."""
    sys.path.insert(0, str(BENCH))
    import torch
    from common import interleaved

    now, last = [0.0], [None]

    def step(name: str):
        def fn():
            now[0] += 10.0 if last[0] != name else 1.0  # cold after the other contender, warm after itself
            last[0] = name
        return fn

    fns = {"a": step("a"), "b": step("b")}
    single = interleaved(fns, reps=3, device=torch.device("cpu"), warmup=0, clock=lambda: now[0])
    bursts = interleaved(fns, reps=3, device=torch.device("cpu"), warmup=0, clock=lambda: now[0], burst=4)
    assert single["a"].median == 10.0 and bursts["a"].median == bursts["b"].best == 1.0


def test_paired_ratio_sees_through_load_shared_by_a_turn():
    """Turn-level load that multiplies both contenders' times (a busy neighbour) leaves each turn's ratio alone:
    the interval holds the true 1.05 and excludes 1.0, though the two medians alone swing by 2x."""
    sys.path.insert(0, str(BENCH))
    import numpy as np
    from common import Timing, goal_verdict, paired_ratio

    rng = np.random.default_rng(1)
    load = rng.uniform(1.0, 2.0, 40)  # (turns,) shared by both calls of a turn
    ref = 0.1 * load * rng.normal(1.0, 0.01, 40)
    a = 0.105 * load * rng.normal(1.0, 0.01, 40)
    timing = lambda v: Timing(float(np.median(v)), float(v.min()), tuple(v))  # noqa: E731
    ratio, lo, hi = paired_ratio(timing(a), timing(ref))
    assert lo < 1.05 < hi and lo > 1.0 and abs(ratio - 1.05) < 0.01
    assert goal_verdict(lo, hi, 1.0) == "missed" and goal_verdict(lo, hi, 1.1) == "met"
    assert goal_verdict(0.98, 1.02, 1.0) == "undecided"
    with pytest.raises(ValueError, match="equally many"):
        paired_ratio(timing(a), timing(ref[:-1]))


def test_reference_model_moves_whole_to_a_device():
    """The reference model keeps no tensor behind on the CPU (its RoPE tables are buffers): on the `meta` device
    a forward mixing devices raises, as it did on CUDA (`train_throughput.py --device cuda`)."""
    sys.path.insert(0, str(BENCH))
    import torch
    from reference_model import ReferenceLM

    from phasekv import ModelConfig

    model = ReferenceLM(ModelConfig.from_name("Full attention · 1 KV", preset="tiny", max_seq_len=64)).to("meta")
    logits = model(torch.zeros(2, 16, dtype=torch.long, device="meta"))
    assert logits.device.type == "meta" and logits.shape == (2, 16, model.config.vocab_size)


def test_gpu_env_names_a_missing_package():
    """gpu.sh's environment check: a python without a package the benchmarks import fails with one line naming it;
    pyproject's dependencies are each listed with their version."""
    code = ("import sys, importlib.abc\n"
            "class NoRich(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'rich': raise ModuleNotFoundError(name=name)\n"
            "sys.meta_path.insert(0, NoRich())\n"
            "import gpu_env; gpu_env.main(['--cpu'])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1].startswith("error:")
    assert "lacks rich, which the benchmarks import" in out.stderr
    assert "transformers" in out.stdout and "pyproject" in out.stdout


def test_gpu_script_parses_and_compares_demo_verdicts(tmp_path):
    """benchmarks/gpu.sh is valid bash (`SMOKE=1 bash benchmarks/gpu.sh OUT` runs it whole on a CPU, ~10 min);
    demo_verdicts.py says whether two demos' claim verdicts agree and exits 1 where they do not."""
    assert subprocess.run(["bash", "-n", str(BENCH / "gpu.sh")]).returncode == 0
    for name, verdict in (("cpu", "reproduced"), ("cuda", "reproduced"), ("other", "not reproduced")):
        (tmp_path / name / "report").mkdir(parents=True)
        claims = [{"claim": "C1", "verdict": "not testable here"}, {"claim": "C10", "verdict": verdict}]
        (tmp_path / name / "report" / "claims.json").write_text(json.dumps(claims))
    run = lambda a, b: subprocess.run([sys.executable, "demo_verdicts.py", str(tmp_path / a), str(tmp_path / b)],  # noqa: E731
                                      cwd=BENCH, capture_output=True, text=True, timeout=60)
    same, differ = run("cpu", "cuda"), run("cpu", "other")
    assert same.returncode == 0 and "equal to the CPU's (2 of 2 claims)" in same.stdout
    assert differ.returncode == 1 and "DIFFERS" in differ.stdout
