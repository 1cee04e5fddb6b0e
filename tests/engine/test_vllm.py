"""The real engine: vLLM's CPU build serves the demo's full-attention model, exported with `phasekv export`, on
127.0.0.1; the full lookup (13,824 prompts) through the server equals the lookup in process prompt by prompt.

Run it with `make test-engine` (it builds the engine's own environment .engine-venv first; see the Makefile).
The model is trained with the demo's recipe into runs/engine-test (about 6 CPU minutes, reused by later runs);
PHASEKV_ENGINE_RUN=DIR evaluates another full-attention run instead (e.g. demo_out's). The server is stopped
by its process id (and its process group: vLLM's engine core runs in a child process) whatever happens.
"""

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from phasekv.demo import stages
from phasekv.demo.plan import DemoPlan
from phasekv.eval.engine import connect
from phasekv.eval.export import export
from phasekv.eval.models import load
from phasekv.eval.prompts import lookup_config
from phasekv.eval.run import run_retrieval
from tests.net import free_port

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("PHASEKV_ENGINE_VENV", ROOT / ".engine-venv"))
SERVER_ENV = {  # vLLM's CPU build, on this machine only
    "VLLM_TARGET_DEVICE": "cpu",  # the platform, whatever the version metadata says
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache (the default reserves most of the RAM)
    "VLLM_HOST_IP": "127.0.0.1",  # its processes talk over the loopback interface
    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",  # no network beyond 127.0.0.1
}
SUMMARY_NUMBERS = ("mean", "mean_ci", "worst", "best", "gap", "gap_ci", "groups", "detected_period", "n_prompts")


@pytest.fixture(scope="module")
def run_dir() -> Path:
    if os.environ.get("PHASEKV_ENGINE_RUN"):
        return Path(os.environ["PHASEKV_ENGINE_RUN"])
    run = ROOT / "runs" / "engine-test" / "full-1kv"
    stages.train_model(DemoPlan(mode="full").to_dict(), "Full attention · 1 KV", str(run))  # resumes or skips
    return run


@contextmanager
def vllm_server(model_dir: Path, log: Path, name: str = "full"):
    """`python -m vllm.entrypoints.launchers.api_server.entry` (vLLM's server; the `vllm` command of the
    vllm-cpu distribution looks up metadata named `vllm` and fails) on 127.0.0.1; yields its address."""
    python = VENV / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{python} missing: build the engine environment with `make engine-venv`")
    port = free_port()
    cmd = [str(python), "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model_dir),
           "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "512"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **SERVER_ENV},
                                start_new_session=True)  # its own process group: the engine core goes with it
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 900) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            pytest.fail(f"vLLM exited with {proc.returncode}:\n" + "\n".join(log.read_text().splitlines()[-30:]))
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(2)
    pytest.fail(f"vLLM did not answer within {timeout} s:\n" + "\n".join(log.read_text().splitlines()[-30:]))


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (pgid = its pid), SIGKILL if it is still there after 60 s."""
    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def test_full_lookup_through_vllm_equals_in_process(run_dir, tmp_path):
    export(run_dir, tmp_path / "hf")
    start = time.time()
    with vllm_server(tmp_path / "hf", tmp_path / "vllm.log") as url:
        ready = time.time()
        em = connect(url, "full")
        cfg = lookup_config(em.info)
        served = run_retrieval("lookup", em, cfg, tmp_path / "served", batch_size=64, progress=False)
        served_s = time.time() - ready
    inproc = load(run_dir, device="cpu")
    assert lookup_config(inproc.info) == cfg  # the export evaluates like the run: same words, same layout
    t = time.time()
    ref = run_retrieval("lookup", inproc, cfg, tmp_path / "inproc", batch_size=64, progress=False)
    inproc_s = time.time() - t
    a, b = (pd.read_parquet(tmp_path / d / "results.parquet") for d in ("served", "inproc"))
    assert len(a) == len(b) == 13824 and (a["pid"] == b["pid"]).all()
    differ = a.index[(a["correct"] != b["correct"]) | (a["pred"] != b["pred"])].tolist()
    prob_diff = float((a["prob"] - b["prob"]).abs().max())
    print(json.dumps({"prompts": len(a), "server_start_s": round(ready - start, 1), "served_lookup_s": round(served_s, 1),
                      "in_process_lookup_s": round(inproc_s, 1), "max_prob_diff": prob_diff,
                      "answers_from_prompt_logprobs": em.info["engine"]["answers_from_prompt_logprobs"],
                      "mean": served["mean"], "gap": served["gap"]}))
    assert not differ, f"correctness differs on prompts {differ[:10]}"
    assert prob_diff < 1e-3
    assert {k: served[k] for k in SUMMARY_NUMBERS} == {k: ref[k] for k in SUMMARY_NUMBERS}
