"""A rendered report read as a reader sees it, for comparing two renders cell for cell; and a second planted study
directory with the sections `fixture.make_study` has not (repair, family, long context, presses).

`python tests/report/page_tables.py` renders both planted directories and writes what a reader sees of them to
tests/report/data/page_tables.json, the record `test_page_tables.py` compares every render with: run it (and
commit the file) when a change to the report's numbers or words is meant.
"""

from __future__ import annotations

import json
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np

RECORD = Path(__file__).parent / "data" / "page_tables.json"
BLOCKS = {"h2", "h3", "p", "li", "pre", "figcaption", "button"}


class Page(HTMLParser):
    """Per section (its id): its tables cell by cell and its other text blocks, each as its text (whitespace
    collapsed) and the marks of the elements in it (`span.pass`: a verdict's colour, `a[href=figures/x.png]`);
    scripts and styles skipped."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.sections: dict[str, list] = {}
        self.blocks: list | None = None  # the open section's
        self.open: list[dict] = []  # the open text holders (block or cell), innermost last
        self.table: dict | None = None
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "style"):
            self.skip += 1
        elif tag == "section":
            self.blocks = self.sections.setdefault(a.get("id"), [])
        elif self.blocks is None or self.skip:
            return
        elif tag == "table":
            self.table = {"class": a.get("class"), "rows": []}
            self.blocks.append(self.table)
        elif tag == "tr" and self.table is not None:
            self.table["rows"].append({"model": a.get("data-model"), "cells": []})
        elif tag in ("td", "th") and self.table is not None:
            self.open.append({"text": [], "marks": []})
        elif tag in BLOCKS or (tag == "div" and a.get("class") == "prompt"):
            self.open.append({"tag": tag, "text": [], "marks": []})
        elif self.open:
            self.open[-1]["marks"].append(_mark(tag, a))

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip -= 1
        elif tag == "section":
            self.blocks = None
        elif tag == "table":
            self.table = None
        elif self.open and (tag in ("td", "th") and "tag" not in self.open[-1] or self.open[-1].get("tag") == tag):
            done = self.open.pop()
            item = {k: v for k, v in done.items() if v} | {"text": " ".join("".join(done["text"]).split())}
            if "tag" in done:
                self.blocks.append(item)
            else:
                self.table["rows"][-1]["cells"].append(item)

    def handle_data(self, data):
        if self.open and not self.skip:
            self.open[-1]["text"].append(data)


def _mark(tag: str, a: dict) -> str:
    return tag + "".join(f"[{k}={a[k]}]" for k in ("class", "style", "href", "data-model") if a.get(k))


def read_page(html: str) -> dict[str, list]:
    page = Page()
    page.feed(html)
    return page.sections


def extras_study(root: Path) -> Path:
    """A study directory with a repair sweep (goals.json, a seed record cited for one design, another design kept
    from it), a family analysis, the
    long-context controls and a press table, beside one lookup evaluation."""
    from fixture import M, lookup_stage

    from phasekv.config import ModelConfig
    from phasekv.io import write_json
    from phasekv.mitigate.repair import attach_record, evaluate, keep, plot_frontier, seed_record
    from phasekv.report.layout import Layout

    lay = Layout(root)
    lookup_stage(lay.lookup("prefix", "w8s4-1kv"), ModelConfig.from_name("w8s4-1kv", preset="tiny"), "prefix",
                 np.random.default_rng(1))
    result = evaluate(_repair_summaries([_seeded("W12/S6 · 1 KV", s) for s in range(42, 46)]), "W8/S4 · 1 KV")
    measured = [_seeded("W3/S2 · 1 KV", s) for s in (42, 43, 50, 51)] + [_seeded("W12/S6 · 1 KV", s) for s in (46, 47)]
    record = seed_record(evaluate(_repair_summaries(measured), "W8/S4 · 1 KV"), "sweep A")
    record.designs[0].fresh_seeds = [50, 51]
    attach_record(result, record)
    keep(result, record)
    write_json(root / "repair" / "goals.json", result.to_dict())
    plot_frontier(result, root / "repair" / "frontier.png")
    write_json(lay.analysis("family", "w8s4-1kv") / "summary.json", _family_summary(M))
    write_json(root / "needle.json", {"train_len": 128, "controls": [_needle_row(c) for c in (127, 255)]})
    write_json(root / "presses" / "presses.json", _presses())
    return root


def _seeded(name: str, seed: int) -> str:
    from phasekv.config import ModelConfig

    return ModelConfig.from_name(name).replace(seed=seed).name


def _repair_row(label: str, mean=95.0, gap=0.5, gap_ci=(0.0, 1.5), period=1, p=0.6, train=1.0, decode=1.0) -> dict:
    from phasekv.config import ModelConfig

    cfg = ModelConfig.from_name(label)
    return {"label": label, "model": cfg.name, "ensemble_k": 1, "eval_dir": f"eval/{cfg.alias}", "mean": mean,
            "mean_ci": [mean - 1, mean + 1], "gap": gap, "gap_ci": list(gap_ci), "gap_raw": gap + 1,
            "detected_period": period, "periodicity_p": p, "worst": mean - gap, "worst_residue": 0,
            "train_cost_rel": train, "decode_cost_rel": decode}


def _repair_summaries(designs: list[str]) -> dict:
    """Both paddings' compare summaries: full attention, the unrepaired W8/S4 and the designs, the last one weak."""
    rows = [_repair_row("Full attention · 1 KV", mean=93.0, gap=0.0, gap_ci=(0.0, 1.0)),
            _repair_row("W8/S4 · 1 KV", mean=72.0, gap=90.0, gap_ci=(88.0, 92.0), period=4, p=0.0001, train=1.6,
                        decode=1.2),
            *(_repair_row(d) for d in designs[:-1]),
            _repair_row(designs[-1], mean=76.1, gap=79.4, gap_ci=(76.4, 82.3), period=6, p=None)]
    return {p: {"schema": "phasekv.compare/1", "reference": "Full attention · 1 KV", "models": rows}
            for p in ("prefix", "in-sequence")}


def _family_summary(modulus: int) -> dict:
    grids = [{"grid": "d", "period": 4, "modulus": modulus, "test": "period", "weak_spot": True, "p_value": 0.0001,
              "weakest_phase": 3, "gap": 20.0, "gap_ci": [15.0, 25.0], "detected_period": 4},
             {"grid": "B", "period": 16, "modulus": 16, "test": "gap", "weak_spot": None, "p_value": None,
              "weakest_phase": 2, "gap": 3.0, "gap_ci": [0.0, 6.0], "detected_period": 1}]
    lookup = {"mean": 61.0, "mean_ci": [60.0, 62.0], "worst": 50.0, "best": 70.0, "gap": 20.0, "gap_ci": [15.0, 25.0],
              "detected_period": 4, "modulus": modulus, "grids": grids}
    plans = [{"grid": "d", "period": 4, "test": "period"}, {"grid": "B", "period": 16, "test": "gap"},
             {"grid": "w", "period": 32, "test": None}]
    return {"model": "W8/S4 · 1 KV", "design": "x", "chance": 3.1, "alpha": 0.01, "plans": plans,
            "lookup": {"prefix": lookup, "in-sequence": lookup | {"mean": 40.0, "mean_ci": [4.0, 6.0]}}}


def _needle_row(context: int) -> dict:
    return {"model": "W8/S8 · 1 KV", "context": context, "beyond_training_length": context > 128, "n_prompts": 512,
            "modulus": 8, "mean": 61.25, "mean_ci": [57.0, 65.5], "worst": 40.0, "best": 80.0, "gap": 40.0,
            "gap_ci": [30.0, 50.0], "detected_period": 8, "period_p_value": None if context > 128 else 0.0002,
            "stride": 8, "flat": False, "verdict": "fail", "exit_code": 3, "chance": 0.0625}


def _presses() -> dict:
    def row(press, padding, mean, gap, chunk=None):
        return {"press": press, "padding": padding, "dir": f"{padding}/x", "n_prompts": 2304, "chunk": chunk,
                "mean": mean, "mean_ci": [mean - 2, mean + 2], "worst": mean - gap, "best": mean + 1, "gap": gap,
                "gap_ci": [max(0.0, gap - 5), gap + 5], "detected_period": 8 if chunk else 1,
                "p": {"4": 0.5, "8": 0.0001 if chunk else 0.6}, "arguments": None, "batch_size": 1,
                "cache": None if press == "none" else {"context": 81, "question": 9, "kept_per_layer": [[33, 40]] * 2}}

    return {"model": "qwen3:full-1kv-hf", "per_group": 96, "modulus": 24, "prompts": 2304, "periods": [4, 8],
            "rows": [row("none", "prefix", 96.0, 2.0), row("chunkkv(snapkv,8):0.5", "prefix", 70.0, 30.0, chunk=8)]}


def record(study: Path, extras: Path) -> dict:
    """What a reader sees of both planted directories' reports (each rendered already)."""
    return {name: read_page((root / "report" / "index.html").read_text())
            for name, root in (("study", study), ("extras", extras))}


def main(out: Path) -> None:
    """Render both planted directories under `out` and write their record (RECORD)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from fixture import make_study

    from phasekv.report import render_report

    study, extras = make_study(out / "study"), extras_study(out / "extras")
    for root in (study, extras):
        render_report(root, progress=False)
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(record(study, extras), indent=0, ensure_ascii=False) + "\n")
    print(f"wrote {RECORD}")


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(Path(__file__).parents[2]))  # this checkout's phasekv, not an installed one
    with tempfile.TemporaryDirectory() as tmp:
        main(Path(tmp))
