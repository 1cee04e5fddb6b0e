import numpy as np
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from phasekv.data.tokenizer import build_word_tokenizer, to_hf, train_bpe
from phasekv.errors import DataError
from phasekv.eval.design import group_moments
from phasekv.eval.models import load
from phasekv.eval.prompts import PromptConfig, RetrievalPrompts, lookup_config, needle_config
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


def _check_all(ps, pids=None):
    for pr in ps if pids is None else map(ps.prompt, pids):
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


@pytest.fixture(scope="module")
def text_bpe():
    """Byte-level BPE trained on generated text that never uses the shipped lists: clauses of two-syllable words
    at Zipf frequencies joined by "and", so no animal (and hardly any name) is one token, but the frequent
    made-up words are."""
    rng = np.random.default_rng(1)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    lexicon = sorted({"".join(rng.choice(syllables, 2)) for _ in range(400)})
    p = 1 / np.arange(1, len(lexicon) + 1)
    docs = [" and ".join(" ".join(rng.choice(lexicon, 6, p=p / p.sum())) for _ in range(10)) for _ in range(300)]
    return train_bpe(docs, vocab_size=700, min_frequency=2, show_progress=False)


def test_text_bpe_takes_its_own_words_with_exact_placement_and_matched_moments(text_bpe):
    wt = WordTokenizer(text_bpe, "text-bpe")
    assert wt.lead == " "  # found with its own words ("the", "cat", "a", "dog" are not single tokens here)
    assert len(wt.single_tokens(word_list("animals"), "key", 0)[0]) < 16  # the lists do not give the records
    cases = [lookup_config(records=16, demos=4, filler=48, per_group=576),  # the tiny models' lookup
             lookup_config(padding="in-sequence", records=16, demos=4, filler=48, per_group=64, modulus=8),
             needle_config(context=1024, records=125, per_group=64)]  # the needle at the study's density
    for cfg in cases:
        ps = RetrievalPrompts(cfg, wt)
        used = ps.metadata()["words"]
        assert used["source"] == "vocab" and "lists" not in used
        pools = [set(used[r]) for r in ("keys", "values", "filler")]
        assert not (pools[0] & pools[1] or pools[0] & pools[2] or pools[1] & pools[2])
        assert all(w.isalpha() and len(w) >= 3 and wt.word_id(w) is not None for pool in pools for w in pool)
        _check_all(ps, range(0, len(ps), 41))  # the tokenizer's own ids; target and query where the design puts them
        targets = [[] for _ in range(cfg.modulus)]
        for pid in range(len(ps)):  # every prompt's target position (where ps.prompt(pid) puts and checks it)
            r, t, _ = ps.slot(pid)
            targets[r].append(t)
        m = group_moments(targets)
        assert m["mean_spread"] == 0 and m["var_spread"] == 0  # moments matched exactly over the residues


def test_word_source_can_be_forced(text_bpe, bpe):
    wt = WordTokenizer(bpe, "bpe")  # half the animals are one token: the lists suffice, the vocabulary on request
    small = dict(records=20, demos=3, modulus=4, per_group=16, filler=8)
    assert RetrievalPrompts(PromptConfig(**small), wt).word_source == "lists"
    assert RetrievalPrompts(PromptConfig(**small, words="vocab"), wt).word_source == "vocab"
    with pytest.raises(DataError, match=r"only \d+ of \d+ key words are single tokens"):
        RetrievalPrompts(PromptConfig(**small, words="lists"), WordTokenizer(text_bpe, "text-bpe"))
