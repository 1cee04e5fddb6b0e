"""The one loader (`phasekv.train.run.open_model`): a directory opens as what it holds; only `load_run` converts."""

import torch
from tokenizers import Tokenizer

from phasekv import ModelConfig, PhaseLM
from phasekv.data.tokenizer import build_word_tokenizer, to_hf
from phasekv.eval.models import load
from phasekv.train.run import load_run, open_model


def test_hf_dir_is_evaluated_as_published_and_converted_only_by_load_run(tmp_path):
    m = PhaseLM(ModelConfig.from_name("full-1kv", preset="tiny", vocab_size=528)).eval()
    m.to_hf().save_pretrained(tmp_path / "hf")
    to_hf(build_word_tokenizer()).save_pretrained(tmp_path / "hf")
    opened = open_model(tmp_path / "hf")
    assert opened.kind == "hf" and not isinstance(opened.model, PhaseLM) and opened.weights == tmp_path / "hf"
    em = load(tmp_path / "hf")  # what every --model flag does
    assert em.kind == "hf" and type(em.model) is type(opened.model) and em.tok.hf
    converted, _ = load_run(tmp_path / "hf")  # training's --init-from and the Python API: a PhaseLM
    assert isinstance(converted, PhaseLM)
    ids = torch.tensor([[1, 40, 212]])
    with torch.no_grad():
        assert torch.allclose(em.model(ids).logits, converted(ids), atol=1e-5)
        assert torch.allclose(converted(ids), m(ids), atol=1e-5)


def test_phasekv_dir_opens_the_same_model_for_eval_and_load_run(tmp_path):
    m = PhaseLM(ModelConfig.from_name("w8s8-1kv", preset="tiny", vocab_size=528)).eval()
    m.save(tmp_path / "saved")
    opened = open_model(tmp_path / "saved")
    assert opened.kind == "phasekv" and isinstance(opened.tokenizer, Tokenizer)
    em, (model, tok) = load(tmp_path / "saved"), load_run(tmp_path / "saved")
    assert em.kind == "phasekv" and em.stride == 8 and em.info["weights"] == str(tmp_path / "saved")
    ids = torch.tensor([[1, 40, 212]])
    with torch.no_grad():
        assert torch.equal(em.model(ids), model(ids)) and torch.equal(model(ids), m(ids))
    assert tok("cat").input_ids == em.tok.encode("cat")
