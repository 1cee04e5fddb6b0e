"""A clear answer to every bad input: one table of bad inputs across the CLI and the Python API.

Each CLI case must exit non-zero (2) with ONE stderr line `error: ...` that names the problem (the regex),
print no traceback, and leave no output file that looks complete. Each API case must raise a PhaseKVError
(ConfigError / DataError / CheckpointError) with a one-line message naming the problem.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.data.tokenizer import build_word_tokenizer, save_tokenizer, train_bpe
from phasekv.errors import PhaseKVError

from .helpers import COMPLETE, TINY, files, run_cli, run_cli_process

TOK = build_word_tokenizer()
V = TOK.get_vocab_size()
SWEEP_HEAD = '[defaults]\npreset = "tiny"\nsteps = 2\nout_root = "runs"\n'


def _save(model_cfg: ModelConfig, d: Path) -> Path:
    torch.manual_seed(0)
    PhaseLM(model_cfg).save(d)
    save_tokenizer(TOK, d)
    return d


@pytest.fixture(scope="module")
def d(tmp_path_factory) -> Path:
    """Every bad file the table points at, made once."""
    from phasekv.train import train

    d = tmp_path_factory.mktemp("bad")
    good = _save(ModelConfig.from_name("w8s8-1kv", preset="tiny", vocab_size=V), d / "model")
    _save(ModelConfig.from_name("w8s8-1kv", preset="tiny", vocab_size=V, max_seq_len=64), d / "short")
    weights = (good / "model.safetensors").read_bytes()
    cfg = json.loads((good / "config.json").read_text())

    def model_dir(name: str, config=cfg, weights_bytes=weights) -> Path:
        m = d / name
        m.mkdir()
        (m / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        if weights_bytes is not None:
            (m / "model.safetensors").write_bytes(weights_bytes)
        save_tokenizer(TOK, m)
        return m

    model_dir("no_weights", weights_bytes=None)
    model_dir("truncated", weights_bytes=weights[: len(weights) // 2])
    model_dir("garbage", weights_bytes=b"\x89not a safetensors file" * 10)
    model_dir("empty_weights", weights_bytes=b"")
    model_dir("bad_json", config="{config: 1,")
    model_dir("v99", config={**cfg, "config_version": 99})
    model_dir("unknown_field", config={**cfg, "colour": "blue"})
    model_dir("other_shape", config={**cfg, "n_layers": 3})
    model_dir("list_config", config="[1, 2, 3]")
    bad_tok = model_dir("bad_tokenizer")
    (bad_tok / "tokenizer.json").write_text("{not a tokenizer")
    hf = d / "hf_no_weights"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                                                "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
                                                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                                                "intermediate_size": 64}))
    # tokenizers: one lacking the animal key words, one that is not a tokenizer
    save_tokenizer(build_word_tokenizer(lists=("names", "filler")), d / "no_animals.json")
    save_tokenizer(train_bpe(["the quick brown fox jumps"] * 20, vocab_size=280, show_progress=False), d / "bpe.json")
    (d / "not_a_tokenizer.json").write_text("[]")
    # corpora
    (d / "empty.txt").write_text("   \n\n")
    (d / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (d / "bad.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    (d / "notext.jsonl").write_text('{"body": "no text field"}\n')
    (d / "data.csv").write_text("text\nhello\n")
    import pandas as pd

    pd.DataFrame({"body": ["x"]}).to_parquet(d / "notext.parquet")
    (d / "emptydir").mkdir()
    # sweep files
    sweeps = {
        "typo": SWEEP_HEAD + '[[run]]\narch = "w8s8-1kv"\nstpes = 3\n',
        "duplicate": SWEEP_HEAD + '[[run]]\narch = "w8s8-1kv"\n[[run]]\narch = "W8/S8 · 1 KV"\n',
        "invalid": SWEEP_HEAD + '[[run]\narch = "w8s8-1kv"\n',
        "noarch": SWEEP_HEAD + '[[run]]\nlr = 0.001\n',
        "badtable": '[default]\nsteps = 2\n[[run]]\narch = "w8s8-1kv"\n',
        "escape": '[defaults]\nout_root = "../../escaped"\n[[run]]\narch = "w8s8-1kv"\n',
        "absolute": '[defaults]\nout_root = "/tmp/phasekv-escaped"\n[[run]]\narch = "w8s8-1kv"\n',
        "badseed": SWEEP_HEAD + '[[run]]\narch = "w8s8-1kv"\nseeds = ["a"]\n',
        "badarch": SWEEP_HEAD + '[[run]]\narch = "W8/S8 · 1 KV · banana"\n',
        "norun": SWEEP_HEAD,
        "outkey": SWEEP_HEAD + '[[run]]\narch = "w8s8-1kv"\nout = "/etc"\n',
        "negative": SWEEP_HEAD + '[[run]]\narch = "w8s8-1kv"\nbatch_size = -4\n',
    }
    for name, text in sweeps.items():
        (d / f"{name}.toml").write_text(text)
    (d / "latin1.toml").write_bytes(b'[defaults]\nx = "\xe9"\n')
    # runs: a finished one, one whose config is corrupt, one without checkpoints
    train(out=str(d / "run"), steps=2, **TINY)
    (d / "run_bad_config").mkdir()
    (d / "run_bad_config" / "config.json").write_text("{oops")
    (d / "run_empty" / "checkpoints").mkdir(parents=True)
    (d / "hf_pickle").mkdir()
    (d / "hf_pickle" / "config.json").write_text((hf / "config.json").read_text())
    (d / "hf_pickle" / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    return d


LOOKUP = ["eval", "lookup", "--model", "{d}/model", "--out", "{out}", "--device", "cpu", "--records", "10",
          "--demos", "2", "--modulus", "4", "--per-group", "16", "--filler", "8", "--mappings", "4"]
TRAIN = ["train", "--out", "{out}", "--steps", "2", "--batch-size", "4", "--seq-len", "64", "--no-progress"]


def lookup(**changes) -> list[str]:
    args = list(LOOKUP)
    for k, v in changes.items():
        flag = "--" + k.replace("_", "-")
        if flag in args:
            args[args.index(flag) + 1] = str(v)
        else:
            args += [flag, str(v)]
    return args


# (id, argv, what the one-line error must say)
CLI_CASES = [
    # --- model names and impossible configs ---
    ("name-unknown-part", ["info", "W8/S8 · 1 KV · banana"], r"unknown part 'banana'.*known attributes"),
    ("name-empty", ["info", ""], r"empty model name"),
    ("name-garbage", ["info", "%%%"], r"cannot parse model name '%%%'"),
    ("name-stride-gt-window", ["info", "W8/S9 · 1 KV"], r"stride=9.*1 <= S <= W=8"),
    ("name-zero-stride", ["info", "w8s0-1kv"], r"stride=0"),
    ("name-zero-window", ["info", "W0/S0 · 1 KV"], r"window=0 must be >= 1; full attention is named"),
    ("name-zero-window-alias", ["info", "w0s0-1kv"], r"window=0 must be >= 1; full attention is named"),
    ("name-negative-window", ["info", "W-8/S8 · 1 KV"], r"window=-8 must be >= 1; full attention is named"),
    ("name-negative-stride-alias", ["info", "w8s-2-1kv"], r"stride=-2 must be >= 1; full attention is named"),
    ("name-v4-bad-window", ["info", "W8/S2 · 1 KV · V4 compressor"], r"window=8: the V4 compressor needs W = S"),
    ("name-slot-bias-without-v4", ["info", "W8/S8 · 1 KV · no slot bias"], r"'no slot bias' needs the V4 compressor"),
    ("name-kv-not-dividing", ["info", "W8/S8 · 3 KV"], r"n_kv_heads=3.*divide n_heads=4"),
    ("name-zero-kv", ["info", "W8/S8 · 0 KV"], r"n_kv_heads=0.*positive"),
    ("name-repeat", ["info", "w8s8-1kv-norope-norope"], r"repeats 'norope'"),
    ("name-full-with-gates", ["info", "Full attention · 1 KV · vector gates"], r"gate=.*compression attribute"),
    ("name-odd-rope", ["info", "W8/S8 · 1 KV · RoPE on 7 dims"], r"rope_dims=7.*even"),
    ("name-rope-too-wide", ["info", "W8/S8 · 1 KV · RoPE on 64 dims"], r"rope_dims=64.*head_dim=32"),
    ("name-uniform-nobias", ["info", "W8/S8 · 1 KV · uniform averaging · no gate bias"], r"gate_bias.*uniform"),
    ("name-local-window-0", ["info", "W8/S8 · 1 KV · local window 0"], r"local_window=0"),
    ("preset-unknown", ["info", "w8s8-1kv", "--preset", "huge"], r"unknown preset 'huge'.*tiny"),
    ("vocab-zero", ["info", "w8s8-1kv", "--vocab-size", "0"], r"vocab_size=0"),
    ("info-context-zero", ["info", "w8s8-1kv", "--context", "0"], r"--context.*>= 1"),
    ("smoke-tokens-zero", ["smoke", "--tokens", "0"], r"--tokens 0 and --decode 64 must be >= 1"),
    ("smoke-decode-negative", ["smoke", "--decode", "-1"], r"--decode -1 must be >= 1"),
    # --- weights and model directories ---
    ("model-missing", lookup(model="{d}/nowhere"), r"not found.*nowhere"),
    ("model-no-weights", lookup(model="{d}/no_weights"), r"no_weights/model.safetensors: weights file missing"),
    ("model-truncated", lookup(model="{d}/truncated"), r"truncated/model.safetensors: unreadable safetensors"),
    ("model-garbage", lookup(model="{d}/garbage"), r"garbage/model.safetensors: unreadable safetensors"),
    ("model-empty-weights", lookup(model="{d}/empty_weights"), r"empty_weights/model.safetensors: unreadable"),
    ("model-bad-json", lookup(model="{d}/bad_json"), r"bad_json/config.json: not valid JSON"),
    ("model-other-version", lookup(model="{d}/v99"), r"config_version 99 is not supported"),
    ("model-unknown-field", lookup(model="{d}/unknown_field"), r"unknown config field\(s\) colour"),
    ("model-shape-mismatch", lookup(model="{d}/other_shape"), r"weights do not match the config.*layers\.2"),
    ("model-list-config", lookup(model="{d}/list_config"), r"list_config: not a phasekv run"),
    ("model-bad-tokenizer", lookup(model="{d}/bad_tokenizer"), r"bad_tokenizer/tokenizer.json: not a valid"),
    ("hf-without-weights", lookup(model="{d}/hf_no_weights"), r"hf_no_weights: not a loadable Hugging Face"),
    ("hf-pickle-only", lookup(model="{d}/hf_pickle"), r"hf_pickle: not a loadable Hugging Face.*safetensors"),
    ("run-without-checkpoint", lookup(model="{d}/run_empty"), r"run_empty: training run has no complete checkpoint"),
    # --- tokenizers and prompts ---
    ("tokenizer-missing", lookup(tokenizer="{d}/nope.json"), r"tokenizer file not found: .*nope.json"),
    ("tokenizer-invalid", lookup(tokenizer="{d}/not_a_tokenizer.json"), r"not_a_tokenizer.json: not a valid tokenizers"),
    ("tokenizer-no-single-token-keys", lookup(tokenizer="{d}/no_animals.json", words="lists"),
     r"only 0 of \d+ key words are single"),
    ("tokenizer-bpe-words-split", lookup(tokenizer="{d}/bpe.json"), r"key words are single tokens"),
    ("prompt-longer-than-context", lookup(model="{d}/short", records=40), r"prompts of 94 tokens exceed the model.s max_seq_len=64"),
    ("needle-longer-than-context", ["eval", "needle", "--model", "{d}/model", "--out", "{out}", "--device", "cpu",
                                    "--context", "200000", "--records", "16"], r"max_seq_len=131072"),
    ("needle-context-too-short", ["eval", "needle", "--model", "{d}/model", "--out", "{out}", "--context", "100",
                                  "--records", "16000"], r"context=100 tokens is too short for 16000 records"),
    ("padding-unknown", lookup(padding="middle"), r"padding must be one of prefix, in-sequence, got 'middle'"),
    ("per-group-zero", lookup(per_group=0), r"per-group.*>= 1"),
    ("modulus-zero", lookup(modulus=0), r"modulus.*>= 1"),
    ("records-not-above-demos", lookup(records=2, demos=2), r"records > demos"),
    ("records-negative", lookup(records=-3), r"records=-3"),
    ("records-beyond-vocabulary", lookup(records=5000), r"key words are single tokens.*need at least 5000"),
    ("filler-negative", lookup(filler=-1), r"filler=-1"),
    ("mappings-zero", lookup(mappings=0), r"mappings.*>= 1"),
    ("modulus-not-multiple-of-stride", lookup(stride=5, modulus=4), r"--stride 5 must divide --modulus 4"),
    ("stride-zero", lookup(stride=0), r"--stride 0 must divide"),
    ("interval-unknown", lookup(interval="jackknife"), r"interval.*jackknife"),
    ("batch-size-zero", lookup(batch_size=0), r"batch.size.*>= 1"),
    ("device-unknown", lookup(device="tpu"), r"device.*tpu"),
    ("flip-family-unknown", ["eval", "flip", "--model", "{d}/model", "--out", "{out}", "--device", "cpu",
                             "--families", "noise"], r"unknown filler family 'noise'"),
    ("flip-lengths-zero", ["eval", "flip", "--model", "{d}/model", "--out", "{out}", "--device", "cpu",
                           "--lengths", "0"], r"lengths.*>= 1"),
    ("flip-one-candidate", ["eval", "flip", "--model", "{d}/model", "--out", "{out}", "--device", "cpu",
                            "--candidates", " Alice"], r"at least two candidates"),
    # --- corpora ---
    ("corpus-empty", ["tokenizer", "train", "{d}/empty.txt", "--out", "{out}/tok.json"], r"empty.txt: empty"),
    ("corpus-not-utf8", ["tokenizer", "train", "{d}/latin1.txt", "--out", "{out}/tok.json"],
     r"latin1.txt:1: not valid UTF-8 \(byte 0xe9"),
    ("corpus-bad-jsonl", ["tokenizer", "train", "{d}/bad.jsonl", "--out", "{out}/tok.json"], r"bad.jsonl:2: invalid JSON"),
    ("corpus-jsonl-no-text", ["tokenizer", "train", "{d}/notext.jsonl", "--out", "{out}/tok.json"], r"notext.jsonl:1:.*'text'"),
    ("corpus-parquet-no-text", ["tokenizer", "train", "{d}/notext.parquet", "--out", "{out}/tok.json"],
     r"notext.parquet: parquet file has no 'text' column"),
    ("corpus-missing", ["tokenizer", "train", "{d}/missing.txt", "--out", "{out}/tok.json"], r"data file not found"),
    ("corpus-unsupported", ["tokenizer", "train", "{d}/data.csv", "--out", "{out}/tok.json"], r"unsupported file type '.csv'"),
    ("corpus-empty-dir", ["tokenizer", "train", "{d}/emptydir", "--out", "{out}/tok.json"], r"emptydir: directory holds no"),
    ("corpus-glob-no-match", ["tokenizer", "train", "{d}/*.nothing", "--out", "{out}/tok.json"], r"no files match"),
    ("vocab-size-zero", ["tokenizer", "train", "{d}/bad.jsonl", "--out", "{out}/tok.json", "--vocab-size", "0"],
     r"vocab.size.*>= 1|bad.jsonl:2"),
    ("train-empty-corpus", TRAIN + ["--data", "{d}/empty.txt", "--tokenizer", "{d}/bpe.json"], r"empty.txt: empty"),
    ("train-corpus-no-tokenizer", TRAIN + ["--data", "{d}/latin1.txt"], r"text corpus needs --tokenizer"),
    ("train-recall-mix-without-corpus", TRAIN + ["--recall-mix", "0.5"], r"recall_mix needs a text corpus"),
    ("train-recall-mix-out-of-range", TRAIN + ["--data", "{d}/empty.txt", "--tokenizer", "{d}/bpe.json",
                                               "--recall-mix", "1.5"], r"recall_mix must be in \[0, 1\], got 1.5"),
    # --- sweep files ---
    ("sweep-typo", ["sweep", "run", "{d}/typo.toml"], r"typo.toml: run 1: unknown training option\(s\): stpes"),
    ("sweep-duplicate", ["sweep", "run", "{d}/duplicate.toml"], r"duplicate.toml: run 'W8/S8 · 1 KV' appears twice"),
    ("sweep-invalid-toml", ["sweep", "run", "{d}/invalid.toml"], r"invalid.toml: invalid TOML"),
    ("sweep-no-arch", ["sweep", "run", "{d}/noarch.toml"], r"noarch.toml: run 1 has no 'arch'"),
    ("sweep-unknown-table", ["sweep", "status", "{d}/badtable.toml"], r"badtable.toml: unknown table\(s\) default"),
    ("sweep-out-root-escapes", ["sweep", "run", "{d}/escape.toml"], r"out_root='../../escaped' must be a relative path"),
    ("sweep-out-root-absolute", ["sweep", "run", "{d}/absolute.toml"], r"out_root='/tmp/phasekv-escaped' must be"),
    ("sweep-bad-seed", ["sweep", "run", "{d}/badseed.toml"], r"badseed.toml: run 1: seed 'a' must be an integer"),
    ("sweep-bad-arch", ["sweep", "run", "{d}/badarch.toml"], r"badarch.toml: run 1: cannot parse model name"),
    ("sweep-no-runs", ["sweep", "run", "{d}/norun.toml"], r"norun.toml: no \[\[run\]\] entries"),
    ("sweep-out-key", ["sweep", "run", "{d}/outkey.toml"], r"outkey.toml: run 1: 'out' is not a sweep option"),
    ("sweep-negative-count", ["sweep", "run", "{d}/negative.toml"], r"negative.toml: run 1: batch_size=-4 must be >= 1"),
    ("sweep-not-utf8", ["sweep", "run", "{d}/latin1.toml"], r"latin1.toml: invalid TOML"),
    ("sweep-missing", ["sweep", "run", "{d}/none.toml"], r"sweep file not found: .*none.toml"),
    # --- training options ---
    ("train-no-out", ["train", "--steps", "2"], r"--out DIR is required"),
    ("train-negative-steps", TRAIN + ["--steps", "-1"], r"steps=-1 must be >= 0"),
    ("train-zero-batch", TRAIN + ["--batch-size", "0"], r"batch_size=0 must be >= 1"),
    ("train-zero-lr", TRAIN + ["--lr", "0"], r"need lr > 0"),
    ("train-accum-not-dividing", TRAIN + ["--batch-size", "6", "--grad-accum", "4"], r"batch_size=6 must be a multiple of grad_accum=4"),
    ("train-steps-and-tokens", TRAIN + ["--tokens", "1000"], r"--steps or --tokens, not both"),
    ("train-device-unknown", TRAIN + ["--device", "tpu"], r"device='tpu'"),
    ("train-logger-unknown", TRAIN + ["--logger", "mlflow"], r"logger='mlflow'"),
    ("train-gate-steps", TRAIN + ["--gate-steps", "often"], r"gate_steps='often'"),
    ("train-seq-len-too-short", TRAIN + ["--seq-len", "10"], r"seq_len=10 is too short"),
    ("train-bad-arch", TRAIN + ["--arch", "W8/S8 · 1 KV · banana"], r"unknown part 'banana'"),
    ("train-init-from-missing", TRAIN + ["--init-from", "{d}/nowhere"], r"not found.*nowhere"),
    ("train-existing-run", ["train", "--out", "{d}/run", "--steps", "2", "--batch-size", "4", "--seq-len", "64",
                            "--no-progress"], r"already holds a training run; pass --resume"),
    ("train-resume-changed-lr", ["train", "--out", "{d}/run", "--resume", "--lr", "0.1", "--no-progress"],
     r"--resume: lr=0.1 differs from the saved run's"),
    ("train-resume-corrupt-config", ["train", "--out", "{d}/run_bad_config", "--resume"],
     r"run_bad_config/config.json: unreadable run config"),
    # --- other commands ---
    ("report-missing-dir", ["report", "{d}/nowhere"], r"nowhere: no such study directory"),
    ("knockout-missing-model", ["analyze", "knockout", "--model", "{d}/nowhere", "--out", "{out}"], r"not found"),
    ("knockout-zero-calibration", ["analyze", "knockout", "--model", "{d}/model", "--out", "{out}", "--n-cal", "0"],
     r"--n-cal and --final-tokens must be >= 1"),
]


def _fmt(args: list[str], d: Path, out: Path) -> list[str]:
    return [a.format(d=d, out=out) for a in args]


def _complete_files(root: Path) -> set[Path]:
    return {p for p in files(root) if p.name in COMPLETE}


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(case, d, tmp_path, monkeypatch):
    name, argv, expect = case
    monkeypatch.chdir(tmp_path)  # sweep out_roots are relative
    out = tmp_path / "out"
    before = _complete_files(d)
    code, stdout, stderr = run_cli(*_fmt(argv, d, out))
    assert code == 2, f"{name}: exit {code}\nstdout: {stdout}\nstderr: {stderr}"
    assert "Traceback" not in stderr + stdout
    lines = stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), stderr
    assert re.search(expect, lines[-1]), f"{name}: {lines[-1]!r} does not match {expect!r}"
    assert [ln for ln in lines if ln.startswith("error: ")] == [lines[-1]]  # exactly one error line
    assert _complete_files(d) == before
    assert not _complete_files(tmp_path), f"{name}: left {_complete_files(tmp_path)}"


# Python API: (id, call(d) -> anything, exception type, message regex)
def _api_cases():
    from phasekv.config.names import parse_name
    from phasekv.data.corpus import iter_documents, resolve_files
    from phasekv.data.tokenizer import load_tokenizer
    from phasekv.errors import CheckpointError, ConfigError, DataError, ModelNameError
    from phasekv.eval.design import make_design
    from phasekv.eval.prompts import PromptConfig, RetrievalPrompts, needle_config
    from phasekv.eval.tokens import WordTokenizer
    from phasekv.train import TrainConfig, load_run
    from phasekv.train.sweep import load_sweep

    wt = WordTokenizer(TOK, "word")
    return [
        ("api-name-none", lambda d: parse_name(None), ModelNameError, r"empty model name None"),
        ("api-name-unknown", lambda d: ModelConfig.from_name("w8s8-1kv-fast"), ModelNameError, r"unknown part 'fast'"),
        ("api-config-zero-layers", lambda d: ModelConfig.from_name("w8s8-1kv", n_layers=0), ConfigError, r"n_layers=0"),
        ("api-config-bad-gate", lambda d: ModelConfig(window=8, stride=8, gate="softmax"), ConfigError, r"gate='softmax'"),
        ("api-config-float-heads", lambda d: ModelConfig(n_heads=4.0), ConfigError, r"n_heads=4.0"),
        ("api-from-dict-version", lambda d: ModelConfig.from_dict({"config_version": 2}), ConfigError, r"config_version 2"),
        ("api-load-missing", lambda d: PhaseLM.load(d / "nowhere"), CheckpointError, r"nowhere/config.json: no model config"),
        ("api-load-truncated", lambda d: PhaseLM.load(d / "truncated"), CheckpointError, r"unreadable safetensors"),
        ("api-load-run-hf-no-weights", lambda d: load_run(d / "hf_no_weights"), CheckpointError,
         r"hf_no_weights: not a loadable Hugging Face"),
        ("api-load-run-hf-pickle", lambda d: load_run(d / "hf_pickle"), CheckpointError, r"safetensors"),
        ("api-forward-too-long", lambda d: PhaseLM.load(d / "short")(torch.zeros(1, 65, dtype=torch.long)),
         ConfigError, r"65 tokens exceeds the model's max_seq_len=64"),
        ("api-forward-bad-ids", lambda d: PhaseLM.load(d / "model")(torch.full((1, 4), 10**6)), ConfigError,
         r"token ids must be in \[0, vocab_size"),
        ("api-new-cache-zero", lambda d: PhaseLM.load(d / "model").new_cache(0), ConfigError, r"batch_size=0"),
        ("api-tokenizer-missing", lambda d: load_tokenizer(d / "nope.json"), DataError, r"tokenizer file not found"),
        ("api-corpus-empty", lambda d: list(iter_documents(d / "empty.txt")), DataError, r"empty.txt: empty"),
        ("api-corpus-latin1", lambda d: list(iter_documents(d / "latin1.txt")), DataError, r"latin1.txt:1: not valid UTF-8"),
        ("api-corpus-missing", lambda d: resolve_files(str(d / "missing.txt")), DataError, r"data file not found"),
        ("api-train-negative", lambda d: TrainConfig(steps=-5), ConfigError, r"steps=-5 must be >= 0"),
        ("api-train-unknown-option", lambda d: TrainConfig.from_dict({"stpes": 3}), ConfigError, r"stpes"),
        ("api-sweep-duplicate", lambda d: load_sweep(d / "duplicate.toml"), ConfigError, r"appears twice"),
        ("api-design-zero-modulus", lambda d: make_design(0, 16, 50.0), ConfigError, r"modulus must be >= 1, got 0"),
        ("api-design-zero-n", lambda d: make_design(4, 0, 50.0), ConfigError, r"per-group must be >= 1, got 0"),
        ("api-prompts-key-tokens", lambda d: PromptConfig(key_tokens=3), ConfigError, r"key_tokens must be 1 or 2, got 3"),
        ("api-prompts-design-too-wide", lambda d: RetrievalPrompts(PromptConfig(records=4, demos=1, filler=2, modulus=8,
                                                                                per_group=64), wt),
         ConfigError, r"position design spans .* targets can only sit in"),
        ("api-needle-too-short", lambda d: needle_config(context=64, records=100), ConfigError, r"too short"),
        ("api-prompt-id-out-of-range", lambda d: RetrievalPrompts(PromptConfig(records=10, demos=2, filler=8, modulus=4,
                                                                               per_group=16), wt).prompt(10**6),
         ConfigError, r"prompt id 1000000 outside"),
    ]


API_CASES = _api_cases()


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_bad_input(case, d):
    name, call, exc_type, expect = case
    before = _complete_files(d)
    with pytest.raises(exc_type) as info:
        call(d)
    assert isinstance(info.value, PhaseKVError)
    msg = str(info.value)
    assert "\n" not in msg.strip(), f"{name}: multi-line message {msg!r}"
    assert re.search(expect, msg), f"{name}: {msg!r} does not match {expect!r}"
    assert _complete_files(d) == before


def test_the_table_is_large_enough():
    assert len(CLI_CASES) + len(API_CASES) >= 40
    assert len({c[0] for c in CLI_CASES + API_CASES}) == len(CLI_CASES) + len(API_CASES)


def test_real_process_one_line_without_traceback():
    p = run_cli_process("info", "W8/S8 · 1 KV · banana")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: cannot parse")
    assert "Traceback" not in p.stderr and not p.stdout


def test_debug_re_raises_with_the_traceback():
    from phasekv.errors import ModelNameError

    with pytest.raises(ModelNameError, match="banana"):
        run_cli("--debug", "info", "W8/S8 · 1 KV · banana")
