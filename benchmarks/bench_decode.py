"""Decode: step time and cache bytes of full attention vs W8/S8 at contexts 4K, 32K, 128K (`small` preset).

A prefill of 128K tokens through full attention is O(T^2) (hours on a CPU), so each cache is filled
synthetically up to `context - 64` (random keys/values or compressed entries of exactly the shapes a
real prefill leaves) and the last 64 tokens run through the model for real (ring buffer, in-flight window
partials). Then single-token steps are timed, full and compressed interleaved:
  * model step: the whole `small` model (embeddings, 4 blocks, lm_head) for one new token per sequence;
  * attention step: one attention layer (projections, compressor update, attention over the cache);
  * read: the attention over the cache alone (scores, softmax, values: the part that grows with context).
  * model step, graph: the same step as one CUDA graph replayed per token (`phasekv.model.graph.StaticDecoder`,
    `--graph`: its static caches are read whole, `context` + the timed steps long).
Cache bytes: measured `cache.nbytes` against the target (T/S + n_local + W)/T of full attention's.
`--graph-check`: the graph step's logits against the eager step's, for full attention, W8/S8 and staggered heads.
`step_ratio` times the one-layer step of the `tiny` preset at 32K, batch 1 (the issue's target, <= 0.35x full),
for the one-token fast path (`phasekv.attention.decode`) and for the reference chunk path side by side.
"""

from __future__ import annotations

import argparse
import json

import torch
from common import add_common_args, fmt_t, goal_verdict, header, interleaved, paired_ratio, setup

from phasekv import ModelConfig, PhaseLM
from phasekv.attention import blockwise, decode
from phasekv.attention.cache import FullLayerCache, PhaseCache
from phasekv.model.cli import cache_bytes
from phasekv.model.graph import MAX_PHASES, StaticDecoder

REAL_TAIL = 64  # tokens fed for real after the synthetic fill
STEP_GOAL = 0.35  # W8/S8 / full one-layer step at 32K, batch 1, at most (issue 20)
MODEL_GOALS = {(32768, 1): 0.5, (32768, 32): 0.3, (131072, 32): 0.25}  # W8/S8 / full model step on a GPU, at most
GRAPH_TOL = 1e-4  # graph vs eager logits, fp32 (TF32 off)


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

    def graph_step(self, capacity: int):
        """The model step as a replayed CUDA graph (captured at its second call), for up to `capacity` tokens; on
        the CPU the same static step without a graph."""
        decoder = StaticDecoder(self.model, self.cache, capacity, graph=self.ids.device.type == "cuda")
        return lambda: decoder(self.ids)

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


def graph_check(device: torch.device, context: int = 2048, steps: int = 64, preset: str = "small") -> bool:
    """The CUDA-graph model step's logits against the eager step's, fp32, `preset`, batch 2, after a real
    prompt of `context` tokens: PASS/FAIL lines; True when all pass. On the CPU the static step without a graph."""
    tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False  # fp32 means fp32
    ok, graph_on = True, device.type == "cuda"
    for name in ("full-1kv", "w8s8-1kv", "W8/S4 · 2 KV · staggered heads"):
        torch.manual_seed(0)
        model = PhaseLM(ModelConfig.from_name(name, preset=preset, max_seq_len=context + steps)).to(device).eval()
        ids = torch.randint(0, model.config.vocab_size, (2, context + steps), device=device)
        try:
            with torch.no_grad():
                logits = []
                for graph in (False, True):
                    cache = model.new_cache(2)
                    model(ids[:, :context], cache=cache)
                    step = StaticDecoder(model, cache, context + steps, graph=graph_on) if graph else \
                        lambda x, model=model, cache=cache: model(x, cache=cache)
                    logits.append(torch.cat([step(ids[:, t : t + 1]) for t in range(context, context + steps)], 1))
        except Exception as e:  # reported, not fatal: the other models are still checked
            print(f"FAIL {'CUDA-graph' if graph_on else 'static'} decode · {name}: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200] if str(e) else ''}", flush=True)
            ok = False
            continue
        diff = (logits[0] - logits[1]).abs().max().item()
        ok &= diff <= GRAPH_TOL
        print(f"{'PASS' if diff <= GRAPH_TOL else 'FAIL'} {'CUDA-graph' if graph_on else 'static'} decode · {name} · {steps} steps after "
              f"{context} tokens vs eager: max abs diff {diff:.2e} (tolerance {GRAPH_TOL:g})", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    return ok


def main(argv: list[str] | None = None) -> list[dict]:
    p = add_common_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--contexts", default="4096,32768,131072")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--preset", default="small")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--graph", action="store_true", help="also time the model step as a CUDA graph (on the CPU: "
                   "its static step, no graph)")
    p.add_argument("--graph-check", type=int, default=0, metavar="CONTEXT",
                   help="only check the graph step against eager after a prompt of CONTEXT tokens")
    p.add_argument("--json", default="", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    device, dtype = setup(args)
    if args.graph_check:
        if not graph_check(device, args.graph_check, preset=args.preset):
            raise SystemExit("error: the graph decode check failed (its FAIL lines above)")
        return []
    header(f"decode: full attention vs W8/S8 · 1 KV, preset {args.preset}, batch {args.batch}", args,
           f"caches filled synthetically up to context-{REAL_TAIL}, then {REAL_TAIL} real tokens; 3 warm-up steps "
           f"of every contender, then medians of {args.reps} interleaved single-token steps and the best one "
           "(no preemption)" + (f"; graph = the model step replayed as one CUDA graph per phase (CPU: its static "
                                f"step), after {3 + MAX_PHASES} warm-up steps (each phase's capture)"
                                if args.graph else ""))
    torch.manual_seed(0)
    contexts = [int(c) for c in args.contexts.split(",")]
    graph_warmup = 3 + MAX_PHASES  # the graph's: its first step eager, then each phase's capture
    steps = graph_warmup + args.reps  # warm-up and timed steps of each contender, at most
    models = {}
    for name in ("full-1kv", "w8s8-1kv"):  # room for the timed steps past the longest context
        cfg = ModelConfig.from_name(name, preset=args.preset, max_seq_len=max(contexts) + steps + 64)
        models[name] = PhaseLM(cfg).to(device=device, dtype=dtype).eval()
    cfg = models["w8s8-1kv"].config
    names = ("full-1kv", "w8s8-1kv")
    cols = {"model": "model step", "graph": "model step, CUDA graph", "attn": "attention step",
            "read": "cache read"}
    keys = [k for k in cols if k != "graph" or args.graph]  # the columns timed
    print("per context: " + "; ".join(f"{k} = {cols[k]}" for k in keys) + "; cache bytes full, W8/S8, ratio, "
          "target (T/S + n_local + W)/T, ratio/target")
    rows = []
    with torch.no_grad():
        for context in contexts:
            steppers = {n: Stepper(m, synthetic_cache(m, args.batch, context, device, dtype), device, dtype)
                        for n, m in models.items()}
            nbytes = {n: s.cache.nbytes for n, s in steppers.items()}  # before timing grows them
            t = {"model": interleaved({n: s.model_step for n, s in steppers.items()}, args.reps, device, warmup=3)}
            if "graph" in keys:  # own caches: a static decoder takes its cache over
                graphs = {n: Stepper(m, synthetic_cache(m, args.batch, context, device, dtype), device, dtype)
                          for n, m in models.items()}
                try:
                    t["graph"] = interleaved({n: s.graph_step(context + steps) for n, s in graphs.items()},
                                             args.reps, device, warmup=graph_warmup)
                except Exception as e:  # the eager figures still come
                    print(f"graph step failed at {context}: {type(e).__name__}: {str(e).splitlines()[0][:200]}; "
                          "timed eagerly only from here", flush=True)
                    keys.remove("graph")
                del graphs
            t["attn"] = interleaved({n: s.attention_step for n, s in steppers.items()}, args.reps, device, warmup=3)
            t["read"] = interleaved({n: s.cache_attention for n, s in steppers.items()}, args.reps, device, warmup=3)
            ratio = nbytes["w8s8-1kv"] / nbytes["full-1kv"]
            target = (context / cfg.stride + cfg.local_window + cfg.window) / context
            if dtype == torch.float32:  # the analytic helper counts fp32 bytes
                assert nbytes["w8s8-1kv"] == cache_bytes(cfg, context, args.batch), "cache_bytes helper disagrees"
            for stat in ("median", "best"):
                line = f"{context if stat == 'median' else '':>8} {stat:>6}"
                for key in keys:
                    f, c = (getattr(t[key][n], stat) for n in names)
                    line += f" | {key} {fmt_t(f):>9} {fmt_t(c):>9} {c / f:>6.3f}"
                if stat == "median":
                    line += (f" | {nbytes['full-1kv'] / 2**20:>7.2f} MiB {nbytes['w8s8-1kv'] / 2**20:>6.2f} MiB "
                             f"{ratio:>7.4f} {target:>7.4f} {ratio / target:>7.3f}")
                print(line, flush=True)
            row = {"context": context, "batch": args.batch, "cache_bytes": nbytes, "cache_target": target}
            for key in keys:
                paired, lo, hi = paired_ratio(t[key]["w8s8-1kv"], t[key]["full-1kv"])
                row[key] = {"full_s": t[key]["full-1kv"].median, "w8s8_s": t[key]["w8s8-1kv"].median,
                            "ratio": paired, "interval": [lo, hi]}
            if "graph" in keys:
                row["graph_speedup"] = {n: t["model"][n].median / t["graph"][n].median for n in names}
            goal = MODEL_GOALS.get((context, args.batch))
            if goal is not None and device.type == "cuda":
                best = min(row[k]["ratio"] for k in ("model", "graph") if k in row)
                row["goal"], row["verdict"] = goal, "PASS" if best <= goal else "MISS"
                print(f"{'':>8} model step W8/S8 / full (paired median; eager{', graph' if 'graph' in keys else ''}): "
                      + ", ".join(f"{row[k]['ratio']:.3f} ({row[k]['interval'][0]:.3f}-{row[k]['interval'][1]:.3f})"
                                  for k in ("model", "graph") if k in row)
                      + f"; target <= {goal}: {row['verdict']}", flush=True)
            if "graph" in keys:
                print(f"{'':>8} graph speedup of the model step: " +
                      ", ".join(f"{n} {v:.2f}x" for n, v in row["graph_speedup"].items()), flush=True)
            rows.append(row)
            del steppers
    print("targets: attention step at 32K <= 0.35x full (CPU); on a GPU the model step at 32K <= 0.5x (batch 1), "
          "<= 0.3x (batch 32), at 128K batch 32 <= 0.25x; cache bytes within 5% of (T/S + n_local + W)/T "
          "(/target in [0.95, 1.05])")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
