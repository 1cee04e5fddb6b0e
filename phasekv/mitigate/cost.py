"""What each compared model costs relative to full attention: cache bytes per token (computed) and seconds
per training and decode step (measured here, in one process, interleaved, so machine load hits every model
alike; the minimum over repetitions is kept). With one torch thread the clock is the thread's CPU time (on a
shared machine wall-clock step times swing 3x between runs); a training step includes the coverage
regulariser's gate reads when the model trains with one (`· coverage reg X`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from phasekv.config import ModelConfig
from phasekv.mitigate.results import CompareRow
from phasekv.model.cli import cache_bytes
from phasekv.model.transformer import PhaseLM
from phasekv.progress import Progress
from phasekv.train.coverage import CoverageProbe


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
    probes = {n: CoverageProbe(m) for n, m in models.items() if m.config.coverage_reg}  # read during forward
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    train = {n: float("inf") for n in models}
    decode = {n: float("inf") for n in models}
    g = torch.Generator().manual_seed(0)
    for _ in range(bench.reps):
        for n, m in models.items():  # interleaved: every model sees the same machine load
            V = m.config.vocab_size
            ids = torch.randint(0, V, (bench.batch, bench.seq_len), generator=g)
            t = clock()
            loss = m(ids).float().logsumexp(-1).mean()
            if n in probes:
                loss = loss + m.config.coverage_reg * probes[n].pop()
            loss.backward()
            train[n] = min(train[n], clock() - t)
            m.zero_grad(set_to_none=True)
            ids = torch.randint(0, V, (1, bench.decode_context + bench.decode_steps), generator=g)
            m.eval()  # inference: no training-only work (gate reads, grid jitter)
            with torch.no_grad():
                cache = m.new_cache(1)
                m(ids[:, : bench.decode_context], cache=cache)
                t = clock()
                for i in range(bench.decode_context, ids.shape[1]):
                    m(ids[:, i : i + 1], cache=cache)
                decode[n] = min(decode[n], (clock() - t) / bench.decode_steps)
            m.train()
            if progress:
                progress()
    for p in probes.values():
        p.remove()
    return {n: {"train_s": train[n], "decode_s": decode[n]} for n in models}


def _backbone_key(cfg: ModelConfig) -> tuple:
    return (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size)


def add_costs(rows: list[CompareRow], cfgs: dict, ref_cfg: ModelConfig | None, context: int, bench: Bench,
              progress: bool) -> None:
    """Cache bytes (computed) and train/decode cost (measured) relative to the full-attention reference (the model
    a design replaces); a model without a reference of its backbone among the runs is compared with its own
    full-attention twin. `cache_same_kv`: the cache relative to full attention with the model's own KV heads."""
    twins: dict[str, ModelConfig] = {}
    for r in rows:
        cfg = cfgs[r.label]
        if cfg is None:
            continue
        twin = ref_cfg if ref_cfg is not None and _backbone_key(ref_cfg) == _backbone_key(cfg) else _full_twin(cfg)
        twins[r.label] = twin
        r.cache_bytes = cache_bytes(cfg, context)
        r.cache_rel = r.cache_bytes / cache_bytes(twin, context)
        r.cache_same_kv = r.cache_bytes / cache_bytes(_full_twin(cfg), context)
        r.compression = 1.0 / r.cache_rel
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
        cfg = cfgs[r.label]
        if cfg is None:
            continue
        mine, full = cost[_cost_key(cfg)], cost[_cost_key(twins[r.label])]
        r.train_cost_rel = mine["train_s"] / full["train_s"]
        r.decode_cost_rel = r.ensemble_k * mine["decode_s"] / full["decode_s"]  # k passes per answer


def _cost_key(cfg: ModelConfig) -> str:
    # the seed costs nothing (the regulariser does): every seed is keyed as the default one
    return cfg.replace(seed=ModelConfig.seed).name + repr(_backbone_key(cfg))


def _full_twin(cfg: ModelConfig) -> ModelConfig:
    return cfg.full_attention()  # every compression attribute at its default (V4, staggered heads, jitter too)
