"""The coverage regulariser: zero for heads with disjoint static preferences, positive when they coincide."""

import json

import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.errors import ConfigError
from phasekv.train.coverage import CoverageProbe, coverage_penalty, overlap_penalty, phase_preference

SMALL = dict(preset="tiny", vocab_size=61, n_layers=1, d_model=32, n_heads=4, head_dim=16, d_ff=48)


def test_overlap_of_distributions():
    eye = torch.eye(8)
    assert overlap_penalty(eye[[1, 4, 6]]) == 0  # disjoint one-hot preferences
    assert overlap_penalty(eye[[3, 3]]) == pytest.approx(1.0)  # both heads on the same phase
    assert overlap_penalty(torch.full((2, 8), 1 / 8)) == pytest.approx(1 / 8)
    assert overlap_penalty(eye[[2]]) == 0  # a single head has nobody to overlap with


def test_phase_preference_pools_offsets_of_a_phase():
    alpha = torch.zeros(1, 1, 8, 1, 1)
    alpha[0, 0, 5] = 1.0  # offset 5
    assert phase_preference(alpha, stride=4)[0].tolist() == [0, 1, 0, 0]  # W8/S4: offset 5 is phase 1
    assert phase_preference(alpha, stride=8, offset=4)[0].tolist() == [0, 1, 0, 0, 0, 0, 0, 0]  # (4 + 5) mod 8


def _pin(model, offsets):
    """Make KV head h of layer l put (almost) all its key and value gate weight on offsets[l][h]."""
    with torch.no_grad():
        for layer, per_head in zip(model.layers, offsets, strict=True):
            for branch in layer.attn.compressor.branches():
                branch.gate_weight.zero_()
                branch.gate_bias.fill_(-60.0)
                for h, i in enumerate(per_head):
                    branch.gate_bias[i, h] = 60.0


@pytest.mark.parametrize("vector", [False, True])
def test_model_penalty_zero_when_disjoint_positive_when_coinciding(vector):
    name = "W8/S8 · 2 KV" + (" · vector gates" if vector else "")
    model = PhaseLM(ModelConfig.from_name(name, **SMALL))
    ids = torch.randint(0, 61, (2, 40))
    _pin(model, [[1, 5]])
    assert coverage_penalty(model, ids) < 1e-6
    _pin(model, [[3, 3]])
    assert coverage_penalty(model, ids) > 0.99


def test_heads_of_different_layers_compared_on_the_phase_axis():
    """Staggered grids (offsets 0 and 4): offset 4 of layer 0 and offset 0 of layer 1 are the same phase."""
    model = PhaseLM(ModelConfig.from_name("W8/S8 · 1 KV · staggered windows", **(SMALL | {"n_layers": 2})))
    ids = torch.randint(0, 61, (2, 40))
    _pin(model, [[4], [0]])
    assert coverage_penalty(model, ids) > 0.99
    _pin(model, [[4], [1]])
    assert coverage_penalty(model, ids) < 1e-6


def test_gradient_spreads_heads():
    model = PhaseLM(ModelConfig.from_name("W8/S8 · 2 KV", **SMALL))
    ids = torch.randint(0, 61, (4, 40))
    probe = CoverageProbe(model)
    opt = torch.optim.SGD(model.parameters(), lr=5.0)
    first = None
    for _ in range(40):
        model(ids)
        r = probe.pop()
        first = float(r.detach()) if first is None else first
        opt.zero_grad()
        r.backward()
        opt.step()
    probe.remove()
    assert coverage_penalty(model, ids) < 0.5 * first


def test_probe_ignores_eval_forwards():
    model = PhaseLM(ModelConfig.from_name("W8/S8 · 2 KV", **SMALL)).eval()
    probe = CoverageProbe(model)
    model(torch.randint(0, 61, (1, 40)))
    assert float(probe.pop()) == 0.0


def test_name_and_validation():
    cfg = ModelConfig.from_name("W8/S8 · 1 KV · coverage reg 0.1")
    assert cfg.coverage_reg == 0.1 and cfg.alias == "w8s8-1kv-cov0.1"
    assert ModelConfig.from_name(cfg.alias) == cfg
    with pytest.raises(ConfigError, match="coverage_reg"):
        ModelConfig.from_name("W8/S8 · 1 KV · uniform averaging · coverage reg 0.1")
    with pytest.raises(ConfigError, match="coverage_reg"):
        ModelConfig.from_name("Full attention · 1 KV", coverage_reg=0.1)


def test_training_loop_adds_the_penalty(tmp_path):
    from phasekv.train.loop import train

    out = tmp_path / "run"
    train(arch="W8/S8 · 1 KV · coverage reg 0.5", steps=2, batch_size=4, val_sequences=4, gate_steps="none",
          warmup=1, log_every=1, out=str(out), progress=False, threads=1, device="cpu")
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    pen = [r["coverage_penalty"] for r in rows if "coverage_penalty" in r]
    assert len(pen) == 2 and all(0 < p <= 1 for p in pen)
    assert json.loads((out / "config.json").read_text())["name"] == "W8/S8 · 1 KV · coverage reg 0.5"


def test_staggered_heads_compared_on_the_phase_axis():
    """Staggered heads (W8/S4, 2 KV: head 1 starts 2 tokens early): head 0's offset 2 and head 1's offset 0 are the
    same phase; head 0's offset 2 and head 1's offset 2 are not."""
    model = PhaseLM(ModelConfig.from_name("W8/S4 · 2 KV · staggered heads", **(SMALL | {"n_layers": 1})))
    ids = torch.randint(0, 61, (2, 40))
    _pin(model, [[2, 0]])
    assert coverage_penalty(model, ids) > 0.99
    _pin(model, [[2, 2]])
    assert coverage_penalty(model, ids) < 1e-6
    alpha = torch.zeros(1, 1, 8, 2, 1)
    alpha[0, 0, 0, :] = 1.0
    assert phase_preference(alpha, stride=4, offset=[0, -2]).tolist() == [[1, 0, 0, 0], [0, 0, 1, 0]]
