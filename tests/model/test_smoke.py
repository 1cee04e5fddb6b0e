"""`phasekv smoke` times the forward pass apart from the fused kernels' first load (a build, or a wait on another
process's build lock, can take many seconds where the forward takes milliseconds)."""

import re

from phasekv import kernels
from phasekv.model.transformer import PhaseLM
from tests.reliability.helpers import run_cli


def test_smoke_loads_the_kernels_before_timing_the_forward(monkeypatch):
    calls = []
    extension, forward = kernels.extension, PhaseLM.forward

    def traced_extension():
        calls.append("kernels")
        return extension()

    def traced_forward(self, *args, **kwargs):
        calls.append("forward")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(kernels, "extension", traced_extension)
    monkeypatch.setattr(PhaseLM, "forward", traced_forward)
    code, out, err = run_cli("smoke", "--tokens", "16", "--decode", "2")
    assert code == 0, out + err
    assert calls[0] == "kernels" and "forward" in calls  # the load (or wait) is over before the first forward
    wait = re.search(r"fused CPU kernels: (ready|off \(references\)) after \d+\.\d s", out)
    assert wait is not None, out
    assert wait.start() < out.index("forward 18 tokens:"), out
