import json
import subprocess
import sys

import pandas as pd

from phasekv.theory.checks import Grid, coverage_check
from phasekv.theory.flow import FlowOptions

CLI = [sys.executable, "-c", "from phasekv.cli import main; main()", "theory"]


def _run(args, cwd):
    return subprocess.run(CLI + args, capture_output=True, text=True, cwd=cwd, timeout=120)


def test_coverage_check_writes_outputs(tmp_path):
    grid = Grid(N=[24], S=[3], m=[1, 2])
    opts = FlowOptions(runs=3, steps=120, batch=8, eval_contexts=32, track_every=20)
    summary = coverage_check(tmp_path, grid, opts, n_test=32, progress=False)
    for name in ["summary.json", "results.parquet", "flow.parquet", "accuracy_by_position.png"]:
        assert (tmp_path / name).stat().st_size > 0
    df = pd.read_parquet(tmp_path / "results.parquet")
    flow = df[df.kind == "flow"]
    assert set(flow.position) == {1, 2}
    # trained heads answer the positions they chose and fail the others
    assert flow[flow.covered].accuracy.min() > 0.9 and flow[~flow.covered].accuracy.max() < 0.1
    assert summary["claim_reproduced"]
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["provenance"]["seed"] == 0 and len(on_disk["settings"]) == 2


def test_cli_minimisers_and_flow(tmp_path):
    repo = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    out = tmp_path / "min"
    r = _run(["minimisers", "--out", str(out), "--quick", "--N", "24", "--S", "3", "--m", "1", "--eps", "0,0.05",
              "--starts", "4", "--steps", "200", "--no-progress"], repo)
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [s["config"]["eps"] for s in summary["settings"]] == [0.0, 0.05]
    assert (out / "minimisers.png").exists() and (out / "results.parquet").exists()
    out = tmp_path / "flow"
    r = _run(["flow", "--out", str(out), "--quick", "--N", "24", "--S", "3", "--m", "2", "--rho", "0.1,1",
              "--runs", "2", "--steps", "40", "--no-progress"], repo)
    assert r.returncode == 0, r.stderr
    for name in ["gate_paths.png", "collision_rate.png", "results.parquet"]:
        assert (out / name).exists()
    assert len(json.loads((out / "summary.json").read_text())["settings"]) == 2


def test_cli_user_errors_exit_2(tmp_path):
    repo = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    r = _run(["flow", "--out", str(tmp_path), "--N", "8", "--S", "4", "--m", "2"], repo)  # N < L*S
    assert r.returncode == 2 and r.stderr.startswith("error:") and "N=8" in r.stderr
    r = _run(["minimisers", "--out", str(tmp_path), "--kappa", "abc"], repo)
    assert r.returncode == 2 and "--kappa" in r.stderr
    assert not (tmp_path / "summary.json").exists()
