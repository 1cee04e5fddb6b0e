"""Read a study directory (see `phasekv.report.layout`) into plain tables for the report.

The report is rendered from these files alone: no model is loaded. A stage that has not run (or whose
files are missing) is simply absent, and the report says so in its place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from phasekv.attention.compressor import learned_gates
from phasekv.config import ModelConfig
from phasekv.errors import DataError, PhaseKVError
from phasekv.eval.protocols import FLIP, LOOKUP, PROTOCOLS, retrieval_protocols
from phasekv.mitigate.results import SCHEMA as REPAIR_SCHEMA
from phasekv.mitigate.results import RepairResult
from phasekv.report.layout import ANALYSES, RESULTS, SUMMARY, THEORY_CHECKS, Layout


@dataclass
class Stage:
    """One finished stage output: its summary.json and (when present) its results.parquet."""

    path: Path
    summary: dict
    results: pd.DataFrame | None


@dataclass
class Model:
    """What the report knows about one model, keyed by its alias."""

    alias: str
    name: str  # paper name, e.g. "W8/S8 · 1 KV"
    window: int  # 0 for full attention
    stride: int  # 0 for full attention
    gate: str  # scalar | vector | uniform
    learned_gates: bool  # has gate parameters whose statistics the report shows (asked of the compressor variant)
    run: dict = field(default_factory=dict)  # training settings and outcome (preset, steps, seed, time, ...)
    metrics: pd.DataFrame | None = None  # metrics.jsonl rows
    gate_paths: pd.DataFrame | None = None  # gates.jsonl rows

    @property
    def compressed(self) -> bool:
        return self.window > 0


@dataclass
class Study:
    root: Path
    manifest: dict
    models: dict[str, Model]  # alias -> model, in display order
    evals: dict[str, dict[str | None, dict[str, Stage]]]  # protocol -> variant (padding) -> alias -> stage
    analyses: dict[str, dict[str, Stage]]  # knockout | gates | cycle -> alias -> stage
    theory: dict[str, Stage]  # minimisers | flow | coverage -> stage
    examples: list[dict]
    compare: Stage | None = None  # `phasekv compare` (schema phasekv.compare/1)
    repair: RepairResult | None = None  # `phasekv repair`: goals.json (schema phasekv.repair/2)

    @property
    def lookup(self) -> dict[str, dict[str, Stage]]:
        """padding -> alias -> stage of the lookup evaluation."""
        return self.evals.get(LOOKUP.name, {})

    @property
    def flip(self) -> dict[str, Stage]:
        return self.evals.get(FLIP.name, {}).get(None, {})

    def has_results(self) -> bool:
        return (any(st for variants in self.evals.values() for st in variants.values())
                or any(self.analyses.values()) or bool(self.theory))


def retrieval_evals(study: Study) -> dict[str, dict[str, dict[str, Stage]]]:
    """The study's retrieval evaluations: protocol -> padding -> alias -> stage (`Protocol.retrieval`)."""
    return {p.name: study.evals[p.name] for p in retrieval_protocols() if p.name in study.evals}


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: unreadable JSON ({exc})") from None


def read_jsonl(path: Path) -> pd.DataFrame | None:
    """Rows of a JSON-lines file; a torn last line (a run killed mid-write) is skipped."""
    if not path.is_file():
        return None
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return pd.DataFrame(rows) if rows else None


def read_stage(path: Path) -> Stage | None:
    if not (path / SUMMARY).is_file():
        return None
    results = None
    if (path / RESULTS).is_file():
        try:
            results = pd.read_parquet(path / RESULTS)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise DataError(f"{path / RESULTS}: unreadable parquet ({exc})") from None
    return Stage(path, read_json(path / SUMMARY), results)


def _stages(layout: Layout, parent: Path) -> dict[str, Stage]:
    out = {}
    for alias in layout.aliases(parent):
        stage = read_stage(parent / alias)
        if stage is not None:
            out[alias] = stage
    return out


def _model(alias: str, hints: dict, preset: str = "tiny") -> Model:
    """Compression attributes from the paper name (one source of truth) at the study's backbone preset, else from
    a result's summary."""
    name = hints.get("name") or alias
    try:
        cfg = ModelConfig.from_name(name if "·" in name else alias, preset=preset)
        return Model(alias, cfg.name, cfg.window, cfg.stride, cfg.gate, learned_gates(cfg))
    except Exception:  # a model phasekv cannot name (e.g. a Hugging Face directory): use what was recorded
        stride = int(hints.get("stride") or 0)
        gate = hints.get("gate", "scalar")
        return Model(alias, name, int(hints.get("window") or stride), stride, gate, stride > 0 and gate != "uniform")


def _regime(model_cfg: dict, run_dir: Path) -> dict:
    """A phasekv model's backbone (preset and overrides) and compressed entries per record (`ModelConfig`)."""
    try:
        cfg = ModelConfig.from_dict(model_cfg, source=str(run_dir / "config.json"))
    except PhaseKVError:  # a config this version cannot read: the report shows the preset alone
        return {}
    return {"backbone": cfg.backbone, "entries_per_record": cfg.entries_per_record}


def _run_info(run_dir: Path) -> tuple[dict, pd.DataFrame | None, pd.DataFrame | None]:
    """Settings and outcome of a training run directory (config.json, metrics.jsonl, done.json)."""
    info: dict = {}
    if (run_dir / "config.json").is_file():
        cfg = read_json(run_dir / "config.json")
        train = cfg.get("train", cfg)
        for key in ("preset", "steps", "tokens", "seed", "batch_size", "seq_len", "lr"):
            if key in train:
                info[key] = train[key]
        if cfg.get("seed") is not None:  # the resolved seed (the run config's may be None: the name's seed)
            info["seed"] = cfg["seed"]
        if not info.get("tokens") and info.get("steps") and info.get("batch_size") and info.get("seq_len"):
            info["tokens"] = info["steps"] * info["batch_size"] * info["seq_len"]
        model_cfg = cfg.get("model", {})
        if isinstance(model_cfg, dict) and "name" in model_cfg:
            info["name"] = model_cfg["name"]
            info.update(_regime(model_cfg, run_dir))
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    if (run_dir / "done.json").is_file():
        info.update({k: v for k, v in read_json(run_dir / "done.json").items() if not isinstance(v, dict | list)})
        info["status"] = "done"
    else:
        last = int(metrics["step"].max()) if metrics is not None and "step" in metrics else 0
        info["status"] = f"in progress (step {last})"
    gates = read_jsonl(run_dir / "gates.jsonl")
    return info, metrics, gates


def load_study(root: str | Path) -> Study:
    """Everything under a study directory that the report can show."""
    layout = Layout(root)
    if not layout.root.is_dir():
        raise DataError(f"{layout.root}: no such study directory")
    manifest = read_json(layout.manifest) if layout.manifest.is_file() else {}
    evals = {p.name: {v: _stages(layout, layout.evaluation(p.stage(v))) for v in p.study}
             for p in PROTOCOLS.values() if p.study}
    analyses = {k: _stages(layout, layout.root / "analysis" / k) for k in ANALYSES}
    theory = {c: s for c in THEORY_CHECKS if (s := read_stage(layout.theory / c)) is not None}
    examples = read_json(layout.examples).get("examples", []) if layout.examples.is_file() else []

    # models: the manifest's order first, then any other alias seen in a run or a result
    order = list(manifest.get("models", {}))
    runs_dir = layout.root / "runs"
    seen = sorted(p.name for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.is_dir() else []
    for group in [*(st for variants in evals.values() for st in variants.values()), *analyses.values()]:
        seen += list(group)
    for alias in seen:
        if alias not in order:
            order.append(alias)
    models = {}
    for alias in order:
        hints = dict(manifest.get("models", {}).get(alias, {}))
        for group in (st for p in retrieval_protocols() for st in evals.get(p.name, {}).values()):
            if alias in group:
                s = group[alias].summary
                hints.setdefault("name", s.get("model"))
                hints.setdefault("stride", s.get("stride"))
        model = _model(alias, hints, manifest.get("preset", "tiny"))
        run_dir = layout.run(alias)
        if run_dir.is_dir():
            model.run, model.metrics, model.gate_paths = _run_info(run_dir)
        models[alias] = model
    models = dict(sorted(models.items(), key=lambda kv: (kv[1].compressed, kv[1].stride, kv[1].gate == "uniform")))
    goals = layout.repair / "goals.json"
    repair = read_json(goals) if goals.is_file() else None
    if repair is not None and repair.get("schema") != REPAIR_SCHEMA:
        raise DataError(f"{goals}: schema {repair.get('schema')!r}, this phasekv reads {REPAIR_SCHEMA!r} (run "
                        "`phasekv repair` again)")
    return Study(layout.root, manifest, models, evals, analyses, theory, examples, read_stage(layout.compare),
                 repair and RepairResult.from_dict(repair))
