"""Which compression ratios an audit tests, at which modulus and with how many prompts."""

import numpy as np
import pytest

from phasekv.analysis.family import plan_grid
from phasekv.eval.prompts import PromptConfig
from phasekv.eval.ratios import plan_period, plan_ratios, ratio_tests

LONG = PromptConfig(records=512, demos=8, filler=48, modulus=24, per_group=576)  # room for any modulus below
LOOKUP_90 = PromptConfig(records=16, demos=4, filler=48, modulus=24, per_group=576)  # the demo's: 79 positions


def test_ratios_dividing_the_modulus_share_one_evaluation():
    (plan,) = plan_ratios({4: ["csa"], 8: ["hca"]}, LONG)
    assert plan.modulus == 24 and set(plan.ratios) == {4, 8} and plan.per_group is None and not plan.keep_n


def test_a_large_ratio_gets_its_own_modulus_and_keeps_the_prompt_budget():
    small, large = plan_ratios({4: ["csa"], 128: ["hca"]}, LONG)
    assert (small.modulus, set(small.ratios)) == (24, {4})
    assert (large.modulus, set(large.ratios), large.keep_n) == (256, {128}, True)
    assert large.per_group == round(24 * 576 / 256) and "kept" in large.note
    needle = PromptConfig(records=512, demos=8, filler=48, modulus=8, per_group=64)
    assert plan_ratios({128: ["hca"]}, needle)[0].per_group == 16  # floored
    assert [p.modulus for p in plan_ratios({5: ["a"]}, LONG)] == [10]  # the smallest multiple k >= 2 that fits
    assert [(p.modulus, p.ratios) for p in plan_ratios({}, LONG)] == [(24, {})]


def test_moduli_fit_the_prompts_target_positions():
    """The demo's 90-token lookup (79 target positions; an exact design at M needs 3M - 2): B = 16 gets the gap
    at 16 (32 needs 94), w = 32 cannot be tested; the family analysis plans each grid the same way."""
    b, r, untested = plan_ratios({16: ["B"], 8: ["r"], 32: ["w"]}, LOOKUP_90)
    assert (r.modulus, r.ratios, r.test) == (24, {8: ["r"]}, "period")
    assert (b.modulus, b.ratios, b.per_group, b.test) == (16, {16: ["B"]}, 768, "gap")
    assert (untested.modulus, untested.ratios, untested.test) == (None, {32: ["w"]}, None)
    assert "94 target positions, these prompts have 79" in untested.note
    for period in (4, 5, 16, 32):
        grid, shared = plan_grid("g", period, LOOKUP_90), plan_period("g", period, LOOKUP_90)
        assert (grid.modulus, grid.per_group, grid.keep_n, grid.test) == \
            (shared.modulus, shared.per_group, shared.keep_n, shared.test)
    only, none = plan_ratios({64: ["x"]}, LOOKUP_90)  # nothing testable: the evaluation at its own modulus
    assert (only.modulus, only.ratios, none.modulus, none.ratios) == (24, {}, None, {64: ["x"]})
    assert plan_ratios({24: ["x"]}, LONG)[0].modulus == 48  # r = M: tested for its period at 2M where it fits


def test_ratio_tests_fold_and_test_each_period():
    acc = np.tile([100.0, 100.0, 100.0, 0.0], 6)  # weak phase 3 mod 4 (and mod 8: phases 3 and 7)
    summary = {"groups": [{"acc": a} for a in acc]}
    t = {r["ratio"]: r for r in ratio_tests(summary, {4: ["csa"], 8: ["hca"], 24: ["x"]}, n_perm=500)}
    assert t[4]["phase_profile"] == [100, 100, 100, 0] and t[4]["weakest_phase"] == 3 and t[4]["phase_gap"] == 100
    assert t[4]["period_p_value"] < 0.01 and t[8]["layer_types"] == ["hca"]
    assert t[24]["period_p_value"] is None  # r = M: the gap only
    assert t[8]["phase_profile"] == pytest.approx([100, 100, 100, 0] * 2)
    assert [x["ratio"] for x in ratio_tests(summary, {5: ["a"], 4: ["b"]}, n_perm=10)] == [4]  # 5 misses M = 24
