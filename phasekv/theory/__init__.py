"""Idealised induction model of compressed attention: numerical checks of the paper's two theorems.

- `phasekv.theory.model`: the model, its population loss and the closed forms; `embeddings`: equiangular
  token embeddings; `minimisers` (Theorem 1), `flow` (Theorem 2), `coverage`: the checks' computations;
  `checks`: each check end to end (summary.json, results.parquet, figures); `io`: writers, provenance.

Layer: independent of the rest of phasekv: it imports only the foundation (`errors`, `io`), because the
theorems are about an idealised model, not about PhaseLM. It sits beside `mitigate`, below `report` (which
shows the checks' summaries and figures) and `demo` (which runs them).
"""

from phasekv.theory.checks import coverage_check, flow_check, minimisers_check, run_all
from phasekv.theory.embeddings import Embeddings, check_bound, make_embeddings
from phasekv.theory.model import TheoryConfig, closed_form_distinct_loss, closed_form_loss, population_loss

__all__ = [
    "Embeddings", "TheoryConfig", "check_bound", "closed_form_distinct_loss", "closed_form_loss",
    "coverage_check", "flow_check", "make_embeddings", "minimisers_check", "population_loss", "run_all",
]
