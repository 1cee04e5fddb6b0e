"""The report's section "The family": one sentence per design (both paddings folded), and a design continued from
full attention named as such in its rows."""

import json
from types import SimpleNamespace

from phasekv.report.family import design_sentence, label


def _grid(grid, period, test, weak, p=0.0001, gap=(20.0, 15.0, 25.0)):
    return {"grid": grid, "period": period, "modulus": 24 if test == "period" else period, "test": test,
            "weak_spot": weak, "p_value": p if test == "period" else None, "weakest_phase": 2, "gap": gap[0],
            "gap_ci": list(gap[1:])}


def _summary(model, plans, lookups, masking=None):
    return {"model": model, "design": "x", "chance": 3.1, "plans": plans, "lookup": lookups,
            "knockouts": {"masking": masking} if masking else None}


def _lookup(mean_ci, grids):
    return {"mean": sum(mean_ci) / 2, "mean_ci": list(mean_ci), "grids": grids}


def test_one_sentence_per_design_folds_both_paddings():
    plans = [{"grid": "r", "period": 8, "test": "period"}, {"grid": "w", "period": 32, "test": None}]
    s = _summary("Beacon r8 · window 32 · 1 KV", plans, {
        "prefix": _lookup((60, 62), [_grid("r", 8, "period", True)]),
        "in-sequence": _lookup((70, 72), [_grid("r", 8, "period", False, p=0.4, gap=(3.0, 0.0, 6.0))])})
    text = design_sentence("Beacon", s)
    assert text.startswith("Beacon: periodic weak spots at r = 8 under prefix padding (prefix: mean 61")
    assert "in-sequence: mean 71" in text and "r = 8: gap 3.0 [0.0, 6.0], p 0.4000, none" in text
    assert "w = 32 not determinable at this prompt length" in text and text.count(".") >= 1


def test_at_chance_gap_only_and_nsa_masking():
    moba = [{"grid": "B", "period": 16, "test": "gap"}]
    chance = _summary("MoBA", moba, {"prefix": _lookup((4, 6), []), "in-sequence": _lookup((4, 6), [])})
    assert "does not retrieve" in design_sentence("MoBA", chance)
    gap_only = _summary("MoBA", moba, {p: _lookup((80, 82), [_grid("B", 16, "gap", None)])
                                       for p in ("prefix", "in-sequence")})
    text = design_sentence("MoBA", gap_only)
    assert "no period test is possible at its grid" in text and "accuracy depends on t mod 16 (gap 20.0 [15.0, 25.0])" in text
    nsa = _summary("NSA", [{"grid": "d", "period": 4, "test": "period"}],
                   {p: _lookup((40, 42), [_grid("d", 4, "period", True)]) for p in ("prefix", "in-sequence")},
                   {"masks": False, "compressed_weak_at": ["d"], "learned_weak_at": ["d"], "compressed_retrieves": True})
    text = design_sentence("NSA", nsa)
    assert "periodic weak spots at d = 4 under both paddings" in text and "its exact branches mask nothing" in text


def test_a_continued_design_is_named_with_its_source(tmp_path):
    run = tmp_path / "runs" / "moba-b16k3-1kv"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"train": {"steps": 600},
                                                 "init": {"from_name": "Full attention · 1 KV"}}))
    study = SimpleNamespace(root=tmp_path)
    assert label(study, "moba-b16k3-1kv", {"model": "MoBA B16 top 3 · 1 KV"}) == \
        "MoBA B16 top 3 · 1 KV (continued from Full attention · 1 KV, 600 steps)"
    assert label(study, "full-1kv", {"model": "Full attention · 1 KV"}) == "Full attention · 1 KV"
