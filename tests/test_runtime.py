"""glibc's allocator keeps freed tensor memory for reuse once `reuse_freed_memory` ran (a fresh process each)."""

import ctypes
import ctypes.util
import subprocess
import sys

import pytest

PROBE = """
import ctypes, sys, torch
from phasekv.runtime import reuse_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
tuned = sys.argv[1] == "tuned" and reuse_freed_memory()
x = torch.ones(5_000_000)  # 20 MB: above glibc's default mmap threshold, below the tuned one
del x
print(int(tuned), libc.mallinfo2().fordblks)  # free bytes kept in the heap
"""


def kept_after_free(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    tuned, kept = out.stdout.split()
    return int(tuned), int(kept)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(ctypes.util.find_library("c")),
                                                                       "mallinfo2"), reason="needs glibc >= 2.33")
def test_freed_tensor_memory_stays_in_the_process():
    assert kept_after_free("default") == (0, pytest.approx(0, abs=8 << 20))  # returned to the OS
    tuned, kept = kept_after_free("tuned")
    assert tuned == 1 and kept >= 20_000_000  # kept for the next step's tensors
