"""Knockout sites: head knockouts touch only the query heads of one KV head; mean = actual is a no-op;
absolute positions make chunked prefill agree with one forward; whole layer on HF Qwen3 == on PhaseLM."""

import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.analysis.hooks import capture_final, head_knockout, layer_knockout, means, query_heads


def _model(name="w8s8-2kv", V=64):
    return PhaseLM(ModelConfig.from_name(name, preset="tiny", vocab_size=V)).eval()


def _means(model, ids, n_final=1):
    with torch.no_grad(), capture_final(model, ids.shape[1], n_final) as acc:
        model(ids)
    return means(acc)


def _z(model, layer, ids):
    """z at `layer` as o_proj sees it (after any knockout hook registered before this one)."""
    box = []
    h = model.layers[layer].attn.z_hook.register_forward_hook(lambda m, a, out: box.append(out.clone()))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        h.remove()
    return box[0]  # (B, T, H, D)


def test_query_heads_grouping():
    assert query_heads(4, 2, 1) == [2, 3]
    assert query_heads(4, 1, 0) == [0, 1, 2, 3]
    assert query_heads(8, 4, 3) == [6, 7]


@pytest.mark.parametrize("kv", [0, 1])
def test_head_knockout_changes_only_its_query_heads(kv):
    model = _model()
    ids = torch.randint(0, 64, (3, 40))
    mu = _means(model, torch.randint(0, 64, (5, 40)))
    clean = _z(model, 1, ids)
    with head_knockout(model, 1, kv, mu):
        ko = _z(model, 1, ids)
    heads = query_heads(4, 2, kv)
    others = [h for h in range(4) if h not in heads]
    assert torch.equal(ko[:, :, others], clean[:, :, others])  # other heads untouched at every position
    assert torch.equal(ko[:, :-1], clean[:, :-1])  # earlier positions untouched
    assert torch.equal(ko[:, -1, heads], mu.z[1][0, heads].expand(3, -1, -1))  # replaced by the mean
    assert not torch.equal(ko[:, -1, heads], clean[:, -1, heads])


def test_knockout_with_actual_activation_is_noop():
    model = _model("w8s8-1kv")
    ids = torch.randint(0, 64, (1, 37))
    mu = _means(model, ids, n_final=2)  # mean over one prompt = its own activation
    with torch.no_grad():
        base = model(ids)
        for layer in range(2):
            with head_knockout(model, layer, 0, mu):
                assert torch.equal(model(ids), base)
            with layer_knockout(model, layer, mu):
                assert torch.equal(model(ids), base)


def test_knockout_acts_at_absolute_positions_through_the_cache():
    model = _model("w8s8-1kv")
    ids = torch.randint(0, 64, (2, 45))
    mu = _means(model, torch.randint(0, 64, (4, 45)), n_final=3)
    with torch.no_grad(), head_knockout(model, 0, 0, mu), layer_knockout(model, 1, mu):
        full = model(ids)[:, -3:]
        cache = model.new_cache(2)
        chunks = [model(ids[:, s : s + 11], cache=cache) for s in range(0, 45, 11)]  # final tokens split
    assert torch.allclose(torch.cat(chunks, 1)[:, -3:], full, atol=1e-5)


def test_whole_layer_knockout_hf_equals_phaselm():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    hf_cfg = Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                         tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    hf = Qwen3ForCausalLM(hf_cfg).eval()
    ours = PhaseLM.from_hf(hf).eval()
    cal, ids = torch.randint(0, 96, (6, 24)), torch.randint(0, 96, (3, 24))
    mu_hf, mu_ours = _means(hf, cal, 2), _means(ours, cal, 2)
    assert mu_hf.z is None and mu_hf.n == mu_ours.n == 6
    for a, b in zip(mu_hf.out, mu_ours.out, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    with torch.no_grad():
        clean = ours(ids)
        for layer in range(3):
            with layer_knockout(hf, layer, mu_hf):
                out_hf = hf(ids).logits
            with layer_knockout(ours, layer, mu_ours):
                out_ours = ours(ids)
            assert torch.allclose(out_hf, out_ours, atol=1e-4)
            assert torch.equal(out_ours[:, :-2], clean[:, :-2])  # only the final tokens change
            assert not torch.allclose(out_ours[:, -1], clean[:, -1], atol=1e-4)
