import numpy as np
import pytest
import torch

from phasekv.data import (
    IGNORE,
    RecallConfig,
    RecallStream,
    batch,
    build_word_tokenizer,
    load_words,
    recall_accuracy,
    recall_tokenizer,
)
from phasekv.errors import ConfigError

TOK = build_word_tokenizer()


def test_layout_and_labels():
    s = RecallStream(TOK, RecallConfig(seq_len=96), seed=3)
    animals, names = set(load_words("animals")), set(load_words("names"))
    for i in range(50):
        ex = s.example(i)
        assert ex.ids.shape == ex.labels.shape == ex.answer_pos.shape == (96,)
        assert ex.ids[0] == TOK.token_to_id("<bos>")
        words = [TOK.id_to_token(int(t)) for t in ex.ids]
        qs = np.flatnonzero(ex.labels != IGNORE)
        assert len(qs) >= 1
        for q in qs:
            key, value = words[q], TOK.id_to_token(int(ex.labels[q]))
            assert key in animals and value in names and words[q + 1] == value
            p = ex.answer_pos[q]  # the stored record: the same key, directly followed by its value
            assert p < q and words[p] == key and words[p + 1] == value
            assert q - p >= 16  # beyond the local window: only compressed memory can answer
        marker = words.index("?")
        assert all(q > marker for q in qs) and all(ex.answer_pos[q] < marker for q in qs)


def test_deterministic_by_index_and_split():
    a, b = RecallStream(TOK, seed=1), RecallStream(TOK, seed=1)
    assert np.array_equal(a.example(7).ids, b.example(7).ids)
    assert not np.array_equal(a.example(7).ids, a.example(8).ids)
    assert not np.array_equal(a.example(7).ids, RecallStream(TOK, seed=1, split="val").example(7).ids)


def test_every_residue_is_covered():
    s = RecallStream(TOK, RecallConfig(seq_len=96), seed=0)
    b = batch(s, 0, 200)
    res = np.bincount((b["answer_pos"][b["answer_pos"] >= 0] % 24).numpy(), minlength=24)
    assert (res > 20).all()


def test_bad_config():
    with pytest.raises(ConfigError, match="seq_len"):
        RecallStream(TOK, RecallConfig(seq_len=20))
    with pytest.raises(ConfigError, match="min_records"):
        RecallConfig(min_records=5, max_records=4)
    with pytest.raises(ConfigError, match="unknown recall option"):
        RecallConfig.from_dict({"recordz": 3})
    for bad in (-0.1, 1.0):
        with pytest.raises(ConfigError, match=f"repeat_prob must be in \\[0, 1\\), got {bad}"):
            RecallConfig(repeat_prob=bad)
    with pytest.raises(ConfigError, match="too short for repeat sequences"):
        RecallStream(TOK, RecallConfig(seq_len=40, max_prefix=2, min_records=1, repeat_prob=0.5))


def test_repeat_sequences_train_the_copy():
    """With repeat_prob, that share of training sequences is a run of keys and names shown twice, trained on the
    second copy; the records of every other index are unchanged, and held-out splits never get a repeat."""
    cfg = RecallConfig(seq_len=96, repeat_prob=0.25)
    s, plain = RecallStream(TOK, cfg, seed=3), RecallStream(TOK, RecallConfig(seq_len=96), seed=3)
    vocab = {TOK.token_to_id(w) for w in load_words("animals")[:32] + load_words("names")[:32]}
    repeats = 0
    for i in range(400):
        ex = s.example(i)
        if (ex.answer_pos >= 0).any():  # a recall sequence: the same as without repeats
            assert (ex.ids == plain.example(i).ids).all()
            continue
        repeats += 1
        body = ex.ids[1:][ex.ids[1:] != TOK.token_to_id("<pad>")]  # the two copies, then padding
        n = len(body) // 2
        assert len(body) == 2 * n and n >= 20 and (body[:n] == body[n:]).all() and set(body.tolist()) <= vocab
        trained = np.flatnonzero(ex.labels != IGNORE)
        assert trained.tolist() == list(range(1 + n, 2 * n))  # every second-copy token but the last
        assert (ex.labels[trained] == ex.ids[trained + 1]).all()
    assert 70 <= repeats <= 130  # 25% of 400
    for split in ("val", "probe"):
        held = RecallStream(TOK, cfg, seed=3, split=split)
        assert all((held.example(i).answer_pos >= 0).any() for i in range(200))


class Oracle(torch.nn.Module):
    """Answers every query right except when the stored key sits at an odd position."""

    def __init__(self, stream):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.stream = stream

    def forward(self, ids):
        B, T = ids.shape
        logits = torch.zeros(B, T, TOK.get_vocab_size())
        for b in range(B):
            row = ids[b].tolist()
            for t in range(1, T - 1):
                if row[t] in self.keys and row[t] in row[:t]:  # a query (keys repeat: drawn with replacement)
                    p = row.index(row[t])
                    logits[b, t, row[p + 1] if p % 2 == 0 else 0] = 1.0
        return logits


def test_recall_accuracy_groups_by_phase():
    s = RecallStream(TOK, RecallConfig(seq_len=96), seed=0, split="val")
    m = Oracle(s)
    m.keys = {TOK.token_to_id(w) for w in load_words("animals")}
    r = recall_accuracy(m, s, n=64, batch_size=32, modulus=8)
    acc = np.array(r["by_residue"])
    assert np.allclose(acc[0::2], 1.0) and np.allclose(acc[1::2], 0.0)
    assert r["gap"] == pytest.approx(100.0) and 0.4 < r["accuracy"] < 0.6


def test_queries_repeat_keys_so_elimination_does_not_pay():
    """Queries draw keys with replacement: a model cannot score by ruling out the names already asked for."""
    s = RecallStream(TOK, RecallConfig(min_records=8, max_records=8), seed=0)
    repeats = 0
    for i in range(40):
        ex = s.example(i)
        queried = ex.answer_pos[ex.answer_pos >= 0].tolist()
        repeats += len(queried) - len(set(queried))
    assert repeats > 20


def test_recall_tokenizer_holds_only_the_layout_words():
    cfg = RecallConfig(n_keys=5, n_values=7)
    tok = recall_tokenizer(cfg)
    vocab = set(tok.get_vocab())
    assert set(load_words("animals")[:5]) <= vocab and not set(load_words("animals")[5:]) & vocab
    assert set(load_words("names")[:7]) <= vocab and not set(load_words("names")[7:]) & vocab
    assert set(load_words("filler")) <= vocab
    ex = RecallStream(tok, RecallConfig(n_keys=5, n_values=7, max_records=5), seed=0).example(0)
    assert ex.ids.max() < tok.get_vocab_size()


def test_two_word_keys():
    """key_words=2: keys are distinct pairs of animals; the loss sits on the value after the key's last word."""
    cfg = RecallConfig(key_words=2, seq_len=112)
    tok = recall_tokenizer(cfg)
    s = RecallStream(tok, cfg, seed=1)
    animals = set(load_words("animals")[: cfg.n_keys])
    for i in range(20):
        ex = s.example(i)
        words = [tok.id_to_token(int(t)) for t in ex.ids]
        marker = words.index("?")
        for q in np.flatnonzero(ex.labels != IGNORE):
            p = ex.answer_pos[q]  # the stored record's first key word: key, key, value as queried
            assert words[p : p + 3] == words[q - 1 : q + 2] and {words[q - 1], words[q]} <= animals
            assert p + 1 < marker < q
        pairs = [tuple(words[j : j + 2]) for j in range(1, marker - 1) if words[j] in animals and words[j + 1] in animals]
        assert len(pairs) == len(set(pairs))  # distinct keys within a sequence
    with pytest.raises(ConfigError, match="key_words"):
        RecallConfig(key_words=3)


def test_repeat_until_limits_repeats_to_a_warm_up():
    """With repeat_until, examples from that index on are recall sequences, those of a run without repeats; the
    earlier ones are exactly those of a run with repeats throughout."""
    warm = RecallStream(TOK, RecallConfig(seq_len=96, repeat_prob=0.25, repeat_until=40))
    always = RecallStream(TOK, RecallConfig(seq_len=96, repeat_prob=0.25))
    never = RecallStream(TOK, RecallConfig(seq_len=96))
    assert any(warm.is_repeat(i) for i in range(40)) and not any(warm.is_repeat(i) for i in range(40, 200))
    for i in range(120):
        ref = always if i < 40 else never
        assert np.array_equal(warm.example(i).ids, ref.example(i).ids)
        assert np.array_equal(warm.example(i).labels, ref.example(i).labels)
    with pytest.raises(ConfigError, match="repeat_until >= 0"):
        RecallConfig(repeat_until=-1)


# sha256 of the first 400 examples (ids, labels, answer_pos) of each layout, recorded from the generator as it was
# before its draws were batched: runs, resumes and the demo's numbers depend on the stream never changing
STREAM_DIGESTS = {
    "default": "286ace4d5b3447cc2ea28ca8ca8475516acd01849ff478b3b9c61a523c34fde6",
    "demo": "008902431c56e9a3b573f4a2ce149221c46aede212653c3786a0b38693e1bc3a",
    "two-word keys, query gaps": "691dfc61375986797037e299955eb444aca25cbd0bcfd080e9c63a82eacda82a",
}
STREAM_LAYOUTS = {
    "default": {},
    "demo": dict(min_records=2, max_records=16, n_keys=32, n_values=32, max_prefix=24, min_distance=16, gap_prob=1.0,
                 max_gap=4, curriculum=3000),
    "two-word keys, query gaps": dict(key_words=2, query_gaps=True, gap_prob=0.7, max_gap=3),
}


@pytest.mark.parametrize("layout", list(STREAM_LAYOUTS))
def test_the_stream_is_the_one_it_always_was(layout):
    import hashlib

    cfg = RecallConfig(**STREAM_LAYOUTS[layout])
    s = RecallStream(recall_tokenizer(cfg), cfg, seed=7)
    h = hashlib.sha256()
    for i in range(400):
        e = s.example(i)
        for a in (e.ids, e.labels, e.answer_pos):
            h.update(a.tobytes())
    assert h.hexdigest() == STREAM_DIGESTS[layout]
