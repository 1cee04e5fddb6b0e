"""C11 on synthetic pairs: raised mean, narrower gap and the period kept, with the intervals; k of n with the failing
models named; pairs whose models did not learn or whose base shows no period are reported, never read."""

from phasekv.report.claims import NOT_REPRODUCED, REPRODUCED, UNTESTABLE
from phasekv.report.posttrain import c11, read_pair
from tests.report.test_claims import lookup

BASE = lookup([100, 100, 100, 10], 4)  # periodic with stride 4: gap 90, mean 77.5
NARROWER = lookup([100, 100, 100, 60], 4)  # gap 40, mean 90: raised, narrower, period 4 kept
FLAT = lookup([98, 98, 98, 98], 4)  # repaired: the period is gone
CHANCE = lookup([3, 3, 3, 3], 4)


def pair(seed: int, base: dict, post: dict) -> dict:
    name = "W8/S4 · 1 KV" + (f" · seed {seed}" if seed != 42 else "")
    return {"name": name, "seed": seed, "stride": 4, "steps": 150, "base": {"prefix": base}, "post": {"prefix": post}}


def test_read_pair():
    r = read_pair(pair(100, BASE, NARROWER))
    assert r["read"] and r["raised"] and r["narrowed"] and r["kept"] and r["holds"]
    r = read_pair(pair(100, BASE, FLAT))
    assert r["read"] and r["narrowed"] and not r["kept"] and not r["holds"]
    assert not read_pair(pair(100, BASE, BASE))["narrowed"]
    assert read_pair(pair(100, CHANCE, NARROWER))["why"].startswith("did not learn")
    assert "no period 4 to keep" in read_pair(pair(100, FLAT, NARROWER))["why"]


def test_verdict_k_of_n_with_failing_named():
    v = c11([pair(100, BASE, NARROWER), pair(101, BASE, NARROWER)])
    assert v.verdict == REPRODUCED and v.evidence["holds"] == 2 and "holds at 2 of 2" in v.reason
    v = c11([pair(100, BASE, NARROWER), pair(101, BASE, FLAT), pair(102, CHANCE, NARROWER)])
    assert v.verdict == NOT_REPRODUCED and (v.evidence["holds"], v.evidence["read"]) == (1, 2)
    assert v.evidence["failing_seeds"] == ["W8/S4 · 1 KV · seed 101"] and "period not kept" in v.reason
    assert "seed 102: not read (did not learn" in v.reason
    assert "40.2 → 19.1" in v.evidence["published"]["needle gap, DeepSeek-V4-Flash-Base → DeepSeek-V4-Flash-0731"]
    assert c11([]).verdict == c11([pair(102, CHANCE, NARROWER)]).verdict == UNTESTABLE
