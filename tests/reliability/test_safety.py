"""Safe loading: weights only through safetensors, no pickle of files this run did not write (and the one
torch.load uses weights_only=True), trust_remote_code never implied, config paths stay inside."""

import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

from phasekv.errors import CheckpointError, ConfigError
from phasekv.train import checkpoint as ck
from phasekv.train import load_run, train
from phasekv.train.checkpoint import latest_checkpoint

from .helpers import ROOT, TINY

SOURCES = sorted((ROOT / "phasekv").rglob("*.py"))


class _Evil:
    """Unpickling this runs a shell command that leaves a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _calls(pattern: str):
    for f in SOURCES:
        text = f.read_text()
        for m in re.finditer(pattern, text):
            end = text.find(")\n", m.start())  # the whole call, across continuation lines
            yield f.relative_to(ROOT), text[m.start():end + 1]


def test_no_pickle_anywhere_in_the_package():
    for f in SOURCES:
        text = f.read_text()
        assert not re.search(r"^\s*(import pickle|from pickle|import dill|import joblib)", text, re.M), f
        assert "allow_pickle=True" not in text, f
        assert "trust_remote_code=True" not in text, f


def test_every_torch_load_is_weights_only():
    calls = list(_calls(r"torch\.load\("))
    assert calls, "expected the optimizer-state load"
    for where, call in calls:
        assert "weights_only=True" in call, f"{where}: {call}"


def test_every_hugging_face_model_load_is_local_safetensors_without_remote_code():
    calls = list(_calls(r"AutoModel\w*\.from_pretrained\("))
    assert len(calls) >= 1  # the one loader (phasekv.train.run.open_model) behind every --model flag and load_run
    for where, call in calls:
        assert "use_safetensors=True" in call and "local_files_only=True" in call, f"{where}: {call}"
        assert "trust_remote_code=" in call, f"{where}: {call}"  # passed explicitly, from an opt-in flag


def test_trust_remote_code_is_opt_in_on_every_command():
    from typer.main import get_command

    from phasekv import cli

    mounted = list(cli.app.registered_commands), list(cli.app.registered_groups)
    cli._mount()
    group = get_command(cli.app)
    cli.app.registered_commands[:], cli.app.registered_groups[:] = mounted
    seen = 0

    def walk(cmd):
        nonlocal seen
        for p in getattr(cmd, "params", []):
            if "trust_remote_code" in (p.name or ""):
                assert p.default is False, f"{cmd.name}: --trust-remote-code defaults to {p.default}"
                seen += 1
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(group)
    assert seen >= 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("safe") / "run"
    train(out=str(out), steps=2, **TINY)
    return out


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_malicious_optimizer_pickle_is_refused(run, tmp_path):
    marker = tmp_path / "pwned"
    bad = tmp_path / "optimizer.pt"
    with open(bad, "wb") as f:
        pickle.dump({"optimizer": _Evil(marker)}, f)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(latest_checkpoint(run), ckpt)
    shutil.copy(bad, ckpt / ck.OPTIM_FILE)
    with pytest.raises(CheckpointError, match=r"optimizer.pt: unreadable optimizer state.*Weights only load failed"):
        ck.read_optimizer(ckpt)
    assert not marker.exists()


def test_resume_refuses_a_malicious_optimizer_even_with_a_matching_manifest(run, tmp_path):
    """Checksums catch corruption, not attacks (an attacker rewrites the manifest too): weights_only does."""
    from phasekv.model.manifest import write_manifest

    victim = tmp_path / "run"
    shutil.copytree(run, victim)
    ckpt = latest_checkpoint(victim)
    marker = tmp_path / "pwned"
    torch.save({"optimizer": _Evil(marker), "rng": {}}, ckpt / ck.OPTIM_FILE)
    write_manifest(ckpt, ["model.safetensors", "config.json", ck.OPTIM_FILE, ck.STATE_FILE])
    with pytest.raises(CheckpointError, match="optimizer.pt: unreadable optimizer state"):
        train(out=str(victim), resume=True, steps=4, **TINY)
    assert not marker.exists()


def _hf_dir(d: Path, **extra) -> Path:
    from transformers import Qwen3Config

    d.mkdir()
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, intermediate_size=64)
    cfg.save_pretrained(d)
    if extra:
        data = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**data, **extra}))
    return d


def test_pickled_hugging_face_weights_are_never_loaded(tmp_path):
    from phasekv.eval.models import load

    d = _hf_dir(tmp_path / "hf")
    marker = tmp_path / "pwned"
    torch.save({"model.embed_tokens.weight": _Evil(marker)}, d / "pytorch_model.bin")
    for loader in (load_run, load):
        with pytest.raises(CheckpointError, match="not a loadable Hugging Face causal LM"):
            loader(d)
    assert not marker.exists()


def test_remote_code_in_a_model_directory_is_not_run(tmp_path):
    from phasekv.eval.models import load

    marker = tmp_path / "pwned"
    d = _hf_dir(tmp_path / "hf", auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"},
                model_type="evil")
    (d / "modeling_evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    with pytest.raises(CheckpointError, match="trust-remote-code|not a loadable"):
        load(d)
    with pytest.raises(CheckpointError):
        load_run(d)
    assert not marker.exists()


def test_sweep_paths_cannot_leave_the_working_directory(tmp_path, monkeypatch):
    from phasekv.train.sweep import load_sweep

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for root in ("../outside", "/tmp/phasekv-outside", "runs/../../outside", ""):
        f = work / "s.toml"
        f.write_text(f'[defaults]\nout_root = "{root}"\n[[run]]\narch = "w8s8-1kv"\n')
        with pytest.raises(ConfigError, match="out_root"):
            load_sweep(f)
    f.write_text('[defaults]\nout_root = "runs/cpu"\n[[run]]\narch = "w8s8-1kv"\n')
    (run,) = load_sweep(f)
    assert (work / run.out).resolve().is_relative_to(work.resolve())
    assert not (tmp_path / "outside").exists()
