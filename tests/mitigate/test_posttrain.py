"""`phasekv posttrain`: the continuation starts from the base's weights exactly and keeps the base untouched; the
stop rule stops at flat and at the budget and resumes; bad inputs are refused in one line with nothing written."""

import json
import subprocess
import sys

import pytest
import torch

from phasekv.errors import CheckpointError, ConfigError, DataError
from phasekv.mitigate import posttrain as pt
from phasekv.mitigate.audit import FAIL, PASS
from phasekv.train import train
from phasekv.train.build import model_and_tokenizer
from phasekv.train.checkpoint import latest_checkpoint, read_optimizer, read_trainer_state
from phasekv.train.run import load_run
from tests.train.helpers import FAST, ROOT, env

ARCH = "W8/S4 · 1 KV"
SMALL = dict(records=6, demos=2, filler=8, modulus=4, per_group=16)  # a lookup of 64 short prompts


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny trained run (it does not retrieve: 4 steps)."""
    out = tmp_path_factory.mktemp("base") / "run"
    train(out=str(out), **dict(FAST, arch=ARCH, steps=4, ckpt_every=4, val_every=0, gate_steps="none", seed=7))
    return out


def files(path):
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_continuation_starts_from_the_base_exactly(base, tmp_path):
    """A zero-step continuation is the base tensor for tensor (what the training builds before its first step), with
    the recipe: the base's data and length, half the records adjacent, its peak rate held constant, its seed."""
    cfg = pt.continuation(base, tmp_path / "run", pt.Settings(steps=5, every=5))
    assert (cfg.init_from, cfg.lr, cfg.min_lr, cfg.warmup, cfg.seq_len, cfg.seed) == (str(base), 3e-3, 3e-3, 20, 64, 7)
    assert cfg.data.recall.gap_prob == 0.5 and cfg.data.recall.curriculum == 0 and cfg.batch_size == 4
    run, _ = model_and_tokenizer(cfg, resuming=False)
    own, _ = load_run(base, hf_tokenizer=False)
    a, b = run.module.state_dict(), own.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def fake_check(flat_from: int | None, log: list):
    """A check whose every layout passes from step `flat_from` on (fails before), honouring `until` as the real one."""
    def check(model, out, s, until, device="cpu", progress=False):
        step = int(out.name.split("_")[1]) if out.name.startswith("step_") else 0  # step 0: a temporary directory
        log.append(step)
        ok = flat_from is not None and step >= flat_from
        found = {}
        for name in ("prefix", "in-sequence", "held-out"):
            v = {"model": ARCH, "mean": 99.0 if ok else 60.0, "mean_ci": [98.0, 100.0], "gap": 0.0 if ok else 50.0,
                 "gap_ci": [0.0, 1.0] if ok else [45.0, 55.0], "detected_period": 1 if ok else 4, "retrieves": True,
                 "chance": 6.0, "exit_code": PASS if ok else FAIL}
            found[name] = v
            if until(v):
                break
        return found
    return check


@pytest.mark.parametrize("flat_from,stop,checked,stopped,first", [
    (4, True, [0, 2, 4], "flat", 4),  # stops at the first flat check
    (None, True, [0, 2, 4, 6, 8], "budget", None),  # never flat: the budget
    (4, False, [0, 2, 4, 6, 8], "budget", 4),  # --no-stop: the whole budget, the first flat step recorded
])
def test_stop_rule(base, tmp_path, monkeypatch, flat_from, stop, checked, stopped, first):
    log = []
    monkeypatch.setattr(pt, "check", fake_check(flat_from, log))
    before = files(base)
    rec = pt.posttrain(base, tmp_path / "out", pt.Settings(steps=8, every=2, stop=stop), progress=False, say=lambda _: 0)
    assert [c["step"] for c in rec["checks"]] == checked and (rec["stopped"], rec["steps_to_flat"]) == (stopped, first)
    assert rec["fraction"] == (None if first is None else first / 4)  # the base trained 4 steps
    assert read_trainer_state(latest_checkpoint(tmp_path / "out" / "model"))["step"] == checked[-1]
    assert json.loads((tmp_path / "out" / "posttrain.json").read_text())["after"] == f"checks/step_{checked[-1]:06d}"
    assert (tmp_path / "out" / "curve.png").stat().st_size > 0
    assert files(base) == before  # the base is never modified
    not_flat = [c for c in rec["checks"][1:-1] if not c["flat"]]
    assert all(list(c["layouts"]) == ["prefix"] for c in not_flat)  # a failing layout ends an intermediate check


def test_interrupted_run_continues(base, tmp_path, monkeypatch):
    """Interrupted after the check at step 2, the same command continues from there, training resumed exactly."""
    log = []
    check = fake_check(6, log)

    def interrupted(model, out, s, until, **kw):
        if out.name == "step_000004":
            raise KeyboardInterrupt
        return check(model, out, s, until, **kw)
    monkeypatch.setattr(pt, "check", interrupted)
    s = pt.Settings(steps=8, every=2)
    with pytest.raises(KeyboardInterrupt):
        pt.posttrain(base, tmp_path / "out", s, progress=False, say=lambda _: 0)
    monkeypatch.setattr(pt, "check", check)
    rec = pt.posttrain(base, tmp_path / "out", s, progress=False, say=lambda _: 0)
    assert [c["step"] for c in rec["checks"]] == [0, 2, 4, 6] and log == [0, 2, 4, 6] and rec["stopped"] == "flat"
    pt.posttrain(base, tmp_path / "ref", s, progress=False, say=lambda _: 0)  # uninterrupted
    a, b = (read_optimizer(latest_checkpoint(d / "model")) for d in (tmp_path / "out", tmp_path / "ref"))
    assert all(torch.equal(x["exp_avg"], y["exp_avg"]) for x, y in zip(a["optimizer"]["state"].values(),
                                                                         b["optimizer"]["state"].values(), strict=True))
    with pytest.raises(ConfigError, match="other settings"):  # the same OUT with other settings is refused
        pt.posttrain(base, tmp_path / "out", pt.Settings(steps=8, every=4), progress=False, say=lambda _: 0)


def test_mean_goal_with_a_reference():
    found = {"prefix": {"exit_code": PASS, "mean": 90.0}}
    assert pt.flat(found, ["prefix"], None) and pt.flat(found, ["prefix"], {"prefix": {"mean": 94.9}})
    assert not pt.flat(found, ["prefix"], {"prefix": {"mean": 95.1}})  # more than 5 points below full attention
    assert not pt.flat(found, ["prefix", "held-out"], None)  # a layout not run is not flat


def test_a_model_that_does_not_retrieve_is_refused_with_nothing_written(base, tmp_path, monkeypatch):
    monkeypatch.setattr(pt, "layouts", lambda em, task: [pt.Layout("prefix", {"task": "lookup", **SMALL})])
    with pytest.raises(DataError, match="does not retrieve") as e:
        pt.posttrain(base, tmp_path / "out", pt.Settings(steps=4), progress=False, say=lambda _: 0)
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,message", [
    (["{empty}", "--out", "{out}"], "not a phasekv run"),  # a directory that is no model
    (["{base}", "--out", "{out}", "--steps", "0"], "--steps 0"),  # a budget of 0
    (["{base}", "--out", "{base}/post"], "inside the base"),  # the base is never written to
])
def test_bad_inputs_refused_in_one_line(base, tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    fill = {"empty": tmp_path / "empty", "out": tmp_path / "out", "base": base}
    r = subprocess.run([sys.executable, "-m", "phasekv.cli", "posttrain", *(a.format(**fill) for a in args)], cwd=ROOT,
                       env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists() and not (base / "post").exists()


def test_refusals_raise_before_anything_is_read(base, tmp_path):
    with pytest.raises(CheckpointError):
        pt.refuse(tmp_path, tmp_path / "out")
    with pytest.raises(ConfigError, match="--every 0"):
        pt.Settings(steps=4, every=0)


def test_hf_continuation_starts_from_the_base_exactly(tmp_path):
    """A transformers DeepSeek-V4 run is continued with `--hf-model`, from its weights exactly, on its own data."""
    from phasekv.train.hfmodel import load_hf_model
    from tests.hf.tiny import v4_config, write_config

    cfg = write_config(v4_config(), tmp_path / "v4.json")
    base = tmp_path / "v4"
    train(hf_config=str(cfg), out=str(base), steps=1, val_every=0, gate_steps="none",
          **{**{k: v for k, v in FAST.items() if k != "preset"}, "batch_size": 2, "seq_len": 48, "seed": 3})
    tc = pt.continuation(base, tmp_path / "run", pt.Settings(steps=2, every=1))
    assert (tc.hf_model, tc.init_from, tc.seq_len, tc.seed, tc.data.recall.gap_prob) == (str(base), None, 48, 3, 0.5)
    run, _ = model_and_tokenizer(tc, resuming=False)
    a, b = run.module.state_dict(), load_hf_model(base).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
