"""A claim's verdict and the small formatters every claim module shares (`claims`, `posttrain`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from phasekv.report import published as pub

REPRODUCED, NOT_REPRODUCED, UNTESTABLE = "reproduced", "not reproduced", "not testable here"
VARIES = "varies with the seed"  # reproduced at some of the seeds it was tested at, not at others
PADDING = pub.PROTOCOL[1]  # the verdicts' padding


@dataclass
class Verdict:
    claim: str  # C1 .. C11
    verdict: str  # REPRODUCED | NOT_REPRODUCED | UNTESTABLE
    reason: str  # the numbers behind the verdict in words, or why it cannot be tested here
    evidence: dict = field(default_factory=dict)  # measured numbers with intervals; published ones beside them

    def to_dict(self) -> dict:
        return {"claim": self.claim, "text": pub.CLAIMS[self.claim], "verdict": self.verdict, "reason": self.reason,
                "evidence": self.evidence}


def rounded(x, nd: int = 1):
    """x rounded to nd places; None for a missing or NaN value."""
    return None if x is None or x != x else round(float(x), nd)


def ci(s: dict, key: str) -> dict:
    """A summary's estimate with its 95% interval, e.g. {"value": 75.3, "ci": [70.1, 80.2]}."""
    lo, hi = s.get(f"{key}_ci") or (None, None)
    return {"value": rounded(s.get(key)), "ci": [rounded(lo), rounded(hi)]}


def text(s: dict, key: str) -> str:
    c = ci(s, key)
    return f"{c['value']} [{c['ci'][0]}, {c['ci'][1]}]"
