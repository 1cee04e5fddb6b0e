import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phasekv.data.tokenizer import build_word_tokenizer
from phasekv.errors import ConfigError
from phasekv.eval.design import make_design, round_up
from phasekv.eval.prompts import PromptConfig, RetrievalPrompts, needle_config
from phasekv.eval.tokens import WordTokenizer

TOK = WordTokenizer(build_word_tokenizer(), "word")


def assert_exact(positions, modulus):
    """Integer sums and sums of squares identical across groups; every position in its residue."""
    sums = {int(np.sum(p)) for p in positions}
    squares = {int(np.sum(np.asarray(p, dtype=object) ** 2)) for p in positions}
    assert len(sums) == 1 and len(squares) == 1
    for r, p in enumerate(positions):
        assert np.all(np.asarray(p) % modulus == r)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.integers(1, 6), st.floats(50, 5000))
def test_exact_design_for_multiples_of_m2(modulus, q, center):
    d = make_design(modulus, q * modulus**2, center)
    assert d.exact and d.n_per_group == q * modulus**2
    assert_exact(d.positions, modulus)
    assert abs(np.mean(d.positions[0]) - center) <= 1.0
    assert d.moments()["mean_spread"] == 0 and d.moments()["var_spread"] == 0


def test_other_n_rounds_up_with_notice():
    with pytest.warns(UserWarning, match="rounded up"):
        d = make_design(24, 256, 500)
    assert d.n_per_group == 576 and d.requested == 256 and d.exact
    assert round_up(577, 24) == 1152


def test_keep_n_samples_and_reports_spread():
    d = make_design(8, 40, 300, keep_n=True, rng=np.random.default_rng(1))
    assert not d.exact and all(len(p) == 40 for p in d.positions)
    assert "spread" in d.notice
    for r, p in enumerate(d.positions):
        assert np.all(p % 8 == r)


def _built_positions(ps):
    per = [[] for _ in range(ps.cfg.modulus)]
    qs = set()
    for pr in ps:
        per[pr.residue].append(pr.target_pos)
        qs.add(pr.query_pos)
        assert pr.ids[pr.target_pos] == TOK.word_id(pr.words[pr.target_pos - len(TOK.prefix)])
        assert len(pr.ids) == ps.length
    return per, qs


@settings(max_examples=25, deadline=None)
@given(
    modulus=st.sampled_from([2, 3, 4, 6]),
    q=st.integers(1, 2),
    padding=st.sampled_from(["prefix", "in-sequence"]),
    records=st.integers(12, 40),
    demos=st.integers(0, 4),
    extra=st.integers(0, 10),
    seed=st.integers(0, 10_000),
    marker=st.sampled_from([None, "?"]),
)
def test_lookup_prompts_match_moments_exactly(modulus, q, padding, records, demos, extra, seed, marker):
    cfg = PromptConfig(records=records, demos=demos, padding=padding, modulus=modulus, per_group=q * modulus**2,
                       filler=2 * modulus + extra, mappings=5, seed=seed, marker=marker)
    ps = RetrievalPrompts(cfg, TOK)
    per, qs = _built_positions(ps)
    assert len(qs) == 1
    assert_exact(per, modulus)


@settings(max_examples=10, deadline=None)
@given(
    modulus=st.sampled_from([4, 8]),
    padding=st.sampled_from(["prefix", "in-sequence"]),
    records=st.integers(60, 200),
    seed=st.integers(0, 10_000),
)
def test_needle_prompts_match_moments_exactly(modulus, padding, records, seed):
    cfg = needle_config(context=records * 4 + 200, records=records, modulus=modulus, per_group=modulus**2,
                        padding=padding, seed=seed)
    ps = RetrievalPrompts(cfg, TOK)
    per, qs = _built_positions(ps)
    assert len(qs) == 1
    assert_exact(per, modulus)
    mid = ps.length / 2
    assert all(abs(np.mean(p) - mid) < ps.length / 4 for p in per)


def test_in_sequence_moves_distractors_prefix_does_not():
    base = dict(records=16, demos=2, modulus=4, per_group=16, filler=12, mappings=1, seed=3)
    for padding, expect_lockstep in (("prefix", True), ("in-sequence", False)):
        ps = RetrievalPrompts(PromptConfig(padding=padding, **base), TOK)
        lockstep = []
        for pr in list(ps)[:20]:
            first = pr.words.index(next(w for w in pr.words if w in ps.keys))  # first record's key
            lockstep.append((pr.target_pos - len(TOK.prefix) - first) == 2 * pr.target_index)
        assert all(lockstep) == expect_lockstep


def test_design_that_cannot_fit_is_a_config_error():
    with pytest.raises(ConfigError, match="raise records or filler"):
        RetrievalPrompts(PromptConfig(records=10, demos=2, modulus=24, per_group=576, filler=4), TOK)
