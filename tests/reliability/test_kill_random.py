"""The slow variant of the fault suite (`make test-slow`): real `phasekv` processes SIGKILLed at random
moments (inside steps, during checkpoint writes, between sweep runs, mid-evaluation), restarted until they
finish; the result must equal an uninterrupted run bit for bit."""

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from phasekv.train import train

from .helpers import ROOT, TINY, assert_same_weights, env, losses, sweep_toml, weights

pytestmark = pytest.mark.slow
KILLS = 5


def _cli_args(opts: dict) -> list[str]:
    out = []
    for k, v in opts.items():
        flag = "--" + k.replace("_", "-")
        out += [f"--no-{k.replace('_', '-')}"] if v is False else [flag] if v is True else [flag, str(v)]
    return out


def _until_done(argv: list[str], done, started, rng: random.Random, cwd: Path) -> int:
    """Run `phasekv ARGV` again and again, SIGKILLing the first KILLS attempts at a random moment after
    `started()` turns true; returns the number of kills that landed."""
    landed = 0
    for attempt in range(KILLS + 3):
        proc = subprocess.Popen([sys.executable, "-m", "phasekv.cli", *argv], cwd=cwd, env=env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if attempt < KILLS:
            deadline = time.time() + 120
            while not started() and proc.poll() is None and time.time() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 0.8))
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
        landed += proc.returncode == -signal.SIGKILL
        assert proc.returncode in (0, -signal.SIGKILL), err.decode()
        if done():
            return landed
    raise AssertionError("never finished")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_killed_at_random_moments(seed, tmp_path):
    opts = dict(TINY, steps=40, ckpt_every=3, keep_checkpoints=2)
    train(out=str(tmp_path / "ref"), **opts)
    run = tmp_path / "run"
    argv = ["train", *_cli_args({**opts, "out": run}), "--resume"]
    landed = _until_done(argv, lambda: (run / "done.json").exists(), lambda: (run / "metrics.jsonl").exists(),
                         random.Random(seed), ROOT)
    assert landed >= 1
    assert_same_weights(weights(tmp_path / "ref"), weights(run))
    assert losses(tmp_path / "ref") == losses(run)


def test_sweep_killed_at_random_moments(tmp_path):
    sweep = sweep_toml(steps=15, seeds=[42, 43, 44])
    (tmp_path / "ref.toml").write_text(sweep.format(root="ref"))
    (tmp_path / "s.toml").write_text(sweep.format(root="runs"))
    aliases = ["w8s8-1kv", "w8s8-1kv-seed43", "w8s8-1kv-seed44"]
    subprocess.run([sys.executable, "-m", "phasekv.cli", "sweep", "run", "ref.toml"], cwd=tmp_path, env=env(),
                   check=True, capture_output=True)
    runs = tmp_path / "runs"
    landed = _until_done(["sweep", "run", "s.toml"], lambda: all((runs / a / "done.json").exists() for a in aliases),
                         lambda: runs.exists(), random.Random(7), tmp_path)
    assert landed >= 1
    for a in aliases:
        assert_same_weights(weights(tmp_path / "ref" / a), weights(runs / a))
        assert losses(tmp_path / "ref" / a) == losses(runs / a)


def test_evaluation_killed_at_random_moments(tmp_path):
    import torch

    from phasekv import ModelConfig, PhaseLM
    from phasekv.data.tokenizer import build_word_tokenizer, save_tokenizer

    tok = build_word_tokenizer()
    torch.manual_seed(0)
    PhaseLM(ModelConfig.from_name("w8s4-1kv", preset="tiny", vocab_size=tok.get_vocab_size())).save(tmp_path / "m")
    save_tokenizer(tok, tmp_path / "m")
    args = ["--model", tmp_path / "m", "--device", "cpu", "--records", "24", "--demos", "2", "--modulus", "4",
            "--per-group", "256", "--filler", "24", "--mappings", "4", "--batch-size", "16"]
    args = [str(a) for a in args]
    subprocess.run([sys.executable, "-m", "phasekv.cli", "eval", "lookup", *args, "--out", str(tmp_path / "ref")],
                   cwd=ROOT, env=env(), check=True, capture_output=True)
    out = tmp_path / "out"
    landed = _until_done(["eval", "lookup", *args, "--out", str(out)], lambda: (out / "summary.json").exists(),
                         lambda: (out / ".partial").exists(), random.Random(3), ROOT)
    assert landed >= 1
    a, b = (json.loads((d / "summary.json").read_text()) for d in (tmp_path / "ref", out))
    a["provenance"].pop("seconds"), b["provenance"].pop("seconds")
    assert a == b
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "ref/results.parquet"), pd.read_parquet(out / "results.parquet"))
