"""Triton's interpreter on a machine without CUDA, switched on explicitly (phasekv's Triton kernels never switch
it on themselves): the tests' conftest and the CPU runs of the benchmark scripts call `enable()` before anything
imports triton. Slow; for equality checks and launch counts, not for speed.

`enable()` sets TRITON_INTERPRET=1 (Triton's own switch, read when a kernel is decorated) and works around
Triton 3.6's interpreter under numpy >= 2.4: it holds a scalar as a 1-element array and turns it into a loop
bound with `int()`, which numpy 2.4 refuses ("only 0-dimensional arrays"); the fix reads the element instead.
"""

from __future__ import annotations

import os
import sys


def enable() -> bool:
    """Run Triton kernels under the interpreter when no GPU is visible; True when it is on. Call it before
    triton is first imported."""
    import torch

    if torch.cuda.is_available():
        return False
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before the interpreter was switched on: call enable() first")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        from triton.runtime import interpreter
    except ImportError:  # no triton: the kernels' tests skip themselves
        return False
    patch = interpreter._patch_lang_tensor
    if getattr(patch, "reads_element", False):
        return True

    def patched(tensor, scope) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.reads_element = True
    interpreter._patch_lang_tensor = patched
    return True
