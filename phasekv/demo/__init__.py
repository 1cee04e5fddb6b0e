"""`phasekv demo`: train the study's tiny models, evaluate, analyse, run the theory checks, write the report.

- `phasekv.demo.plan`: what the demo runs (models, training budget, evaluation sizes; full and --quick);
- `runner`: the plan's task graph (one task per model and stage, from the protocol registry), resumable, with
  progress and CPU-time accounting, run by `phasekv.study` (a local pool or SLURM); `stages`: the units of work,
  each in a worker process or a job; `cost`: what a plan's trainings cost on GPUs (`phasekv study --dry-run`).

Layer: the top of the library, below `phasekv.cli` only: it composes every room (train, eval, analysis,
mitigate, theory) into one study directory and renders the report over it; nothing imports the demo.
"""

from phasekv.demo.plan import DemoPlan, plan_for
from phasekv.demo.runner import run_demo

__all__ = ["DemoPlan", "plan_for", "run_demo"]
