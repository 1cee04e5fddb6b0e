"""Repairs of phase sensitivity compared at their cost, and the one-command phase audit.

The mitigations themselves live where they act: staggered windows in the model (`ModelConfig.stagger`), the
coverage regulariser in training (`phasekv.train.coverage`), phase ensembling in evaluation
(`phasekv.eval.ensemble`). Here:
- `phasekv.mitigate.compare`: `phasekv compare`, the table (schema phasekv.compare/1) and the Pareto plot,
  from `discovery` (which evaluations, reference, baseline), `cost` (cache bytes, measured step times) and
  `criteria` (Pareto flags, the acceptance check);
- `phasekv.mitigate.repair`: `phasekv repair`, every design against the repair's goals and judged by its seeds (the
  rule), its records typed in `results` (goals.json, the seed record), in words in `repair_text`, drawn in
  `repair_figure`;
- `phasekv.mitigate.audit`: `phasekv audit`, a retrieval protocol, the periodicity verdict and an exit code.

Layer: above `phasekv.eval` (it reads and runs evaluations and looks protocols up in their registry; it needs
nothing of `analysis`, below it in the order), beside `theory` (neither imports the other), below `report`
(which shows the comparison and its criteria) and `demo`.
"""
