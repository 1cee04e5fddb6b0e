import math

from phasekv.theory.flow import FlowOptions, independent_collision_rate, summarise_runs, train_flow
from phasekv.theory.model import TheoryConfig


def test_tiny_flow_converges_to_one_hot_gates():
    cfg = TheoryConfig(N=24, S=3, L=2, m=2, gamma=4.0, beta=2.0).validate()
    opts = FlowOptions(runs=4, steps=150, batch=8, eval_contexts=64, track_every=25, rho=0.1, eta=8.0)
    _, _, tracked, _ = train_flow(cfg, opts, seed=0)
    first, last = tracked[tracked.step == 0], tracked[tracked.step == opts.steps]
    assert (first.key_min < 0.6).all()  # starts near uniform
    assert (last.key_min > 0.95).all() and (last.value_min > 0.95).all()  # uniform over held-out contexts
    assert (last.position < cfg.S).all()  # keys on non-final positions
    summary = summarise_runs(cfg, opts, tracked)
    assert summary["converged_fraction"] == 1.0 and summary["reproduced"]
    assert sum(summary["position_counts"].values()) == opts.runs * cfg.m


def test_independent_collision_rate():
    assert independent_collision_rate(1, 5) == 0.0
    assert math.isclose(independent_collision_rate(2, 4), 1 / 3)
    assert math.isclose(independent_collision_rate(3, 4), 1 - 6 / 27)
