"""The mechanism analyses and the coverage regulariser on DeepSeek-V4's compressor, through the variant
interface: cycling rolls only the slot bias, gate statistics pool V4's 2S slots by phase, the regulariser
reaches the slot bias."""

import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.analysis.cycling import cycled, gate_params
from phasekv.analysis.gates import collect_alpha, gate_stats
from phasekv.train.build import param_groups
from phasekv.train.coverage import CoverageProbe


def _model(name):
    torch.manual_seed(5)
    model = PhaseLM(ModelConfig.from_name(name, preset="tiny", vocab_size=64)).eval()
    with torch.no_grad():
        for block in model.layers:
            block.attn.compressor.key.position_bias.normal_(0, 2.0)
    return model


def test_cycling_rolls_the_slot_bias_and_restores_it():
    model = _model("W8/S8 · 1 KV · V4 compressor")
    ids = torch.randint(0, 64, (2, 40))
    before = [p.detach().clone() for p in gate_params(model)]
    assert len(before) == model.config.n_layers  # one position_bias per layer, nothing else
    with torch.no_grad():
        base = model(ids)
        with cycled(model, 3):
            assert all(torch.equal(p, torch.roll(b, 3, 0)) for p, b in zip(gate_params(model), before, strict=True))
            moved = model(ids)
        assert torch.equal(model(ids), base)
    assert not torch.allclose(moved, base, atol=1e-4)


def test_gate_stats_pool_the_two_halves_by_phase():
    """W8/S4 V4 (CSA): 8 slots per window, 4 phases; the leading half-empty window is not a window of 8 tokens."""
    model = _model("W8/S4 · 1 KV · V4 compressor")
    T = 42
    alphas = collect_alpha(model, [torch.randint(0, 64, (3, T))])
    assert set(alphas) == {(0, "key"), (1, "key")}
    alpha = alphas[(0, "key")]
    assert alpha.shape == (3 * (T // 4 - 1), 8, 1, model.config.head_dim)  # full windows only
    assert torch.allclose(alpha.sum(1), torch.ones(()).double())
    heads, phases = gate_stats(model, alphas)
    assert (heads["grid_offset"] == -4).all() and (heads["static"] <= 8).all() and (heads["static_phase"] <= 4).all()
    assert sorted(phases["phase"].unique()) == [0, 1, 2, 3]


def test_coverage_regulariser_reaches_the_slot_bias():
    model = PhaseLM(ModelConfig.from_name("W8/S8 · 1 KV · V4 compressor · coverage reg 0.1", preset="tiny",
                                          vocab_size=64)).train()
    probe = CoverageProbe(model)
    model(torch.randint(0, 64, (2, 40)))
    penalty = probe.pop()
    probe.remove()
    penalty.backward()
    assert 0 < float(penalty.detach()) <= 1
    assert model.layers[0].attn.compressor.key.position_bias.grad.abs().sum() > 0


def test_slot_bias_gets_no_weight_decay():
    model = PhaseLM(ModelConfig.from_name("W8/S4 · 1 KV · V4 compressor", preset="tiny", vocab_size=64))
    decay, no_decay = param_groups(model, 0.1)
    biases = [b.attn.compressor.key.position_bias for b in model.layers]
    assert all(any(p is b for p in no_decay["params"]) for b in biases)
    assert not any(p is b for b in biases for p in decay["params"])


def test_variant_gate_facts_match_the_modules():
    """`learned_gates` / `cyclable` (asked of the config's variant, for code that loads no model) agree with
    the compressor modules."""
    from phasekv.analysis.cycling import gate_params
    from phasekv.attention.compressor import cyclable, learned_gates

    for name in ("W8/S8 · 1 KV", "W8/S8 · 1 KV · uniform averaging", "W8/S4 · 1 KV", "Full attention · 1 KV",
                 "W8/S8 · 1 KV · V4 compressor", "W8/S8 · 1 KV · V4 compressor · no slot bias",
                 "W8/S4 · 1 KV · V4 compressor"):
        cfg = ModelConfig.from_name(name, preset="tiny", vocab_size=64)
        model = PhaseLM(cfg)
        comp = model.layers[0].attn.compressor
        assert learned_gates(cfg) == (comp is not None and comp.gated)
        rows = [p.shape[0] for p in gate_params(model)]  # offsets (paper) or slots (V4) along dim 0
        assert cyclable(cfg) == (bool(rows) and all(r == cfg.stride for r in rows))  # one row per phase
