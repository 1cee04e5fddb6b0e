"""Gate statistics on constructed gates: one-hot -> 1, uniform -> W, one-hot at a different offset in each
window -> static W and per-window 1; phase pooling with overlapping windows; the value shift."""

import numpy as np
import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.analysis.gates import collect_alpha, gate_stats, offset_phases, pool_phases
from phasekv.model.concentration import concentration

W = 8


def _onehot(offsets, n_kv=1):
    a = torch.zeros(len(offsets), W, n_kv, 1)
    a[torch.arange(len(offsets)), torch.as_tensor(offsets)] = 1.0
    return a


def test_constructed_alpha():
    s, p = concentration(_onehot([3] * 16))
    assert s.item() == pytest.approx(1.0) and p.item() == pytest.approx(1.0)
    s, p = concentration(torch.full((16, W, 1, 1), 1 / W))
    assert s.item() == pytest.approx(W) and p.item() == pytest.approx(W)
    s, p = concentration(_onehot([j % W for j in range(32)]))
    assert s.item() == pytest.approx(W) and p.item() == pytest.approx(1.0)


def test_pool_phases_overlapping_windows():
    ph = offset_phases(8, 4)
    assert ph.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert offset_phases(8, 4, shift=1).tolist() == [3, 0, 1, 2, 3, 0, 1, 2]
    s, p = concentration(pool_phases(torch.full((4, 8, 1, 1), 1 / 8), ph, 4))
    assert s.item() == pytest.approx(4) and p.item() == pytest.approx(4)  # effective phases in [1, S]
    s, _ = concentration(pool_phases(_onehot([1, 5, 1, 5]), ph, 4))  # offsets 1 and 5 share phase 1
    assert s.item() == pytest.approx(1.0)


def _onehot_model(name="w8s8-1kv"):
    """Layer 0 sees h = sqrt(d) e_token (one-hot embeddings, unit norm weights); its key gate scores the
    marker token 0 high and its value gate has a bias peaking at offset 4."""
    cfg = ModelConfig.from_name(name, preset="tiny", vocab_size=64)
    model = PhaseLM(cfg).eval()
    with torch.no_grad():
        model.embed.weight.copy_(torch.eye(64, cfg.d_model))
        comp = model.layers[0].attn.compressor
        comp.key.gate_weight.zero_()
        comp.key.gate_weight[:, :, :, 0] = 10.0  # Z_i h = 10 sqrt(d) at the marker, 0 elsewhere
        comp.key.gate_bias.zero_()
        comp.value.gate_weight.zero_()
        comp.value.gate_bias.zero_()
        comp.value.gate_bias[4] = 50.0
    return model


def test_gate_stats_on_a_model_with_constructed_gates():
    model = _onehot_model()
    ids = torch.randint(1, 64, (2, 8 * 16))
    ids[:, torch.arange(16) * 8 + torch.arange(16) % 8] = 0  # window j has its marker at offset j mod 8
    heads, phases = gate_stats(model, collect_alpha(model, [ids]))
    key = heads[(heads["layer"] == 0) & (heads["branch"] == "key")].iloc[0]
    assert key["n_windows"] == 32
    assert key["static"] == pytest.approx(W, abs=1e-3) and key["per_window"] == pytest.approx(1.0, abs=1e-3)
    value = heads[(heads["layer"] == 0) & (heads["branch"] == "value")].iloc[0]
    assert value["static"] == pytest.approx(1.0, abs=1e-3) and value["per_window"] == pytest.approx(1.0, abs=1e-3)
    assert value["peak_offset"] == 4 and value["peak_phase"] == 3  # value shifted back one offset
    vs = phases[(phases["layer"] == 0) & (phases["branch"] == "value")].sort_values("phase")["score_rel"]
    assert vs.tolist() == pytest.approx([0, 0, 0, W, 0, 0, 0, 0], abs=1e-3)
    ks = phases[(phases["layer"] == 0) & (phases["branch"] == "key")]["score_rel"].to_numpy()
    assert np.allclose(ks, 1.0, atol=1e-3)  # every offset wins equally often: uniform on average


def test_gate_stats_of_staggered_heads_use_each_heads_grid():
    """W8/S4 · 2 KV · staggered heads: head 1's windows start 2 tokens early, so the same bias peak (value offset
    4) sits at phase 3 for head 0 and at phase 1 for head 1."""
    cfg = ModelConfig.from_name("W8/S4 · 2 KV · staggered heads", preset="tiny", vocab_size=64)
    model = PhaseLM(cfg).eval()
    with torch.no_grad():
        comp = model.layers[0].attn.compressor
        comp.value.gate_weight.zero_()
        comp.value.gate_bias.zero_()
        comp.value.gate_bias[4] = 50.0
    heads, _ = gate_stats(model, collect_alpha(model, [torch.randint(1, 64, (2, 64))]))
    value = heads[(heads["layer"] == 0) & (heads["branch"] == "value")].sort_values("kv_head")
    assert value["grid_offset"].tolist() == [0, -2]
    assert value["peak_offset"].tolist() == [4, 4] and value["peak_phase"].tolist() == [3, 1]


def test_gate_stats_overlapping_windows_report_effective_phases():
    model = _onehot_model("w8s4-1kv")
    heads, _ = gate_stats(model, collect_alpha(model, [torch.randint(1, 64, (2, 64))]))
    value = heads[(heads["layer"] == 0) & (heads["branch"] == "value")].iloc[0]
    assert value["static_phase"] == pytest.approx(1.0, abs=1e-3)
    assert value["stride"] == 4 and value["peak_phase"] == 3
    assert (heads["static_phase"] <= 4 + 1e-6).all() and (heads["static"] <= 8 + 1e-6).all()


def test_alignment_of_gate_preferences_with_knockout_losses():
    import pandas as pd

    from phasekv.analysis.gates import alignment

    heads = pd.DataFrame([{"layer": 0, "kv_head": 0, "branch": "key", "static": 2.0, "static_phase": 2.0}])
    score = [0.5, 0.5, 4.0, 1.0]
    phases = pd.DataFrame([{"layer": 0, "kv_head": 0, "branch": b, "phase": p, "score_rel": s}
                           for b in ("key", "value") for p, s in enumerate(score)])
    ko = pd.DataFrame([{"grouping": "phase", "layer": 0, "kv_head": 0, "group": p, "rel_change": r}
                       for p, r in enumerate([0.0, 0.0, -0.9, -0.2])])
    (row,) = alignment(heads, phases, ko)
    assert row["key_peak_phase"] == row["ko_worst_phase"] == 2
    assert row["key_loss_corr"] > 0.95 and row["ko_max_loss"] == pytest.approx(0.9)
