"""Same seed, same machine: identical training losses, evaluation prompts and results; outputs record
their seeds, versions and the git revision."""

import json

import pandas as pd
import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.data.tokenizer import build_word_tokenizer, save_tokenizer
from phasekv.eval.models import load
from phasekv.eval.prompts import RetrievalPrompts, lookup_config, needle_config
from phasekv.eval.run import run_retrieval
from phasekv.eval.tokens import WordTokenizer
from phasekv.provenance import git_revision
from phasekv.train import train

from .helpers import TINY, assert_same_weights, losses, weights

TOK = build_word_tokenizer()
EVAL = dict(records=10, demos=2, modulus=4, per_group=16, filler=8, mappings=4, padding="in-sequence")


def test_same_seed_same_losses_and_weights_other_seed_differs(tmp_path):
    runs = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        train(out=str(tmp_path / name), steps=4, seed=seed, **TINY)
        runs[name] = tmp_path / name
    assert losses(runs["a"]) == losses(runs["b"]) and len(losses(runs["a"])) == 4
    assert_same_weights(weights(runs["a"]), weights(runs["b"]))
    assert losses(runs["a"]) != losses(runs["c"])
    done = json.loads((runs["a"] / "done.json").read_text())
    config = json.loads((runs["a"] / "config.json").read_text())
    assert done["seed"] == config["seed"] == config["train"]["seed"] == 7
    for versions in (done["versions"], config["versions"]):
        assert versions["torch"] == torch.__version__ and versions["phasekv"] and versions["tokenizers"]
        assert versions["git"] == git_revision()


def test_git_revision_is_recorded_when_in_a_checkout():
    rev = git_revision()
    assert rev is None or rev.split("-")[0].isalnum() and len(rev.split("-")[0]) >= 7


@pytest.mark.parametrize("cfg", [lookup_config(**EVAL), lookup_config(**{**EVAL, "padding": "prefix"}),
                                 needle_config(context=200, records=12, per_group=64, modulus=4, mappings=2)],
                         ids=["lookup-in-sequence", "lookup-prefix", "needle"])
def test_same_seed_same_prompts_other_seed_differs(cfg):
    wt = WordTokenizer(TOK, "word")
    a, b = RetrievalPrompts(cfg, wt), RetrievalPrompts(cfg, wt)
    ids_a = [a.prompt(p).ids for p in range(len(a))]
    assert ids_a == [b.prompt(p).ids for p in range(len(b))]
    cfg.seed += 1
    c = RetrievalPrompts(cfg, wt)
    assert ids_a != [c.prompt(p).ids for p in range(len(c))]


def test_same_evaluation_twice_gives_identical_results_and_summary(tmp_path):
    torch.manual_seed(3)
    d = tmp_path / "model"
    PhaseLM(ModelConfig.from_name("w8s8-1kv", preset="tiny", vocab_size=TOK.get_vocab_size())).save(d)
    save_tokenizer(TOK, d)
    summaries = [run_retrieval("lookup", load(d), lookup_config(**EVAL), tmp_path / o, batch_size=8, progress=False)
                 for o in ("a", "b")]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a/results.parquet"),
                                  pd.read_parquet(tmp_path / "b/results.parquet"))
    on_disk = [json.loads((tmp_path / o / "summary.json").read_text()) for o in ("a", "b")]
    for s in on_disk:
        s["provenance"].pop("seconds")
    assert on_disk[0] == on_disk[1]
    prov = summaries[0]["provenance"]
    assert prov["seed"] == 0 and prov["prompt_config"]["seed"] == 0
    assert prov["versions"]["git"] == git_revision() and prov["versions"]["torch"] == torch.__version__
    assert prov["model_info"]["config"]["seed"] == 42  # the model's own seed (its name's)
