"""The records of `phasekv compare` and `phasekv repair`, typed: a comparison's row (summary.json "models", schema
`phasekv.compare/1`), what the repair writes (DIR/repair/goals.json, schema `phasekv.repair/2`) and keeps
(`--record`, schema `phasekv.repair-seeds/1`), and what the report and the command line read back.

Each record is a dataclass with `to_dict` (the JSON on disk) and `from_dict` (that JSON read back, older files
too: a field added later is None when a file lacks it). The rules that fill them are `phasekv.mitigate.compare`
and `phasekv.mitigate.repair`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from phasekv.errors import DataError
from phasekv.eval.stats import FLAT_MARGIN

SCHEMA = "phasekv.repair/2"
RECORD_SCHEMA = "phasekv.repair-seeds/1"  # `phasekv repair --record`: designs' seed distributions, kept for the demo
PADDINGS = ("prefix", "in-sequence")  # a repair is judged under both


@dataclass(frozen=True)
class Goals:
    """The repair's acceptance thresholds."""

    max_cache: float = 0.25  # cache bytes / the reference full-attention model's (the model the repair replaces)
    max_cost: float = 1.5  # training and decode step / the unrepaired model's
    max_mean_drop: float = 5.0  # points below the full-attention reference's mean
    margin: float = FLAT_MARGIN  # delta (points): flat when the gap's 95% upper bound is below it (`flatness`)
    seeds: int = 8  # seeds a design must be trained at; it is repaired only when every one of them meets every goal


@dataclass
class CompareRow:
    """One model of a comparison (`phasekv.mitigate.compare`): what it is, its cache and costs relative to the
    reference (`cost.add_costs`), its lookup numbers, its Pareto flag (`criteria.mark_pareto`); a column each of
    results.parquet. None: not known (a model phasekv cannot name, a cost not measured)."""

    label: str  # the model's name, or its name and directory when one name was trained two ways (`twin_label`)
    model: str | None = None  # its name
    role: str | None = None  # reference | baseline | candidate
    mitigations: list[str] | None = None
    eval_dir: str | None = None
    run_dir: str | None = None
    window: int | None = None
    stride: int | None = None
    n_kv_heads: int | None = None
    ensemble_k: int | None = None  # a phase ensemble's k (1: none)
    cache_bytes: int | None = None  # at the comparison's context
    cache_rel: float | None = None  # / the reference's
    cache_same_kv: float | None = None  # / full attention's with the model's KV heads
    compression: float | None = None  # 1 / cache_rel
    train_cost_rel: float | None = None  # training step / the reference's
    decode_cost_rel: float | None = None  # decode step / the reference's (k passes for a phase ensemble)
    train_tokens_per_s: float | None = None
    eval_seconds: float | None = None
    mean: float | None = None
    mean_ci: list[float] | None = None
    worst: float | None = None
    worst_ci: list[float] | None = None
    worst_residue: int | None = None
    best: float | None = None
    gap: float | None = None
    gap_ci: list[float] | None = None
    gap_raw: float | None = None
    fold_consistency: float | None = None
    detected_period: int | None = None
    periodicity_p: float | None = None
    pareto: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CompareRow:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def lookup(self) -> Lookup:
        """The numbers the repair's goals read."""
        return Lookup(**{f.name: getattr(self, f.name) for f in fields(Lookup)})


@dataclass
class Lookup:
    """One model's lookup under one padding (of its `CompareRow`): the numbers the repair's goals read."""

    mean: float
    mean_ci: list[float]
    gap: float
    gap_ci: list[float]
    gap_raw: float | None = None
    detected_period: int | None = None
    periodicity_p: float | None = None
    worst: float | None = None
    worst_residue: int | None = None

    @classmethod
    def from_dict(cls, d: dict) -> Lookup:
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})


def _lookups(d: dict) -> dict[str, Lookup]:
    return {padding: Lookup.from_dict(n) for padding, n in d.items()}


@dataclass
class Check:
    """One goal of one model: the measured value against its limit, and by how much it misses ('' when met)."""

    goal: str  # cache | train | decode | PADDING: flat | PADDING: mean | PADDING: evaluated
    value: float | None
    limit: float | None
    ok: bool
    miss: str


@dataclass
class SeedResult:
    """One seed of a design against every goal: what a seed record keeps of it (its "per_seed")."""

    seed: int
    meets: bool  # every goal met
    meets_but_cache: bool  # every goal but the cache met
    misses: list[str]  # each missed goal, by how much
    cache_ref: float  # cache bytes / the reference model's (the goal's)
    cache_rel: float  # cache bytes / full attention's with the same KV heads
    train_rel: float | None  # training step / the unrepaired model's (None: not measured)
    decode_rel: float | None
    paddings: dict[str, Lookup]

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(SeedResult)} | {"paddings": _plain(self.paddings)}

    @classmethod
    def from_dict(cls, d: dict) -> SeedResult:
        return cls(**{f.name: d[f.name] for f in fields(SeedResult)} | {"paddings": _lookups(d["paddings"])})


@dataclass(kw_only=True)
class ModelResult(SeedResult):
    """One model of a repair run against every goal (goals.json "models")."""

    label: str | None = None  # the model's name with its recipe (None: a seed record's seed, judged again)
    design: str  # the label without its seed (`design_name`): the seeds of one design are its replicates
    role: str  # unrepaired | design
    arch: str  # the model's name without seed or recipe
    recipe: dict  # its training recipe (`phasekv.mitigate.repair.recipe`)
    checks: list[Check]

    def seed_result(self) -> SeedResult:
        return SeedResult(**{f.name: getattr(self, f.name) for f in fields(SeedResult)})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelResult:
        return cls(**d | {"paddings": _lookups(d["paddings"]), "checks": [Check(**c) for c in d["checks"]]})


@dataclass
class Worst:
    """A design's worst seed: the largest gap upper bound under either padding, with that padding's numbers."""

    seed: int
    padding: str
    gap: float
    gap_ci: list[float]
    period: int | None
    p: float | None  # the periodicity test's (None: untestable at this stride)
    mean: float


OPTIONAL = ("meeting_but_cache", "source", "per_seed", "fresh_seeds", "measured")  # absent from a file without them


@dataclass(kw_only=True)
class Seeds:
    """One design judged by its seeds (goals.json "designs" and "kept", a seed record's "designs"):
    `phasekv.mitigate.repair.seed_distribution`."""

    design: str
    role: str  # unrepaired | design
    arch: str
    recipe: dict
    cache_ref: float
    cache_rel: float
    seeds: list[int]
    meeting_seeds: list[int]  # the seeds meeting every goal
    meeting_but_cache: list[int] | None = None  # ... every goal but the cache (None: a record written before it)
    failing_seeds: list[int]
    rate: float  # the fraction of seeds meeting every goal
    rate_ci: list[float]  # its exact 95% interval
    worst: Worst | None
    enough_seeds: bool  # at least `Goals.seeds`
    meets: bool  # the rule's verdict: enough seeds, and every one meets every goal
    source: str | None = None  # a record's design: the run that measured it
    per_seed: list[SeedResult] | None = None  # ... and its seeds' numbers
    fresh_seeds: list[int] | None = None  # ... the seeds first trained after it was fixed as the winner
    measured: Seeds | None = None  # a seed record's distribution of the same design and recipe (`attach_record`)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)} | {
            "worst": _plain(self.worst), "measured": _plain(self.measured),
            "per_seed": None if self.per_seed is None else [s.to_dict() for s in self.per_seed]}
        return {k: v for k, v in d.items() if not (k in OPTIONAL and v is None)}

    @classmethod
    def from_dict(cls, d: dict) -> Seeds:
        return cls(**d | {"worst": d["worst"] and Worst(**d["worst"]),
                          "measured": d.get("measured") and Seeds.from_dict(d["measured"]),
                          "per_seed": d.get("per_seed") and [SeedResult.from_dict(s) for s in d["per_seed"]]})


@dataclass(kw_only=True)
class RepairResult:
    """Every model and design of a repair run against the goals, and the verdict (DIR/repair/goals.json)."""

    schema: str = SCHEMA
    goals: Goals
    rule: str  # the flatness rule in words
    context: int  # tokens at which cache bytes are counted
    reference: str  # the full-attention model the goals are relative to (its label)
    reference_model: str  # ... its name
    unrepaired: str
    reference_numbers: dict[str, Lookup]
    reference_flat: dict[str, str]  # padding -> flat | not flat | not shown (`flatness`)
    models: list[ModelResult]
    designs: list[Seeds]
    repaired: list[str]  # the designs the rule calls repaired
    verdict: str
    kept: list[Seeds] | None = None  # an earlier record's designs this run did not measure (`keep`)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)} | {
            "goals": asdict(self.goals), "reference_numbers": _plain(self.reference_numbers),
            "models": [m.to_dict() for m in self.models], "designs": [s.to_dict() for s in self.designs],
            "kept": None if self.kept is None else [s.to_dict() for s in self.kept]}
        return {k: v for k, v in d.items() if not (k == "kept" and v is None)}

    @classmethod
    def from_dict(cls, d: dict) -> RepairResult:
        _check_schema(d, SCHEMA, "repair results")
        return cls(**d | {"goals": Goals(**d["goals"]), "reference_numbers": _lookups(d["reference_numbers"]),
                          "models": [ModelResult.from_dict(m) for m in d["models"]],
                          "designs": [Seeds.from_dict(s) for s in d["designs"]],
                          "kept": d.get("kept") and [Seeds.from_dict(s) for s in d["kept"]]})


@dataclass(kw_only=True)
class SeedRecord:
    """What `phasekv repair --record` keeps of a seed study (phasekv/demo/repair_seeds.json): the rule, the reference
    and every candidate design's seed distribution with its per-seed numbers and the run that measured it."""

    schema: str = RECORD_SCHEMA
    source: str  # the run that wrote it
    rule: str  # the seed rule in words
    flat_rule: str
    goals: Goals
    reference: str
    reference_model: str
    reference_numbers: dict[str, Lookup]
    designs: list[Seeds]

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "goals": asdict(self.goals), "reference_numbers": _plain(self.reference_numbers),
            "designs": [s.to_dict() for s in self.designs]}

    @classmethod
    def from_dict(cls, d: dict) -> SeedRecord:
        _check_schema(d, RECORD_SCHEMA, "a seed record")
        return cls(**d | {"goals": Goals(**d["goals"]), "reference_numbers": _lookups(d["reference_numbers"]),
                          "designs": [Seeds.from_dict(s) for s in d["designs"]]})


def _plain(x):
    """A record (or a dict of them) as JSON; None stays None."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x.to_dict() if hasattr(x, "to_dict") else None if x is None else asdict(x)


def _check_schema(d: dict, schema: str, what: str) -> None:
    if d.get("schema") != schema:
        raise DataError(f"repair: {what} needs schema {schema!r}, got {d.get('schema')!r}")

