"""Greedy continuation through a model's decode cache (`phasekv.eval.models.greedy`): the prompt costs one prefill
(a long one in chunks through the cache), every further token one one-token forward, and the tokens are those of
greedy decoding by full forward passes; a compressed PhaseLM and a transformers model alike."""

from itertools import islice

import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.eval import models
from phasekv.eval.models import greedy, last_logits

NEW = 12  # tokens generated


def _model(name: str) -> PhaseLM:
    torch.manual_seed(0)
    return PhaseLM(ModelConfig.from_name(name, preset="tiny")).eval()


def _forwards(model: torch.nn.Module) -> list[int]:
    """The length of every forward call the model gets from now on (a PhaseLM's ids, a transformers input_ids)."""
    seen = []
    model.register_forward_pre_hook(lambda m, args, kw: seen.append((args[0] if args else kw["input_ids"]).shape[1]),
                                    with_kwargs=True)
    return seen


def _by_full_passes(model: torch.nn.Module, ids: list[int]) -> list[int]:
    out = []
    for _ in range(NEW):
        out.append(int(last_logits(model, torch.tensor([ids + out])).argmax(-1)))
    return out


@pytest.mark.parametrize("kind", ["W8/S8 · 1 KV", "hf"])
def test_n_new_tokens_cost_one_prefill_and_a_one_token_step_each(kind):
    model = _model("Full attention · 1 KV").to_hf().eval() if kind == "hf" else _model(kind)
    ids = torch.randint(0, 500, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    want = _by_full_passes(model, ids)
    seen = _forwards(model)
    assert list(islice(greedy(model, ids), NEW)) == want
    assert seen == [len(ids)] + [1] * (NEW - 1)  # the last token needs no step after it


def test_a_long_prompt_is_prefilled_in_chunks_through_the_cache(monkeypatch):
    model = _model("W8/S4 · 1 KV")
    ids = torch.randint(0, 500, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    want = _by_full_passes(model, ids)
    monkeypatch.setattr(models, "PREFILL_CHUNK", 16)
    seen = _forwards(model)
    assert list(islice(greedy(model, ids), NEW)) == want
    assert seen == [16, 16, 8] + [1] * (NEW - 1)
