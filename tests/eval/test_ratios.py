"""Which compression ratios an audit tests, at which modulus and with how many prompts."""

import numpy as np
import pytest

from phasekv.eval.ratios import plan_ratios, ratio_tests


def test_ratios_dividing_the_modulus_share_one_evaluation():
    (plan,) = plan_ratios({4: ["csa"], 8: ["hca"]}, 24, 576)
    assert plan.modulus == 24 and set(plan.ratios) == {4, 8} and plan.per_group is None and not plan.keep_n


def test_a_large_ratio_gets_its_own_modulus_and_keeps_the_prompt_budget():
    small, large = plan_ratios({4: ["csa"], 128: ["hca"]}, 24, 576)
    assert (small.modulus, set(small.ratios)) == (24, {4})
    assert (large.modulus, set(large.ratios), large.keep_n) == (256, {128}, True)
    assert large.per_group == round(24 * 576 / 256) and "kept" in large.n_rule
    assert plan_ratios({128: ["hca"]}, 8, 64)[0].per_group == 16  # floored
    assert [p.modulus for p in plan_ratios({5: ["a"]}, 24, 576)] == [25]
    assert [(p.modulus, p.ratios) for p in plan_ratios({}, 24, 576)] == [(24, {})]


def test_ratio_tests_fold_and_test_each_period():
    acc = np.tile([100.0, 100.0, 100.0, 0.0], 6)  # weak phase 3 mod 4 (and mod 8: phases 3 and 7)
    summary = {"groups": [{"acc": a} for a in acc]}
    (plan,) = plan_ratios({4: ["csa"], 8: ["hca"], 24: ["x"]}, 24, 576)
    t = {r["ratio"]: r for r in ratio_tests(summary, plan.ratios, n_perm=500)}
    assert t[4]["phase_profile"] == [100, 100, 100, 0] and t[4]["weakest_phase"] == 3 and t[4]["phase_gap"] == 100
    assert t[4]["period_p_value"] < 0.01 and t[8]["layer_types"] == ["hca"]
    assert t[24]["period_p_value"] is None  # r = M: the gap only
    assert t[8]["phase_profile"] == pytest.approx([100, 100, 100, 0] * 2)
    assert [x["ratio"] for x in ratio_tests(summary, {5: ["a"], 4: ["b"]}, n_perm=10)] == [4]  # 5 misses M = 24
