"""The engine backend against a minimal local server speaking vLLM's protocol (tests/eval/fake_engine.py), and
`phasekv export`'s evaluation metadata. The real vLLM test is tests/engine (make test-engine)."""

import json

import pytest
from typer.testing import CliRunner

from phasekv.cli import _mount, app
from phasekv.errors import ConfigError
from phasekv.eval import run as run_module
from phasekv.eval.engine import EngineError, connect
from phasekv.eval.export import export
from phasekv.eval.flip import FlipConfig, run_flip
from phasekv.eval.models import load
from phasekv.eval.prompts import lookup_config
from phasekv.eval.run import run_retrieval
from phasekv.eval.tokens import word_list
from phasekv.model.hf import EVAL_KEY
from phasekv.train import train
from tests.net import free_port
from tests.train.helpers import FAST, phasekv

from .fake_engine import FakeEngine

FASTER = dict(retries=1, backoff=0.01)  # closed ports and planted failures need not wait
LAYOUT = dict(modulus=4, per_group=16, mappings=4)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny full-attention recall run (a few steps: the protocol, not the accuracy, is under test) and its export."""
    root = tmp_path_factory.mktemp("engine")
    train(out=str(root / "run"), **dict(FAST, arch="full-1kv", steps=2, val_every=0, gate_steps="none"))
    export(root / "run", root / "hf")
    return root


@pytest.fixture(scope="module")
def inproc(run):
    return load(run / "run", device="cpu")


@pytest.fixture
def server(run, inproc):
    with FakeEngine(inproc.model, inproc.tok, root=str(run / "hf")) as s:
        yield s


def test_export_carries_the_runs_evaluation_metadata(run, inproc):
    meta = json.loads((run / "hf" / "config.json").read_text())[EVAL_KEY]
    assert meta == {"recall": inproc.info["recall"], "train_len": 64} and meta["recall"]["n_keys"] == 32
    hf = load(run / "hf", device="cpu")
    assert (hf.kind, hf.info["recall"], hf.info["train_len"]) == ("hf", meta["recall"], 64)
    assert lookup_config(hf.info) == lookup_config(inproc.info)  # same words and layout as the run


def test_lookup_through_the_server_equals_in_process(run, inproc, server, tmp_path):
    server.delay = 0.02  # requests overlap
    em = connect(server.url, "tiny", top_logprobs=3, concurrency=3, **FASTER)  # tokenizer: the served directory
    assert em.info["recall"] == inproc.info["recall"] and em.kind == "engine" and em.max_len == 4096
    cfg = lookup_config(em.info, **LAYOUT)
    assert cfg == lookup_config(inproc.info, **LAYOUT)
    ours = run_retrieval("lookup", em, cfg, tmp_path / "engine", batch_size=5, progress=False)
    ref = run_retrieval("lookup", inproc, cfg, tmp_path / "inproc", batch_size=5, progress=False)
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("engine", "inproc"))
    rows_a, rows_b = (run_module.pd.read_parquet(tmp_path / d / "results.parquet") for d in ("engine", "inproc"))
    assert (rows_a["pred"] == rows_b["pred"]).all() and (rows_a["correct"] == rows_b["correct"]).all()
    assert (rows_a["prob"] - rows_b["prob"]).abs().max() < 1e-5
    assert (ours["mean"], ours["gap"], ours["groups"]) == (ref["mean"], ref["gap"], ref["groups"])
    engine = a["provenance"]["model_info"]["engine"]
    assert engine["prompts"] == 64 and engine["answers_from_prompt_logprobs"] > 0  # outside the top 3
    assert b["model_kind"] == "phasekv" and 1 < server.max_inflight <= 3


def test_flip_through_the_server_equals_in_process(inproc, server, tmp_path):
    em = connect(server.url, "tiny", **FASTER)
    a, b = word_list("names")[:2]
    cfg = FlipConfig(lengths=3, families=["words"], records=4, candidates=[f" {a}", f" {b}", f" {a} {b}"])
    ours = run_flip(em, cfg, tmp_path / "engine", stride=2, progress=False)
    ref = run_flip(inproc, cfg, tmp_path / "inproc", stride=2, progress=False)
    assert ours["families"] == ref["families"]
    a, b = (run_module.pd.read_parquet(tmp_path / d / "results.parquet") for d in ("engine", "inproc"))
    assert (a["logprob"] - b["logprob"]).abs().max() < 1e-5  # incl. the two-token candidate


def test_resume_sends_only_the_prompts_left(inproc, server, tmp_path, monkeypatch):
    monkeypatch.setattr(run_module, "FLUSH_ROWS", 8)
    cfg = lookup_config(inproc.info, **LAYOUT)
    every = dict(top_logprobs=inproc.model.config.vocab_size, **FASTER)  # the whole vocabulary: no second requests
    server.fail_after = 5
    em = connect(server.url, "tiny", concurrency=1, **every)  # the probe's completion, then 4 batches of 4 prompts
    with pytest.raises(EngineError, match="HTTP 400: planted failure"):
        run_retrieval("lookup", em, cfg, tmp_path / "e", batch_size=4, progress=False)
    flushed = sorted((tmp_path / "e" / ".partial").glob("rows-*.parquet"))
    assert sum(len(run_module.pd.read_parquet(f)) for f in flushed) == 16
    server.fail_after, before = None, server.prompts
    resumed = run_retrieval("lookup", connect(server.url, "tiny", **every), cfg, tmp_path / "e", batch_size=4,
                            progress=False)
    assert server.prompts - before == 1 + 64 - 16  # the probe and the prompts not flushed before
    fresh = run_retrieval("lookup", inproc, cfg, tmp_path / "ref", batch_size=4, progress=False)
    done = run_module.pd.read_parquet(tmp_path / "e" / "results.parquet")
    assert done["pid"].tolist() == list(range(64)) and resumed["groups"] == fresh["groups"]


def test_retries_a_busy_server(server):
    server.busy = 2
    connect(server.url, "tiny", retries=2, backoff=0.01)  # the probe's completion succeeds on its third try
    server.busy = 5
    with pytest.raises(EngineError, match="HTTP 503: server busy"):
        connect(server.url, "tiny", **FASTER)


def test_closed_port():
    port = free_port()
    with pytest.raises(EngineError, match=f"cannot reach the server at http://127.0.0.1:{port}"):
        connect(f"http://127.0.0.1:{port}/v1", "tiny", **FASTER)


@pytest.mark.parametrize("knob,value,error", [
    ("name", "other", "serves no model named 'tiny' \\(it serves 'other'\\); check --served-model"),
    ("tokenize_with", "bpe", "the server's tokenizer differs from .*tokenizer.json: a sample prompt encodes"),
    ("has_tokenize", False, "has no /tokenize endpoint"),
    ("logprobs", False, "the server returned no log-probabilities"),
    ("token_ids", False, "instead of its id: it must support `return_tokens_as_token_ids`"),
])
def test_unusable_servers_fail_in_one_line(run, server, knob, value, error):
    if value == "bpe":  # the same words, other ids: a tokenizer trained on another vocabulary
        from phasekv.data.tokenizer import build_word_tokenizer
        from phasekv.eval.tokens import WordTokenizer

        value = WordTokenizer(build_word_tokenizer())
    setattr(server, knob, value)
    with pytest.raises((EngineError, ConfigError), match=error):
        connect(server.url, "tiny", tokenizer=run / "run" / "tokenizer.json", **FASTER)


def test_prompts_longer_than_the_server_allows(inproc, server, tmp_path):
    server.max_len = 40
    em = connect(server.url, "tiny", **FASTER)
    with pytest.raises(ConfigError, match="exceed the served model's max_model_len=40"):
        run_retrieval("lookup", em, lookup_config(em.info, **LAYOUT), tmp_path, progress=False)


def test_answers_outside_the_top_k_need_prompt_logprobs(inproc, server, tmp_path, monkeypatch):
    server.prompt_logprobs = False
    monkeypatch.setenv("PHASEKV_SERVER_API_KEY", "secret")
    em = connect(server.url, "tiny", top_logprobs=1, **FASTER)
    assert server.authorization == "Bearer secret"
    with pytest.raises(EngineError, match="no prompt log-probabilities"):
        run_retrieval("lookup", em, lookup_config(em.info, **LAYOUT), tmp_path, progress=False)


def test_settings_and_tokenizer_source_checked(server):
    with pytest.raises(ConfigError, match="expected an address like http://"):
        connect("127.0.0.1:8000", "tiny")
    with pytest.raises(ConfigError, match="--served-model is required"):
        connect(server.url, "")
    server.root = "/nowhere/model"
    with pytest.raises(ConfigError, match="not a directory on this machine: pass --tokenizer"):
        connect(server.url, "tiny", **FASTER)


def test_cli_server_options(run, server, tmp_path):
    r = phasekv("eval", "lookup", "--server", server.url, "--served-model", "nope", "--out", str(tmp_path))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {server.url} serves no model named 'nope' (it serves 'tiny'); check --served-model"]
    _mount()
    r = CliRunner().invoke(app, ["eval", "lookup", "--server", server.url, "--model", str(run / "run"), "--out",
                                 str(tmp_path)])
    assert isinstance(r.exception, ConfigError) and "one of the two" in str(r.exception)
    r = CliRunner().invoke(app, ["audit", "--server", server.url, "--served-model", "tiny", "--per-group", "16",
                                 "--modulus", "4", "--out", str(tmp_path / "audit")])
    audit = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert r.exit_code in (0, 3, 4) and audit["task"] == "lookup" and audit["n_prompts"] == 64  # an export: lookup
