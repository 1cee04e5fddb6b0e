"""Each claim's verdict rule on synthetic summaries: a reproduced case, a not-reproduced case, and what it needs."""

import numpy as np
import pandas as pd
import pytest

from phasekv.report import claims
from phasekv.report.claims import NOT_REPRODUCED, REPRODUCED, UNTESTABLE, Facts

M = 24
FULL1, FULL8, W8S8, W8S4 = "Full attention · 1 KV", "Full attention · 8 KV", "W8/S8 · 1 KV", "W8/S4 · 1 KV"
FLAT = [90.0] * 8
PERIODIC = [70, 70, 78, 45, 48, 23, 62, 6]  # the published seed-42 profile, rounded


def lookup(phases, stride: int = 8, half: float = 2.0, n: int = 576) -> dict:
    """A lookup summary.json whose residue r has the accuracy of phase r mod len(phases)."""
    acc = np.array([phases[r % len(phases)] for r in range(M)], dtype=float)
    mean, worst, best = acc.mean(), acc.min(), acc.max()
    gap = best - worst
    periodic = gap > 10
    return {"mean": mean, "mean_ci": [mean - 1, mean + 1], "worst": worst, "worst_ci": [worst - half, worst + half],
            "best": best, "gap": gap, "gap_ci": [max(gap - half, 0), gap + half], "records": 16,
            "stride": stride or None, "detected_period": stride if periodic else 1,
            "periodicity": {"p_value": 1e-4 if periodic else 0.6},
            "groups": [{"residue": r, "n": n, "correct": int(round(acc[r] * n / 100)), "acc": acc[r]} for r in range(M)]}


def facts(**runs) -> Facts:
    """Facts with the same lookup under both paddings; runs: paper name -> summary."""
    return Facts(lookup={"prefix": dict(runs), "in-sequence": dict(runs)})


def test_c1_periodic_with_period_s():
    f = facts(**{W8S8: lookup(PERIODIC), "W4/S4 · 1 KV": lookup(PERIODIC[:4], 4)})
    v = claims.c1(f)
    assert v.verdict == REPRODUCED and v.evidence["strides_tested"] == [4, 8]
    assert "stride 12 (not run)" in v.reason and "stride 6 (not run)" in v.reason
    f.lookup["prefix"]["W12/S12 · 1 KV"] = lookup([50.0] * 12, 12)  # flat: no period
    assert claims.c1(f).verdict == NOT_REPRODUCED


def test_c1_needs_a_run_that_learned():
    assert claims.c1(Facts()).verdict == UNTESTABLE
    v = claims.c1(facts(**{W8S8: lookup([5.0] * 8)}))  # at chance (1 of 16 names)
    assert v.verdict == UNTESTABLE and "did not learn" in v.reason


def test_c2_baselines_flat_under_both_paddings():
    assert claims.c2(facts(**{FULL1: lookup(FLAT, 0)})).verdict == REPRODUCED
    bumpy = facts(**{FULL1: lookup(FLAT, 0)})
    bumpy.lookup["in-sequence"] = {FULL1: lookup([90, 90, 90, 70, 90, 90, 90, 90], 0)}
    assert claims.c2(bumpy).verdict == NOT_REPRODUCED
    one = Facts(lookup={"prefix": {FULL1: lookup(FLAT, 0)}})
    assert claims.c2(one).verdict == UNTESTABLE
    wide = facts(**{FULL1: lookup([90, 90, 90, 89, 90, 90, 90, 90], 0, half=4.0)})  # gap 1 [0, 5]: not shown flat
    v = claims.c2(wide)
    assert v.verdict == NOT_REPRODUCED and "1.0 [0.0, 5.0] (undecided)" in v.reason and "δ = 3.5" in v.reason


def test_c3_mean_near_full_attention_worst_at_floor():
    base = lookup([61.0] * 8, 0)
    hidden = lookup([75, 75, 75, 70, 70, 70, 70, 10])  # mean 66.9, worst 10
    assert claims.c3(facts(**{"W8/S8 · 8 KV": hidden, FULL8: base})).verdict == REPRODUCED
    shallow = lookup([62, 62, 62, 62, 62, 62, 62, 50])  # worst 50: not near the floor
    assert claims.c3(facts(**{"W8/S8 · 8 KV": shallow, FULL8: base})).verdict == NOT_REPRODUCED
    v = claims.c3(facts(**{"W8/S8 · 8 KV": hidden}))
    assert v.verdict == UNTESTABLE and "Full attention · 8 KV (not run)" in v.reason


def test_c4_phases_inside_the_window_differ():
    assert claims.c4(facts(**{W8S8: lookup(PERIODIC)})).verdict == REPRODUCED
    boundary_only = lookup([50, 52, 55, 50, 52, 48, 50, 5])  # only the boundary phase is weak
    assert claims.c4(facts(**{W8S8: boundary_only})).verdict == NOT_REPRODUCED
    assert claims.c4(Facts()).verdict == UNTESTABLE


def test_c5_persists_without_rope_and_gate():
    runs = {FULL1: lookup(FLAT, 0), "W8/S8 · 1 KV · no RoPE": lookup(PERIODIC),
            "W8/S8 · 1 KV · uniform averaging": lookup([30, 30, 30, 30, 30, 30, 30, 12])}
    assert claims.c5(facts(**runs)).verdict == REPRODUCED
    runs["W8/S8 · 1 KV · uniform averaging"] = lookup([30.0] * 8)  # flat
    assert claims.c5(facts(**runs)).verdict == NOT_REPRODUCED
    v = claims.c5(facts(**{FULL1: lookup(FLAT, 0)}))  # the demo's case: neither of its runs trained
    assert v.verdict == UNTESTABLE and v.reason.startswith("needs W8/S8 · 1 KV · no RoPE or W8/S8 · 1 KV · uniform "
                                                           "averaging beside Full attention · 1 KV.")


def test_a_full_attention_control_below_90_is_not_read():
    """Full attention that retrieves but half-solves the lookup (the study's 1-KV control at one seed: 59.5) is no
    reference: the claims that compare with it are not testable, and say why."""
    half = lookup([60.0] * 8, 0) | {"model_kind": "phasekv"}
    runs = {FULL1: half, W8S8: lookup(PERIODIC), W8S4: lookup([70, 70, 70, 40], 4)}
    v2, v6 = claims.c2(facts(**runs)), claims.c6(facts(**runs))
    assert v2.verdict == v6.verdict == UNTESTABLE and "no full-attention baseline learned" in v2.reason
    assert "did not learn the lookup (mean 60.0" in v6.reason
    runs[FULL1] = lookup(FLAT, 0) | {"model_kind": "phasekv"}  # at 90: read
    assert claims.c6(facts(**runs)).verdict == REPRODUCED


def test_c6_overlap_narrows_without_removing():
    runs = {FULL1: lookup(FLAT, 0), W8S8: lookup(PERIODIC), W8S4: lookup([70, 70, 70, 40], 4)}
    assert claims.c6(facts(**runs)).verdict == REPRODUCED
    runs[W8S4] = lookup([80, 80, 80, 8], 4)  # gap as wide as W8/S8's
    assert claims.c6(facts(**runs)).verdict == NOT_REPRODUCED
    runs[W8S4] = lookup(FLAT[:4], 4)  # removed
    assert claims.c6(facts(**runs)).verdict == NOT_REPRODUCED


def _ko(spec: float) -> dict:
    return {"strongest": [{"unit": "L0·KV0", "specificity": spec}]}


def test_c7_knockouts_phase_specific_only_when_compressed():
    f = facts(**{FULL1: lookup(FLAT, 0), W8S8: lookup(PERIODIC)})
    f.knockout = {FULL1: _ko(0.05), W8S8: _ko(0.8)}
    assert claims.c7(f).verdict == REPRODUCED
    f.knockout[FULL1] = _ko(0.5)
    assert claims.c7(f).verdict == NOT_REPRODUCED
    f.knockout = {W8S8: _ko(0.8)}
    assert claims.c7(f).verdict == UNTESTABLE


def test_c8_concentrated_gates_line_up_with_knockouts():
    f = facts(**{W8S8: lookup(PERIODIC)})
    head = {"layer": 0, "kv_head": 0, "static": 1.4, "ko_worst_phase": 2, "key_peak_phase": 2,
            "value_peak_phase": 3, "key_loss_corr": 0.8, "value_loss_corr": 0.6}
    f.gates = {W8S8: {"alignment": [head]}}
    assert claims.c8(f).verdict == REPRODUCED
    f.gates = {W8S8: {"alignment": [{**head, "static": 6.5}]}}  # spread over the window
    assert claims.c8(f).verdict == NOT_REPRODUCED
    f.gates = {W8S8: {"alignment": [{**head, "key_peak_phase": 5, "key_loss_corr": -0.2, "value_loss_corr": 0.1}]}}
    assert claims.c8(f).verdict == NOT_REPRODUCED  # concentrated, but not where the knockout hurts
    assert claims.c8(Facts()).verdict == UNTESTABLE


def _cycle(r2_hi: float, boundary_acc: float) -> dict:
    profile = np.array([70, 70, 78, 45, 48, 23, 62, boundary_acc], dtype=float)
    return {"grid": [{"delta": d, "r2": r2_hi - 0.1, "r2_lo": r2_hi - 0.2, "r2_hi": r2_hi} for d in (-1, 1)],
            "boundary_phase": 7, "profiles": {-1: profile, 0: profile, 1: profile}}


def test_c9_cycling_moves_weak_phases_boundary_stays():
    f = facts(**{FULL1: lookup(FLAT, 0), W8S8: lookup(PERIODIC)})
    f.cycle = {W8S8: _cycle(0.95, 6.0)}
    assert claims.c9(f).verdict == REPRODUCED
    f.cycle = {W8S8: _cycle(0.5, 6.0)}  # R² below the published range
    assert claims.c9(f).verdict == NOT_REPRODUCED
    f.cycle = {W8S8: _cycle(0.95, 90.0)}  # the boundary phase became strong
    assert claims.c9(f).verdict == NOT_REPRODUCED
    f.cycle = {}
    assert claims.c9(f).verdict == UNTESTABLE


def test_c10_theory_checks():
    t = {"minimisers": {"claim_reproduced": True}, "flow": {"claim_reproduced": True, "collisions_occur": True}}
    assert claims.c10(Facts(theory=t)).verdict == REPRODUCED
    t["flow"]["collisions_occur"] = False
    assert claims.c10(Facts(theory=t)).verdict == NOT_REPRODUCED
    assert claims.c10(Facts()).verdict == UNTESTABLE


@pytest.mark.parametrize("f", [Facts(), facts(**{W8S8: lookup(PERIODIC)})])
def test_every_claim_gets_a_verdict(f):
    found = [v.to_dict() for v in claims.verdicts(f)]
    assert [v["claim"] for v in found] == [f"C{i}" for i in range(1, 12)]
    assert all(v["verdict"] in (REPRODUCED, NOT_REPRODUCED, UNTESTABLE) and v["reason"] and v["text"] for v in found)


def test_models_without_a_paper_name_are_left_out(study_dir, tmp_path):
    import shutil

    from phasekv.report import load_study

    root = tmp_path / "hf"
    shutil.copytree(study_dir / "eval", root / "eval")
    shutil.copytree(root / "eval" / "lookup-prefix" / "w8s8-1kv", root / "eval" / "lookup-prefix" / "my-hf-model")
    path = root / "eval" / "lookup-prefix" / "my-hf-model" / "summary.json"
    path.write_text(path.read_text().replace("W8/S8 · 1 KV", "Qwen3-0.6B (HF)"))
    f = claims.facts(load_study(root))
    assert "Qwen3-0.6B (HF)" not in f.lookup["prefix"] and W8S8 in f.lookup["prefix"]
    assert len(claims.verdicts(f)) == 11


def test_cycling_check_reads_an_undefined_r2_as_not_checkable():
    """A flat profile has no R² (stored as None): the check says n/a and cannot be decided; no crash."""
    from types import SimpleNamespace

    from phasekv.report.checks import cycling_checks
    grid = [{"delta": -1, "r2": None}, {"delta": 1, "r2": 0.91}]
    study = SimpleNamespace(analyses={"cycle": {"w8s8-1kv": SimpleNamespace(summary={"grid": grid})}}, models={})
    (check,) = cycling_checks(study)
    assert check.passed is None and "δ=-1: n/a, δ=+1: 0.91" in check.detail


def test_the_plans_repair_designs_are_left_out(study_dir, tmp_path):
    """A repair design is built to have no weak phase: the claims about the study's compressed models leave it out
    (a flat W3/S2 · 1 KV would make C1 count a stride without its period), the Repair section checks it."""
    import json
    import shutil

    from phasekv.report import load_study

    root = tmp_path / "with-repair"
    shutil.copytree(study_dir / "eval", root / "eval")
    (root / "demo.json").write_text(json.dumps({"plan": {"repair_models": [W8S8]}}))
    f = claims.facts(load_study(root))
    assert W8S8 not in f.lookup["prefix"] and W8S8 in claims.facts(load_study(study_dir)).lookup["prefix"]


def test_claims_over_seeds_state_k_of_n_and_name_the_failing_seeds():
    """A directory with each model at several seeds: each claim read at each seed on that seed's runs only, stated
    as k of n with the failing seeds named; a seed whose model did not learn is not read (not testable there)."""
    boundary_only = lookup([50, 52, 55, 50, 52, 48, 50, 5])
    f = facts(**{W8S8: lookup(PERIODIC), f"{W8S8} · seed 43": lookup(PERIODIC), f"{W8S8} · seed 44": boundary_only,
                 f"{W8S8} · seed 45": lookup([5.0] * 8), FULL1: lookup(FLAT, 0), f"{FULL1} · seed 43": lookup(FLAT, 0)})
    assert sorted(claims.by_seed(f)) == [42, 43, 44, 45]
    assert set(claims.by_seed(f)[43].lookup["prefix"]) == {W8S8, FULL1}  # names without the seed
    c4 = next(v for v in claims.verdicts(f) if v.claim == "C4")
    assert c4.verdict == claims.VARIES and c4.reason.startswith("2 of 3 seeds")
    assert c4.evidence["failing_seeds"] == [44] and c4.evidence["untestable_seeds"] == [45]
    assert "not at seed 44" in c4.reason and "Not testable at seed 45" in c4.reason and "did not learn" in c4.reason
    c2 = next(v for v in claims.verdicts(f) if v.claim == "C2")
    assert c2.verdict == REPRODUCED and c2.evidence["reproduced_seeds"] == [42, 43]  # 44, 45: no baseline
    lo, hi = c2.evidence["rate_ci"]
    assert 0.15 < lo < 0.16 and hi == 1.0  # 2 of 2: Clopper-Pearson 15.8-100%
    assert next(v for v in claims.verdicts(f) if v.claim == "C10").verdict == UNTESTABLE  # read once, not per seed


def test_claims_at_one_other_seed_are_read_on_its_runs_and_name_it():
    f = facts(**{f"{W8S8} · seed 7": lookup(PERIODIC)})
    c4 = next(v for v in claims.verdicts(f) if v.claim == "C4")
    assert c4.verdict == REPRODUCED and c4.reason.startswith("At seed 7:") and c4.evidence["seeds"] == [7]
    assert claims.verdicts(facts(**{W8S8: lookup(PERIODIC)}))[3].reason.startswith(W8S8)  # the default: unchanged


def test_report_reads_a_directory_of_several_seeds(tmp_path):
    """The report of a directory holding its models at two seeds: the claims at each seed (a table, the claims that
    change with the seed), the grid one row per design with its seeds, the Markdown grid likewise."""
    from fixture import make_study

    from phasekv.report import render_report
    from phasekv.report.markdown import grid_markdown

    root = make_study(tmp_path / "seeds", models=["full-1kv", "w8s8-1kv", "full-1kv-seed43", "w8s8-1kv-seed43"])
    page = render_report(root, progress=False).read_text()
    assert "At each seed" in page and "seed 43" in page
    grid = pd.read_csv(root / "report" / "grid.csv")
    w8s8 = grid[grid.model == W8S8].iloc[0]
    assert w8s8.n_seeds == 2 and w8s8.seeds == "42, 43" and w8s8.mean_min <= w8s8["mean"] <= w8s8.mean_max
    assert not grid.model.str.contains("seed").any()
    assert "42, 43" in grid_markdown(root)


def test_the_plans_repair_designs_are_found_at_every_seed():
    """A repair design is left out of the claims at any seed (W3/S2 · 1 KV is flat by design: C1 would count it)."""
    from types import SimpleNamespace

    from phasekv.report.checks import repair_aliases

    models = {a: SimpleNamespace(name=n) for a, n in [("w3s2-1kv-seed70", "W3/S2 · 1 KV · seed 70"),
                                                       ("w3s2-1kv", "W3/S2 · 1 KV"),
                                                       ("w8s8-1kv-seed70", "W8/S8 · 1 KV · seed 70")]}
    study = SimpleNamespace(manifest={"plan": {"repair_models": ["W3/S2 · 1 KV"]}}, models=models)
    assert repair_aliases(study) == {"w3s2-1kv-seed70", "w3s2-1kv"}
