"""Whole-model decode steps at static shapes, replayed as one CUDA graph per token (`graph=True`).

At batch 1 a decode step of a small model is bound by kernel launches and Python, not by the GPU: a few hundred
small kernels per token. `StaticDecoder` runs the step over the static form of every layer's cache
(`attention.static`): fixed buffers for `capacity` tokens, the position a tensor on the device, no host
synchronisation. With `graph=True` (CUDA) the first static step runs eagerly (warming cuBLAS and the plans);
after it one graph per phase of the token (its position mod the strides' least common multiple, at most
`MAX_PHASES`: each graph carries its phase's compressor rows alone, and the window completion only where the
phase ends a window) is captured at its phase's first token, and every later token copies its ids and position
into the static inputs and replays its phase's graph (strides beyond `MAX_PHASES`: one graph for every phase). On the CPU, or with `graph=False`, the same static step runs eagerly: the tests hold it
equal to `PhaseLM.forward` with a cache; CUDA graphs themselves need a GPU (`benchmarks/gpu_check.py`).
"""

from __future__ import annotations

import math

import torch

from phasekv.attention import decode, static
from phasekv.attention.attention import Attention
from phasekv.attention.cache import PhaseCache
from phasekv.errors import ConfigError
from phasekv.model.transformer import PhaseLM, _hooked

MAX_PHASES = 16  # graphs per decoder at most (one per phase of the token): more strides share one graph


class StaticDecoder:
    """Feeds one token per sequence per call to `model` and its `cache` (already holding a prompt, or empty),
    -> logits (B, 1, V). Positions before a layer's `start` (its grid's first tokens) go through the eager step."""

    def __init__(self, model: PhaseLM, cache: PhaseCache, capacity: int, graph: bool = False):
        if capacity > model.config.max_seq_len:
            raise ConfigError(f"capacity={capacity} exceeds the model's max_seq_len={model.config.max_seq_len}")
        if model.beacon_embed is not None or not all(type(b.attn) is Attention for b in model.layers):
            raise ConfigError(f"static decode runs the study's attention layers, not family={model.config.family!r}")
        if _hooked(model):
            raise ConfigError("static decode: remove the model's forward hooks first (a graph would skip them)")
        device = model.embed.weight.device
        if graph and device.type != "cuda":
            raise ConfigError(f"graph=True needs a CUDA model, got device {device}")
        self.model, self.cache, self.capacity, self.use_graph = model, cache, capacity, graph
        self.start = max(static.start(b.attn) for b in model.layers)  # first position every layer steps statically
        self.layers: list | None = None  # the layers' static steps, made at the first static position
        B = cache.batch_size
        self.ids = torch.zeros(B, 1, dtype=torch.long, device=device)  # static inputs: the token ...
        self.pos = torch.zeros(1, dtype=torch.long, device=device)  # ... and its position
        strides = [b.attn.grid.stride for b in model.layers if b.attn.grid is not None]
        period = math.lcm(*strides) if strides else 1
        self.period = period if period <= MAX_PHASES else None  # None: the phase computed on the device
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # phase -> graph, its logits buffer

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, 1) -> logits (B, 1, V) of the next position; the cache advances by one token."""
        cache = self.cache
        if ids.shape != self.ids.shape:
            raise ConfigError(f"ids must have shape {tuple(self.ids.shape)}, got {tuple(ids.shape)}")
        if cache.pos >= self.capacity:
            raise ConfigError(f"the static cache holds capacity={self.capacity} tokens: all used")
        if not decode.enabled():
            raise ConfigError("static decode runs the one-token step: not under use_backend('reference')")
        if cache.pos < self.start:
            return self.model(ids, cache=cache)  # the grids' first tokens: the eager step
        self.ids.copy_(ids)
        self.pos.fill_(cache.pos)
        phase = None if self.period is None else cache.pos % self.period
        if self.layers is None:  # the first static step, run eagerly (off the default stream for a graph)
            self.layers = [static.make(b.attn, c, cache.batch_size, self.capacity)
                           for b, c in zip(self.model.layers, cache.layers, strict=True)]
            self._at(cache.pos)
            out = self._warm_step() if self.use_graph else self._step()
        elif not self.use_graph:
            self._at(cache.pos)
            out = self._step()
        else:
            if phase not in self.graphs:  # its first token: captured (recorded, not run), then replayed
                self._at(cache.pos)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self.graphs[phase] = graph, self._step()
            graph, logits = self.graphs[phase]
            graph.replay()
            out = logits.clone()
        cache.pos += 1
        for layer in self.layers:
            layer.sync(cache.pos)
        return out

    def _at(self, pos: int) -> None:
        """Tell the compressed layers the phase of the step at pos (when each phase has its graph)."""
        for layer in self.layers:
            if isinstance(layer, static.StaticCompressed):
                layer.at(None if self.period is None else pos)

    def _warm_step(self) -> torch.Tensor:
        """`_step` on a side stream, as CUDA graph capture wants its warm-up (cuBLAS workspaces, lazy tables)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = self._step()
        torch.cuda.current_stream().wait_stream(side)
        return out

    def _step(self) -> torch.Tensor:
        """The static step: `PhaseLM.forward` of one token over the static layer caches."""
        x = self.model.embed(self.ids)  # (B, 1, d)
        for block, layer in zip(self.model.layers, self.layers, strict=True):
            x = block(x, self.pos, layer)
        return self.model.head(x)  # (B, 1, V)
