"""Fused CPU kernels: C++ built once per machine by torch's extension builder (`make setup` builds them:
`python -m phasekv.kernels`), each behind an autograd Function and held by the tests to an obviously-correct
PyTorch reference.

- `rms_norm`: RMSNorm over the last dim in one pass forward and one backward, where PyTorch's eager ops make
  ~13: 4x faster at the tiny model's shapes, 5-7% of its training step (benchmarks/RESULTS.md).

Where one cannot be built (no C++ compiler or ninja) or with PHASEKV_KERNELS=0, callers run the references (the
same results to float rounding); the reason is said once on stderr. The bottom layer: imports torch only.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import time
from pathlib import Path

import torch

SOURCES = (Path(__file__).with_name("rms_norm.cpp"),)
CFLAGS = ("-O3", "-march=native", "-fopenmp-simd")  # built where it runs: the build key holds the CPU's flags
STALE_LOCK_S = 600  # a build takes ~15 s (a few minutes on a loaded machine): a lock this old lost its builder


def enabled() -> bool:
    """Whether fused kernels may be used (PHASEKV_KERNELS=0 turns them off, e.g. to time the references)."""
    return os.environ.get("PHASEKV_KERNELS", "1") != "0"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def build_key() -> str:
    """What a build depends on: the sources, torch's version, the flags and the CPU they target."""
    h = hashlib.sha256()
    for part in (*(p.read_bytes() for p in SOURCES), torch.__version__.encode(), " ".join(CFLAGS).encode(),
                 _cpu_flags().encode()):
        h.update(part)
    return h.hexdigest()[:12]


def build_dir() -> Path:
    """$PHASEKV_KERNEL_DIR, else beside the environment (the set-up's .venv), else the user's cache."""
    if os.environ.get("PHASEKV_KERNEL_DIR"):
        root = Path(os.environ["PHASEKV_KERNEL_DIR"])
    elif os.access(sys.prefix, os.W_OK):
        root = Path(sys.prefix) / "phasekv-kernels"
    else:
        root = Path.home() / ".cache" / "phasekv" / "kernels"
    return root / build_key()


@functools.cache
def extension():
    """The built module (building it the first time, ~15 s), or None where it cannot be built or is turned off."""
    if not enabled():
        return None
    from torch.utils.cpp_extension import load  # imported when used: ~0.5 s

    where = build_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
        clear_stale_lock(where)
        return load(name=f"phasekv_kernels_{build_key()}", sources=[str(p) for p in SOURCES],
                    extra_cflags=list(CFLAGS), build_directory=str(where), verbose=False)
    except Exception as e:  # no compiler, no ninja, a failed build: the references run instead
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"phasekv: fused CPU kernels unavailable ({reason[:200]}); running the PyTorch references",
              file=sys.stderr)
        return None


def clear_stale_lock(where: Path) -> bool:
    """Remove `where/lock` when it is older than STALE_LOCK_S. torch's builder takes that lock in every process,
    built or not, and waits for it without end: a builder killed mid-build would stall every later process."""
    lock = where / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < STALE_LOCK_S:
        return False
    lock.unlink(missing_ok=True)
    print(f"phasekv: removed a stale kernel-build lock ({lock}, {age / 60:.0f} min old)", file=sys.stderr)
    return True


def fuses_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `rms_norm` runs the fused kernel for x (..., D) and weight: float32 CPU tensors, one weight per
    channel, outside torch.compile (which traces the reference), and the kernel available."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and weight.dim() == 1 and weight.shape[0] == x.shape[-1] > 0 and x.numel() > 0
            and not torch.compiler.is_compiling() and extension() is not None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / rms(x) over the last dim of x (..., D), fused (see `fuses_rms_norm`); the output keeps x's
    memory layout (a layer's queries are a transposed view)."""
    return _RMSNorm.apply(x, weight, eps)


def _memory_order(x: torch.Tensor) -> list[int]:
    """x's dims outermost in memory first, the last (normalised) dim last: x.permute(order) is contiguous when x
    is dense (a contiguous tensor or a transposed view of one), so its rows are read in place."""
    return sorted(range(x.dim() - 1), key=lambda i: x.stride(i), reverse=True) + [x.dim() - 1]


def _rows(t: torch.Tensor, order: list[int]) -> torch.Tensor:
    return t.permute(order).reshape(-1, t.shape[-1]).contiguous()  # (rows, D): a view when t is laid out so


def _unrows(rows: torch.Tensor, shape: torch.Size, order: list[int]) -> torch.Tensor:
    return rows.view([shape[i] for i in order]).permute(sorted(range(len(order)), key=order.__getitem__))


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        order = _memory_order(x)
        rows = _rows(x, order)  # (rows, D)
        y, rstd = extension().rms_norm_forward(rows, weight.contiguous(), eps)  # (rows, D), (rows,)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.order, ctx.shape = order, x.shape
        return _unrows(y, x.shape, order)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: torch.Tensor):
        rows, weight, rstd = ctx.saved_tensors
        dx, dw = extension().rms_norm_backward(_rows(dy, ctx.order), rows, weight.contiguous(), rstd)
        return _unrows(dx, ctx.shape, ctx.order), dw, None
