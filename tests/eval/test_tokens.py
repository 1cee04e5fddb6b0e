import numpy as np
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from phasekv.data.tokenizer import build_word_tokenizer, to_hf, train_bpe
from phasekv.errors import DataError
from phasekv.eval.models import load
from phasekv.eval.prompts import PromptConfig, RetrievalPrompts, needle_config
from phasekv.eval.run import evaluate
from phasekv.eval.tokens import WordTokenizer, word_list

WORDS = word_list("animals") + word_list("names") + word_list("filler")


@pytest.fixture(scope="module")
def bpe():
    """Byte-level BPE trained on text where about half the animals are frequent enough to become one token."""
    rng = np.random.default_rng(0)
    common = word_list("animals")[::2] + word_list("names") + word_list("filler") + ["the", "cat", "dog"]
    docs = [" ".join(rng.choice(common, 40)) for _ in range(400)]
    return train_bpe(docs, vocab_size=1200, min_frequency=2, show_progress=False)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf") / "qwen3-tiny"
    tok = to_hf(build_word_tokenizer())
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=512,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _check_all(ps):
    for pr in ps:
        assert pr.ids == ps.tok.encode(ps.tok.text(pr.words))  # the final ids are the tokenizer's own output
        assert pr.ids[pr.target_pos] == ps.tok.word_id(pr.words[pr.target_pos - len(ps.tok.prefix)])
        assert pr.ids[pr.target_pos + ps.cfg.key_tokens] == pr.answer
        assert pr.ids[pr.query_pos] == pr.ids[pr.target_pos + ps.cfg.key_tokens - 1]
        assert pr.target_pos % ps.cfg.modulus == pr.residue


def test_bpe_tokenizer_filters_words_and_places_exactly(bpe):
    wt = WordTokenizer(bpe, "bpe")
    assert wt.lead == " "  # GPT-2 style: a leading space makes the first word a mid-text token
    keys, _ = wt.single_tokens(word_list("animals"), "key", 1)
    assert 0 < len(keys) < len(word_list("animals"))  # rare animals are several tokens and are dropped
    for padding in ("prefix", "in-sequence"):
        ps = RetrievalPrompts(PromptConfig(records=20, demos=3, modulus=4, per_group=16, filler=8, padding=padding), wt)
        assert set(ps.keys) <= set(keys)
        _check_all(ps)
    _check_all(RetrievalPrompts(needle_config(context=600, records=100, modulus=4, per_group=16), wt))


def test_too_few_single_token_words_is_a_clear_error(bpe):
    wt = WordTokenizer(bpe, "bpe")
    with pytest.raises(DataError, match=r"only \d+ of \d+ key words are single tokens"):
        RetrievalPrompts(PromptConfig(records=150, demos=2, modulus=4, per_group=16, filler=8), wt)


def test_placement_mismatch_fails_loudly(monkeypatch):
    wt = WordTokenizer(build_word_tokenizer(), "word")
    ps = RetrievalPrompts(PromptConfig(records=12, demos=2, modulus=4, per_group=16, filler=8), wt)
    real = wt.encode
    monkeypatch.setattr(wt, "encode", lambda text, special=True: real(text, special)[:-2] + real(text, special)[-1:])
    with pytest.raises(DataError, match="token placement mismatch"):
        ps.prompt(3)


def test_hf_qwen3_dir_token_exact_and_evaluates(hf_dir):
    em = load(hf_dir)
    assert em.kind == "hf" and em.tok.hf and em.tok.prefix == [em.tok.tok.convert_tokens_to_ids("<bos>")]
    cfg = PromptConfig(records=12, demos=2, modulus=4, per_group=16, filler=8, padding="in-sequence")
    ps = RetrievalPrompts(cfg, em.tok)
    _check_all(ps)
    rows = evaluate(em, None, cfg, pids=range(0, 64, 5), batch_size=4)
    assert len(rows) == 13 and rows["prob"].between(0, 1).all()
    # the same prompts scored through the HF model directly give the same probabilities
    pr = ps.prompt(5)
    with torch.no_grad():
        p = torch.softmax(em.model(torch.tensor([pr.ids])).logits[0, -1].float(), -1)[pr.answer].item()
    assert p == pytest.approx(rows.set_index("pid").loc[5, "prob"], rel=1e-4)


def test_hf_remote_code_needs_the_flag(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not-a-real-arch", "auto_map": {
        "AutoModelForCausalLM": "modeling.Model"}}))
    with pytest.raises(Exception, match="trust-remote-code|trust_remote_code|not a loadable"):
        load(tmp_path)
