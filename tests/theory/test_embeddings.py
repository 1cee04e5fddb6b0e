import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phasekv.errors import ConfigError, DataError
from phasekv.theory.embeddings import check_bound, gram_deviation, make_embeddings


@settings(max_examples=25, deadline=None)
@given(
    N=st.integers(2, 40),
    kappa=st.floats(0.0, 0.99),
    eps=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**16),
)
def test_generator_meets_bound(N, kappa, eps, seed):
    emb = make_embeddings(N, kappa, eps, seed=seed)
    G = emb.gram
    assert torch.allclose(G.diagonal(), torch.full((N,), 1 + kappa, dtype=G.dtype))  # diagonal exact
    assert emb.max_deviation() <= eps + 1e-12
    if eps == 0:
        assert emb.max_deviation() < 1e-12  # exactly kappa J + I


def test_bound_is_used_not_vacuous():
    emb = make_embeddings(64, 0.3, 0.2, seed=1)
    dev = emb.max_deviation()
    assert 0.02 < dev <= 0.2  # random unit vectors spread the error over a real fraction of the bound
    with pytest.raises(DataError, match="deviation"):
        check_bound(emb.X, 0.3, dev / 2)


def test_check_bound_detects_wrong_kappa():
    X = make_embeddings(8, 0.5).X
    assert gram_deviation(X, 0.4) == pytest.approx(0.1)
    with pytest.raises(DataError):
        check_bound(X, 0.4, 0.05)


@pytest.mark.parametrize("kw", [{"N": 1, "kappa": 0.1}, {"N": 4, "kappa": 1.0}, {"N": 4, "kappa": 0.1, "eps": -0.1}])
def test_bad_arguments(kw):
    with pytest.raises(ConfigError):
        make_embeddings(**kw)
