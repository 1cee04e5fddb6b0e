"""The static decode step (`StaticDecoder`, what a CUDA graph captures) gives the eager decode's logits for
every variant whose stride divides its window, from a prompt or from an empty cache, and leaves a cache that the
eager step continues. CUDA graphs themselves need a GPU: benchmarks/gpu_check.py replays one against eager."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from phasekv import ModelConfig, PhaseLM
from phasekv.attention import blockwise
from phasekv.errors import ConfigError
from phasekv.model import graph
from phasekv.model.graph import StaticDecoder
from tests.attention.variants import REPAIR_VARIANTS, V4_VARIANTS

SMALL = dict(preset="tiny", vocab_size=61, n_layers=2, d_model=32, n_heads=8, head_dim=16, d_ff=48)
# every variant with S | W whose step differs: projections, gates, ties, norms, RoPE, tails, sinks, delays
DIVIDES = ["Full attention · 4 KV", "W8/S8 · 1 KV", "W8/S4 · 1 KV", "W8/S8 · 2 KV", "W8/S8 · 1 KV · tied K/V",
           "W8/S8 · 1 KV · uniform averaging · tied K/V · post-norm", "W8/S8 · 1 KV · vector gates",
           "W8/S8 · 1 KV · no Q/K norm", "W8/S8 · 1 KV · RoPE on 16 dims", "W8/S8 · 8 KV · uncompressed tail",
           "DeepSeek-style kernel", "W8/S8 · 1 KV · staggered windows", "W6/S6 · 2 KV · local window 3",
           *V4_VARIANTS, *(n for n in REPAIR_VARIANTS if "jitter" not in n and "W8/S4 · 1 KV" not in n)]


def model_of(name: str) -> PhaseLM:
    torch.manual_seed(0)
    return PhaseLM(ModelConfig.from_name(name, **SMALL)).eval()


@torch.no_grad()
def decode(model, ids, prompt: int, static_until: int = 0):
    """Logits of ids (B, T): a prompt chunk, then one token per step, statically up to `static_until` (a
    `StaticDecoder` of that capacity), eagerly after; and the decoder (None without static steps)."""
    cache = model.new_cache(ids.shape[0])
    out = [model(ids[:, :prompt], cache=cache)] if prompt else []
    dec = StaticDecoder(model, cache, capacity=static_until) if static_until else None
    for t in range(prompt, ids.shape[1]):
        out.append(dec(ids[:, t : t + 1]) if t < static_until else model(ids[:, t : t + 1], cache=cache))
    return torch.cat(out, 1), dec


@pytest.mark.parametrize("name", DIVIDES)
def test_static_step_equals_eager(name):
    model = model_of(name)
    ids = torch.randint(0, 61, (2, 56))
    ref, _ = decode(model, ids, prompt=19)
    out, dec = decode(model, ids, prompt=19, static_until=48)  # the last 8 tokens: eager steps on its cache
    assert dec.layers is not None and dec.start <= 19  # every step after the prompt was static
    assert (out - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("name", ["W8/S4 · 2 KV · staggered heads", "W8/S8 · 2 KV · V4 compressor · attention sink · "
                                  "staggered windows", "W8/S8 · 1 KV · uniform averaging · tied K/V · post-norm"])
def test_static_step_with_the_phase_on_the_device(name, monkeypatch):
    """Strides whose phases would need too many graphs: one step for every phase, the phase computed from t."""
    monkeypatch.setattr(graph, "MAX_PHASES", 1)
    model = model_of(name)
    ids = torch.randint(0, 61, (2, 56))
    ref, _ = decode(model, ids, prompt=19)
    out, dec = decode(model, ids, prompt=19, static_until=48)
    assert dec.period is None and all(getattr(layer, "phase", None) is None for layer in dec.layers)
    assert (out - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("name", ["W8/S4 · 2 KV · staggered heads", "W8/S4 · 1 KV · V4 compressor", "Full attention · 1 KV"])
def test_static_from_an_empty_cache(name):
    """A grid's first tokens (before every phase has its windows in flight) take the eager step, then static."""
    model = model_of(name)
    ids = torch.randint(0, 61, (1, 30))
    ref, _ = decode(model, ids, prompt=0)
    out, dec = decode(model, ids, prompt=0, static_until=30)
    assert (out - ref).abs().max() <= 1e-5 and dec.layers is not None


def test_static_refuses_what_it_cannot_run():
    model = model_of("W5/S2 · 1 KV · uncompressed tail")
    with pytest.raises(ConfigError, match="stride to divide the window, got W5/S2"):
        StaticDecoder(model, model.new_cache(1), capacity=16)
    model = model_of("W8/S8 · 1 KV")
    with pytest.raises(ConfigError, match="graph=True needs a CUDA model"):
        StaticDecoder(model, model.new_cache(1), capacity=16, graph=True)
    with pytest.raises(ConfigError, match="capacity=200000 exceeds"):
        StaticDecoder(model, model.new_cache(1), capacity=200_000)
    cache = model.new_cache(1)
    model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    dec = StaticDecoder(model, cache, capacity=5)
    with pytest.raises(ConfigError, match="not under use_backend"), blockwise.use_backend("reference"):
        dec(torch.zeros(1, 1, dtype=torch.long))
    dec(torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ConfigError, match="capacity=5 tokens: all used"):
        dec(torch.zeros(1, 1, dtype=torch.long))


class SyncWatch(TorchDispatchMode):
    """Records the ops that read a tensor's value back to the host (a CUDA graph cannot capture them)."""

    HOST_READS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
                  "aten.is_nonzero.default"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in self.HOST_READS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["Full attention · 1 KV", "W8/S4 · 2 KV · staggered heads",
                                  "W6/S3 · 1 KV · V4 compressor · uncompressed tail · attention sink"])
def test_static_step_reads_nothing_back_to_the_host(name):
    """What lets CUDA capture the step: no `.item()`, `int(tensor)`, `nonzero` in it (the eager step has some)."""
    model = model_of(name)
    cache = model.new_cache(1)
    ids = torch.zeros(1, 1, dtype=torch.long)
    with torch.no_grad():
        model(torch.zeros(1, 20, dtype=torch.long), cache=cache)
        dec = StaticDecoder(model, cache, capacity=40)
        dec(ids)
        static, eager = SyncWatch(), SyncWatch()
        with static:
            dec._step()
        with eager:
            model(ids, cache=cache)
    assert static.seen == [] and eager.seen
