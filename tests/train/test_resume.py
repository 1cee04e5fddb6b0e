"""Exact resume after SIGKILL, atomic checkpoints, non-finite loss."""

import json

import pytest
import torch

from phasekv.errors import ConfigError
from phasekv.train import TrainingDiverged, load_run, loop, train
from phasekv.train import checkpoint as ck
from phasekv.train.checkpoint import latest_checkpoint, list_checkpoints

from .helpers import FAST, final_weights, kill_at_first_checkpoint

ARCH = "W8/S8 · 1 KV"


def assert_bitwise_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_sigkill_then_resume_is_bitwise_identical(tmp_path):
    opts = dict(FAST, arch=ARCH, steps=40, ckpt_every=5, val_every=0, gate_steps="none")
    ref = tmp_path / "ref"
    train(out=str(ref), **opts)

    run = tmp_path / "killed"
    kill_at_first_checkpoint(opts, run)
    assert not (run / "done.json").exists(), "the run finished before it was killed"
    killed_at = json.loads((latest_checkpoint(run) / "trainer_state.json").read_text())["step"]
    assert killed_at < 40

    train(out=str(run), resume=True, **opts)
    assert_bitwise_equal(final_weights(ref), final_weights(run))
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == sorted(steps) and len(steps) == len(set(steps)) == 40  # no duplicated rows after resume
    ref_opt, run_opt = (ck.read_optimizer(latest_checkpoint(d))["optimizer"] for d in (ref, run))
    assert all(torch.equal(ref_opt["state"][k]["exp_avg"], run_opt["state"][k]["exp_avg"]) for k in ref_opt["state"])


def test_crash_while_writing_keeps_previous_checkpoint(tmp_path, monkeypatch):
    opts = dict(FAST, arch=ARCH, steps=12, ckpt_every=4, val_every=0, gate_steps="none")
    ref = tmp_path / "ref"
    train(out=str(ref), **opts)

    real_save = torch.save

    def crash_at_step_8(obj, f, *a, **k):
        if "step_00000008" in str(f):
            with open(f, "wb") as fh:
                fh.write(b"half a file")
            raise OSError("disk on fire")
        return real_save(obj, f, *a, **k)

    run = tmp_path / "run"
    monkeypatch.setattr(ck.torch, "save", crash_at_step_8)
    with pytest.raises(OSError, match="disk on fire"):
        train(out=str(run), **opts)
    monkeypatch.setattr(ck.torch, "save", real_save)
    assert latest_checkpoint(run).name == "step_00000004"
    assert (run / "checkpoints" / ".tmp-step_00000008").is_dir()  # the half-written one, ignored
    model, tok = load_run(run)
    assert model.config.name == ARCH and tok.convert_tokens_to_ids("cat") > 3

    train(out=str(run), resume=True, **opts)
    assert not list((run / "checkpoints").glob(".tmp-*"))
    assert [p.name for p in list_checkpoints(run)] == ["step_00000008", "step_00000012"]  # keep_checkpoints=2
    assert_bitwise_equal(final_weights(ref), final_weights(run))


def test_non_finite_loss_stops_and_keeps_last_good(tmp_path, monkeypatch):
    real = loop.loss_sum
    calls = {"n": 0}

    def poisoned(*a, **k):
        calls["n"] += 1
        out = real(*a, **k)
        return out * float("nan") if calls["n"] == 6 else out

    monkeypatch.setattr(loop, "loss_sum", poisoned)
    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"step 6: non-finite loss .*step_00000004"):
        train(out=str(run), **dict(FAST, arch=ARCH, steps=10, ckpt_every=2, val_every=0, gate_steps="none"))
    assert latest_checkpoint(run).name == "step_00000004"
    assert not (run / "done.json").exists()
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "non-finite" and last["step"] == 6


def test_existing_run_needs_resume_and_same_settings(tmp_path):
    run = tmp_path / "run"
    opts = dict(FAST, arch=ARCH, steps=2, val_every=0, gate_steps="none")
    train(out=str(run), **opts)
    with pytest.raises(ConfigError, match="--resume"):
        train(out=str(run), **opts)
    with pytest.raises(ConfigError, match="lr=.* differs"):
        train(out=str(run), resume=True, **{**opts, "lr": 1e-2})
    s = train(out=str(run), resume=True, **{**opts, "steps": 4})  # a longer run continues
    assert s["steps"] == 4 and latest_checkpoint(run).name == "step_00000004"


def test_stopped_at_until_then_resumed_is_the_uninterrupted_run(tmp_path):
    """`train(until=s)` stops after step s with a checkpoint there (none at 0) and no done.json; continued in
    pieces, the run ends bit for bit where one uninterrupted run does (its schedule is over all steps)."""
    opts = dict(FAST, arch=ARCH, steps=10, ckpt_every=100, val_every=0, gate_steps="none")
    ref = tmp_path / "ref"
    train(out=str(ref), **opts)
    run = tmp_path / "run"
    assert train(out=str(run), resume=True, until=0, **opts)["stopped"] == 0 and latest_checkpoint(run) is None
    for until in (3, 7):
        s = train(out=str(run), resume=True, until=until, **opts)
        assert s["stopped"] == until and not (run / "done.json").exists()
        assert json.loads((latest_checkpoint(run) / "trainer_state.json").read_text())["step"] == until
    assert train(out=str(run), resume=True, **opts)["steps"] == 10 and (run / "done.json").is_file()
    assert_bitwise_equal(final_weights(ref), final_weights(run))
