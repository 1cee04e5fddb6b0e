"""Phase-aware evaluation: position-matched lookup and needle tests, the filler sweep, and statistics.

- `phasekv.eval.models`: `EvalModel` and `load` (every `--model` flag: phasekv runs, PhaseLM dirs, HF dirs).
- `phasekv.eval.protocols`: each evaluation protocol registered once (prompts, summary, figure, study variants).
- `phasekv.eval.design`: target positions with identical mean and variance in every residue group.
- `phasekv.eval.prompts`: token-exact prompt builders (lookup, needle) over the shipped word lists.
- `phasekv.eval.run` / `flip`: scoring, resumable and sharded runs; the filler sweep.
- `phasekv.eval.ensemble`: phase ensembling, a way of scoring (`phasekv eval lookup --ensemble K`).
- `phasekv.eval.stats`: Wilson and bootstrap intervals, gap, fold consistency, periodicity test.
- `phasekv.eval.figure`: figures as data (a backend-neutral spec) and their PNG and plotly renderers;
  `phasekv.eval.report`: the terminal tables and the accuracy-by-residue and filler-sweep figures.

Layer: above `phasekv.train` (the one model loader, `train.run.open_model`, lives there because
`train --init-from` needs it too) and the layers it builds on (data, model, config), below everything that
reads evaluations: `analysis` (scores prompts with hooks through `run.evaluate`), `mitigate` (compares and
audits evaluations), `report` and `demo`. It is the lowest layer that draws figures, so the figure spec
lives here and the layers above reuse it.
"""
