"""The run directory, `load_run`, gate snapshots, `--init-from`, the CLI."""

import json

import pytest
import torch

from phasekv import PhaseLM
from phasekv.data import RecallConfig, RecallStream, batch, build_word_tokenizer
from phasekv.data.recall import recall_tokenizer
from phasekv.errors import CheckpointError, ConfigError
from phasekv.train import load_run, train
from phasekv.train.checkpoint import latest_checkpoint
from phasekv.train.config import TrainConfig

from .helpers import FAST


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "w8s8"
    train(out=str(out), **dict(FAST, arch="w8s8-1kv", steps=6, ckpt_every=3, val_every=3))
    return out


def test_run_directory(run_dir):
    names = {p.name for p in run_dir.iterdir()}
    assert {"config.json", "tokenizer.json", "metrics.jsonl", "gates.jsonl", "checkpoints", "done.json"} <= names
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["name"] == "W8/S8 · 1 KV" and cfg["model"]["vocab_size"] == recall_tokenizer(RecallConfig()).get_vocab_size()
    rows = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7))
    val = [r for r in rows if "val_accuracy" in r]
    assert [r["step"] for r in val] == [3, 6] and len(val[0]["val_by_residue"]) == 24
    done = json.loads((run_dir / "done.json").read_text())
    assert done["steps"] == 6 and done["final_loss"] == rows[-2]["loss"]


def test_gate_snapshots(run_dir):
    rows = [json.loads(r) for r in (run_dir / "gates.jsonl").read_text().splitlines()]
    steps = sorted({r["step"] for r in rows})
    assert steps[0] == 1 and steps[-1] == 6 and steps == sorted(TrainConfig(steps=6).gate_schedule())
    per_step = [r for r in rows if r["step"] == 1]
    assert {(r["layer"], r["branch"]) for r in per_step} == {(0, "key"), (0, "value"), (1, "key"), (1, "value")}
    for r in rows:
        assert 1 <= r["per_window"] <= 8 + 1e-4 and 1 <= r["static"] <= 8 + 1e-4


def test_log_spaced_schedule():
    s = sorted(TrainConfig(steps=1500).gate_schedule())
    assert s[:3] == [1, 2, 3] and s[-1] == 1500 and len(s) > 15
    assert sorted(TrainConfig(steps=100, gate_steps="1,50,500").gate_schedule()) == [1, 50]
    assert TrainConfig(gate_steps="none").gate_schedule() == set()
    with pytest.raises(ConfigError, match="gate_steps"):
        TrainConfig(gate_steps="often")


def test_load_run_accepts_run_checkpoint_and_model_dirs(run_dir, tmp_path):
    model, tok = load_run(run_dir)
    ckpt = latest_checkpoint(run_dir)
    assert ckpt.name == "step_00000006" and not model.training
    m2, tok2 = load_run(ckpt)
    saved = tmp_path / "saved"
    model.save(saved)
    m3, tok3 = load_run(saved)  # no tokenizer.json: the default recall layout's word tokenizer (same size)
    ids = batch(RecallStream(recall_tokenizer(RecallConfig()), seed=0), 0, 2)["input_ids"]
    with torch.no_grad():
        ref = model(ids)
        assert torch.equal(ref, m2(ids)) and torch.equal(ref, m3(ids))
    assert tok("cat Alice").input_ids == tok3("cat Alice").input_ids == [1, tok.convert_tokens_to_ids("cat"),
                                                                         tok.convert_tokens_to_ids("Alice")]
    with pytest.raises(CheckpointError, match="not a phasekv run"):
        load_run(tmp_path)
    with pytest.raises(CheckpointError, match="not found"):
        load_run(tmp_path / "absent")


def test_load_run_hf_dir(tmp_path):
    from phasekv import ModelConfig

    m = PhaseLM(ModelConfig.from_name("full-1kv", preset="tiny", vocab_size=528))
    m.to_hf().save_pretrained(tmp_path / "hf")
    build_word_tokenizer().save(str(tmp_path / "hf" / "tokenizer.json"))
    model, tok = load_run(tmp_path / "hf")
    assert isinstance(model, PhaseLM) and model.config.name == "Full attention · 1 KV"
    ids = torch.tensor([[1, 40, 212]])
    with torch.no_grad():
        assert torch.allclose(model(ids), m(ids), atol=1e-5)


def test_init_from_continues_other_data(run_dir, tmp_path):
    out = tmp_path / "post"
    s = train(out=str(out), init_from=str(run_dir), **dict(FAST, steps=2, val_every=0, gate_steps="none",
                                                             recall={"min_records": 2, "max_records": 4}))
    assert s["name"] == "W8/S8 · 1 KV" and s["steps"] == 2
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["train"]["init_from"] == str(run_dir) and cfg["train"]["data"]["recall"]["max_records"] == 4
    with pytest.raises(ConfigError, match="differs from --init-from"):  # a design to another design
        train(out=str(tmp_path / "x"), init_from=str(run_dir), arch="w8s4-1kv", **dict(FAST, steps=1))


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """Run `phasekv ARGS` in-process through the console entry point; (exit code, stderr)."""
    from phasekv.cli import main

    monkeypatch.setattr("sys.argv", ["phasekv", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    return exc.value.code, capsys.readouterr().err


def test_cli_errors_are_one_line(monkeypatch, capsys, tmp_path):
    code, err = cli(monkeypatch, capsys, "train", "--arch", "W8/S9 · 1 KV", "--out", str(tmp_path / "a"))
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err and "stride" in err
    code, err = cli(monkeypatch, capsys, "train", "--data", str(tmp_path / "*.txt"), "--tokenizer", "word",
                    "--out", str(tmp_path / "b"))
    assert code == 2 and "no files match" in err
