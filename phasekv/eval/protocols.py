"""Evaluation protocols, each registered once: its prompts, its summary, its figure, where the study runs it.

`phasekv compare`, `phasekv audit`, the report and the demo look a protocol up here instead of matching its
name: a retrieval protocol (accuracy by residue group with intervals, gap and period, `run_retrieval`) is
comparable and auditable, gets the report's accuracy-by-residue section and runs in the demo under each of
its `study` paddings; a sweep (the filler sweep) has a summary and a figure of its own.

Adding a protocol: its prompt builder (`phasekv.eval.prompts`, or a module of its own), one `Protocol(...)`
in `PROTOCOLS` below, its `phasekv eval NAME` command; a sweep also needs its report section and demo stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import torch

from phasekv.errors import ConfigError
from phasekv.eval.figure import Figure
from phasekv.eval.prompts import PADDINGS, PromptConfig, lookup_config, needle_config
from phasekv.eval.report import flip_figure, flip_rows, profile_rows, residue_figure

if TYPE_CHECKING:  # the registry is read by the report and the demo, which load no model
    from phasekv.eval.models import EvalModel


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol: `name` is the summary's "task", the `phasekv eval NAME` command and, with
    a padding, the study directory `eval/NAME-PADDING/` (`eval/NAME/` without)."""

    name: str
    retrieval: bool  # accuracy by residue group (summary: groups, gap, detected period): compare and audit take it
    figure: str  # the figure file of an evaluation directory
    build_figure: Callable[[dict, pd.DataFrame], Figure]  # (summary, results) -> that figure
    fit: Callable[..., PromptConfig] | None = None  # (EvalModel, **options) -> prompts sized to fit the model
    interval: str | None = None  # per-group interval a retrieval summary uses unless told
    audits: Callable[[EvalModel], bool] | None = None  # whether `phasekv audit --task auto` runs it on a model
    # (the first retrieval protocol that says yes)
    study: tuple[str | None, ...] = ()  # variants the study runs (paddings; None: the protocol has none)

    def stage(self, variant: str | None) -> str:
        """The study directory of a variant: `lookup-prefix`, `flip`."""
        return self.name if variant is None else f"{self.name}-{variant}"

    def task(self, variant: str | None) -> str:
        """The demo's task label of a variant (without the model): `lookup prefix`, `flip`."""
        return self.name if variant is None else f"{self.name} {variant}"


def fit_context(em: EvalModel) -> int:
    """Needle context that fits: the model's position limit, capped by memory (about 1K tokens per GiB of
    accelerator memory; 2,048 tokens on CPU; a served model: the server's limit, up to the study's 128K)."""
    if em.kind == "engine":
        budget = em.max_len or 131072
    elif em.device.type == "cuda":
        gib = torch.cuda.get_device_properties(em.device).total_memory / 2**30
        budget = int(gib * 1024)
    else:
        budget = 2048
    cfg = getattr(em.model, "config", None)
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "max_seq_len", None) or budget
    ctx = min(budget, int(limit), 131072)
    return max(256, ctx - ctx % 256 - 64)  # room for special tokens and demonstrations


def _fit_lookup(em: EvalModel, context: int | None = None, **options) -> PromptConfig:
    """The lookup over the words a recall run was trained on, in the longest layout that fits its training
    length (`lookup_config`; context is not a lookup option). Options that are None are not given."""
    return lookup_config(em.info, **options)


def _fit_needle(em: EvalModel, context: int | None = None, records: int | None = None, per_group: int | None = None,
                filler: int | None = None, **options) -> PromptConfig:
    """The needle test at a context that fits the model and the machine (`fit_context`), with the study's
    record density and N = 64 = 8^2 (exact moment matching at M = 8); filler follows from the context."""
    ctx = context or fit_context(em)
    given = {k: v for k, v in options.items() if v is not None}
    return needle_config(context=ctx, records=records, per_group=per_group or 64, **given)


def _has_recall_words(em: EvalModel) -> bool:
    """The lookup needs the words a model was trained on: phasekv models and their exports carry them (a model
    trained on the needle's task is audited with the needle)."""
    return (em.kind == "phasekv" and not em.info.get("needle")) or bool(em.info.get("recall"))


def _retrieval_figure(summary: dict, results: pd.DataFrame) -> Figure:
    """One evaluation's accuracy by residue (`residue_figure` of one model)."""
    rows = profile_rows(summary["model"], summary["model"], summary, summary.get("stride"))
    return residue_figure(rows, summary["protocol"], {})


def _flip_figure(summary: dict, results: pd.DataFrame) -> Figure:
    """One model's filler sweep (`flip_figure` of one model)."""
    return flip_figure(flip_rows(summary["model"], summary["model"], summary, results, summary.get("stride")), {})


LOOKUP = Protocol("lookup", retrieval=True, figure="accuracy.png", build_figure=_retrieval_figure, fit=_fit_lookup,
                  interval="bootstrap", audits=_has_recall_words, study=PADDINGS)
NEEDLE = Protocol("needle", retrieval=True, figure="accuracy.png", build_figure=_retrieval_figure, fit=_fit_needle,
                  interval="wilson", audits=lambda em: True)
FLIP = Protocol("flip", retrieval=False, figure="flip.png", build_figure=_flip_figure, study=(None,))
PROTOCOLS = {p.name: p for p in (LOOKUP, NEEDLE, FLIP)}


def protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ConfigError(f"unknown evaluation protocol {name!r} (known: {', '.join(PROTOCOLS)})")
    return PROTOCOLS[name]


def retrieval_protocols() -> list[Protocol]:
    return [p for p in PROTOCOLS.values() if p.retrieval]


def is_retrieval(summary: dict) -> bool:
    """Whether a summary.json is a retrieval evaluation (accuracy by residue group)."""
    p = PROTOCOLS.get(summary.get("task"))
    return p is not None and p.retrieval and "groups" in summary


def for_model(em: EvalModel) -> Protocol:
    """The retrieval protocol the audit runs on a model by default: the first whose `audits` says yes."""
    return next(p for p in retrieval_protocols() if p.audits is not None and p.audits(em))

