"""Needle-format training data: the evaluation's record layout at the training length, labels on the queries."""

import numpy as np
import pytest

from phasekv.data import DataConfig, build_stream, data_tokenizer
from phasekv.data.needle import NeedleConfig, NeedleStream, needle_records, needle_tokenizer
from phasekv.data.stream import IGNORE
from phasekv.data.tokenizer import train_bpe
from phasekv.errors import ConfigError, DataError
from phasekv.eval.prompts import RetrievalPrompts, needle_config
from phasekv.eval.tokens import WordTokenizer


@pytest.fixture(scope="module")
def tok():
    return needle_tokenizer(NeedleConfig())


def words(tok, ids):
    return [tok.id_to_token(int(i)) for i in ids]


def test_layout_labels_and_answer_positions(tok):
    s = NeedleStream(tok, NeedleConfig(seq_len=512, queries=6), seed=3)
    e = s.example(11)
    assert len(e.ids) == 512 and e.ids[0] == tok.token_to_id("<bos>")
    w = words(tok, e.ids)
    q = np.flatnonzero(e.labels != IGNORE)
    assert len(q) == 6 and q[-1] == 510  # the last query's name is the sequence's last token
    assert (np.diff(q) == 4).all()  # queries are whole records: key key name ;
    names = set(s.values)
    seps = [i for i, x in enumerate(w) if x == ";"]
    assert len(seps) == needle_records(512) + 5  # every record and every query but the last ends with ";"
    for p in q:
        k = e.answer_pos[p]  # the queried record's first key token
        assert w[k : k + 4] == [w[p - 1], w[p], w[p + 1], ";"] and w[p + 1] in names
        assert tok.id_to_token(int(e.labels[p])) == w[p + 1]
        assert p - k >= 16  # beyond the local window


def test_records_are_the_evaluations(tok):
    """A training sequence and a needle prompt are made of the same records: two key words of the animals, a name,
    the separator the needle picks, filler between them."""
    ev = RetrievalPrompts(needle_config(context=512, per_group=64), WordTokenizer(tok))
    prompt = ev.prompt(0)
    assert ev.sep == NeedleConfig().separator and ev.cfg.records == needle_records(512)
    e = NeedleStream(tok, NeedleConfig(seq_len=512)).example(0)
    for ws in (prompt.words, words(tok, e.ids[1:])):
        seps = [i for i, x in enumerate(ws) if x == ";"]
        assert all(ws[i - 1] in ev.values and ws[i - 2] in ev.keys and ws[i - 3] in ev.keys for i in seps)


def test_deterministic_and_splits_differ(tok):
    s, v = NeedleStream(tok, NeedleConfig(seq_len=256)), NeedleStream(tok, NeedleConfig(seq_len=256), split="val")
    assert (s.example(4).ids == NeedleStream(tok, NeedleConfig(seq_len=256)).example(4).ids).all()
    assert not (s.example(4).ids == v.example(4).ids).all()


def test_curriculum_grows_the_records(tok):
    s = NeedleStream(tok, NeedleConfig(seq_len=256, curriculum=100))
    count = [(words(tok, s.example(i).ids).count(";") - 7) for i in (0, 99, 100)]
    assert count[0] == 1 and count[2] == needle_records(256) and count[0] < count[1] <= count[2]
    assert NeedleStream(tok, NeedleConfig(seq_len=256, curriculum=100), split="val").record_range(0) == (31, 31)


def test_every_phase_is_covered(tok):
    s = NeedleStream(tok, NeedleConfig(seq_len=256))
    res = {int(p) % 8 for i in range(40) for p in s.example(i).answer_pos if p >= 0}
    assert res == set(range(8))


def test_bad_config_and_tokenizer(tok):
    with pytest.raises(ConfigError, match="too short"):
        NeedleStream(tok, NeedleConfig(seq_len=64, max_records=20))
    with pytest.raises(ConfigError, match="unknown needle option"):
        NeedleConfig.from_dict({"record": 3})
    with pytest.raises(ConfigError, match="min_records"):
        NeedleConfig(min_records=9, max_records=8)
    bpe = train_bpe(["the cat sat on the mat"] * 20, vocab_size=300, show_progress=False)
    with pytest.raises(DataError):
        NeedleStream(bpe, NeedleConfig(seq_len=256))


def test_data_config_builds_the_stream():
    cfg = DataConfig(data="needle", needle={"queries": 3})
    s = build_stream(cfg, data_tokenizer(cfg), 300, seed=1, split="val")
    assert isinstance(s, NeedleStream) and s.seq_len == 300 and s.cfg.queries == 3
    with pytest.raises(ConfigError, match="recall_mix"):
        DataConfig(data="needle", recall_mix=0.5)
