import torch

from phasekv.theory.embeddings import make_embeddings
from phasekv.theory.minimisers import MinimiserOptions, assignment_table, one_hotness, run_minimisers
from phasekv.theory.model import TheoryConfig, closed_form_distinct_loss


def test_optima_are_one_hot_with_value_after_key():
    cfg = TheoryConfig(N=32, S=3, L=2, m=1, gamma=4.0, beta=2.0).validate()
    starts, table, [summary] = run_minimisers([cfg], MinimiserOptions(starts=8, steps=300), progress=False)
    assert summary["best_one_hot"] and summary["frac_starts_one_hot"] == 1.0
    assert (starts.key_max_min > 0.99).all() and (starts.value_succ_min > 0.99).all()
    assert summary["best_minus_closed_form"] > -1e-9  # nothing beats the one-hot distinct closed form
    assert summary["best_minus_closed_form"] < 1e-3
    assert summary["reproduced"]


def test_distinct_assignments_strictly_beat_collisions_at_eps0():
    cfg = TheoryConfig(N=64, S=4, L=3, m=2, beta=2.0).validate()
    table = assignment_table(cfg, make_embeddings(cfg.N, cfg.kappa))
    assert len(table) == 6  # multisets of 2 positions from {1, 2, 3}
    distinct, colliding = table[table.distinct], table[~table.distinct]
    assert distinct.loss.max() - distinct.loss.min() < 1e-12  # all distinct assignments are equivalent
    assert colliding.loss.min() > distinct.loss.max()
    assert abs(distinct.loss.iloc[0] - closed_form_distinct_loss(cfg)) < 1e-10


def test_one_hotness_flags_diffuse_and_misaligned_rules():
    S = 4
    pK = torch.full((2, 1, 1, S), 1.0 / S)  # start 0 diffuse
    pK[1, 0, 0] = torch.tensor([0.0, 1.0, 0.0, 0.0])  # start 1 keys on position 2
    pV = torch.zeros(2, 1, 1, S)
    pV[:, 0, 0, 1] = 1.0  # value on position 2 (same as key: misaligned)
    oh = one_hotness(pK, pV)
    assert oh["key_max_min"][0] == 0.25 and oh["key_max_min"][1] == 1.0
    assert oh["value_succ_min"][1] == 0.0
