"""The fused RMSNorm kernel against its reference (`phasekv.attention.norm.reference_rms_norm`): values, input and
weight gradients, every memory layout a layer hands it, and the fallback where the kernel cannot be built."""

import os
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phasekv import ModelConfig, PhaseLM, kernels
from phasekv.attention.norm import reference_rms_norm, rms_norm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_kernel = pytest.mark.skipif(kernels.extension() is None, reason="the fused kernels could not be built here")


def _both(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, eps: float = 1e-6):
    """(y, dx, dw) of the fused and the reference RMSNorm for the same inputs."""
    out = []
    for fn in (kernels.rms_norm, reference_rms_norm):
        xi, wi = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = fn(xi, wi, eps)
        y.backward(dy)
        out.append((y.detach(), xi.grad, wi.grad))
    return out


def _mismatches(a, b, rows: int) -> list[str]:
    """Which of (y, dx, dw) differ beyond float rounding (dw sums over the rows: its tolerance grows with them)."""
    return [name for name, u, v in zip(("y", "dx", "dw"), a, b, strict=True)
            if not torch.allclose(u, v, rtol=1e-5, atol=1e-5 * max(1.0, rows**0.5))]


@needs_kernel
@pytest.mark.parametrize("layout", ["contiguous", "heads transposed", "tokens transposed", "strided rows"])
def test_fused_equals_reference_in_every_layout(layout):
    """A layer's queries are a (B, H, T, D) view of (B, T, H, D) memory: the kernel reads such rows in place and
    returns y in x's layout; a gradient in another layout (or rows with gaps) is still right."""
    base = torch.randn(3, 10, 4, 32)  # (B, T, H, D)
    x = {"contiguous": base, "heads transposed": base.transpose(1, 2), "tokens transposed": base.transpose(0, 1),
         "strided rows": torch.randn(3, 10, 4, 64)[..., ::2]}[layout]
    w = torch.randn(32)
    dy = torch.randn(x.shape).transpose(1, 2).contiguous().transpose(1, 2)  # its own layout, not x's
    fused, ref = _both(x, w, dy)
    assert _mismatches(fused, ref, rows=x.numel() // 32) == []
    if layout != "strided rows":
        assert fused[0].stride() == x.stride()  # dense x: the output keeps its memory layout


@needs_kernel
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 700), dim=st.sampled_from([1, 3, 16, 31, 64, 128, 257]), eps=st.sampled_from([1e-6, 1e-2]),
       scale=st.sampled_from([1e-3, 1.0, 30.0]))
def test_fused_equals_reference_on_random_shapes(rows, dim, eps, scale):
    x, w, dy = torch.randn(rows, dim) * scale, torch.randn(dim), torch.randn(rows, dim)
    fused, ref = _both(x, w, dy, eps)
    assert _mismatches(fused, ref, rows) == []


@needs_kernel
def test_dispatch_fuses_float32_cpu_with_one_weight_per_channel_only():
    x, w = torch.randn(4, 8), torch.randn(8)
    assert kernels.fuses_rms_norm(x, w)
    assert not kernels.fuses_rms_norm(x.bfloat16(), w)  # other dtypes: the reference (computed in fp32)
    assert not kernels.fuses_rms_norm(x.view(4, 2, 4), torch.randn(2, 4))  # a broadcast weight (the decode step's)
    assert not kernels.fuses_rms_norm(x[:0], w)
    torch.testing.assert_close(rms_norm(x.bfloat16(), w, 1e-6), reference_rms_norm(x.bfloat16(), w, 1e-6))
    with torch.inference_mode():
        torch.testing.assert_close(rms_norm(x, w, 1e-6), reference_rms_norm(x, w, 1e-6))


@needs_kernel
@pytest.mark.parametrize("name", ["Full attention · 1 KV", "W8/S8 · 1 KV", "W8/S8 · 2 KV · post-norm"])
def test_training_step_matches_the_reference_norms(name, monkeypatch):
    """A model's loss and every parameter's gradient agree with the fused and the reference norms."""
    cfg = ModelConfig.from_name(name, preset="tiny")
    ids = torch.randint(0, cfg.vocab_size, (4, 41))
    grads = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(kernels, "fuses_rms_norm", lambda x, w: False)
        torch.manual_seed(0)
        model = PhaseLM(cfg)
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-5, atol=1e-6)
    for n, g in grads[0][1].items():
        torch.testing.assert_close(g, grads[1][1][n], rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


def _run(code: str, **env_extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env_extra})


def test_turned_off_runs_the_reference():
    r = _run("import torch; from phasekv import kernels; from phasekv.attention.norm import rms_norm; "
             "x = torch.randn(3, 8); assert kernels.extension() is None and not kernels.fuses_rms_norm(x, x[0]); "
             "print(rms_norm(x, torch.ones(8), 1e-6).shape)", PHASEKV_KERNELS="0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch.Size([3, 8])" in r.stdout and r.stderr == ""


def test_a_kernel_that_does_not_build_falls_back_with_one_line(tmp_path):
    """A failed build (here: a source that does not compile) says why on one stderr line and the references run."""
    bad = tmp_path / "broken.cpp"
    bad.write_text("this is not C++\n")
    r = _run("import pathlib, torch; from phasekv import kernels; "
             f"kernels.SOURCES = (pathlib.Path({str(bad)!r}),); "
             "from phasekv.attention.norm import rms_norm; x = torch.randn(3, 8, requires_grad=True); "
             "rms_norm(x, torch.ones(8), 1e-6).sum().backward(); assert kernels.extension() is None; print('ran')",
             PHASEKV_KERNEL_DIR=str(tmp_path / "build"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "ran"
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("phasekv: fused CPU kernels unavailable (")


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path, capsys):
    """torch's builder waits without end on a lock its killed builder left; phasekv removes one that old."""
    lock = tmp_path / "lock"
    lock.touch()
    assert not kernels.clear_stale_lock(tmp_path) and lock.exists()  # a build may be running: wait for it
    old = time.time() - kernels.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    assert kernels.clear_stale_lock(tmp_path) and not lock.exists()
    assert "stale kernel-build lock" in capsys.readouterr().err
    assert not kernels.clear_stale_lock(tmp_path)  # none there
