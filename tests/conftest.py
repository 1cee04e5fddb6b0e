import importlib.util
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
torch.set_num_threads(1)  # 2 shared cores: OpenMP spinning across processes is 100x slower


def _triton_on_cpu() -> None:
    """Without a GPU the Triton kernels' tests run under Triton's interpreter, switched on before triton is
    imported (benchmarks/triton_cpu.py, loaded by path: tests/benchmarks is another `benchmarks`)."""
    spec = importlib.util.spec_from_file_location("triton_cpu", os.path.join(ROOT, "benchmarks", "triton_cpu.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.enable()


_triton_on_cpu()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fused_kernels_ran():
    """No test passes on a reference that ran in place of a fused Triton kernel which failed (`blockwise.guarded`)."""
    from phasekv.attention import blockwise

    yield
    assert not blockwise.FAILED, f"a fused Triton kernel failed and the reference ran instead: {blockwise.FAILED}"
