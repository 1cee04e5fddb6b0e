"""Decode: step time and cache bytes of full attention vs W8/S8 at contexts 4K, 32K, 128K (`small` preset).

A prefill of 128K tokens through full attention is O(T^2) (hours on a CPU), so each cache is filled
synthetically up to `context - 64` (random keys/values or compressed entries of exactly the shapes a
real prefill leaves) and the last 64 tokens run through the model for real (ring buffer, in-flight window
partials). Then single-token steps are timed, full and compressed interleaved:
  * model step: the whole `small` model (embeddings, 4 blocks, lm_head) for one new token per sequence;
  * attention step: one attention layer (projections, compressor update, attention over the cache);
  * read: the attention over the cache alone (scores, softmax, values: the part that grows with context).
Cache bytes: measured `cache.nbytes` against the target (T/S + n_local + W)/T of full attention's.
`step_ratio` times the one-layer step of the `tiny` preset at 32K, batch 1 (the issue's target, <= 0.35x full),
for the one-token fast path (`phasekv.attention.decode`) and for the reference chunk path side by side.
"""

from __future__ import annotations

import argparse

import torch
from common import add_common_args, fmt_t, goal_verdict, header, interleaved, paired_ratio, setup

from phasekv import ModelConfig, PhaseLM
from phasekv.attention import blockwise, decode
from phasekv.attention.cache import FullLayerCache, PhaseCache
from phasekv.model.cli import cache_bytes

REAL_TAIL = 64  # tokens fed for real after the synthetic fill
STEP_GOAL = 0.35  # W8/S8 / full one-layer step at 32K, batch 1, at most (issue 20)


def synthetic_cache(model: PhaseLM, batch: int, context: int, device, dtype) -> PhaseCache:
    """A cache holding `context` tokens: synthetic up to context - REAL_TAIL, the rest decoded for real."""
    cfg, start = model.config, context - REAL_TAIL
    cache = model.new_cache(batch)
    g = torch.Generator(device=device).manual_seed(0)
    for block, layer_cache in zip(model.layers, cache.layers, strict=True):
        full = isinstance(layer_cache, FullLayerCache)
        n = start if full else block.attn.grid.n_complete(start)
        stores = [layer_cache.k, layer_cache.v] if full else [layer_cache.entries_k, layer_cache.entries_v]
        for store in filter(None, stores):
            store.append(torch.randn(batch, cfg.n_kv_heads, n, cfg.head_dim, generator=g, device=device, dtype=dtype))
    cache.pos = start
    ids = torch.randint(0, cfg.vocab_size, (batch, REAL_TAIL), generator=g, device=device)
    model(ids, cache=cache)
    return cache


class Stepper:
    """Advances one model's cache by one token per call (model step) or one layer's cache (attention step)."""

    def __init__(self, model: PhaseLM, cache: PhaseCache, device, dtype):
        self.model, self.cache = model, cache
        cfg = model.config
        self.ids = torch.randint(0, cfg.vocab_size, (cache.batch_size, 1), device=device)
        self.h = torch.randn(cache.batch_size, 1, cfg.d_model, device=device, dtype=dtype)
        self.attn_pos = cache.pos  # the attention-only steps use layer 0's cache from here on
        B, H, D = cache.batch_size, cfg.n_heads, cfg.head_dim
        self.q = torch.randn(B, H, 1, D, device=device, dtype=dtype)

    def cache_attention(self) -> None:
        """The attention read over the cache alone (what grows with the context): scores, softmax, values."""
        attn, layer_cache, q = self.model.layers[0].attn, self.cache.layers[0], self.q[:, :, 0]
        if isinstance(layer_cache, FullLayerCache):
            decode.read(q, layer_cache.k.whole(), layer_cache.v.whole(), None, None)
            return
        keys = layer_cache.entries_k.whole()  # (B, n_kv, keep + n, D): ring, then entries
        values = keys if layer_cache.entries_v is None else layer_cache.entries_v.whole()
        plan = layer_cache.plan or decode.StepPlan.build(attn)
        decode.read(q, keys, values, plan.ring.at(attn.grid, self.cache.pos, layer_cache.ring_pos), None)

    def model_step(self) -> None:
        self.model(self.ids, cache=self.cache)

    def attention_step(self) -> None:
        pos = torch.tensor([self.attn_pos], device=self.h.device)
        self.model.layers[0].attn(self.h, pos, self.cache.layers[0])
        self.attn_pos += 1


def reference(fn):
    """fn run through the reference chunk path (`blockwise.use_backend("reference")` turns the fast step off)."""
    def run():
        with blockwise.use_backend("reference"):
            fn()
    return run


def step_ratio(argv: list[str] | None = None) -> None:
    """One-layer decode step, W8/S8 · 1 KV vs full · 1 KV, fast path and reference path, side by side."""
    p = add_common_args(argparse.ArgumentParser())
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--burst", type=int, default=4, help="consecutive steps per turn, all but the first timed (a "
                   "decoding model runs its steps back to back; 1: single alternating steps, which charge the "
                   "smaller working set for refilling the cache)")
    args = p.parse_args(argv)
    device, dtype = setup(args)
    header(f"decode step ratio: one attention layer at {args.context} tokens, batch 1, preset tiny", args,
           f"medians of {args.reps} interleaved turns of {args.burst} consecutive single-token step(s) per contender"
           + (" (the first of a turn untimed)" if args.burst > 1 else "") + ", and the best step (no preemption); "
           "'reference' = the chunk path the fast step is tested against (before the fast step existed, every step "
           "took it)")
    torch.manual_seed(0)
    steps = {}
    for name in ("full-1kv", "w8s8-1kv"):
        cfg = ModelConfig.from_name(name, preset="tiny", max_seq_len=args.context + 5 + args.burst * args.reps + 64)  # warmup + timed steps
        model = PhaseLM(cfg).to(device=device, dtype=dtype).eval()
        for path in ("fast", "reference"):
            s = Stepper(model, synthetic_cache(model, 1, args.context, device, dtype), device, dtype)
            steps[name, path] = s.attention_step if path == "fast" else reference(s.attention_step)
    with torch.no_grad():
        t = interleaved(steps, args.reps, device, warmup=5, burst=args.burst)
    print(f"{'path':>9} {'stat':>6} | {'full':>9} {'W8/S8':>9} {'ratio':>6}")
    for path in ("fast", "reference"):
        for stat in ("median", "best"):
            f, c = (getattr(t[n, path], stat) for n in ("full-1kv", "w8s8-1kv"))
            print(f"{path:>9} {stat:>6} | {fmt_t(f):>9} {fmt_t(c):>9} {c / f:>6.3f}")
    for path in ("fast", "reference"):  # the goal is the fast path's; the reference path's ratio for context
        ratio, lo, hi = paired_ratio(t["w8s8-1kv", path], t["full-1kv", path])
        goal = f"; goal <= {STEP_GOAL}: {goal_verdict(lo, hi, STEP_GOAL)}" if path == "fast" else ""
        print(f"{path} path, W8/S8 / full, median of paired steps: {ratio:.3f} (95% interval {lo:.3f}-{hi:.3f}){goal}")


def main(argv: list[str] | None = None) -> None:
    p = add_common_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--contexts", default="4096,32768,131072")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--preset", default="small")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    device, dtype = setup(args)
    header(f"decode: full attention vs W8/S8 · 1 KV, preset {args.preset}, batch {args.batch}", args,
           f"caches filled synthetically up to context-{REAL_TAIL}, then {REAL_TAIL} real tokens; medians of "
           f"{args.reps} interleaved single-token steps and the best one (no preemption)")
    torch.manual_seed(0)
    contexts = [int(c) for c in args.contexts.split(",")]
    models = {}
    for name in ("full-1kv", "w8s8-1kv"):  # room for the timed steps past the longest context
        cfg = ModelConfig.from_name(name, preset=args.preset, max_seq_len=max(contexts) + 4 * args.reps + 64)
        models[name] = PhaseLM(cfg).to(device=device, dtype=dtype).eval()
    cfg = models["w8s8-1kv"].config
    print(f"{'context':>8} | {'':>6} {'full':>9} {'W8/S8':>9} {'ratio':>6} | {'':>6} {'full':>9} {'W8/S8':>9} "
          f"{'ratio':>6} | {'':>5} {'full':>9} {'W8/S8':>9} {'ratio':>6} | {'cache full':>11} {'W8/S8':>10} {'ratio':>7} {'target':>7} {'/target':>7}")
    with torch.no_grad():
        for context in contexts:
            steppers = {n: Stepper(m, synthetic_cache(m, args.batch, context, device, dtype), device, dtype)
                        for n, m in models.items()}
            nbytes = {n: s.cache.nbytes for n, s in steppers.items()}  # before timing grows them
            model_t = interleaved({n: s.model_step for n, s in steppers.items()}, args.reps, device, warmup=3)
            attn_t = interleaved({n: s.attention_step for n, s in steppers.items()}, args.reps, device, warmup=3)
            read_t = interleaved({n: s.cache_attention for n, s in steppers.items()}, args.reps, device, warmup=3)
            ratio = nbytes["w8s8-1kv"] / nbytes["full-1kv"]
            target = (context / cfg.stride + cfg.local_window + cfg.window) / context
            if dtype == torch.float32:  # the analytic helper counts fp32 bytes
                assert nbytes["w8s8-1kv"] == cache_bytes(cfg, context, args.batch), "cache_bytes helper disagrees"
            for stat in ("median", "best"):
                m_f, m_c = (getattr(model_t[n], stat) for n in ("full-1kv", "w8s8-1kv"))
                a_f, a_c = (getattr(attn_t[n], stat) for n in ("full-1kv", "w8s8-1kv"))
                r_f, r_c = (getattr(read_t[n], stat) for n in ("full-1kv", "w8s8-1kv"))
                cache_cols = (f"{nbytes['full-1kv'] / 2**20:>7.2f} MiB {nbytes['w8s8-1kv'] / 2**20:>6.2f} MiB "
                              f"{ratio:>7.4f} {target:>7.4f} {ratio / target:>7.3f}") if stat == "median" else ""
                print(f"{context if stat == 'median' else '':>8} | model {stat:>6}: {fmt_t(m_f):>9} {fmt_t(m_c):>9} "
                      f"{m_c / m_f:>6.3f} | attn {stat:>6}: {fmt_t(a_f):>9} {fmt_t(a_c):>9} {a_c / a_f:>6.3f} | "
                      f"read: {fmt_t(r_f):>9} {fmt_t(r_c):>9} {r_c / r_f:>6.3f} | "
                      f"{cache_cols}", flush=True)
            del steppers
    print("targets: attention step at 32K <= 0.35x full; cache bytes within 5% of (T/S + n_local + W)/T "
          "(/target in [0.95, 1.05])")


if __name__ == "__main__":
    main()
