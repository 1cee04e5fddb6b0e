"""torchrun with 2 CPU processes (gloo) equals one process with the same global batch."""

import json
import subprocess
import sys

import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.train import train

from .helpers import FAST, ROOT, cli_args, env, final_weights

# Tolerance. fp32 sums over 2 ranks vs 1 differ in the last bits: per-step losses and gradient norms agree
# to 1e-5 (relative). AdamW divides each update by the root of its own squared-gradient average, so on
# elements whose gradient is at that noise level the update can flip sign: >= 99% of the weights agree
# to 1e-5 and every weight to 2 * lr * steps.
RTOL_LOSS, ATOL_W, FRAC_W = 1e-5, 1e-5, 0.99


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "phasekv.cli", "train", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)


def metrics(run) -> list[dict]:
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


@pytest.mark.parametrize("fsdp", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["ddp", "fsdp2"])
def test_two_gloo_ranks_match_single_process(tmp_path, fsdp):
    opts = dict(FAST, arch="W8/S8 · 1 KV", steps=4, batch_size=8, grad_accum=2, ckpt_every=2, val_every=0,
                gate_steps="2")
    single = tmp_path / "single"
    train(out=str(single), **opts)
    multi = tmp_path / "multi"
    r = torchrun(2, *cli_args({**opts, "out": multi, "fsdp": fsdp}))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Grad strides do not match" not in r.stderr  # see test_gradients_keep_their_parameters_strides
    assert (r.stdout + r.stderr).count("final loss") == 1  # one summary, from rank 0
    a, b = final_weights(single), final_weights(multi)
    assert a.keys() == b.keys()
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    assert (diff <= ATOL_W).float().mean() >= FRAC_W
    assert diff.max() <= 2 * opts["steps"] * 3e-3
    la, lb = (metrics(d) for d in (single, multi))
    for x, y in zip(la, lb, strict=True):
        assert x["step"] == y["step"]
        assert abs(x["loss"] - y["loss"]) <= RTOL_LOSS * abs(x["loss"])
        assert abs(x["grad_norm"] - y["grad_norm"]) <= RTOL_LOSS * abs(x["grad_norm"])
    # only rank 0 wrote: one metrics row per step, one gate row per (layer, branch)
    assert len(lb) == 4
    assert len((multi / "gates.jsonl").read_text().splitlines()) == 2 * 2


@pytest.mark.parametrize("name", ["W8/S8 · 1 KV", "W8/S4 · 2 KV · vector gates", "W8/S8 · 2 KV · staggered heads",
                                  "W8/S8 · 1 KV · tied K/V", "W8/S8 · 1 KV · uniform averaging",
                                  "W8/S8 · 1 KV · shared payload", "W16/S8 · 1 KV · V4 compressor"])
def test_gradients_keep_their_parameters_strides(name):
    """DDP copies each gradient into its bucket through a view with the parameter's strides and warns on every
    step when they differ (autograd allows any stride on a dim of size 1, as in the gate weights (W, 1, 1, d)):
    every gradient, the compressor's included, comes with its parameter's own strides."""
    torch.manual_seed(0)
    model = PhaseLM(ModelConfig.from_name(name, preset="tiny"))
    model(torch.randint(0, model.config.vocab_size, (2, 40))).sum().backward()
    assert [n for n, p in model.named_parameters() if p.grad is not None and p.grad.stride() != p.stride()] == []
