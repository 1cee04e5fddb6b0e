"""PhaseLM's V4 compressor equals transformers' DeepseekV4CSACompressor / DeepseekV4HCACompressor."""

import pytest
import torch
from transformers import DeepseekV4Config
from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
    DeepseekV4CSACompressor,
    DeepseekV4HCACompressor,
)

from phasekv import ModelConfig, PhaseLM
from phasekv.errors import ConfigError, ModelNameError
from phasekv.model.hf import compressor_from_hf, compressor_to_hf

TOL = 1e-5


def hf_config(hidden=64, head_dim=32, prf=0.5, csa=4, hca=8):
    return DeepseekV4Config(
        vocab_size=64, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4, head_dim=head_dim,
        q_lora_rank=16, o_lora_rank=16, o_groups=2, index_n_heads=2, index_head_dim=16, index_topk=1024,
        partial_rotary_factor=prf, compress_rates={"compressed_sparse_attention": csa, "heavily_compressed_attention": hca},
        layer_types=["compressed_sparse_attention", "heavily_compressed_attention"], sliding_window=16,
        n_routed_experts=4, num_experts_per_tok=2, hc_mult=1,
    )


def random_module(cls, config, seed):
    torch.manual_seed(seed)
    m = cls(config).float()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)  # random position_bias and norm weights too (transformers leaves them empty)
    return m.eval()


def hf_entries(m, h, config):
    B, T, _ = h.shape
    q_residual = torch.randn(B, T, config.q_lora_rank)
    pos = torch.arange(T)[None].expand(B, -1)
    kv, bias = m(h, q_residual, pos, None, 0)
    return kv.squeeze(1), bias, pos  # (B, n, D)


CASES = [  # (hidden, head_dim, partial rotary factor, csa ratio, hca ratio, T)
    (64, 32, 0.5, 4, 8, 37), (48, 16, 1.0, 2, 16, 50), (32, 64, 0.25, 8, 2, 21), (64, 32, 0.125, 16, 12, 70),
    (40, 24, 1 / 3, 3, 5, 4),
]


@pytest.mark.parametrize("cls", [DeepseekV4CSACompressor, DeepseekV4HCACompressor])
@pytest.mark.parametrize("hidden,head_dim,prf,csa,hca,T", CASES)
@torch.no_grad()
def test_entries_equal_transformers(cls, hidden, head_dim, prf, csa, hca, T):
    config = hf_config(hidden, head_dim, prf, csa, hca)
    m = random_module(cls, config, seed=T)
    h = torch.randn(2, T, hidden)
    want, _, _ = hf_entries(m, h, config)
    ours = compressor_from_hf(m, config)
    got = ours.compressed_entries(h)
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=0, atol=TOL)
    # the reverse: our (re-randomised) weights written into the transformers module give the same entries
    for p in ours.parameters():
        p.normal_(0, 0.3)
    compressor_to_hf(ours, m)
    assert torch.allclose(ours.compressed_entries(h), hf_entries(m, h, config)[0], rtol=0, atol=TOL)


@pytest.mark.parametrize("cls", [DeepseekV4CSACompressor, DeepseekV4HCACompressor])
@torch.no_grad()
def test_visibility_equals_transformers(cls):
    """HCA: the block bias of the module; CSA: its causal rule (every causal entry selected, index_topk large)."""
    config = hf_config(csa=4, hca=8)
    m = random_module(cls, config, seed=1)
    T = 45
    h = torch.randn(1, T, 64)
    want, bias, pos = hf_entries(m, h, config)
    grid = compressor_from_hf(m, config).grid
    ours = grid.entry_visible(torch.arange(T), torch.arange(want.shape[1]))  # (T, n)
    assert torch.equal(torch.isfinite(bias[0, 0]), ours)


def test_name_grammar_and_errors():
    for name in ("W8/S4 · 1 KV · V4 compressor", "W16/S16 · 1 KV · V4 compressor · no slot bias",
                 "W8/S8 · 1 KV · V4 compressor · attention sink · local window 128"):
        cfg = ModelConfig.from_name(name)
        assert cfg.name == name and ModelConfig.from_name(cfg.alias) == cfg
        assert (cfg.compressor, cfg.gate, cfg.tied_kv, cfg.post_norm) == ("v4", "vector", True, True)
    with pytest.raises(ConfigError, match="window=8: the V4 compressor needs W = S"):
        ModelConfig.from_name("W8/S2 · 1 KV · V4 compressor")
    with pytest.raises(ModelNameError, match="'no slot bias' needs the V4 compressor"):
        ModelConfig.from_name("W8/S8 · 1 KV · no slot bias")
    with pytest.raises(ConfigError, match="gate='scalar': the V4 compressor implies gate='vector'"):
        ModelConfig.from_name("W8/S4 · 1 KV", compressor="v4", tied_kv=True, post_norm=True)
    with pytest.raises(ConfigError, match="compressor='v5'"):
        ModelConfig.from_name("W8/S4 · 1 KV", compressor="v5")
    with pytest.raises(ConfigError, match="attention_sink=True: is a compression attribute"):
        ModelConfig.from_name("Full attention · 1 KV", attention_sink=True)


def test_v4_gate_parameters_are_the_slot_bias():
    """Gate cycling rolls only the slot bias: the projections are shared by every offset."""
    model = PhaseLM(ModelConfig.from_name("W8/S4 · 1 KV · V4 compressor", preset="tiny", vocab_size=64))
    comp = model.layers[0].attn.compressor
    assert comp.cycled_params() == [comp.key.position_bias]
    bare = PhaseLM(ModelConfig.from_name("W8/S4 · 1 KV · V4 compressor · no slot bias", preset="tiny", vocab_size=64))
    assert bare.layers[0].attn.compressor.cycled_params() == []


@torch.no_grad()
def test_attention_sink_takes_mass_from_every_key():
    """A very negative sink is no sink; a very large one takes all the attention (output 0)."""
    cfg = ModelConfig.from_name("W8/S8 · 1 KV · attention sink", preset="tiny", vocab_size=64)
    model = PhaseLM(cfg).eval()
    plain = PhaseLM(cfg.replace(attention_sink=False)).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "sinks" not in k})
    ids = torch.randint(0, 64, (2, 40))
    for block in model.layers:
        block.attn.sinks.fill_(-1e4)
    assert (model(ids) - plain(ids)).abs().max() <= TOL
    attn = model.layers[0].attn
    attn.sinks.fill_(1e4)
    z = []
    handle = attn.z_hook.register_forward_hook(lambda m, a, out: z.append(out))
    model(ids)
    handle.remove()
    assert z[0].abs().max() <= 1e-6


@torch.no_grad()
def test_decode_equals_parallel_with_learned_sinks():
    cfg = ModelConfig.from_name("W8/S4 · 2 KV · V4 compressor · attention sink", preset="tiny", vocab_size=64,
                                n_heads=4)
    model = PhaseLM(cfg).eval()
    for block in model.layers:
        block.attn.sinks.normal_(0, 2.0)
    ids = torch.randint(0, 64, (2, 41))
    cache = model.new_cache(2)
    steps = torch.cat([model(ids[:, :5], cache)] + [model(ids[:, t : t + 1], cache) for t in range(5, 41)], 1)
    assert (steps - model(ids)).abs().max() <= TOL
