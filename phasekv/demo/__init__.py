"""`phasekv demo`: train the study's tiny models, evaluate, analyse, run the theory checks, write the report."""

from phasekv.demo.plan import DemoPlan, plan_for
from phasekv.demo.runner import run_demo

__all__ = ["DemoPlan", "plan_for", "run_demo"]
