"""Gate snapshots: static and per-window effective numbers of offsets of every KV head's key and value
gate on a fixed probe batch (`phasekv.model.concentration`), one row per (layer, KV head, branch).

The gates are read inside the model's own forward pass (`phasekv.model.gates.gate_scores`), so it also
works when FSDP2 shards the parameters outside a layer's forward.
"""

from __future__ import annotations

import torch

from phasekv.model.concentration import concentration
from phasekv.model.gates import GateRead, gate_scores


@torch.no_grad()
def gate_snapshot(model, input_ids: torch.Tensor) -> list[dict]:
    """Rows {layer, kv_head, branch, static, per_window, window, stride, gate} for every learned gate."""
    rows: list[dict] = []

    def read(r: GateRead) -> None:
        static, per_window = concentration(r.alpha)  # (n_kv,) each
        for kv in range(static.shape[0]):
            rows.append({"layer": r.layer, "kv_head": kv, "branch": r.branch, "static": float(static[kv]),
                         "per_window": float(per_window[kv]), "window": r.grid.window, "stride": r.grid.stride,
                         "gate": getattr(model.config, "gate", "vector")})  # V4: vector

    was = model.training
    model.eval()
    try:
        with gate_scores(model, read):
            model(input_ids)
    finally:
        model.train(was)
    return rows
