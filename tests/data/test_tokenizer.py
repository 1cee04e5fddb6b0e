import json

import pytest

from phasekv.data import build_word_tokenizer, load_tokenizer, load_words, save_tokenizer, to_hf, train_bpe
from phasekv.errors import DataError


def test_every_listed_word_is_one_token():
    tok = build_word_tokenizer()
    for name in ("animals", "names", "filler"):
        for w in load_words(name):
            ids = tok.encode(w, add_special_tokens=False).ids
            assert len(ids) == 1 and tok.id_to_token(ids[0]) == w


def test_ids_are_fixed_and_bos_is_prepended():
    a, b = build_word_tokenizer(), build_word_tokenizer()
    assert a.to_str() == b.to_str()
    assert [a.token_to_id(t) for t in ("<pad>", "<bos>", "<eos>", "<unk>")] == [0, 1, 2, 3]
    enc = a.encode("cat Alice, dog Emma?")
    assert enc.tokens == ["<bos>", "cat", "Alice", ",", "dog", "Emma", "?"]
    assert a.decode(enc.ids) == "cat Alice , dog Emma ?"
    assert a.encode("zorgblat", add_special_tokens=False).tokens == ["<unk>"]


def test_save_load_and_hf_wrapper(tmp_path):
    tok = build_word_tokenizer()
    path = save_tokenizer(tok, tmp_path)
    assert path.name == "tokenizer.json" and json.loads(path.read_text())["model"]["type"] == "WordLevel"
    assert load_tokenizer(tmp_path).to_str() == tok.to_str()
    hf = to_hf(tok)
    assert hf("cat Alice").input_ids == [1, tok.token_to_id("cat"), tok.token_to_id("Alice")]
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (0, 1, 2)
    with pytest.raises(DataError, match="not found"):
        load_tokenizer(tmp_path / "missing.json")


def test_bpe_round_trip():
    texts = ["the quick brown fox jumps over the lazy dog. " * 20, "naïve café — ünïcode ✓ " * 10]
    tok = train_bpe(texts, vocab_size=300, show_progress=False)
    assert tok.token_to_id("<eos>") == 2
    s = "the lazy café ✓ fox"
    assert tok.decode(tok.encode(s).ids) == s
