"""Phase ensembling at test time: k = 1 is the plain evaluation; k = S shifts flatten a periodic profile."""

import json

import numpy as np
import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.data.tokenizer import build_word_tokenizer
from phasekv.errors import ConfigError
from phasekv.eval.ensemble import PhaseEnsemble, ensemble_shifts, pad_ids, phase_ensemble
from phasekv.eval.models import EvalModel
from phasekv.eval.prompts import lookup_config
from phasekv.eval.run import evaluate
from phasekv.eval.tokens import WordTokenizer

CFG = dict(records=12, demos=2, filler=8, modulus=4, per_group=16, mappings=4)


class Planted(torch.nn.Module):
    """Answers right iff pattern[t mod S] (t = the target key's position, read from the prompt), else names the
    next token id: a model whose weak phases are known."""

    def __init__(self, vocab, pattern):
        super().__init__()
        self.vocab, self.pattern = vocab, list(pattern)
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, **_):
        out = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab)
        for b, ids in enumerate(input_ids.tolist()):
            t = ids.index(ids[-1])
            out[b, -1, ids[t + 1] if self.pattern[t % len(self.pattern)] else (ids[t + 1] + 1) % self.vocab] = 10.0
        return out


@pytest.fixture(scope="module")
def tok():
    return WordTokenizer(build_word_tokenizer(), "word")


def test_shifts_spread_over_the_stride():
    assert ensemble_shifts(1, 8) == [0]
    assert ensemble_shifts(2, 8) == [0, 4]
    assert ensemble_shifts(4, 8) == [0, 2, 4, 6]
    assert ensemble_shifts(8, 8) == list(range(8))
    with pytest.raises(ConfigError, match="k=9"):
        ensemble_shifts(9, 8)


def test_k1_equals_plain_evaluation(tok):
    model = PhaseLM(ModelConfig.from_name("W4/S4 · 1 KV", vocab_size=tok.vocab_size)).eval()
    cfg = lookup_config(**CFG)
    plain = evaluate(model, tok, cfg)
    ens = evaluate(PhaseEnsemble(model, [0], pad_ids(tok), keep=len(tok.prefix)), tok, cfg)
    assert plain["pred"].tolist() == ens["pred"].tolist()
    assert plain["correct"].tolist() == ens["correct"].tolist()
    np.testing.assert_allclose(plain["prob"], ens["prob"], rtol=1e-5, atol=1e-7)


def test_shift_moves_every_token(tok):
    ens = PhaseEnsemble(torch.nn.Linear(1, 1), [0, 3], [7, 8], keep=1)
    ids = torch.tensor([[1, 2, 3]])
    assert ens.shifted(ids, 3).tolist() == [[1, 7, 8, 7, 2, 3]]
    assert ens.shifted(ids, 0).tolist() == [[1, 2, 3]]


def test_full_ensemble_flattens_a_periodic_profile(tok):
    planted = Planted(tok.vocab_size, [1, 1, 1, 0])  # phase 3 is weak
    em = EvalModel(planted, tok, "planted", "phasekv", 4, {"path": "planted"})
    cfg = lookup_config(**CFG)
    plain = evaluate(em, None, cfg).groupby("residue")["correct"].mean()
    assert plain[3] == 0 and plain[[0, 1, 2]].min() == 1
    ens = phase_ensemble(em, 4)
    assert ens.name == "planted · phase ensemble 4" and ens.info["ensemble"]["forward_passes_per_prompt"] == 4
    flat = evaluate(ens, None, cfg).groupby("residue")["correct"].mean()
    assert flat.min() == 1  # every target is read at 3 good phases out of 4


def test_eval_cli_option(tmp_path, tok):
    from typer.testing import CliRunner

    from phasekv.eval.cli import app

    model = PhaseLM(ModelConfig.from_name("W4/S4 · 1 KV", vocab_size=tok.vocab_size))
    model.save(tmp_path / "m")
    args = ["lookup", "--model", str(tmp_path / "m"), "--records", "12", "--demos", "2", "--filler", "8",
            "--modulus", "4", "--per-group", "16", "--mappings", "4", "--device", "cpu"]
    r = CliRunner().invoke(app, args + ["--out", str(tmp_path / "e2"), "--ensemble", "2"])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "e2" / "summary.json").read_text())
    assert s["model"] == "W4/S4 · 1 KV · phase ensemble 2"
    assert s["provenance"]["model_info"]["ensemble"]["shifts"] == [0, 2]
