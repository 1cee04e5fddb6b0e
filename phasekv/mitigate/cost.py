"""What each compared model costs relative to full attention: cache bytes per token (computed) and seconds
per training and decode step (measured here, in one process, interleaved, so machine load hits every model
alike; the minimum over repetitions is kept)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from phasekv.config import ModelConfig
from phasekv.model.cli import cache_bytes
from phasekv.model.transformer import PhaseLM
from phasekv.progress import Progress


@dataclass
class Bench:
    batch: int = 8  # training micro-benchmark: forward + backward on (batch, seq_len)
    seq_len: int = 80
    decode_context: int = 512  # decode micro-benchmark: prefill this many tokens, then decode one at a time
    decode_steps: int = 32
    reps: int = 5  # interleaved repetitions; the minimum time is kept (robust to a busy machine)


def _tiny_model(cfg: ModelConfig, T: int) -> PhaseLM:
    torch.manual_seed(0)
    return PhaseLM(cfg.replace(max_seq_len=max(cfg.max_seq_len, T + 1)))


def measure_costs(configs: dict[str, ModelConfig], bench: Bench, progress=None) -> dict[str, dict]:
    """Seconds per training step (forward + backward) and per decode step of each config, min over reps."""
    models = {n: _tiny_model(c, bench.decode_context + bench.decode_steps) for n, c in configs.items()}
    train = {n: float("inf") for n in models}
    decode = {n: float("inf") for n in models}
    g = torch.Generator().manual_seed(0)
    for _ in range(bench.reps):
        for n, m in models.items():  # interleaved: every model sees the same machine load
            V = m.config.vocab_size
            ids = torch.randint(0, V, (bench.batch, bench.seq_len), generator=g)
            t = time.perf_counter()
            m(ids).float().logsumexp(-1).mean().backward()
            train[n] = min(train[n], time.perf_counter() - t)
            m.zero_grad(set_to_none=True)
            ids = torch.randint(0, V, (1, bench.decode_context + bench.decode_steps), generator=g)
            with torch.no_grad():
                cache = m.new_cache(1)
                m(ids[:, : bench.decode_context], cache=cache)
                t = time.perf_counter()
                for i in range(bench.decode_context, ids.shape[1]):
                    m(ids[:, i : i + 1], cache=cache)
                decode[n] = min(decode[n], (time.perf_counter() - t) / bench.decode_steps)
            if progress:
                progress()
    return {n: {"train_s": train[n], "decode_s": decode[n]} for n in models}


def _backbone_key(cfg: ModelConfig) -> tuple:
    return (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size)


def add_costs(rows: list[dict], cfgs: dict, ref_cfg: ModelConfig | None, context: int, bench: Bench,
               progress: bool) -> None:
    """Cache bytes (computed) and train/decode cost (measured) relative to the full-attention reference; a
    model without a reference among the runs is compared with its own full-attention twin."""
    twins: dict[str, ModelConfig] = {}
    for r in rows:
        cfg = cfgs[r["label"]]
        if cfg is None:
            continue
        twin = ref_cfg if ref_cfg is not None and _backbone_key(ref_cfg) == _backbone_key(cfg) else _full_twin(cfg)
        twins[r["label"]] = twin
        r["cache_bytes"] = cache_bytes(cfg, context)
        r["cache_rel"] = r["cache_bytes"] / cache_bytes(twin, context)
        r["compression"] = 1.0 / r["cache_rel"]
    if bench.reps <= 0:
        return
    unique: dict[str, ModelConfig] = {}
    for label, cfg in cfgs.items():
        if cfg is not None:
            unique.setdefault(_cost_key(cfg), cfg)
            unique.setdefault(_cost_key(twins[label]), twins[label])
    with Progress(disable=not progress) as bar:
        task = bar.add_task("measuring cost", total=bench.reps * len(unique))
        cost = measure_costs(unique, bench, progress=lambda: bar.advance(task))
    for r in rows:
        cfg = cfgs[r["label"]]
        if cfg is None:
            continue
        mine, full = cost[_cost_key(cfg)], cost[_cost_key(twins[r["label"]])]
        r["train_cost_rel"] = mine["train_s"] / full["train_s"]
        r["decode_cost_rel"] = r["ensemble_k"] * mine["decode_s"] / full["decode_s"]  # k passes per answer


def _cost_key(cfg: ModelConfig) -> str:
    return cfg.replace(seed=42, coverage_reg=0.0).name + repr(_backbone_key(cfg))  # training-only fields cost nothing


def _full_twin(cfg: ModelConfig) -> ModelConfig:
    fields = ModelConfig.__dataclass_fields__
    reset = {f: fields[f].default for f in ("gate", "tied_kv", "gate_bias", "local_window", "post_norm", "stagger",
                                            "coverage_reg")}
    return cfg.replace(window=0, stride=0, **reset)
