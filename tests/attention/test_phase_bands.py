"""Phase bands (issue 39): KV head h's key gate reads only the offsets whose phase is in its band (`phase bands`:
the layer's heads split the phases; `layer bands`: every (layer, KV head) of the model)."""

import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.attention.compressor import phase_band
from phasekv.errors import ConfigError
from tests.attention.test_blockwise import TOL, model_outputs
from tests.attention.test_decode import SMALL, decode_all

BANDED = ["W12/S6 · 2 KV · phase bands", "W8/S4 · 4 KV · phase bands · vector gates · no gate bias",
          "W12/S6 · 2 KV · layer bands"]


def test_bands_split_the_phases():
    assert phase_band(12, 6, 2).int().T.tolist() == [[1, 1, 1, 0, 0, 0] * 2, [0, 0, 0, 1, 1, 1] * 2]
    assert phase_band(8, 4, 4).sum(1).tolist() == [1] * 8  # every offset in exactly one head's band
    bands = [c.key.band[:6, :, 0] == 0 for c in (layer.attn.compressor for layer in
             PhaseLM(ModelConfig.from_name("W12/S6 · 2 KV · layer bands", **SMALL)).layers)]
    owners = torch.cat(bands, 1).int().argmax(1).tolist()  # (S,) the (layer, head) slot owning each phase
    assert owners == [0, 0, 1, 2, 2, 3]


def test_names():
    for name, alias in (("W12/S6 · 2 KV · phase bands", "w12s6-2kv-bands"), ("W12/S6 · 2 KV · layer bands",
                                                                             "w12s6-2kv-lbands")):
        cfg = ModelConfig.from_name(name)
        assert cfg.name == name and cfg.alias == alias and ModelConfig.from_name(alias) == cfg
        assert cfg.full_attention().name == "Full attention · 2 KV"


@pytest.mark.parametrize("name", ["W12/S6 · 1 KV · phase bands", "W4/S2 · 4 KV · phase bands",
                                  "W12/S6 · 2 KV · phase bands · uniform averaging",
                                  "W12/S6 · 2 KV · phase bands · V4 compressor", "W4/S2 · 2 KV · layer bands",
                                  "W12/S6 · 2 KV · phase bands · layer bands"])
def test_invalid_bands_name_the_field(name):
    with pytest.raises(ConfigError, match="phase_bands|layer_bands"):
        ModelConfig.from_name(name)


@torch.no_grad()
def test_banded_key_gate_is_a_softmax_over_its_band():
    """The reference: each head's softmax over its in-band offsets alone, from the unmasked logits; values unmasked."""
    comp = PhaseLM(ModelConfig.from_name("W12/S6 · 2 KV · phase bands", **SMALL)).layers[0].attn.compressor
    windows, _ = comp.windows(torch.randn(2, 40, SMALL["d_model"]))  # (B, n, W, d)
    band = phase_band(12, 6, 2)  # (W, n_kv)
    alpha = comp.key.gate_scores(windows)[..., 0]  # (B, n, W, n_kv)
    comp.key.band = None
    logits = comp.key.logits(windows)[..., 0]
    ref = logits.masked_fill(~band, float("-inf")).softmax(dim=2)
    assert torch.allclose(alpha, ref, atol=1e-6) and (alpha[:, :, ~band[:, 0], 0] == 0).all()
    assert (comp.value.gate_scores(windows) > 0).all()


@pytest.mark.parametrize("name", BANDED)
@torch.no_grad()
def test_decode_equals_parallel(name):
    model = PhaseLM(ModelConfig.from_name(name, **SMALL)).eval()
    ids = torch.randint(0, 61, (2, 43))
    ref = model(ids)
    steps, _ = decode_all(model, ids, range(1, 44))
    chunked, _ = decode_all(model, ids, [3, 17, 30, 43])
    assert (steps - ref).abs().max() <= 1e-5 and (chunked - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("name", BANDED)
def test_blockwise_equals_reference(name):
    model = PhaseLM(ModelConfig.from_name(name, **SMALL))
    ids = torch.randint(0, 61, (2, 157))
    (fast, g_fast), (ref, g_ref) = (model_outputs(model, ids, b) for b in ("blockwise", "reference"))
    assert (fast - ref).abs().max() <= TOL
    assert all((g_fast[n] - g_ref[n]).abs().max() <= TOL for n in g_ref)
