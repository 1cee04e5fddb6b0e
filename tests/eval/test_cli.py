import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from phasekv import ModelConfig, PhaseLM
from phasekv.data.tokenizer import build_word_tokenizer, save_tokenizer
from phasekv.eval.cli import app
from tests.net import free_port

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--records", "12", "--demos", "2", "--modulus", "4", "--per-group", "16", "--filler", "8",
        "--mappings", "4", "--device", "cpu"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli") / "w4s4"
    tok = build_word_tokenizer()
    torch.manual_seed(0)
    PhaseLM(ModelConfig.from_name("w4s4-1kv", preset="tiny", vocab_size=tok.get_vocab_size())).save(d)
    save_tokenizer(tok, d)
    return d


def test_cli_lookup_writes_interface_files(model_dir, tmp_path):
    out = tmp_path / "o"
    res = CliRunner().invoke(app, ["lookup", "--model", str(model_dir), "--out", str(out), "--padding", "in-sequence",
                                   "--seed", "3", *ARGS])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    assert s["protocol"] == "in-sequence" and s["modulus"] == 4 and s["stride"] == 4 and len(s["groups"]) == 4
    assert s["provenance"]["seed"] == 3 and "gap" in res.output
    chance = 100 / s["provenance"]["word_pools"]["values"]  # the mean is read against naming a value at random
    assert re.search(rf"mean [\d.]+ \[[\d., ]+\]\s+\(chance\s+{chance:.1f}\)", res.output), res.output
    rows = pd.read_parquet(out / "results.parquet")
    assert len(rows) == 64 and set(rows["residue"]) == {0, 1, 2, 3}


def test_cli_rounds_up_with_notice(model_dir, tmp_path):
    args = [a if a != "16" else "10" for a in ARGS]
    res = CliRunner().invoke(app, ["lookup", "--model", str(model_dir), "--out", str(tmp_path), *args])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["per_group"] == 16 and s["per_group_requested"] == 10 and "rounded up" in s["design_notice"]


def test_cli_user_errors_exit_2(model_dir, tmp_path, monkeypatch, capsys):
    import phasekv.cli as cli

    for bad in (["--padding", "middle"], ["--model", str(tmp_path / "missing")]):
        args = ["eval", "lookup", "--model", str(model_dir), "--out", str(tmp_path / "x"), *ARGS, *bad]
        monkeypatch.setattr(sys, "argv", ["phasekv", *args])
        with pytest.raises(SystemExit) as exc:
            cli.main()
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.startswith("error: ") and "Traceback" not in err


def _rank_worker(rank, world, port, model_dir, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from phasekv.eval.models import load
    from phasekv.eval.prompts import lookup_config
    from phasekv.eval.run import run_retrieval

    cfg = lookup_config(records=12, demos=2, modulus=4, per_group=16, filler=8, mappings=4, padding="in-sequence")
    run_retrieval("lookup", load(model_dir), cfg, out, batch_size=8, progress=False)
    if world > 1:
        torch.distributed.destroy_process_group()


def test_two_rank_gloo_equals_one_rank(model_dir, tmp_path):
    import torch.multiprocessing as mp

    _rank_worker(0, 1, 0, model_dir, tmp_path / "one")
    mp.spawn(_rank_worker, args=(2, free_port(), model_dir, tmp_path / "two"), nprocs=2, join=True)
    a, b = (pd.read_parquet(tmp_path / d / "results.parquet") for d in ("one", "two"))
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-5)
    sa, sb = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two"))
    assert sa["groups"] == sb["groups"] and sa["gap"] == sb["gap"] and sb["provenance"]["world_size"] == 2


@pytest.mark.slow
def test_torchrun_cli_two_ranks_equals_one(model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    common = ["eval", "lookup", "--model", str(model_dir), "--padding", "in-sequence", *ARGS]
    one = subprocess.run([sys.executable, "-m", "phasekv.cli", *common, "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          "29533", "-m", "phasekv.cli", *common, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = (pd.read_parquet(tmp_path / d / "results.parquet") for d in ("one", "two"))
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-5)


def test_cli_needle_scales_records_with_the_context(model_dir, tmp_path):
    out = tmp_path / "needle"
    res = CliRunner().invoke(app, ["needle", "--model", str(model_dir), "--out", str(out), "--context", "1024",
                                   "--modulus", "4", "--per-group", "16", "--mappings", "4", "--device", "cpu",
                                   "--batch-size", "16"])
    assert res.exit_code == 0, res.output
    assert "125 records in 1024 tokens" in res.output  # 16,000 per 131,072 tokens
    s = json.loads((out / "summary.json").read_text())
    assert s["records"] == 125 and s["prompt_length"] == 1 + 1024 and s["n_prompts"] == 64


def test_text_mixture_run_is_evaluated_on_its_own_words(tmp_path):
    """`phasekv train --data python-docs --recall-mix P` with a BPE that splits the animals: its recall data and
    its lookup and needle prompts take the same single-token words of the BPE, reported in summary.json."""
    from phasekv.data.corpus import iter_corpus
    from phasekv.data.recall import RecallConfig, recall_words
    from phasekv.data.tokenizer import load_tokenizer, train_bpe
    from phasekv.train import train

    save_tokenizer(train_bpe(iter_corpus("python-docs"), vocab_size=1024, show_progress=False), tmp_path / "bpe")
    run = tmp_path / "run"
    train(out=str(run), data="python-docs", tokenizer=str(tmp_path / "bpe"), recall_mix=0.5, steps=2, preset="tiny",
          batch_size=4, seq_len=96, val_sequences=4, gate_probe=2, progress=False, threads=1,
          cache_dir=str(tmp_path / "cache"), workers=1)
    source, trained = recall_words(RecallConfig(), load_tokenizer(run / "tokenizer.json"))
    assert source == "vocab" and len(trained["keys"]) == 32
    for task, extra in (("lookup", ["--per-group", "16", "--modulus", "4", "--mappings", "4"]),
                        ("needle", ["--context", "256", "--per-group", "16", "--modulus", "4", "--mappings", "4"])):
        res = CliRunner().invoke(app, [task, "--model", str(run), "--out", str(tmp_path / task), "--device", "cpu",
                                       *extra])
        assert res.exit_code == 0, res.output
        words = json.loads((tmp_path / task / "summary.json").read_text())["provenance"]["words"]
        assert words["source"] == "vocab"
        if task == "lookup":  # the run's 32 recall keys and values, as it was trained on them
            assert (words["keys"], words["values"]) == (trained["keys"], trained["values"])
