"""`phasekv train --hf-config` / `--hf-model`: transformers causal LMs with phasekv's data, loop and checkpoints."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from phasekv.errors import CheckpointError, ConfigError
from phasekv.train import load_run, train
from phasekv.train.checkpoint import latest_checkpoint
from phasekv.train.hfmodel import hf_weights_dir, load_hf_model
from tests.hf.tiny import qwen3_config, v4_config, write_config
from tests.train.helpers import FAST, final_weights, kill_at_first_checkpoint, phasekv

OPTS = {**{k: v for k, v in FAST.items() if k != "preset"}, "batch_size": 2, "seq_len": 48}


@pytest.fixture(scope="module")
def v4_json(tmp_path_factory):
    return write_config(v4_config(), tmp_path_factory.mktemp("cfg") / "config.json")


def test_v4_run_writes_save_pretrained_checkpoints_and_gate_snapshots(v4_json, tmp_path):
    out = tmp_path / "run"
    s = train(hf_config=str(v4_json), out=str(out), steps=3, ckpt_every=3, val_every=0, gate_steps="1,3", **OPTS)
    assert s["name"] == f"deepseek_v4:{v4_json.parent.name}" and s["steps"] == 3
    ckpt = latest_checkpoint(out)
    hf = AutoModelForCausalLM.from_pretrained(ckpt, local_files_only=True, use_safetensors=True)
    assert type(hf).__name__ == "DeepseekV4ForCausalLM"
    assert AutoTokenizer.from_pretrained(ckpt).vocab_size == json.loads((out / "config.json").read_text())[
        "tokenizer"]["vocab_size"]
    ids = torch.randint(0, 200, (1, 20))
    model, _ = load_run(out)  # a run of a transformers model loads as that model
    assert torch.equal(model(ids).logits, hf.eval()(ids).logits)
    rows = [json.loads(r) for r in (out / "gates.jsonl").read_text().splitlines()]
    assert {(r["step"], r["layer"], r["branch"], r["window"], r["stride"]) for r in rows} == {
        (s, 0, "key", 8, 4) for s in (1, 3)} | {(s, 0, "indexer", 8, 4) for s in (1, 3)} | {
        (s, 1, "key", 8, 8) for s in (1, 3)}
    # continue from its weights with a fresh optimizer
    s2 = train(hf_model=str(ckpt), out=str(tmp_path / "more"), steps=1, val_every=0, gate_steps="none", **OPTS)
    assert s2["name"] == f"deepseek_v4:{ckpt.name}"
    # or from the run itself (its latest checkpoint): a chain of runs, each continuing the one before
    assert hf_weights_dir(out) == ckpt and torch.equal(load_hf_model(out).eval()(ids).logits, hf(ids).logits)
    s3 = train(hf_model=str(out), out=str(tmp_path / "chained"), steps=1, val_every=0, gate_steps="none", **OPTS)
    assert s3["name"] == f"deepseek_v4:{out.name}" and s3["steps"] == 1


def test_sigkill_then_resume_is_bitwise_identical(v4_json, tmp_path):
    opts = dict(OPTS, hf_config=str(v4_json), steps=8, ckpt_every=2, val_every=0, gate_steps="none")
    ref = tmp_path / "ref"
    train(out=str(ref), **opts)
    run = tmp_path / "killed"
    kill_at_first_checkpoint(opts, run)
    killed_at = json.loads((latest_checkpoint(run) / "trainer_state.json").read_text())["step"]
    assert killed_at < 8
    train(out=str(run), resume=True, **opts)
    a, b = final_weights(ref), final_weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_qwen3_config_trains_and_resumes(tmp_path):
    cfg = write_config(qwen3_config(), tmp_path / "qwen3.json")
    out = tmp_path / "q"
    opts = dict(OPTS, hf_config=str(cfg), ckpt_every=2, val_every=0, gate_steps="none")
    train(out=str(out), steps=2, **opts)
    s = train(out=str(out), steps=4, resume=True, **opts)
    assert s["steps"] == 4 and (out / "done.json").is_file()
    assert not (out / "gates.jsonl").exists()  # no compressors, no gate snapshots


def test_configs_it_cannot_train_give_one_line_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ConfigError, match="has no model_type"):
        train(hf_config=str(bad), out=str(tmp_path / "a"), steps=1, **OPTS)
    bad.write_text(json.dumps({"model_type": "t5", "vocab_size": 600}))
    with pytest.raises(ConfigError, match="model_type='t5' has no causal LM"):
        train(hf_config=str(bad), out=str(tmp_path / "b"), steps=1, **OPTS)
    small = write_config(v4_config(vocab=64), tmp_path / "small.json")
    with pytest.raises(ConfigError, match="vocab_size=64 .* set vocab_size >= "):
        train(hf_config=str(small), out=str(tmp_path / "c"), steps=1, **OPTS)
    with pytest.raises(ConfigError, match="one of --hf-config, --hf-model and --init-from"):
        train(hf_config=str(small), hf_model=str(tmp_path), out=str(tmp_path / "d"), steps=1, **OPTS)
    with pytest.raises(CheckpointError, match="--hf-model"):
        train(hf_model=str(tmp_path), out=str(tmp_path / "e"), steps=1, **OPTS)
    (tmp_path / "unfinished" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="--hf-model: .*no complete checkpoint"):
        train(hf_model=str(tmp_path / "unfinished"), out=str(tmp_path / "g"), steps=1, **OPTS)
    r = phasekv("train", "--hf-config", str(tmp_path / "missing.json"), "--out", str(tmp_path / "f"))
    assert r.returncode != 0 and "not found" in r.stderr and "Traceback" not in r.stderr
