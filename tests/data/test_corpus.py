import json

import numpy as np
import pandas as pd
import pytest

from phasekv.data import (
    DataConfig,
    MixtureStream,
    RecallStream,
    TextStream,
    batch,
    build_shards,
    build_stream,
    iter_corpus,
    resolve_files,
    train_bpe,
)
from phasekv.data.stream import IGNORE
from phasekv.errors import ConfigError, DataError

DOCS = [f"document {i}: the fox {i} saw the crow near the river, and the crow flew to the hill." for i in range(60)]


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text(" ".join(DOCS[:20]))
    (d / "b.jsonl").write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(DOCS[20:40])))
    pd.DataFrame({"text": DOCS[40:]}).to_parquet(d / "c.parquet")
    return d


@pytest.fixture
def bpe(corpus):
    return train_bpe(iter_corpus(corpus), vocab_size=300, show_progress=False)


def test_resolve_and_read(corpus):
    assert [p.name for p in resolve_files(corpus)] == ["a.txt", "b.jsonl", "c.parquet"]
    assert [p.name for p in resolve_files(str(corpus / "*.jsonl"))] == ["b.jsonl"]
    docs = list(iter_corpus(f"{corpus}/a.txt,{corpus}/c.parquet"))
    assert len(docs) == 1 + 20 and docs[-1] == DOCS[-1]


@pytest.mark.parametrize("workers", [1, 2])
def test_shards_round_trip(corpus, bpe, tmp_path, workers):
    d = build_shards(corpus, bpe, tmp_path / f"cache{workers}", workers=workers, progress=False)
    meta = json.loads((d / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and len(meta["tokens"]) == 3
    shard = np.fromfile(d / "shard_00001.bin", dtype=np.uint16)
    assert (shard == bpe.token_to_id("<eos>")).sum() == 20  # one end-of-text per jsonl document
    text = bpe.decode([int(t) for t in shard[: np.argmax(shard == 2)]])
    assert text == DOCS[20]
    assert build_shards(corpus, bpe, tmp_path / f"cache{workers}", progress=False) == d  # cached, not rebuilt


def test_text_stream_windows(corpus, bpe, tmp_path):
    d = build_shards(corpus, bpe, tmp_path / "cache", workers=1, progress=False)
    s = TextStream(d, seq_len=32, seed=0)
    ex = s.example(5)
    assert ex.ids.shape == ex.labels.shape == (32,) and (ex.labels[:-1] == ex.ids[1:]).all()
    assert np.array_equal(ex.ids, TextStream(d, seq_len=32, seed=0).example(5).ids)
    v = TextStream(d, seq_len=32, seed=0, split="val", val_fraction=0.2)
    assert v.example(0).ids.shape == (32,)
    with pytest.raises(DataError, match="too small"):
        TextStream(d, seq_len=10**6)


def test_mixture_ratio(corpus, bpe, tmp_path):
    cfg = DataConfig(data=str(corpus), recall_mix=0.25, cache_dir=str(tmp_path / "cache"), workers=1)
    s = build_stream(cfg, bpe, seq_len=96, seed=0, progress=False)
    assert isinstance(s, MixtureStream)
    b = batch(s, 0, 400)
    is_recall = (b["answer_pos"] >= 0).any(1)
    assert 0.18 < is_recall.float().mean() < 0.32
    # recall words are multi-token under this BPE: every value token after a queried key is a target
    rec = RecallStream(bpe, seed=0)
    assert any(len(v) > 1 for v in rec.values)
    assert (b["labels"][is_recall] != IGNORE).sum() > (b["answer_pos"] >= 0).sum()


def test_text_needs_a_tokenizer(corpus):
    from phasekv.data import data_tokenizer

    with pytest.raises(ConfigError, match="--tokenizer"):
        data_tokenizer(DataConfig(data=str(corpus)))
    with pytest.raises(ConfigError, match="recall_mix"):
        DataConfig(recall_mix=0.5)


@pytest.mark.parametrize(
    "name,content,match",
    [
        ("empty.txt", b"", r"empty.txt: empty"),
        ("blank.jsonl", b"\n\n", r"blank.jsonl: empty"),
        ("latin1.txt", b"line one\nline two caf\xe9\n", r"latin1.txt:2: not valid UTF-8"),
        ("bad.jsonl", b'{"text": "ok"}\n{"text": \n', r"bad.jsonl:2: invalid JSON"),
        ("nofield.jsonl", b'{"text": "ok"}\n{"body": "x"}\n', r"nofield.jsonl:2: expected an object with a string 'text'"),
        ("utf.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n', r"utf.jsonl:2: not valid UTF-8"),
        ("x.csv", b"a,b\n", r"unsupported file type"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path, bpe, name, content, match):
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(DataError, match=match):
        build_shards(p, bpe, tmp_path / "cache", workers=1, progress=False)


def test_bad_parquet_and_missing(tmp_path, bpe):
    pd.DataFrame({"body": ["x"]}).to_parquet(tmp_path / "t.parquet")
    with pytest.raises(DataError, match="no 'text' column"):
        list(iter_corpus(tmp_path / "t.parquet"))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="junk.parquet: cannot read parquet"):
        list(iter_corpus(tmp_path / "junk.parquet"))
    with pytest.raises(DataError, match="no files match"):
        resolve_files(str(tmp_path / "*.nothing"))
    with pytest.raises(DataError, match="not found"):
        resolve_files(str(tmp_path / "absent.txt"))


def test_bad_file_in_worker_pool(tmp_path, bpe):
    (tmp_path / "good.txt").write_text("fine text here")
    (tmp_path / "zbad.txt").write_bytes(b"ok\n\xff\xfe")
    with pytest.raises(DataError, match=r"zbad.txt:2: not valid UTF-8"):
        build_shards(tmp_path, bpe, tmp_path / "cache", workers=2, progress=False)
