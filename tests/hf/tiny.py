"""Tiny transformers configs for the Hugging Face tests: DeepSeek-V4 (CSA + HCA layers) and Qwen3."""

import json
from pathlib import Path

from transformers import DeepseekV4Config, Qwen3Config


def v4_config(csa=4, hca=8, layers=("compressed_sparse_attention", "heavily_compressed_attention"), vocab=512,
              **kw) -> DeepseekV4Config:
    """hidden 64, one KV head, sliding window 16, 4 experts, hc_mult 1 (the issue's tiny V4)."""
    base = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=len(layers), num_attention_heads=4, head_dim=32,
                q_lora_rank=32, o_lora_rank=32, o_groups=2, index_n_heads=2, index_head_dim=16, index_topk=1024,
                partial_rotary_factor=0.5, layer_types=list(layers), mlp_layer_types=["moe"] * len(layers),
                compress_rates={"compressed_sparse_attention": csa, "heavily_compressed_attention": hca},
                sliding_window=16, n_routed_experts=4, num_experts_per_tok=2, hc_mult=1, moe_intermediate_size=32,
                max_position_embeddings=512, initializer_range=0.125)
    return DeepseekV4Config(**{**base, **kw})


def qwen3_config(vocab=512) -> Qwen3Config:
    return Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256)


def write_config(config, path: Path) -> Path:
    path.write_text(json.dumps(config.to_dict()))
    return path
