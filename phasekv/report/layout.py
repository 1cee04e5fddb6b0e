"""Where a study directory keeps each stage's outputs: the one layout `phasekv demo` writes and
`phasekv report` reads.

    DIR/demo.json                         the manifest (demo or study): kind, mode, models, settings, stage timings
    DIR/runs/<alias>/                     training runs (`phasekv train`): config.json, metrics.jsonl, gates.jsonl
    DIR/eval/<stage>/<alias>/             an evaluation protocol's variant (`phasekv.eval.protocols`): results.parquet,
                                          summary.json; lookup-<padding> (`phasekv eval lookup`), flip (filler sweep)
    DIR/eval/examples.json                a few lookup prompts as words, target marked (for the report)
    DIR/analysis/knockout/<alias>/        KV-head knockouts (`phasekv analyze knockout`)
    DIR/analysis/gates/<alias>/           gate concentration (`phasekv analyze gates`)
    DIR/analysis/cycle/<alias>/           gate cycling (`phasekv analyze cycle`)
    DIR/analysis/family/<alias>/          the grid family's tests and knockouts (`phasekv analyze family`)
    DIR/theory/{minimisers,flow,coverage}/  theory checks (`phasekv theory ...`)
    DIR/compare/                          cache, cost and gap side by side (`phasekv compare`, phasekv.compare/1)
    DIR/repair/                           the repair's goals per design (`phasekv repair`, phasekv.repair/2):
                                          goals.json, frontier.png, prefix/ and in-sequence/ comparisons
    DIR/posttrain/<alias>/                the model post-trained in miniature (claim C11): run/, eval/lookup-<padding>/,
                                          summary.json (`phasekv.demo.stages.posttrain`)
    DIR/report/index.html                 the report; DIR/report/figures/*.png its figures as PNG
    DIR/report/claims.json, grid.csv      the verdicts on the study's claims C1-C11; the grid table (Figure 2)
    DIR/report/family.md                  the section "The family" as Markdown (a family run)

`<alias>` is the model's ASCII alias (`w8s8-1kv`), so directory names stay portable.
"""

from __future__ import annotations

from pathlib import Path

from phasekv.eval.protocols import FLIP, LOOKUP

ANALYSES = ("knockout", "gates", "cycle", "family")
THEORY_CHECKS = ("minimisers", "flow", "coverage")
RESULTS, SUMMARY = "results.parquet", "summary.json"
POSTTRAIN = "posttrain"  # DIR/posttrain/<alias>/: the model <alias> post-trained in miniature


class Layout:
    """Paths of one study directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def manifest(self) -> Path:
        return self.root / "demo.json"

    def run(self, alias: str) -> Path:
        return self.root / "runs" / alias

    def evaluation(self, stage: str) -> Path:
        """The directory of an evaluation stage (`Protocol.stage`: `lookup-prefix`, `flip`), one model per alias."""
        return self.root / "eval" / stage

    def lookup(self, padding: str, alias: str) -> Path:
        return self.evaluation(LOOKUP.stage(padding)) / alias

    def flip(self, alias: str) -> Path:
        return self.evaluation(FLIP.stage(None)) / alias

    @property
    def examples(self) -> Path:
        return self.root / "eval" / "examples.json"

    def analysis(self, kind: str, alias: str) -> Path:
        return self.root / "analysis" / kind / alias

    @property
    def theory(self) -> Path:
        return self.root / "theory"

    @property
    def compare(self) -> Path:
        return self.root / "compare"

    @property
    def repair(self) -> Path:
        return self.root / "repair"

    def posttrain(self, alias: str) -> Path:
        return self.root / POSTTRAIN / alias

    def posttrain_lookup(self, alias: str, padding: str) -> Path:
        return self.posttrain(alias) / "eval" / LOOKUP.stage(padding)

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def claims(self) -> Path:
        return self.report / "claims.json"

    @property
    def grid(self) -> Path:
        return self.report / "grid.csv"

    def aliases(self, parent: Path) -> list[str]:
        """Model directories under `parent` that hold a finished result (a summary.json)."""
        if not parent.is_dir():
            return []
        return sorted(p.name for p in parent.iterdir() if p.is_dir() and (p / SUMMARY).is_file())


def done(out: Path) -> bool:
    """A stage's output directory is complete when both its results and its summary exist (written last)."""
    return (out / SUMMARY).is_file() and (out / RESULTS).is_file()
