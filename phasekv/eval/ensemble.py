"""Phase ensembling at test time: run a prompt at k phases and average the answer log-probabilities.

Shift j prepends j filler tokens right after the prompt's special prefix, which moves every token of the
prompt (target, distractors, query) by j, so its phase becomes (t + j) mod S. With shifts spread over
0..S-1 a target whose phase is weak for the model is also read at the other phases:

    log p_ens(y) = (1/k) sum_j log p(y | shift_j(prompt))        (renormalised: a geometric mean of the k)

Cost: k forward passes (prefill) per prompt instead of one, and the cache of the longest copy; k = 1 is
the plain evaluation. Works for any model `phasekv.eval` can score (PhaseLM, Hugging Face causal LMs).
It is a mitigation evaluated as a way of scoring, so it lives with the evaluation (`phasekv eval lookup
--ensemble K`), which `phasekv.mitigate` sits above.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from phasekv.errors import ConfigError
from phasekv.eval.models import EvalModel, last_logits
from phasekv.eval.tokens import WordTokenizer, word_list


def ensemble_shifts(k: int, stride: int) -> list[int]:
    """k distinct shifts spread evenly over the phases 0..S-1 (k = S: every phase once)."""
    if not 1 <= k <= stride:
        raise ConfigError(f"phase ensemble: k={k} must be between 1 and the stride S={stride}")
    return [(i * stride) // k for i in range(k)]


class PhaseEnsemble(nn.Module):
    """Wraps a causal LM: forward(input_ids) -> (B, 1, V) mean log-probabilities of the next token over the
    shifted copies of input_ids (the shape `phasekv.eval.models.last_logits` reads)."""

    def __init__(self, model: nn.Module, shifts: list[int], pad_ids: list[int], keep: int = 0):
        super().__init__()
        if not shifts or not pad_ids:
            raise ConfigError("phase ensemble needs at least one shift and one pad token")
        self.model, self.shifts, self.keep = model, list(shifts), keep
        self.register_buffer("pad", torch.tensor(pad_ids, dtype=torch.long), persistent=False)

    def shifted(self, ids: torch.Tensor, j: int) -> torch.Tensor:
        """ids (B, T) with j pad tokens inserted after the first `keep` (special) tokens -> (B, T + j)."""
        if j == 0:
            return ids
        pad = self.pad.to(ids.device)[torch.arange(j, device=ids.device) % len(self.pad)]  # (j,)
        pad = pad.expand(ids.shape[0], j)  # (B, j)
        return torch.cat([ids[:, : self.keep], pad, ids[:, self.keep :]], dim=1)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, **_) -> torch.Tensor:
        logp = sum(last_logits(self.model, self.shifted(input_ids, j)).log_softmax(-1) for j in self.shifts)
        return (logp / len(self.shifts))[:, None]  # (B, 1, V)


def pad_ids(tok: WordTokenizer) -> list[int]:
    """Single-token filler words (the words the prompts' own filler uses) as the pad tokens."""
    return tok.single_tokens(word_list("filler"), "filler", 1)[1]


def phase_ensemble(em: EvalModel, k: int, stride: int | None = None) -> EvalModel:
    """The EvalModel evaluated with k phase shifts (name `... · phase ensemble k`); its info records the
    shifts and the cost (forward passes per prompt)."""
    stride = stride or em.stride
    if not stride:
        raise ConfigError(f"phase ensemble: {em.name} has no compression stride; give --stride S")
    shifts = ensemble_shifts(k, stride)
    wrapped = PhaseEnsemble(em.model, shifts, pad_ids(em.tok), keep=len(em.tok.prefix))
    info = {**em.info, "ensemble": {"k": k, "shifts": shifts, "stride": stride, "forward_passes_per_prompt": k,
                                    "pad": "filler words inserted after the special prefix"}}
    name = em.name if k == 1 else f"{em.name} · phase ensemble {k}"
    return dataclasses.replace(em, model=wrapped, name=name, info=info)
