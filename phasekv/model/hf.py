"""Hugging Face interop: full-attention PhaseLM <-> transformers' Qwen3ForCausalLM, same weights; PhaseLM's V4
compressor <-> transformers' DeepSeek-V4 compressors (`compressor_from_hf`, `compressor_to_hf`), same entries;
how a V4-like config compresses its layers (`compression_layout`) and where a V4 model's compressors sit
(`v4_sites`)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from phasekv.attention.compressor import layer_grid, layer_rope, make_compressor
from phasekv.attention.positions import Grid
from phasekv.config import ModelConfig
from phasekv.errors import ConfigError

# phasekv parameter name (per layer "{i}") -> transformers Qwen3 parameter name
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
                "lm_head.weight": "lm_head.weight"}
EVAL_KEY = "phasekv_evaluation"  # config.json key of an export: what its evaluation needs from the run (recall
#                                  words and layout, training length); phasekv.eval.models reads it back


def _rope_theta(hf_config) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ConfigError("Hugging Face config has no rope_theta")
    if params.get("rope_type", "default") != "default":
        raise ConfigError(f"rope_type={params['rope_type']!r} is not supported (only default RoPE)")
    return float(theta)


def config_from_hf(hf_config) -> ModelConfig:
    if getattr(hf_config, "model_type", None) != "qwen3":
        raise ConfigError(f"model_type={getattr(hf_config, 'model_type', None)!r}: only qwen3 converts to PhaseLM")
    if getattr(hf_config, "attention_bias", False):
        raise ConfigError("attention_bias=True is not supported (Qwen3 has no attention bias)")
    return ModelConfig(
        vocab_size=hf_config.vocab_size, n_layers=hf_config.num_hidden_layers, d_model=hf_config.hidden_size,
        n_heads=hf_config.num_attention_heads, n_kv_heads=hf_config.num_key_value_heads,
        head_dim=hf_config.head_dim, d_ff=hf_config.intermediate_size, rope_theta=_rope_theta(hf_config),
        norm_eps=hf_config.rms_norm_eps, tie_embeddings=bool(hf_config.tie_word_embeddings),
        max_seq_len=hf_config.max_position_embeddings, preset="hf",
    )


def _name_map(config: ModelConfig) -> dict[str, str]:
    names = {k: v for k, v in GLOBAL_NAMES.items() if k != "lm_head.weight" or not config.tie_embeddings}
    for i in range(config.n_layers):
        names.update({f"layers.{i}.{k}": f"model.layers.{i}.{v}" for k, v in LAYER_NAMES.items()})
    return names


def from_hf(hf_model, build: Callable[[ModelConfig], nn.Module]):
    """`build(config)` (`PhaseLM.from_hf`: the class, full attention) with the weights of a transformers
    Qwen3ForCausalLM."""
    config = config_from_hf(hf_model.config)
    model = build(config)
    hf_state = hf_model.state_dict()
    state = {ours: hf_state[theirs].detach().clone().float() for ours, theirs in _name_map(config).items()}
    model.load_state_dict(state)
    return model


def to_hf(model, evaluation: dict | None = None):
    """transformers Qwen3ForCausalLM with this (full-attention) model's weights; `evaluation` (the run's
    evaluation metadata) goes into its config under EVAL_KEY, so `save_pretrained` writes it beside the weights."""
    c = model.config
    if c.compressed or c.family is not None:
        raise ConfigError(f"{c.name}: only full-attention models convert to Qwen3 (transformers has no compressor, "
                          "NSA, MoBA or Activation Beacon)")
    if c.rope_dims is not None or not c.qk_norm:
        raise ConfigError(f"{c.name}: Qwen3 needs RoPE on all dims and QK-norm")
    from transformers import Qwen3Config, Qwen3ForCausalLM
    hf_config = Qwen3Config(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps, tie_word_embeddings=c.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta}, attention_bias=False,
        **({EVAL_KEY: evaluation} if evaluation else {}),
    )
    hf_model = Qwen3ForCausalLM(hf_config)
    ours = model.state_dict()
    state = {theirs: ours[name] for name, theirs in _name_map(c).items()}
    if c.tie_embeddings:
        state["lm_head.weight"] = ours["embed.weight"]
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if "rotary" not in m]:
        raise ConfigError(f"weight names do not match Qwen3 (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return hf_model.to(torch.float32)


# ---- DeepSeek-V4 compressors (transformers' DeepseekV4CSACompressor / DeepseekV4HCACompressor) ----
V4_LAYER_TYPES = {"DeepseekV4CSACompressor": "compressed_sparse_attention",
                  "DeepseekV4HCACompressor": "heavily_compressed_attention",
                  "DeepseekV4Indexer": "compressed_sparse_attention"}  # the CSA indexer's own compressor
V4_WEIGHTS = {"kv_proj.weight": "key.kv_proj.weight", "gate_proj.weight": "key.gate_proj.weight",
              "position_bias": "key.position_bias", "kv_norm.weight": "key.post_norm.weight"}  # HF -> ours


def v4_compressor_config(hf_module, hf_config) -> ModelConfig:
    """The one-layer PhaseLM config whose V4 compressor has the shape of `hf_module` (a transformers V4
    compressor): W = S = ratio (HCA) or W = 2S, S = ratio (CSA, and the CSA indexer's compressor at
    index_head_dim); RoPE on V4's compress slice and theta."""
    kind = type(hf_module).__name__
    if kind not in V4_LAYER_TYPES:
        raise ConfigError(f"{kind}: expected a transformers DeepseekV4CSACompressor, DeepseekV4HCACompressor "
                          f"or DeepseekV4Indexer")
    rope = hf_config.rope_parameters["compress"]
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"compress rope_type={rope['rope_type']!r}: PhaseLM models only default RoPE "
                          f"(V4's YaRN frequencies are not reproduced)")
    ratio = hf_config.compress_rates[V4_LAYER_TYPES[kind]]
    overlap = 1 if kind == "DeepseekV4HCACompressor" else 2
    head_dim = hf_module.head_dim  # index_head_dim for the indexer
    return ModelConfig(
        vocab_size=hf_config.vocab_size, n_layers=1, d_model=hf_config.hidden_size,
        n_heads=hf_config.num_attention_heads, n_kv_heads=1, head_dim=head_dim,
        rope_theta=float(rope["rope_theta"]), rope_dims=int(hf_config.head_dim * rope["partial_rotary_factor"]),  # also the indexer's
        norm_eps=hf_config.rms_norm_eps, window=overlap * ratio, stride=ratio, compressor="v4", gate="vector",
        tied_kv=True, post_norm=True, local_window=hf_config.sliding_window, attention_sink=True, preset="hf",
    )


def compressor_from_hf(hf_module, hf_config):
    """A PhaseLM V4 compressor with the weights of a transformers V4 compressor (CSA or HCA):
    `compressor_from_hf(m, cfg).compressed_entries(h)` equals m's stateless compressed KV, squeezed."""
    cfg = v4_compressor_config(hf_module, hf_config)
    comp = make_compressor(cfg, layer_grid(cfg, 0), layer_rope(cfg))
    theirs = hf_module.state_dict()
    comp.load_state_dict({ours: theirs[name].detach().clone().float() for name, ours in V4_WEIGHTS.items()})
    return comp


@torch.no_grad()
def compressor_to_hf(comp, hf_module) -> None:
    """Write a PhaseLM V4 compressor's weights into a transformers V4 compressor of the same shape."""
    ours = comp.state_dict()
    for name, param in hf_module.named_parameters():
        if name in V4_WEIGHTS:
            if ours[V4_WEIGHTS[name]].shape != param.shape:
                raise ConfigError(f"{name}: shape {tuple(ours[V4_WEIGHTS[name]].shape)} of the PhaseLM compressor "
                                  f"does not match the transformers module's {tuple(param.shape)}")
            param.copy_(ours[V4_WEIGHTS[name]])


@dataclass
class V4Site:
    """One DeepSeek-V4 compressor of a transformers model and the PhaseLM mirror config that reads it."""

    layer: int
    branch: str  # "key": the layer's CSA/HCA compressor (its entry is key and value); "indexer": the CSA indexer's
    module: nn.Module  # the transformers module (DeepseekV4{CSA,HCA}Compressor or DeepseekV4Indexer)
    config: ModelConfig  # `v4_compressor_config` of the module

    @property
    def grid(self) -> Grid:
        return layer_grid(self.config, 0)  # V4's windows start at position 0 in every layer


_LAYER_INDEX = re.compile(r"layers\.(\d+)\.")


def v4_sites(model: nn.Module) -> list[V4Site]:
    """Every DeepSeek-V4 compressor of a transformers model, in layer order (a layer's compressor before its
    indexer); [] for models without any."""
    sites = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind in V4_LAYER_TYPES and (m := _LAYER_INDEX.search(name + ".")):
            branch = "indexer" if kind == "DeepseekV4Indexer" else "key"
            sites.append(V4Site(int(m.group(1)), branch, module, v4_compressor_config(module, model.config)))
    return sorted(sites, key=lambda s: (s.layer, s.branch == "indexer"))


# ---- how a (DeepSeek-V4-like) config compresses its layers ----
LEGACY_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


@dataclass
class CompressionLayout:
    """Per-layer compression of a Hugging Face config, as V4 declares it (`layer_types` + `compress_rates`, or
    the older per-layer `compress_ratios` list), with its sliding window and rotary slices."""

    ratios: list[int]  # per layer: compression ratio (0 = no compressed branch)
    layer_types: list[str]  # per layer: the config's layer type
    sliding_window: int | None  # exact tokens each query sees (None: full attention)
    head_dim: int | None
    rotary_dims: int | None  # rotated dims per head (V4: the trailing slice)
    rope_theta: dict  # {"main": theta, "compress": theta} (V4) or {"main": theta}

    def distinct(self) -> dict[int, list[str]]:
        """{ratio: the layer types it belongs to} of every compression ratio present, smallest first."""
        out: dict[int, list[str]] = {}
        for r, t in zip(self.ratios, self.layer_types, strict=True):
            if r > 0 and t not in out.setdefault(r, []):
                out[r].append(t)
        return dict(sorted(out.items()))

    @property
    def period(self) -> int | None:
        """The least common multiple of the ratios (the phase period of the whole model), None without any."""
        return math.lcm(*self.distinct()) if self.distinct() else None


def _get(config, key: str, default=None):
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def _ratios(config, n: int) -> tuple[list[int], list[str]]:
    rates = dict(_get(config, "compress_rates") or {})
    for key, kind in (("compress_rate_csa", "compressed_sparse_attention"),
                      ("compress_rate_hca", "heavily_compressed_attention")):
        if _get(config, key) is not None:
            rates[kind] = _get(config, key)
    types, legacy = _get(config, "layer_types"), _get(config, "compress_ratios")
    if types is None and legacy is not None:
        if not isinstance(legacy, list) or not all(isinstance(r, int) and r >= 0 for r in legacy):
            raise ConfigError(f"compress_ratios={legacy!r}: expected a list of per-layer ratios (0 = none)")
        by_rate = {v: k for k, v in rates.items()}
        return list(legacy[:n]), [by_rate.get(r) or LEGACY_TYPES.get(r, "compressed_attention") for r in legacy[:n]]
    if types is None:  # a single scalar stride (older V4-style configs), or no compression
        scalar = next((_get(config, k) for k in ("compress_stride", "compression_stride", "compress_ratio")
                       if isinstance(_get(config, k), int) and _get(config, k) > 0), 0)
        return [scalar] * n, ["compressed_attention" if scalar else "full_attention"] * n
    missing = sorted({t for t in types if "compress" in t and t not in rates})
    if missing:
        raise ConfigError(f"layer_types name {', '.join(missing)} but compress_rates has no ratio for it")
    ratios = [int(rates.get(t, 0)) if "compress" in t else 0 for t in types[:n]]
    if any(r < 1 for r, t in zip(ratios, types, strict=False) if "compress" in t):
        raise ConfigError(f"compress_rates={rates!r}: every ratio must be >= 1")
    return ratios, list(types[:n])


def compression_layout(config) -> CompressionLayout:
    """The compression of every layer of a Hugging Face config (a PretrainedConfig or a config.json dict):
    the one reader behind audit and eval's choice of the ratios to test."""
    n = _get(config, "num_hidden_layers") or len(_get(config, "layer_types") or _get(config, "compress_ratios") or [])
    ratios, types = _ratios(config, int(n))
    head_dim = _get(config, "head_dim")
    rope = _get(config, "rope_parameters") or {}
    sub = {k: rope[k] for k in ("main", "compress") if isinstance(rope.get(k), dict)} or {"main": rope}
    prf = next((r["partial_rotary_factor"] for r in sub.values() if "partial_rotary_factor" in r),
               _get(config, "partial_rotary_factor"))
    if prf is None and _get(config, "qk_rope_head_dim") and head_dim:
        prf = _get(config, "qk_rope_head_dim") / head_dim
    thetas = {k: r.get("rope_theta", _get(config, "rope_theta")) for k, r in sub.items()}
    if "compress" not in thetas and _get(config, "compress_rope_theta") is not None and any(ratios):
        thetas["compress"] = _get(config, "compress_rope_theta")
    return CompressionLayout(ratios, types, _get(config, "sliding_window"), head_dim,
                             int(head_dim * (prf if prf is not None else 1.0)) if head_dim else None, thetas)
