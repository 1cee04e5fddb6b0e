"""Knockout sites on an Activation Beacon model: its attention layers run over the stream of raw tokens with
beacons interleaved (`phasekv.attention.beacon`), its `z_hook` sees the raw tokens alone. The hooks act at the
final raw tokens in both, in one forward and through the cache: equal to the same knockout done by hand."""

import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.analysis.hooks import capture_final, head_knockout, layer_knockout, means, query_heads
from phasekv.attention.beacon import stream_slot

R, L, FINAL = 4, 37, 3  # beacon ratio; prompt length (not a multiple of r); final tokens knocked out


def _model():
    return PhaseLM(ModelConfig.from_name(f"Beacon r{R} · window 16 · 2 KV", preset="tiny", vocab_size=64)).eval()


def _slots() -> list[int]:
    """The stream slots of the final raw tokens (by hand)."""
    return [stream_slot(t, R) for t in range(L - FINAL, L)]


@torch.no_grad()
def _by_hand(model, ids, layer: int, site: str, value=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits with the final raw tokens' rows at `site` ("z": the layer's per-head z, raw rows; "out": the
    attention output, stream rows) replaced by `value` (None: unchanged), and the rows as they were."""
    attn, seen = model.layers[layer].attn, []

    def z_hook(m, args, z):  # (B, L, H, D): the raw tokens
        seen.append(z[:, -FINAL:].clone())
        if value is not None:
            z = z.clone()
            z[:, -FINAL:] = value(z[:, -FINAL:])
        return z

    def out_hook(m, args, y):  # (B, T_s, d): the stream
        seen.append(y[:, _slots()].clone())
        if value is not None:
            y = y.clone()
            y[:, _slots()] = value(y[:, _slots()])
        return y

    h = attn.z_hook.register_forward_hook(z_hook) if site == "z" else attn.register_forward_hook(out_hook)
    try:
        return model(ids), seen[0]
    finally:
        h.remove()


def _chunked(model, ids) -> torch.Tensor:
    cache = model.new_cache(ids.shape[0])
    return torch.cat([model(ids[:, s : s + 11], cache=cache) for s in range(0, L, 11)], 1)  # final tokens split


def test_capture_reads_the_final_raw_tokens():
    model, cal = _model(), torch.randint(0, 64, (5, L))
    with torch.no_grad(), capture_final(model, L, FINAL) as acc:
        model(cal)
    mu = means(acc)
    for layer in range(2):
        assert torch.allclose(mu.z[layer], _by_hand(model, cal, layer, "z")[1].mean(0), atol=1e-6)
        assert torch.allclose(mu.out[layer], _by_hand(model, cal, layer, "out")[1].mean(0), atol=1e-6)


@pytest.mark.parametrize("kv", [0, 1])
def test_head_knockout_equals_by_hand(kv):
    model, ids = _model(), torch.randint(0, 64, (2, L))
    with torch.no_grad(), capture_final(model, L, FINAL) as acc:
        model(torch.randint(0, 64, (1, L)))
    m = means(acc)
    m.z[1] = mu = torch.randn_like(m.z[1])  # (n_final, H, D): any replacement
    heads = query_heads(4, 2, kv)

    def put(z):  # (B, FINAL, H, D)
        z[:, :, heads] = mu[:, heads]
        return z

    hand, _ = _by_hand(model, ids, 1, "z", put)
    with torch.no_grad(), head_knockout(model, 1, kv, m):
        assert torch.allclose(model(ids), hand, atol=1e-5)
        assert torch.allclose(_chunked(model, ids), hand, atol=1e-4)
    assert not torch.allclose(hand[:, -1], model(ids)[:, -1].detach(), atol=1e-4)  # the knockout did something


def test_layer_knockout_equals_by_hand():
    model, ids = _model(), torch.randint(0, 64, (2, L))
    with torch.no_grad(), capture_final(model, L, FINAL) as acc:
        model(torch.randint(0, 64, (1, L)))
    m = means(acc)
    m.out[0] = torch.randn(FINAL, 64)  # (n_final, d)
    hand, _ = _by_hand(model, ids, 0, "out", lambda y: m.out[0].expand_as(y))
    with torch.no_grad(), layer_knockout(model, 0, m):
        assert torch.allclose(model(ids), hand, atol=1e-5)
        assert torch.allclose(_chunked(model, ids), hand, atol=1e-4)
