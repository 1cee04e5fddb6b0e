"""Gate snapshots: static and per-window effective numbers of offsets of every KV head's key and value
gate on a fixed probe batch (`phasekv.analysis.concentration`), one row per (layer, KV head, branch).

The gates are read inside the model's own forward pass (a pre-hook on each compressed attention), so it
also works when FSDP2 shards the parameters outside a layer's forward.
"""

from __future__ import annotations

import torch

from phasekv.analysis.concentration import concentration


@torch.no_grad()
def gate_snapshot(model, input_ids: torch.Tensor) -> list[dict]:
    """Rows {layer, kv_head, branch, static, per_window, window, stride, gate} for every learned gate."""
    rows: list[dict] = []
    handles = []

    def hook(layer: int, attn):
        def pre(_module, args):
            h = args[0]  # (B, T, d) normed hidden states, the compressor's input
            windows = attn.compressor.windows(h, attn.grid.offset)  # (B, n, W, d)
            if windows.shape[1] == 0:
                return
            for name, branch in (("key", attn.compressor.key), ("value", attn.compressor.value)):
                if branch is None:
                    continue
                static, per_window = concentration(branch.gate_scores(windows))  # (n_kv,) each
                for kv in range(static.shape[0]):
                    rows.append({"layer": layer, "kv_head": kv, "branch": name, "static": float(static[kv]),
                                 "per_window": float(per_window[kv]), "window": attn.compressor.window,
                                 "stride": attn.compressor.stride, "gate": attn.cfg.gate})
        return pre

    for i, layer in enumerate(model.layers):
        if layer.attn.compressor is not None:
            handles.append(layer.attn.register_forward_pre_hook(hook(i, layer.attn)))
    if not handles:
        return rows
    was = model.training
    model.eval()
    try:
        model(input_ids)
    finally:
        for h in handles:
            h.remove()
        model.train(was)
    return rows
