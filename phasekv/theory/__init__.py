"""Idealised induction model of compressed attention: numerical checks of the paper's two theorems."""

from phasekv.theory.checks import coverage_check, flow_check, minimisers_check, run_all
from phasekv.theory.embeddings import Embeddings, check_bound, make_embeddings
from phasekv.theory.model import TheoryConfig, closed_form_distinct_loss, closed_form_loss, population_loss

__all__ = [
    "Embeddings", "TheoryConfig", "check_bound", "closed_form_distinct_loss", "closed_form_loss",
    "coverage_check", "flow_check", "make_embeddings", "minimisers_check", "population_loss", "run_all",
]
