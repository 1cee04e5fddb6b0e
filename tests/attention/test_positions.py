import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phasekv.attention.positions import Grid


@settings(max_examples=100, deadline=None)
@given(W=st.integers(1, 12), S=st.integers(1, 12), o=st.integers(0, 5), T=st.integers(1, 60),
       local=st.sampled_from([None, 1, 3, 16]))
def test_visibility_rule_matches_definition(W, S, o, T, local):
    S = min(S, W)
    g = Grid(W, S, o, local)
    t = torch.arange(T)
    n = g.n_complete(T)
    j = torch.arange(n + 2)
    vis = g.entry_visible(t, j)
    for tt in range(T):
        for jj in range(n + 2):
            assert bool(vis[tt, jj]) == (jj * S + o + W - 1 <= tt)
    # entries complete inside the sequence are exactly n
    assert all(int(g.entry_end(torch.tensor(k))) <= T - 1 for k in range(n))
    assert int(g.entry_end(torch.tensor(n))) > T - 1
    ex = g.exact_visible(t, t)
    for tt in range(T):
        ends = [k * S + o + W - 1 for k in range(T) if k * S + o + W - 1 <= tt]
        last = max(ends) if ends else -1
        for p in range(T):
            want = p <= tt and (p > tt - local if local is not None else p > last)
            assert bool(ex[tt, p]) == want
        # the longest exact set never exceeds what the decode cache keeps
        assert int(ex[tt].sum()) <= g.exact_keep
