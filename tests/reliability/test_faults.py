"""Nothing lost under faults: SIGKILL at chosen points of training, checkpoint writes, sweeps and evaluation,
then resume, gives the uninterrupted result bit for bit; a full disk leaves the previous state intact."""

import errno
import json
import shutil

import pandas as pd
import pytest
import torch

from phasekv.train import checkpoint as ck
from phasekv.train import train
from phasekv.train.checkpoint import latest_checkpoint, list_checkpoints

from .faults import KillPoint, kill_at
from .helpers import TINY, assert_same_weights, losses, run_cli, sweep_toml, weights

STEPS = dict(steps=8, ckpt_every=2)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    train(out=str(out), **STEPS, **TINY)
    return out


def _train(out):
    train(out=str(out), **STEPS, **TINY)


def _optimizer(run):
    return ck.read_optimizer(latest_checkpoint(run))["optimizer"]["state"]


KILLS = [
    # inside a training step
    KillPoint("phasekv.train.loop:loss_sum", 5, "after"),  # forward of step 5 done, no backward yet
    KillPoint("torch.optim:AdamW.step", 5, "after"),  # weights of step 5 updated, step not counted
    # during a checkpoint write (the second one, step 4)
    KillPoint("safetensors.torch:save_file", 2, "after", match="step_"),  # weights written, rest not
    KillPoint("phasekv.train.checkpoint:torch.save", 2, "after"),  # optimizer written, no trainer state
    KillPoint("phasekv.train.checkpoint:write_manifest", 2, "after"),  # complete, not yet renamed
    KillPoint("os:replace", 3, "after", match="checkpoints"),  # step 6 renamed into place, step 2 not pruned
    KillPoint("shutil:rmtree", 1, "before", match=".tmp-old"),  # step 2 moved aside for pruning, not deleted
    # logs and run files
    KillPoint("phasekv.train.loop:Logs._append", 4, torn=True),  # killed mid-append: a torn metrics row
    KillPoint("phasekv.train.loop:save_tokenizer", 1, "after"),  # before the run's config.json exists
]


@pytest.mark.parametrize("point", KILLS, ids=str)
def test_sigkill_then_resume_equals_uninterrupted(point, reference, tmp_path):
    run = tmp_path / "run"
    kill_at(point, _train, run)
    assert not (run / "done.json").exists()
    train(out=str(run), resume=True, **STEPS, **TINY)
    assert_same_weights(weights(reference), weights(run))
    assert losses(run) == losses(reference)  # every step logged once, same losses
    ref_opt, run_opt = _optimizer(reference), _optimizer(run)
    assert all(torch.equal(ref_opt[k]["exp_avg_sq"], run_opt[k]["exp_avg_sq"]) for k in ref_opt)
    assert [p.name for p in list_checkpoints(run)] == ["step_00000006", "step_00000008"]
    assert not list((run / "checkpoints").glob(".tmp-*"))


SWEEP = sweep_toml(steps=4, seeds=[42, 43])


def _sweep(path):
    from phasekv.train.sweep import run_sweep

    run_sweep(path)


@pytest.mark.parametrize("point", [KillPoint("phasekv.train.loop:train", 2, "before"),  # between the runs
                                   KillPoint("torch.optim:AdamW.step", 7, "after")],  # inside the second run
                         ids=str)
def test_sweep_killed_then_rerun_equals_uninterrupted(point, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ref.toml").write_text(SWEEP.format(root="ref"))
    (tmp_path / "s.toml").write_text(SWEEP.format(root="runs"))
    _sweep(tmp_path / "ref.toml")
    kill_at(point, _sweep, tmp_path / "s.toml", cwd=tmp_path)
    assert (tmp_path / "runs/w8s8-1kv/done.json").exists()
    assert not (tmp_path / "runs/w8s8-1kv-seed43/done.json").exists()
    _sweep(tmp_path / "s.toml")
    for alias in ("w8s8-1kv", "w8s8-1kv-seed43"):
        assert_same_weights(weights(tmp_path / "ref" / alias), weights(tmp_path / "runs" / alias))
        assert losses(tmp_path / "ref" / alias) == losses(tmp_path / "runs" / alias)


# ---- evaluation: interrupted, then re-run, gives the same summary.json --------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from phasekv import ModelConfig, PhaseLM
    from phasekv.data.tokenizer import build_word_tokenizer, save_tokenizer

    tok = build_word_tokenizer()
    d = tmp_path_factory.mktemp("model") / "w8s4"
    torch.manual_seed(1)
    PhaseLM(ModelConfig.from_name("w8s4-1kv", preset="tiny", vocab_size=tok.get_vocab_size())).save(d)
    save_tokenizer(tok, d)
    return d


EVAL = dict(records=10, demos=2, modulus=4, per_group=16, filler=8, mappings=4, padding="in-sequence")


def _evaluate(model_dir, out, flush_rows=None):
    import phasekv.eval.run as run_mod
    from phasekv.eval.models import load
    from phasekv.eval.prompts import lookup_config

    if flush_rows:
        run_mod.FLUSH_ROWS = flush_rows
    return run_mod.run_retrieval("lookup", load(model_dir), lookup_config(**EVAL), out, batch_size=8, progress=False)


def _stable(summary: dict) -> dict:
    s = json.loads(json.dumps(summary))
    s["provenance"].pop("seconds")
    return s


@pytest.mark.parametrize("point", [KillPoint("phasekv.eval.models:last_logits", 5, "before"),
                                   KillPoint("phasekv.eval.run:_flush", 3, "after"),
                                   KillPoint("phasekv.eval.run:write_json", 1, "after", match="summary.json")],
                         ids=str)
def test_eval_killed_then_rerun_gives_the_same_summary(point, model_dir, tmp_path):
    full = _stable(_evaluate(model_dir, tmp_path / "a"))
    kill_at(point, _evaluate, model_dir, tmp_path / "b", 8)
    if point.match != "summary.json":
        assert not (tmp_path / "b" / "summary.json").exists()
        assert list((tmp_path / "b" / ".partial").glob("rows-*.parquet"))
    again = _stable(_evaluate(model_dir, tmp_path / "b"))
    assert again == full
    assert _stable(json.loads((tmp_path / "b" / "summary.json").read_text())) == full
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / "results.parquet"),
                                  pd.read_parquet(tmp_path / "b" / "results.parquet"))


# ---- a full disk: the previous state stays, the error says so ---------------------------------------

def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_during_a_checkpoint_keeps_the_previous_one(reference, tmp_path, monkeypatch):
    real = ck.torch.save
    calls = {"n": 0}

    def fill_disk(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            with open(f, "wb") as fh:
                fh.write(b"\0" * 100)
            _enospc()
        return real(obj, f, *a, **k)

    monkeypatch.setattr(ck.torch, "save", fill_disk)
    run = tmp_path / "run"
    with pytest.raises(OSError, match=r"no space left on device while writing checkpoint step_00000004; "
                                      r"the previous checkpoint \(step_00000002\) is intact") as exc:
        train(out=str(run), **STEPS, **TINY)
    assert exc.value.errno == errno.ENOSPC
    assert [p.name for p in list_checkpoints(run)] == ["step_00000002"]
    assert not list((run / "checkpoints").glob(".tmp-*"))  # the partial write is removed (space freed)
    monkeypatch.setattr(ck.torch, "save", real)
    train(out=str(run), resume=True, **STEPS, **TINY)
    assert_same_weights(weights(reference), weights(run))


def test_full_disk_from_the_cli_is_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.setattr(ck.torch, "save", _enospc)
    code, _, err = run_cli("train", "--out", tmp_path / "run", "--steps", "2", "--batch-size", "4", "--seq-len", "64",
                           "--val-sequences", "4", "--gate-probe", "2", "--gate-steps", "none", "--no-progress")
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "no space left on device while writing checkpoint step_00000002" in err
    assert not (tmp_path / "run" / "done.json").exists()


def test_full_disk_when_saving_a_model_keeps_the_old_files(model_dir, tmp_path, monkeypatch):
    from phasekv import PhaseLM
    from phasekv.model import io

    d = tmp_path / "m"
    shutil.copytree(model_dir, d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    monkeypatch.setattr(io, "save_file", lambda *a, **k: _enospc())
    with pytest.raises(OSError, match=r"no space left on device; model\.safetensors was left as it was") as exc:
        PhaseLM.load(d).save(d)
    assert str(d / "model.safetensors") in str(exc.value)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # nothing changed, no temp files


def test_full_disk_when_writing_eval_results_keeps_partial_rows(model_dir, tmp_path, monkeypatch):
    import phasekv.eval.run as run_mod

    full = _stable(_evaluate(model_dir, tmp_path / "a"))
    monkeypatch.setattr(pd.DataFrame, "to_parquet", lambda self, path, **k: _enospc() if "results" in str(path)
                        else pd.DataFrame.__dict__["_real_to_parquet"](self, path, **k), raising=True)
    monkeypatch.setattr(pd.DataFrame, "_real_to_parquet", run_mod.pd.io.parquet.to_parquet, raising=False)
    with pytest.raises(OSError, match="no space left on device; results.parquet"):
        _evaluate(model_dir, tmp_path / "b", 8)
    assert not (tmp_path / "b" / "summary.json").exists() and not (tmp_path / "b" / "results.parquet").exists()
    assert list((tmp_path / "b" / ".partial").glob("rows-*.parquet"))
    monkeypatch.undo()
    assert _stable(_evaluate(model_dir, tmp_path / "b")) == full


def test_full_disk_while_logging_metrics_loses_no_step(reference, tmp_path, monkeypatch):
    from phasekv.train import loop

    real, calls = loop.Logs._append, {"n": 0}

    def append(self, name, rows):
        calls["n"] += 1
        if calls["n"] == 6:
            with open(self.out / name, "a") as f:
                f.write('{"step": 6, "lo')
            _enospc()
        return real(self, name, rows)

    monkeypatch.setattr(loop.Logs, "_append", append)
    run = tmp_path / "run"
    with pytest.raises(OSError, match="No space left"):
        train(out=str(run), **STEPS, **TINY)
    monkeypatch.setattr(loop.Logs, "_append", real)
    train(out=str(run), resume=True, **STEPS, **TINY)
    assert losses(run) == losses(reference)
    assert_same_weights(weights(reference), weights(run))
