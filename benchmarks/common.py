"""Shared benchmark plumbing: device/thread setup, the header every benchmark prints, an interleaved timer,
peak-memory measurement and synthetic decode caches."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if os.environ.get("TRITON_INTERPRET") == "1":  # asked for on a CPU: the fused Triton kernels under the interpreter
    import triton_cpu

    triton_cpu.enable()

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def add_common_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (set explicitly: see README gotcha)")
    return p


def setup(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """Threads, device and dtype from the common flags; glibc's allocator tuned as the `phasekv` command and the
    demo's workers tune it (`phasekv.runtime`), for every contender of the process alike."""
    from phasekv.runtime import reuse_freed_memory  # after ROOT joined sys.path

    torch.set_num_threads(args.threads)
    reuse_freed_memory()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch.cuda.is_available() is False")
    return device, DTYPES[args.dtype]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.node()} · {cpu} · {os.cpu_count()} logical cores · {platform.system()} {platform.release()}"


def header(title: str, args: argparse.Namespace, note: str = "") -> None:
    device = args.device
    if device.startswith("cuda") and torch.cuda.is_available():
        device += f" ({torch.cuda.get_device_name()})"
    print(f"\n=== {title} ===")
    print(f"date {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC} · machine {machine()}")
    print(f"torch {torch.__version__} · python {platform.python_version()} · device {device} · dtype {args.dtype} · "
          f"torch threads {torch.get_num_threads()}")
    print(load_note())
    if note:
        print(note)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    median: float  # seconds per call
    best: float  # fastest call: the cost without preemption by other processes on a shared machine
    samples: tuple[float, ...] = ()  # seconds of each timed call, in turn order (paired across contenders)


def paired_ratio(a: Timing, ref: Timing, level: float = 0.95, n_boot: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """The ratio of a's time to ref's: the median over turns of the round-robin of each turn's a / ref, and its
    `level` bootstrap interval (percentile, turns resampled). A turn's calls run back to back, so load that hits a
    turn hits both sides of its ratio (here their times correlate ~0.7-0.8): a tighter estimate than the ratio of
    the two medians, whose interval carries each side's own swings."""
    x, y = np.asarray(a.samples), np.asarray(ref.samples)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"paired_ratio needs equally many timed calls of both contenders, got {x.size} and {y.size}")
    r = x / y  # (turns,)
    idx = np.random.default_rng(seed).integers(0, r.size, size=(n_boot, r.size))  # (n_boot, turns)
    lo, hi = np.quantile(np.median(r[idx], axis=1), [(1 - level) / 2, (1 + level) / 2])
    return float(np.median(r)), float(lo), float(hi)


def goal_verdict(lo: float, hi: float, goal: float) -> str:
    """Whether a ratio with interval [lo, hi] meets `goal` (at most): 'met', 'missed' or 'undecided' (the interval
    holds the goal: this run cannot tell)."""
    return "met" if hi <= goal else "missed" if lo > goal else "undecided"


def interleaved(fns: dict[str, Callable[[], object]], reps: int, device: torch.device, warmup: int = 1,
                clock: Callable[[], float] = time.perf_counter, burst: int = 1) -> dict:
    """Timing of each fn, measured round-robin so that load from other processes hits every contender alike
    (the ratios are what matters on a shared machine). `clock=time.thread_time` times single-threaded CPU
    work by the CPU it used, which waiting for a busy core does not inflate. `burst` > 1: each turn calls a fn
    `burst` times in a row and times all but the first, which finds the other contenders' data in the caches
    (a decoding model runs its steps back to back: single alternating steps would charge the contender with the
    smaller working set for refilling the cache)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            for call in range(burst):
                sync(device)
                t = clock()
                fn()
                sync(device)
                if call or burst == 1:
                    times[name].append(clock() - t)
    return {k: Timing(statistics.median(v), min(v), tuple(v)) for k, v in times.items()}


def load_note() -> str:
    """The 1-minute load average against the core count: figures from a busy machine are noisier."""
    try:
        return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at start"
    except OSError:
        return ""


# ---- peak memory ----
def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Extra bytes at the peak while fn runs, over what was resident before: CUDA's allocator statistics, or on
    CPU the process's resident-set high-water mark (reset through /proc/self/clear_refs). Run it in a fresh
    process per measurement (see `in_subprocess`) so that no freed-but-cached memory hides allocations."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    base = _status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    fn()
    return (_status_kb("VmHWM") - base) * 1024


def in_subprocess(script: str, argv: list[str]) -> str:
    """Run `python script argv...` (a fresh process) and return its stdout; errors propagate."""
    out = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"{script} {' '.join(argv)} failed:\n{out.stderr[-2000:]}")
    return out.stdout


def mem_available() -> int:
    """Bytes the OS can still give (MemAvailable), for skipping runs that would not fit."""
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) * 1024


def gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def fmt_t(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"
