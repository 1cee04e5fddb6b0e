"""Every phasekv benchmark in one run (`make bench`): attention layer time, peak memory, decode step time and
cache bytes, evaluation and training throughput, the training step against a plain reference model, and the
demo's CPU-minutes from its demo.json when there is one. CPU default: 1 torch thread (set explicitly; on a shared
2-core machine more threads make small ops far slower), sizes chosen to finish in under 10 minutes.
`--device cuda --dtype bf16 --gpu` runs the long-context sizes instead (benchmarks/gpu.sh runs its own selection
in a time budget).
"""

from __future__ import annotations

import argparse
import time

import bench_attention
import bench_decode
import bench_memory
import bench_throughput
import demo_cost
import train_throughput
from common import DTYPES


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gpu", action="store_true", help="GPU sizes: T up to 128K, bigger decode batches")
    p.add_argument("--only", default="attention,memory,decode,throughput,train,demo", help="comma-separated subset")
    p.add_argument("--demo", default="demo_out/demo.json", help="the demo.json whose cost to print")
    args = p.parse_args()
    common = ["--device", args.device, "--dtype", args.dtype, "--threads", str(args.threads)]
    only = set(args.only.split(","))
    start = time.perf_counter()
    print(f"phasekv benchmarks · torch threads {args.threads} (set explicitly) · device {args.device} · {args.dtype}")
    if "attention" in only:
        if args.gpu:
            bench_attention.main(common + ["--train-lengths", "4096,16384,65536", "--fwd-lengths", "131072",
                                           "--backends", "blockwise,flex,triton"])
        else:
            bench_attention.main(common + ["--reps", "3", "--warmup", "1"])
    if "memory" in only:
        bench_memory.main(common + (["--preset", "small"] if args.gpu else []))
    if "decode" in only:
        bench_decode.step_ratio(common)
        for batch in (1, 8) if not args.gpu else (1, 32):
            bench_decode.main(common + ["--batch", str(batch), "--reps", "15" if not args.gpu else "50"]
                              + (["--graph"] if args.gpu else []))
    if "throughput" in only:
        bench_throughput.main(common)
    if "train" in only:
        train_throughput.main(common + ["--presets", "tiny,small" if args.gpu else "tiny"])
    if "demo" in only:
        demo_cost.main(["--demo", args.demo])
    print(f"\nall benchmarks: {time.perf_counter() - start:.0f} s wall")


if __name__ == "__main__":
    main()
