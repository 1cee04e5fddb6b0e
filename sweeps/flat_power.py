"""How often a model with no phase structure at all is shown flat: the audit's power for its negative control.

A flat model of accuracy p is simulated as independent hits at every (mapping, residue) cell, evaluated like the
needle audit (M residues, 32 mappings, `phasekv.eval.stats.gap_estimate`), and judged by the flat rule (the gap's
95% upper bound below δ). Prints, for each accuracy and prompt count, the share of repetitions shown flat with its
exact interval and the median upper bound (docs/results/seeds.md, the needle's controls).

    python sweeps/flat_power.py [--reps 40] [--modulus 16]
"""

from __future__ import annotations

import argparse

import numpy as np

from phasekv.eval.stats import FLAT, clopper_pearson, flatness, gap_estimate

ACCURACIES = (0.75, 0.90, 0.97, 0.99)
PROMPTS = (2048, 8192, 32768)  # the audit's 2,048 per length, then 4x and 16x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--modulus", type=int, default=16)
    ap.add_argument("--mappings", type=int, default=32)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print("| accuracy | prompts | per residue | shown flat | median upper bound |")
    print("|---|---|---|---|---|")
    for p in ACCURACIES:
        for n in PROMPTS:
            trials = np.full((a.mappings, a.modulus), n // (a.mappings * a.modulus))  # (mappings, M)
            ubs = [100 * gap_estimate(rng.binomial(trials, p), trials, n_boot=1000, seed=r)[1][1]
                   for r in range(a.reps)]
            k = sum(flatness(np.array([0.0, u])) == FLAT for u in ubs)
            lo, hi = clopper_pearson(k, a.reps)
            print(f"| {100 * p:.0f}% | {n:,} | {n // a.modulus:,} | {k} of {a.reps} ({100 * lo:.0f}-{100 * hi:.0f}%) | "
                  f"{np.median(ubs):.1f} |", flush=True)


if __name__ == "__main__":
    main()
