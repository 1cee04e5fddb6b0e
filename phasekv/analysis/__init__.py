"""Mechanism analyses (docs: Explain the weak phases): why a compressed model has weak phases.

- `phasekv.analysis.knockout`: KV-head / whole-layer mean-ablation knockouts by residue and phase
  (`analyze_knockout`, `run_knockouts`, `effect_table`); hooks in `phasekv.analysis.hooks`.
- `phasekv.analysis.gates`: static / per-window gate concentration, gate scores by phase, training paths
  (`analyze_gates`, `collect_alpha`, `gate_stats`, `read_gate_paths`); the concentration math itself lives
  in `phasekv.model.concentration`.
- `phasekv.analysis.cycling`: gate cycling by delta with R^2 excluding the boundary phase (`analyze_cycle`,
  `cycled`, `run_cycling`).
- `phasekv.analysis.figures`: one builder per figure (knockout map, concentration plane, gates beside
  knockouts, gate cycling, R² grid), used for the PNGs here and by the report.

Layer: above `phasekv.eval`, whose prompts, scoring, model loading and figure spec it reuses (an analysis is
an evaluation with hooks on the model), below `mitigate`, `theory`, `report` and `demo`: the report draws
these figures from the tables the analyses write, so the builders sit with the analyses, not above them.
"""
