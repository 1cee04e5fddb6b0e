"""The long-context regime's results as the report reads them (`phasekv study --needle` writes them: DIR/needle.json
and one audit per model and context under DIR/needle-<context>/<alias>/): the controls' table and the audits."""

from __future__ import annotations

import json
from pathlib import Path

from phasekv.config import ModelConfig

HEADERS = ["model", "context", "prompts (mod M)", "mean [95%]", "worst", "best", "gap [95%]", "period", "p at S", "flat",
           "audit (exit)"]


def cells(r: dict) -> list[str]:
    """One control (a model's needle audit at one length) as the table's cells."""
    p = "" if r["period_p_value"] is None else f"{r['period_p_value']:.4f} (S={r['stride']})"
    return [r["model"], f"{r['context']:,}{' (beyond training)' if r['beyond_training_length'] else ''}",
            f"{r['n_prompts']:,} (mod {r['modulus']})", f"{r['mean']:.1f} [{r['mean_ci'][0]:.1f}, {r['mean_ci'][1]:.1f}]",
            f"{r['worst']:.1f}", f"{r['best']:.1f}", f"{r['gap']:.1f} [{r['gap_ci'][0]:.1f}, {r['gap_ci'][1]:.1f}]",
            str(r["detected_period"]), p, "yes" if r["flat"] else "no", f"{r['verdict']} ({r['exit_code']})"]


def table(rows: list[dict]) -> str:
    """The controls' table (markdown): each model's needle audit at each length."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    return "\n".join(lines + ["| " + " | ".join(cells(r)) + " |" for r in rows]) + "\n"


def load(root: Path) -> dict | None:
    """`phasekv study --needle`'s results (ROOT/needle.json: the controls and the training length), if any."""
    return kept(Path(root) / "needle.json")


def kept(path: Path) -> dict | None:
    """A finished evaluation's summary or audit's verdict, if there is one."""
    return json.loads(path.read_text()) if path.is_file() else None


def audits(root: Path, rows: list[dict], context: int) -> list[tuple[str, str, dict, dict]]:
    """(model, alias, the evaluation's summary, the audit's verdict) of every model's needle audit at `context`
    under ROOT (OUT/needle-<context>/<alias>/), for the report's figures; audits not on disk are skipped."""
    found = []
    for r in rows:
        if r["context"] != context:
            continue
        alias = ModelConfig.from_name(r["model"]).alias
        where = Path(root) / f"needle-{context}" / alias
        v, summaries = kept(where / "audit.json"), sorted(where.rglob("summary.json"))
        if v and summaries:
            found.append((r["model"], alias, json.loads(summaries[0].read_text()), v))
    return found
