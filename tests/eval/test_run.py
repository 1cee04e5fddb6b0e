import json

import numpy as np
import pandas as pd
import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.data.tokenizer import build_word_tokenizer, save_tokenizer
from phasekv.eval.flip import FlipConfig, default_prompt, run_flip
from phasekv.eval.models import EvalModel, load
from phasekv.eval.prompts import lookup_config
from phasekv.eval.run import COLUMNS, evaluate, run_retrieval
from phasekv.eval.stats import summarize
from phasekv.eval.tokens import WordTokenizer

from .fakes import PlantedFlip, PlantedLookup

TOK = build_word_tokenizer()
WT = WordTokenizer(TOK, "word")
V = TOK.get_vocab_size()
SMALL = dict(records=12, demos=2, modulus=4, per_group=16, filler=8, mappings=4)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("m") / "w8s4"
    torch.manual_seed(0)
    PhaseLM(ModelConfig.from_name("w8s4-1kv", preset="tiny", vocab_size=V)).save(d)
    save_tokenizer(TOK, d)
    return d


def test_planted_model_recovered_end_to_end():
    pattern = [0.95, 0.9, 0.85, 0.1]
    fake = PlantedLookup(V, pattern)
    for padding in ("prefix", "in-sequence"):
        cfg = lookup_config(records=16, demos=2, modulus=8, per_group=128, filler=16, mappings=16, padding=padding)
        rows = evaluate(fake, TOK, cfg, batch_size=64)
        assert list(rows.columns) == COLUMNS and len(rows) == 8 * 128
        s = summarize(rows["residue"], rows["mapping"], rows["correct"], 8, 4)
        assert s.detected_period == 4
        assert s.periodicity["p_value"] < 0.05
        assert s.gap_ci[0] <= 85.0 <= s.gap_ci[1]
        worst = min(s.groups, key=lambda g: g["acc"])
        assert worst["residue"] % 4 == 3


def test_phase_free_fake_end_to_end():
    cfg = lookup_config(records=16, demos=2, modulus=8, per_group=128, filler=16, mappings=16)
    rows = evaluate(PlantedLookup(V, [0.6]), TOK, cfg, batch_size=64)
    s = summarize(rows["residue"], rows["mapping"], rows["correct"], 8, 4)
    assert s.periodicity["p_value"] > 0.05 and s.detected_period == 1


def test_run_dir_outputs_and_resume(model_dir, tmp_path, monkeypatch):
    em = load(model_dir)
    assert em.kind == "phasekv" and em.stride == 4 and em.name == "W8/S4 · 1 KV"
    cfg = lookup_config(padding="in-sequence", **SMALL)
    full = run_retrieval("lookup", em, cfg, tmp_path / "a", batch_size=8, progress=False)
    for key in ("model", "protocol", "modulus", "stride", "groups", "mean", "worst", "best", "gap", "gap_ci",
                "fold_consistency", "periodicity"):
        assert key in full
    assert set(full["groups"][0]) >= {"residue", "n", "correct", "acc", "lo", "hi"}
    assert full["periodicity"]["period"] == 4 and "p_value" in full["periodicity"]
    assert full["target_moments"]["mean_spread"] == 0 and full["target_moments"]["var_spread"] == 0
    assert len(full["target_moments"]["query_positions"]) == 1
    a = pd.read_parquet(tmp_path / "a" / "results.parquet")
    assert {"residue", "target_pos", "query_pos", "mapping", "correct", "prob"} <= set(a.columns)
    assert (tmp_path / "a" / "accuracy.png").stat().st_size > 0
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["model"] == "W8/S4 · 1 KV"

    # interrupt after 3 batches of 8 (partial rows flushed every 8 here), then resume
    import phasekv.eval.models as models_mod
    import phasekv.eval.run as run_mod

    monkeypatch.setattr(run_mod, "FLUSH_ROWS", 8)
    real, calls = models_mod.last_logits, {"n": 0}

    def flaky(model, ids):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return real(model, ids)

    monkeypatch.setattr(models_mod, "last_logits", flaky)  # what `score` calls
    with pytest.raises(KeyboardInterrupt):
        run_retrieval("lookup", em, cfg, tmp_path / "b", batch_size=8, progress=False)
    assert not (tmp_path / "b" / "results.parquet").exists()
    assert len(list((tmp_path / "b" / ".partial").glob("rows-*.parquet"))) == 3
    calls["n"] = -1000
    seen = []
    monkeypatch.setattr(models_mod, "last_logits", lambda m, ids: seen.append(len(ids)) or real(m, ids))
    run_retrieval("lookup", em, cfg, tmp_path / "b", batch_size=8, progress=False)
    assert sum(seen) == len(a) - 24  # only the missing prompts were evaluated
    b = pd.read_parquet(tmp_path / "b" / "results.parquet")
    pd.testing.assert_frame_equal(a, b)
    assert not (tmp_path / "b" / ".partial").exists()


def test_evaluate_matches_batch_size_and_hooks_stay_active(model_dir):
    em = load(model_dir)
    cfg = lookup_config(**SMALL)
    r1 = evaluate(em, None, cfg, pids=range(10), batch_size=1)
    r4 = evaluate(em.model, TOK, cfg, pids=range(10), batch_size=4)
    np.testing.assert_allclose(r1["prob"], r4["prob"], rtol=1e-4, atol=1e-7)
    handle = em.model.layers[0].attn.z_hook.register_forward_hook(lambda m, i, o: torch.zeros_like(o))
    try:
        r0 = evaluate(em, None, cfg, pids=range(10), batch_size=4)
    finally:
        handle.remove()
    assert not np.allclose(r0["prob"], r4["prob"])


def test_flip_counts_periodic_rankings(tmp_path):
    prompt, cands = default_prompt(WT, records=6, seed=0)
    a, b = (WT.word_id(c.strip()) for c in cands)
    em = EvalModel(PlantedFlip(V, a, b), WT, "planted", "phasekv", 4)
    s = run_flip(em, FlipConfig(lengths=12, records=6, families=["words", "repeat:the", "repeat:="]), tmp_path, progress=False)
    assert s["rankings"] == 36 and s["follow_pattern"] == 36 and s["switching"]
    rows = pd.read_parquet(tmp_path / "results.parquet")
    top = rows[rows["top"]]
    assert all((top["winner"] == cands[0]) == ((top["tokens"] - 1) % 4 >= 2))
    assert (tmp_path / "flip.png").exists()


def test_long_prompts_prefill_through_the_cache(model_dir, monkeypatch):
    import phasekv.eval.models as models

    em = load(model_dir)
    ids = torch.randint(0, V, (2, 150))
    full = models.last_logits(em.model, ids)
    monkeypatch.setattr(models, "PREFILL_CHUNK", 32)  # 150 tokens -> 5 chunks through the decode cache
    chunked = models.last_logits(em.model, ids)
    torch.testing.assert_close(chunked, full, rtol=1e-4, atol=1e-5)


def test_lookup_config_follows_the_training_data():
    """A recall run's words and key length carry over to its lookup prompts; explicit options win."""
    info = {"recall": {"n_keys": 32, "n_values": 24, "key_words": 2}}
    cfg = lookup_config(info, records=16, demos=2)
    assert (cfg.n_keys, cfg.n_values, cfg.key_tokens, cfg.record_len) == (32, 24, 2, 3)
    assert lookup_config(info, n_keys=48, n_values=None).n_keys == 48
    assert lookup_config(None).key_tokens == 1 and lookup_config(None).n_keys == 0  # an HF model: all words


def test_lookup_layout_fits_the_training_length():
    """Without records/demos/filler a run gets the longest layout that fits its training sequences; the
    study's layout for unknown lengths; given options are kept as they are."""
    info = {"recall": {"n_keys": 32, "n_values": 32}, "train_len": 96}
    cfg = lookup_config(info)
    assert (cfg.records, cfg.demos, cfg.filler) == (16, 4, 48)
    prompt_len = 1 + cfg.filler + cfg.record_len * (cfg.records + cfg.demos) + cfg.key_tokens
    assert prompt_len == 90 and prompt_len <= info["train_len"]
    assert (lookup_config({"train_len": 80}).records, lookup_config({"train_len": 80}).demos) == (16, 2)
    assert lookup_config({"train_len": 4096}).records == 64 and lookup_config(None).records == 64
    assert lookup_config(info, records=12).records == 12 and lookup_config(info, records=12).demos == 8


@pytest.mark.parametrize("threads", [1, 2])
def test_prefetch_builds_every_prompt_in_order_with_threads_or_in_turn(threads):
    from phasekv.eval.run import prefetch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        built = list(prefetch(lambda pid: pid * pid, range(50), depth=8))
    finally:
        torch.set_num_threads(before)
    assert built == [pid * pid for pid in range(50)]
