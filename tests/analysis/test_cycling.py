"""Gate cycling: delta then -delta restores the logits exactly, delta = 0 is a no-op, the prediction and
R^2 (boundary phase excluded) on constructed accuracy profiles."""

import numpy as np
import pandas as pd
import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.analysis.cycling import (
    boundary_phase,
    cycle_gates_,
    cycled,
    cycling_stats,
    predicted,
    r_squared,
)
from phasekv.errors import ConfigError


def _model(name="w8s8-2kv"):
    torch.manual_seed(3)
    model = PhaseLM(ModelConfig.from_name(name, preset="tiny", vocab_size=64)).eval()
    with torch.no_grad():  # non-trivial biases so a cycle really moves something
        for block in model.layers:
            for b in block.attn.compressor.branches():
                b.gate_bias.normal_(0, 1.0)
                b.gate_weight.mul_(20)
    return model


@pytest.mark.parametrize("delta", [1, -2, 3, 7])
def test_cycle_then_back_restores_logits_exactly(delta):
    model = _model()
    ids = torch.randint(0, 64, (2, 50))
    with torch.no_grad():
        base = model(ids)
        cycle_gates_(model, delta)
        moved = model(ids)
        cycle_gates_(model, -delta)
        back = model(ids)
    assert not torch.allclose(moved, base, atol=1e-4)
    assert torch.equal(back, base)


def test_delta_zero_and_context_manager_are_exact():
    model = _model()
    ids = torch.randint(0, 64, (2, 50))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        base = model(ids)
        with cycled(model, 0):
            assert torch.equal(model(ids), base)
        with cycled(model, 8):  # a full turn of W = 8 offsets
            assert torch.equal(model(ids), base)
        with cycled(model, 2):
            pass
        assert torch.equal(model(ids), base)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_cycling_shifts_offsets():
    model = _model("w8s8-1kv")
    b = model.layers[0].attn.compressor.key
    before = b.gate_bias.detach().clone()
    cycle_gates_(model, 3)
    assert torch.equal(b.gate_bias[(np.arange(8) + 3) % 8], before)  # new b_{i+3} = old b_i


def test_cycling_refuses_overlapping_windows_and_uniform_gates():
    for name in ("w8s4-1kv", "w8s8-1kv-uniform", "full-1kv"):
        with pytest.raises(ConfigError):
            cycle_gates_(PhaseLM(ModelConfig.from_name(name, preset="tiny", vocab_size=64)), 1)


def test_boundary_phase():
    assert boundary_phase(_model("w8s8-1kv")) == 7


def test_prediction_and_r2():
    acc0 = np.array([0.9, 0.8, 0.1, 0.5, 0.7, 0.3, 0.6, 0.05])
    assert predicted(acc0, 1)[2] == acc0[1]  # A_1(r) = A_0(r - 1)
    keep = np.arange(8) != 7
    assert r_squared(acc0, predicted(acc0, 2), 2, keep) == pytest.approx(1.0)
    noisy = predicted(acc0, 2) + np.array([0, 0.1, -0.1, 0, 0.05, 0, 0, 0.4])
    assert 0.5 < r_squared(acc0, noisy, 2, keep) < 1.0
    assert np.isnan(r_squared(acc0, acc0, 1, keep))  # no observed change: undefined


def _rows(acc, n_map=6, reps=10, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for m in range(n_map):
        for r, a in enumerate(acc):
            out += [{"phase": r, "mapping": m, "correct": bool(x)} for x in rng.random(reps) < a]
    return pd.DataFrame(out)


def test_cycling_stats_perfect_shift():
    acc0 = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    st = cycling_stats(_rows(acc0), _rows(predicted(acc0, 1)), 8, 1, boundary=7, n_boot=200)
    assert st["r2"] == pytest.approx(1.0)
    assert st["r2_ci"] == pytest.approx([1.0, 1.0])
    assert np.array_equal(st["pred"], predicted(st["acc0"], 1))
