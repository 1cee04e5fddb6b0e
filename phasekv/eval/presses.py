"""`phasekv eval presses`: the phase audit of inference-time KV-cache compression in one go.

One Hugging Face model's lookup under both paddings, uncompressed and under each kvpress press of a table at
each compression ratio (`phasekv.eval.press`), written as

    OUT/presses/presses.json              the table: model, settings, one row per (padding, press)
    OUT/presses/presses.md                the same table as Markdown (what the report's section shows)
    OUT/presses/<padding>/<alias>/        each evaluation (`phasekv eval lookup --press`): summary.json, ...

Every row gives mean [95%], worst, best, gap [95%], the detected period and the residue profile's power at
periods 4 and 8 (permutation p; chunked presses lay a grid of their chunk length from cache index 0).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from phasekv.errors import ConfigError
from phasekv.eval.models import EvalModel
from phasekv.eval.press import parse_press, with_press
from phasekv.eval.prompts import PADDINGS
from phasekv.eval.protocols import LOOKUP
from phasekv.eval.ratios import ratio_tests
from phasekv.eval.run import run_retrieval
from phasekv.io import write_json, write_text

TABLE = ("snapkv", "streaming", "knorm", "chunkkv(snapkv,4)", "chunkkv(snapkv,8)", "chunk(knorm,8)")
RATIOS = (0.5, 0.75)
PERIODS = (4, 8)  # the periods every row is tested at (the table's chunk lengths)
NONE = "none"  # the uncompressed model's alias


def alias(spec: str | None) -> str:
    """A directory name for a press spec: chunkkv(snapkv,8):0.5 -> chunkkv-snapkv-8-0.5."""
    return NONE if spec is None else re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-")


def run_presses(em: EvalModel, out: str | Path, presses: tuple[str, ...] = TABLE, ratios: tuple[float, ...] = RATIOS,
                paddings: tuple[str, ...] = PADDINGS, per_group: int | None = None, batch_size: int = 32,
                progress: bool = True) -> dict:
    """Evaluate `em` uncompressed and under every press x ratio, each padding; finished evaluations are kept
    (re-running resumes). Returns presses.json's content."""
    specs = [None] + [f"{p}:{r:g}" for p in presses for r in ratios]
    parsed = {s: parse_press(s) for s in specs if s}  # every spec checked before any work
    root = Path(out) / "presses"
    rows = []
    for padding in paddings:
        n = per_group or 576
        cfg = LOOKUP.fit(em, padding=padding, per_group=n, keep_n=n % 24**2 != 0)
        for spec in specs:
            d = root / padding / alias(spec)
            summary = _finished(d)
            if summary is None:
                model = em if spec is None else with_press(em, parsed[spec])
                summary = run_retrieval(LOOKUP.name, model, cfg, d, batch_size=batch_size, progress=progress)
            rows.append(row(summary, spec, padding, d.relative_to(root)))
    table = {"model": em.name, "per_group": cfg.per_group, "modulus": cfg.modulus, "prompts": rows[0]["n_prompts"],
             "periods": list(PERIODS), "rows": rows}
    write_json(root / "presses.json", table)
    write_text(root / "presses.md", markdown(table))
    return table


def _finished(d: Path) -> dict | None:
    try:
        return json.loads((d / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def row(summary: dict, spec: str | None, padding: str, directory: Path) -> dict:
    """One table row from an evaluation's summary."""
    press = summary["provenance"]["model_info"].get("press", {})
    tests = {t["ratio"]: t["period_p_value"] for t in ratio_tests(summary, {p: [] for p in PERIODS})}
    return {"press": spec or NONE, "padding": padding, "dir": str(directory), "n_prompts": summary["n_prompts"],
            "chunk": parse_press(spec).chunk if spec else None,
            "mean": summary["mean"], "mean_ci": summary["mean_ci"], "worst": summary["worst"],
            "best": summary["best"], "gap": summary["gap"], "gap_ci": summary["gap_ci"],
            "detected_period": summary["detected_period"], "p": {str(k): v for k, v in tests.items()},
            "arguments": press.get("arguments"), "cache": press.get("cache"),
            "batch_size": press.get("batch_size")}


def _ci(x: float, ci) -> str:
    return f"{x:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]"


def _p(p) -> str:
    return "–" if p is None else f"{p:.4f}"


HEADERS = ["press", "padding", "kept", "mean [95%]", "worst", "best", "gap [95%]", "period", "p (4)", "p (8)"]


def cells(r: dict) -> list[str]:
    """A row's cells (HEADERS): kept is the context tokens the cache kept (of the context's)."""
    c = r.get("cache") or {}
    kept = "all" if r["press"] == NONE else (
        f"{c['kept_per_layer'][0][0]}-{c['kept_per_layer'][0][1]} of {c['context']}"
        if c["kept_per_layer"][0][0] != c["kept_per_layer"][0][1] else f"{c['kept_per_layer'][0][0]} of {c['context']}")
    return [r["press"], r["padding"], kept, _ci(r["mean"], r["mean_ci"]), f"{r['worst']:.1f}", f"{r['best']:.1f}",
            _ci(r["gap"], r["gap_ci"]), str(r["detected_period"]), _p(r["p"].get("4")), _p(r["p"].get("8"))]


def markdown(table: dict) -> str:
    """The table as Markdown, a row per (padding, press)."""
    lines = [f"{table['model']} · lookup, {table['prompts']:,} prompts per evaluation ({table['per_group']} per "
             f"residue group, M = {table['modulus']}); p (d): the residue profile's power at period d "
             "(permutation test)", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in table["rows"]]
    return "\n".join(lines + [""] + [f"- {s}" for s in findings(table)]) + "\n"


ALPHA = 0.01  # level of the period tests in the findings


def findings(table: dict) -> list[str]:
    """Plain sentences, one per press: whether retrieval under it depends on phase (the residue profile's power
    at its chunk length, or at 4 or 8 for an unchunked press, significant at ALPHA; or a detected period other
    than 1), with its gaps by ratio and padding."""
    out = []
    presses = dict.fromkeys(r["press"].split(":")[0] for r in table["rows"])
    for press in presses:
        rows = [r for r in table["rows"] if r["press"].split(":")[0] == press]
        periods = [str(rows[0]["chunk"])] if rows[0]["chunk"] else [str(d) for d in table["periods"]]
        hits = sorted({f"period {d} ({r['press']}, {r['padding']}: p {r['p'][d]:.4f})" for r in rows for d in periods
                       if r["p"].get(d) is not None and r["p"][d] < ALPHA})
        detected = sorted({r["detected_period"] for r in rows} - {1})
        gaps = "; ".join(f"{r['press'].split(':', 1)[-1] if ':' in r['press'] else 'uncompressed'} {r['padding']}: "
                         f"mean {r['mean']:.1f}, gap {_ci(r['gap'], r['gap_ci'])}" for r in rows)
        if hits:
            verdict = "retrieval depends on phase at " + ", ".join(hits)
        elif detected:
            verdict = (f"no significant power at period {' or '.join(periods)}: its gaps do not follow the phase "
                       f"(detected period {', '.join(map(str, detected))} of M = {table['modulus']})")
        else:
            verdict = f"no phase dependence detected (period 1; no significant power at period {' or '.join(periods)})"
        out.append(f"{press}: {verdict}. {gaps}.")
    return out


def load_table(root: str | Path) -> dict | None:
    """DIR/presses/presses.json of a directory (None when it has none)."""
    try:
        return json.loads((Path(root) / "presses" / "presses.json").read_text())
    except (OSError, ValueError):
        return None


def check_presses(presses: list[str]) -> tuple[str, ...]:
    """Press specs without a ratio (`snapkv`, `chunk(knorm,8)`), each checked by the parser."""
    for p in presses:
        if ":" in p:
            raise ConfigError(f"--press {p!r}: give the press without its ratio (the ratios are --ratios)")
        parse_press(f"{p}:0.5")
    return tuple(presses)
