"""The training loss computes logits at labelled positions only; same loss and gradients as logits everywhere."""

import pytest
import torch
import torch.nn.functional as F

from phasekv import ModelConfig, PhaseLM
from phasekv.data.stream import IGNORE
from phasekv.train.loop import loss_sum


@pytest.mark.parametrize("name", ["Full attention · 1 KV", "W8/S4 · 1 KV"])
@pytest.mark.parametrize("share", [0.2, 1.0])  # a few labelled positions, as in recall; all, as in text
def test_loss_on_labelled_positions_equals_full_logits(name, share):
    torch.manual_seed(0)
    model = PhaseLM(ModelConfig.from_name(name, n_layers=1, d_model=32, n_heads=2, head_dim=16, d_ff=48,
                                          vocab_size=40))
    ids = torch.randint(0, 40, (3, 30))
    labels = torch.full_like(ids, IGNORE)
    labels[torch.rand(ids.shape) < share] = 7
    labels[0, -1] = 3
    keep = labels != IGNORE
    assert torch.equal(model(ids, select=keep), model(ids)[keep])
    fast = loss_sum(model, ids, labels, autocast=False)
    g_fast = torch.autograd.grad(fast, list(model.parameters()))
    full = F.cross_entropy(model(ids).flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum")
    g_full = torch.autograd.grad(full, list(model.parameters()))
    torch.testing.assert_close(fast, full, rtol=1e-6, atol=0)
    for a, b in zip(g_fast, g_full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
