import math

import pytest
import torch

from phasekv.errors import ConfigError
from phasekv.theory.embeddings import make_embeddings
from phasekv.theory.flow import LogLinearGates, gate_probs
from phasekv.theory.model import (
    TheoryConfig,
    closed_form_distinct_loss,
    closed_form_loss,
    config_grid,
    context_losses,
    one_hot_rule,
    population_loss,
    query_correct,
    sample_contexts,
)


@pytest.mark.parametrize(
    "cfg, positions",
    [
        (TheoryConfig(N=40, S=5, L=3, m=3, kappa=0.3, gamma=3.0, beta=2.0), (1, 2, 3)),
        (TheoryConfig(N=40, S=5, L=3, m=3, kappa=0.0, gamma=1.0, beta=5.0), (4, 1, 2)),
        (TheoryConfig(N=100, S=4, L=5, m=1, kappa=0.7), (3,)),
    ],
)
def test_one_hot_distinct_loss_matches_closed_form(cfg, positions):
    cfg.validate()
    emb = make_embeddings(cfg.N, cfg.kappa)
    est = population_loss(cfg, emb, one_hot_rule(positions, cfg))
    assert est.method == "exact-symmetry" and est.se == 0
    assert est.mean == pytest.approx(closed_form_distinct_loss(cfg), abs=1e-10)
    assert est.mean == pytest.approx(closed_form_loss(cfg, positions), abs=1e-10)


def test_symmetry_shortcut_agrees_with_exact_enumeration():
    cfg = TheoryConfig(N=6, S=3, L=2, m=2, kappa=0.4, gamma=2.0, beta=3.0).validate()  # 720 ordered contexts
    emb = make_embeddings(cfg.N, cfg.kappa)
    rule = one_hot_rule((1, 2), cfg)
    enum = population_loss(cfg, emb, lambda ctx: tuple(p.expand(len(ctx), *p.shape) for p in rule))
    assert enum.method == "exact-enumeration" and enum.n_contexts == math.perm(6, 6)
    assert enum.mean == pytest.approx(closed_form_distinct_loss(cfg), abs=1e-10)


def test_collisions_match_closed_form_and_are_worse():
    cfg = TheoryConfig(N=50, S=4, L=3, m=3, kappa=0.2).validate()
    emb = make_embeddings(cfg.N, cfg.kappa)
    for pos in [(1, 1, 2), (3, 3, 3), (2, 2, 1)]:
        exact = population_loss(cfg, emb, one_hot_rule(pos, cfg)).mean
        assert exact == pytest.approx(closed_form_loss(cfg, pos), abs=1e-10)
        assert exact > closed_form_distinct_loss(cfg)


def test_monte_carlo_has_standard_error_and_is_consistent():
    cfg = TheoryConfig(N=30, S=4, L=3, m=2, kappa=0.3, eps=0.1).validate()
    emb = make_embeddings(cfg.N, cfg.kappa, cfg.eps, seed=3)
    rule = one_hot_rule((1, 2), cfg)
    a = population_loss(cfg, emb, rule, n_contexts=2000, seed=1)
    b = population_loss(cfg, emb, rule, n_contexts=2000, seed=2)
    assert a.method == "monte-carlo" and a.se > 0
    assert abs(a.mean - b.mean) < 5 * math.hypot(a.se, b.se)
    assert abs(a.mean - closed_form_distinct_loss(cfg)) < 0.5  # eps = 0.1 perturbs the closed form a little


def test_population_loss_gradient_matches_finite_differences():
    cfg = TheoryConfig(N=12, S=3, L=2, m=2, kappa=0.3, eps=0.1, gamma=2.0, beta=2.0).validate()
    emb = make_embeddings(cfg.N, cfg.kappa, cfg.eps, seed=0)
    ctx = sample_contexts(cfg, 3, torch.Generator().manual_seed(0))
    G = emb.gram

    def loss(theta_k, theta_v):
        return context_losses(G, ctx, theta_k.softmax(-1), theta_v.softmax(-1), cfg).mean()

    gen = torch.Generator().manual_seed(1)
    tk = torch.randn(3, cfg.m, cfg.L, cfg.S, generator=gen, dtype=torch.float64, requires_grad=True)
    tv = torch.randn(3, cfg.m, cfg.L, cfg.S, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(loss, (tk, tv), eps=1e-6, atol=1e-7)


def test_log_linear_gate_gradient_matches_finite_differences():
    cfg = TheoryConfig(N=8, S=3, L=2, m=2, kappa=0.5).validate()
    emb = make_embeddings(cfg.N, cfg.kappa)
    c = LogLinearGates(2, cfg, emb.X.shape[1], rho=1.0, gen=torch.Generator().manual_seed(0)).c.detach()
    ctx = sample_contexts(cfg, 6, torch.Generator().manual_seed(1)).view(2, 3, cfg.L, cfg.S)

    def loss(c):
        pK, pV = gate_probs(c, emb.X, ctx)  # (R, B, m, L, S)
        return context_losses(emb.gram, ctx.flatten(0, 1), pK.flatten(0, 1), pV.flatten(0, 1), cfg).mean()

    assert torch.autograd.gradcheck(loss, (c.clone().requires_grad_(),), eps=1e-6, atol=1e-7)


def test_gates_are_probabilities_and_ball_init():
    cfg = TheoryConfig(N=20, S=4, L=3, m=2).validate()
    emb = make_embeddings(cfg.N, cfg.kappa)
    gates = LogLinearGates(3, cfg, emb.X.shape[1], rho=0.5, gen=torch.Generator().manual_seed(0))
    assert gates.c.norm(dim=-1).max() <= 0.5 + 1e-12
    ctx = sample_contexts(cfg, 12, torch.Generator().manual_seed(0)).view(3, 4, cfg.L, cfg.S)
    pK, pV = gates(emb.X, ctx)
    assert pK.shape == (3, 4, cfg.m, cfg.L, cfg.S)
    one = torch.ones((), dtype=torch.float64)
    assert torch.allclose(pK.sum(-1), one) and torch.allclose(pV.sum(-1), one)


def test_accuracy_of_one_hot_rule_is_coverage():
    cfg = TheoryConfig(N=40, S=5, L=3, m=2).validate()
    emb = make_embeddings(cfg.N, cfg.kappa)
    ctx = sample_contexts(cfg, 5, torch.Generator().manual_seed(0))
    correct = query_correct(emb.gram, ctx, *one_hot_rule((1, 3), cfg), cfg).view(5, cfg.L, cfg.S - 1)
    assert correct[..., [0, 2]].all() and not correct[..., [1, 3]].any()


@pytest.mark.parametrize(
    "kw", [{"m": 4, "S": 4}, {"N": 10, "S": 4, "L": 4}, {"L": 1}, {"gamma": 0.0}, {"kappa": 1.0}]
)
def test_config_validation(kw):
    with pytest.raises(ConfigError):
        TheoryConfig(**kw).validate()


def test_grid_skips_invalid_heads_and_rejects_unknown_fields():
    grid = config_grid(TheoryConfig(), S=[3, 4], m=[2, 3])
    assert [(c.S, c.m) for c in grid] == [(3, 2), (4, 2), (4, 3)]
    with pytest.raises(ConfigError, match="unknown"):
        config_grid(TheoryConfig(), heads=[2])
