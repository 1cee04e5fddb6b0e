"""Phase-aware evaluation: position-matched lookup and needle tests, the filler sweep, and statistics.

- `phasekv.eval.design`: target positions with identical mean and variance in every residue group.
- `phasekv.eval.prompts`: token-exact prompt builders (lookup, needle) over the shipped word lists.
- `phasekv.eval.stats`: Wilson and bootstrap intervals, gap, fold consistency, periodicity test.
"""
