"""Process-wide settings for CPU work: glibc's allocator told to keep freed memory for reuse.

A training step frees and reallocates the same few-MB activation tensors every step. glibc's defaults return
them to the OS (`mmap` above a threshold, heap trimming on `free`), so each step faults every page in again and
the kernel zeroes it: on this project's 2-core VMs that was ~20% of a tiny model's CPU step. Raising the mmap
threshold to its maximum (32 MiB) and the trim threshold keeps those pages mapped; the process's resident memory
then stays near its peak instead of shrinking between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value: smaller blocks come from the heap and are reused
TRIM_THRESHOLD = 1 << 30  # free heap memory kept before returning any to the OS
TOP_PAD = 64 << 20  # extra heap grown at a time


def reuse_freed_memory() -> bool:
    """Tune glibc's malloc as above for this process; False (and nothing changed) where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # another C library (musl) or none found
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in
               ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
