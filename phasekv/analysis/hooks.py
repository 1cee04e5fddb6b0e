"""Intervention sites for the mechanism analyses, on PhaseLM and on Hugging Face decoders.

Three sites per layer:

    head        PhaseLM only: `layers[l].attn.z_hook`, the per-head outputs z (B, T, H, D) before o_proj.
                Query head h reads KV head h // (H // n_kv) (GQA grouping of `attention.attend`).
    layer       the attention block's output (B, T, d) after o_proj: `layers[l].attn` on PhaseLM,
                `self_attn` of each decoder layer on Hugging Face models (first element of its output tuple).
    compressed  transformers DeepSeek-V4 only: the layer's compressed entries, hidden from the final queries
                (the block bias its CSA/HCA compressor returns set to -inf on their rows); the exact tokens
                of the sliding window and the attention sink stay.

Interventions act at absolute positions: the final `n_final` tokens of prompts of `length` tokens, read
from the positions the model passes to its attention (PhaseLM's `pos`, Hugging Face's `position_ids`),
so they work for a single forward as well as for chunked prefill through a cache. An Activation Beacon layer runs
over stream slots (raw tokens with beacons interleaved) while its `z_hook` sees the raw tokens alone: its rows are
mapped to raw token positions by the design's own slot layout (`token_rows`), beacon slots are no token.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from phasekv.attention.attention import Attention
from phasekv.attention.beacon import BeaconAttention, is_beacon, rope_position
from phasekv.errors import ConfigError
from phasekv.model.hf import v4_sites
from phasekv.model.transformer import PhaseLM


def is_phaselm(model: nn.Module) -> bool:

    return isinstance(model, PhaseLM)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention module of every layer, first to last."""
    if is_phaselm(model):
        return [block.attn for block in model.layers]
    base = getattr(model, "model", None) or getattr(model, "transformer", None) or model
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    if layers is None:
        raise ConfigError(f"{type(model).__name__}: no decoder layers found (expected model.layers or transformer.h)")
    mods = [getattr(layer, "self_attn", None) or getattr(layer, "attn", None) for layer in layers]
    if any(m is None for m in mods):
        raise ConfigError(f"{type(model).__name__}: a decoder layer has no self_attn/attn module")
    return mods


def query_heads(n_heads: int, n_kv_heads: int, kv_head: int) -> list[int]:
    """Query heads that read KV head `kv_head` (contiguous groups, as in `attention.attend`)."""
    if n_heads % n_kv_heads or not 0 <= kv_head < n_kv_heads:
        raise ConfigError(f"kv_head={kv_head} with n_heads={n_heads}, n_kv_heads={n_kv_heads}")
    g = n_heads // n_kv_heads
    return list(range(kv_head * g, (kv_head + 1) * g))


def final_rows(pos: torch.Tensor, length: int, n_final: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices into a call's positions `pos` (T,) that are among the final `n_final` tokens of a prompt of
    `length` tokens, and their index k = 0..n_final-1 among those final tokens."""
    k = pos - (length - n_final)  # (T,)
    idx = torch.nonzero((k >= 0) & (k < n_final)).flatten()
    return idx, k[idx]


def token_rows(module: nn.Module, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of a PhaseLM attention call's output that are prompt tokens, (n,), and their absolute positions,
    (n,), from the positions `pos` (T,) it was given: every row, at `pos`; on an Activation Beacon layer, whose rows
    are stream slots (`phasekv.attention.beacon`), its raw slots at their raw tokens' positions (a raw slot's RoPE
    position is its token's), in order: the rows its `z_hook` sees."""
    if not isinstance(module, BeaconAttention):
        return torch.arange(len(pos), device=pos.device), pos
    r = module.cfg.beacon_ratio
    rows = torch.nonzero(~is_beacon(pos, r)).flatten()  # (n,)
    return rows, rope_position(pos[rows], r)


def _final(rows: torch.Tensor, pos: torch.Tensor, length: int, n_final: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`final_rows` of the token rows `rows` at positions `pos` (`token_rows`): output rows and their k."""
    idx, k = final_rows(pos, length, n_final)
    return rows[idx], k


def _positions(module: nn.Module, args: tuple, kwargs: dict, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The token rows of a call to an attention module (T output rows) and their absolute positions (`token_rows`)."""
    if is_phaselm_attention(module):
        return token_rows(module, args[1])
    rows = torch.arange(T, device=device)
    pid = kwargs.get("position_ids")
    if pid is None:
        pid = kwargs.get("cache_position")
    if pid is None:  # no positions passed (e.g. GPT-2 attention): a single forward from position 0
        return rows, rows
    return rows, pid.reshape(-1, pid.shape[-1])[0]  # same positions in every row (prompts of equal length)


def is_phaselm_attention(module: nn.Module) -> bool:

    return isinstance(module, Attention)


@dataclass
class FinalMeans:
    """Mean activations at the final `n_final` tokens over calibration prompts, per layer."""

    out: list[torch.Tensor]  # per layer: (n_final, d) attention-block output
    z: list[torch.Tensor] | None  # per layer: (n_final, H, D) per-head outputs (PhaseLM only)
    n: int  # calibration prompts
    length: int
    n_final: int


@contextmanager
def capture_final(model: nn.Module, length: int, n_final: int = 1, heads: bool = True) -> Iterator[dict]:
    """Accumulate sums of the attention outputs (and PhaseLM per-head z) at the final tokens of every prompt
    the model runs inside the block. Yields a dict; after the block, `means(acc)` turns it into FinalMeans."""
    mods = attention_modules(model)
    acc = {"out": [None] * len(mods), "z": [None] * len(mods), "n": 0, "length": length, "n_final": n_final,
           "heads": heads and is_phaselm(model)}
    handles: list = []
    z_pos: dict[int, torch.Tensor] = {}  # layer -> positions of the rows its z_hook sees

    def add(key: str, layer: int, x: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> None:
        idx, k = _final(rows, pos, length, n_final)
        if idx.numel() == 0:
            return
        s = torch.zeros(n_final, *x.shape[2:], dtype=torch.float64, device=x.device)
        s.index_add_(0, k, x[:, idx].double().sum(0))  # (n_final, ...)
        acc[key][layer] = s if acc[key][layer] is None else acc[key][layer] + s
        if key == "out" and layer == 0 and int(k.max()) == n_final - 1:
            acc["n"] += x.shape[0]  # a prompt counts once its last token has been seen

    for i, mod in enumerate(mods):

        def out_hook(m, args, kwargs, output, i=i):
            y = output[0] if isinstance(output, tuple) else output  # (B, T, d)
            add("out", i, y.detach(), *_positions(m, args, kwargs, y.shape[1], y.device))

        if acc["heads"]:

            def pre(m, args, i=i):
                z_pos[i] = token_rows(m, args[1])[1]

            def z_hook(m, args, output, i=i):
                add("z", i, output.detach(), torch.arange(len(z_pos[i]), device=output.device), z_pos[i])

            handles.append(mod.register_forward_pre_hook(pre))
            handles.append(mod.z_hook.register_forward_hook(z_hook))
        handles.append(mod.register_forward_hook(out_hook, with_kwargs=True))
    try:
        yield acc
    finally:
        for h in handles:
            h.remove()


def means(acc: dict) -> FinalMeans:
    """FinalMeans from the sums `capture_final` collected."""
    n = acc["n"]
    if n == 0 or any(s is None for s in acc["out"]):
        raise ConfigError(
            f"no calibration prompt reached its final token (length={acc['length']}): nothing to average"
        )
    out = [(s / n).float() for s in acc["out"]]
    z = [(s / n).float() for s in acc["z"]] if acc["heads"] else None
    return FinalMeans(out=out, z=z, n=n, length=acc["length"], n_final=acc["n_final"])


@contextmanager
def head_knockout(model: nn.Module, layer: int, kv_head: int, means_: FinalMeans) -> Iterator[None]:
    """Inside the block, z of every query head that reads (layer, kv_head) is replaced at the final tokens
    by its calibration mean; nothing else changes."""
    if not is_phaselm(model) or means_.z is None:
        raise ConfigError("per-KV-head knockouts need a PhaseLM with per-head means; use the whole-layer knockout")
    cfg = model.config
    if not 0 <= layer < cfg.n_layers:
        raise ConfigError(f"layer={layer} outside 0..{cfg.n_layers - 1}")
    heads = torch.tensor(query_heads(cfg.n_heads, cfg.n_kv_heads, kv_head))
    attn = model.layers[layer].attn
    pos_box: list[torch.Tensor] = []  # positions of the rows the z_hook sees

    def pre(m, args):
        pos_box[:] = [token_rows(m, args[1])[1]]

    def hook(m, args, z):
        idx, k = final_rows(pos_box[0], means_.length, means_.n_final)
        if idx.numel() == 0:
            return z
        z = z.clone()  # (B, T, H, D)
        mean = means_.z[layer].to(z)[k][:, heads]  # (n_idx, g, D)
        z[:, idx[:, None], heads[None, :]] = mean.expand(z.shape[0], *mean.shape)
        return z

    handles = [attn.register_forward_pre_hook(pre), attn.z_hook.register_forward_hook(hook)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def layer_knockout(model: nn.Module, layer: int, means_: FinalMeans) -> Iterator[None]:
    """Inside the block, layer `layer`'s attention output is replaced at the final tokens by its calibration
    mean (PhaseLM or Hugging Face decoder)."""
    mods = attention_modules(model)
    if not 0 <= layer < len(mods):
        raise ConfigError(f"layer={layer} outside 0..{len(mods) - 1}")

    def hook(m, args, kwargs, output):
        y = output[0] if isinstance(output, tuple) else output  # (B, T, d)
        idx, k = _final(*_positions(m, args, kwargs, y.shape[1], y.device), means_.length, means_.n_final)
        if idx.numel() == 0:
            return output
        y = y.clone()
        y[:, idx] = means_.out[layer].to(y)[k].expand(y.shape[0], -1, -1)
        return (y, *output[1:]) if isinstance(output, tuple) else y

    handle = mods[layer].register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def compressed_layers(model: nn.Module) -> list[int]:
    """Layers of a transformers DeepSeek-V4 model with a CSA or HCA compressor."""
    return [site.layer for site in v4_sites(model) if site.branch == "key"]


@contextmanager
def compressed_knockout(model: nn.Module, layer: int, length: int, n_final: int = 1) -> Iterator[None]:
    """Inside the block, the final `n_final` queries of prompts of `length` tokens see none of layer
    `layer`'s compressed entries (a transformers DeepSeek-V4 model); everything else is unchanged."""
    sites = {site.layer: site.module for site in v4_sites(model) if site.branch == "key"}
    if layer not in sites:
        raise ConfigError(f"layer={layer} has no DeepSeek-V4 compressor (compressed layers: {sorted(sites)})")

    def hook(m, args, output):
        kv, bias = output  # (B, 1, n, D), (B, 1, T, n) or None
        pos = args[2].reshape(-1, args[2].shape[-1])[0]  # position_ids: same positions in every row
        idx, _ = final_rows(pos, length, n_final)
        if idx.numel() == 0 or kv.shape[2] == 0:
            return output
        bias = kv.new_zeros(kv.shape[0], 1, pos.shape[0], kv.shape[2]) if bias is None else bias.clone()
        bias[:, :, idx] = float("-inf")
        return kv, bias

    handle = sites[layer].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
