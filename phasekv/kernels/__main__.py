"""`python -m phasekv.kernels`: build the fused CPU kernels now (the set-up runs it), and say where or why not."""

import time

from phasekv import kernels

if __name__ == "__main__":
    start = time.perf_counter()
    if kernels.extension() is None:
        print("phasekv kernels: not built; the PyTorch references will run")
    else:
        print(f"phasekv kernels: built in {kernels.build_dir()} ({time.perf_counter() - start:.0f} s)")
