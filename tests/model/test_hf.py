import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from phasekv import ModelConfig, PhaseLM
from phasekv.errors import ConfigError


@pytest.mark.parametrize("tied,kv", [(True, 2), (False, 1), (False, 4)])
@torch.no_grad()
def test_from_hf_equals_qwen3(tied, kv):
    torch.manual_seed(1)
    hf_cfg = Qwen3Config(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv, head_dim=16, max_position_embeddings=256,
                         tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    hf = Qwen3ForCausalLM(hf_cfg).eval()
    for p in hf.parameters():  # norms are ones at init: randomise them so the test sees every weight
        p.add_(torch.randn_like(p) * 0.05)
    ours = PhaseLM.from_hf(hf).eval()
    ids = torch.randint(0, 101, (2, 37))
    ref = hf(ids).logits
    assert (ours(ids) - ref).abs().max() <= 1e-5
    back = ours.to_hf().eval()
    assert (back(ids).logits - ref).abs().max() <= 1e-5


def test_to_hf_refuses_compressed():
    with pytest.raises(ConfigError, match="only full-attention"):
        PhaseLM(ModelConfig.from_name("W8/S8 · 1 KV")).to_hf()
