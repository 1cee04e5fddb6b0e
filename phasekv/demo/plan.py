"""What `phasekv demo` and `phasekv study` run: the models, the backbone preset, the training budget and the
evaluation sizes (full and --quick). The study is the demo's plan over the paper's whole grid."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from phasekv.config import ModelConfig, names

STUDY_PRESET = "tiny-8h"  # the study's backbone: every run of the grid is valid on it (8 KV heads need 8 query heads)


@dataclass
class DemoPlan:
    mode: str  # "full" | "quick"
    kind: str = "demo"  # "demo" (four models) | "study" (the paper's grid), in messages and the report
    # --- models (paper names; tiny preset) ---
    models: list[str] = field(default_factory=lambda: [
        "Full attention · 1 KV", "W8/S8 · 1 KV", "W8/S4 · 1 KV",
        "W3/S2 · 1 KV"])  # the last: the repair, trained with half the records adjacent (per_model)
    #   Not here (`make study` trains both; the demo trained them until 2026-12-03, when it had to fit 12 minutes on
    #   the slowest 2-core machines here: with six models 14 min 35 s to 15 min 17 s there, with five 13 min 7 s):
    #   - W8/S8 · 1 KV · uniform averaging (C5's run without a learned gate). With no gate to pick the record it
    #     learns slowest: 1,600 steps with the record curriculum (seed 42: lookup mean 15.8 [14.9, 16.6], gap 24.8
    #     [21.0, 28.6], period 8, p = 0.0001; at 1,000 steps still at chance, mean 6.8, period 1; at lr 6e-3 its
    #     loss was no lower, at batch 32 it stayed at ~2.3 through 3,200 steps): 23% of the six models' CPU.
    #   - W6/S6 · 1 KV (C1's third stride; 600 steps: gap 97.4 [95.7, 99.1], period 6): 13% of the five's.
    seeds: list[int] = field(default_factory=lambda: [names.DEFAULTS["seed"]])  # the seeds each model is trained at
    #   (weights and data; `--seed`, `--seeds`): `models` holds each model once per seed, its name carrying
    #   `· seed N` (none at 42), and the report reads every claim at each seed (`at_seeds`)
    preset: str = "tiny"
    # --- training (phasekv train on synthetic associative recall: 2-16 records over 32 keys and 32 names, queries
    #     drawn with replacement, every record followed by 1-4 filler words; measured, see README) ---
    steps: int = 600  # optimizer steps per model (with the record curriculum below; measured, seed 42: W8/S4
    #                   held-out recall 98.7%, lookup gap 88.4 [85.8, 90.9], period 4 at 600 (800: 89.7 [87.2, 92.2]);
    #                   W6/S6 · 1 KV 92.1%, gap 97.4 [95.7, 99.1] at 600 (800: 97.6); without the curriculum the
    #                   models had 1,000, and full attention left the chance plateau only at ~900)
    batch_size: int = 64  # sequences per step (at 32, per step, W8/S8 learned far slower: loss 2.95 and a lookup
    #                       mean of 3.9% after 1,000 steps, where 64 had 0.82; measured)
    curriculum: int = 400  # steps over which a training sequence's record count grows from 1 to the full 2-16
    #   (`RecallConfig.curriculum`): one or two records teach key-name binding far sooner than sixteen. Measured at
    #   the tiny preset, seed 42, held-out recall (chance 18.9%): W8/S8 · 1 KV 56.6% at step 400 and lookup gap 95.2
    #   [93.6, 96.9], period 8 at 1,000 steps (without: gap 41.8 at 1,000, 95.7 at 1,600); uniform averaging 54.6%
    #   at 1,600 (without: lookup mean 10.5 at 2,400, 19.5 at 3,200); full attention 98.0% at 800 (without: chance
    #   until ~900)
    per_model: dict = field(default_factory=lambda: {"Full attention · 1 KV": {"steps": 2000},
                                                     "W8/S8 · 1 KV": {"steps": 1000},
                                                     "W3/S2 · 1 KV": {"steps": 800, "recall": {"gap_prob": 0.5}}})
    #   models trained longer: full attention leaves the chance plateau (held-out ~19%) abruptly, at a step that
    #   varies by seed: at 1,000 steps it learned at 2 of 4 tuning seeds (54-57; 54 on the plateau, 56 ended at 86.5),
    #   at 1,600 (the schedule stretched) it left the plateau at steps 600-900 and learned at every tuning seed tried;
    #   2,000 keeps the same room after the latest exit seen (sweeps/seeds.md, docs/results/seeds.md). At 1,000 the
    #   project's seeds 42 and 45 learned (96.8, gap 1.3 [0.2, 2.6] at 42). W8/S8 is still learning at 800 steps (74% held-out recall
    #   at 600, 83% at 1,000); the repair (W12/S6 · 2 KV then, seed 42) was flat at 800 (100.0, gap 0.0) and not yet
    #   at 600 (gap 80.5, period 6); W8/S6 · 4 KV at 800 is at >= 99.8% at every phase at seeds 42-49.
    #   The repair trains on half its records adjacent (gap_prob 0.5): with records spaced out a window mostly holds
    #   one record, its gates learn a favourite offset, and dense prompts lose the records at the other phases;
    #   trained on adjacent records too, W12/S6 · 2 KV was flat at 100% under both paddings at seeds 42-44 (1,600
    #   steps; its loss was flat from ~800; sweeps/repair.toml, README "Repairing the weak phases"), but not at seed 45
    #   (gap 79.4, period 6): its two layer-1 KV heads own two phases each and no head the other two (knockouts,
    #   docs/results/repair.md). With four KV heads (eight phase slots in layer 1) W12/S6 was flat at 4 of 8 seeds
    #   (48: gap 62.3), its training step 1.42-1.71x the unrepaired model's (on or over the 1.5x goal). W8/S6 · 4 KV
    #   (windows 2 tokens longer than the stride: a key and its name share an entry at every phase) costs 1.25x and
    #   is at >= 99.8% at every phase at all 8 seeds, flat by the equivalence rule at every one, but keeps 0.669 of
    #   Full attention · 1 KV's cache. W3/S2 · 1 KV (one KV head, windows one token longer than the stride: the one
    #   record of a 2-token block sits whole in an entry at either phase) is the smallest design flat at every seed
    #   tried: 8 of 8 (42-49), then 4 of 4 fresh seeds (50-53) after it was fixed as the winner, at 0.5005 of the
    #   reference's cache and a training step 1.05x the unrepaired model's; W6/S4 · 1 KV (0.25) failed at seed 47,
    #   W4/S3 · 1 KV (0.33) at 46 (docs/results/repair.md, "The cache frontier"). Its seeds are `repair_record`'s
    seq_len: int = 96  # tokens per training sequence (~7 spaced-out records fit; lookup prompts are 90)
    micro_batches: int = 4  # each step's batch as 4 micro-batches of similar length, each cut after its last target
    #                         (TrainConfig.trim): the same gradient over ~22% fewer tokens (the last target sits at
    #                         67 of 96 on average); W8/S8 · 1 KV's step at tiny-8h 0.72-0.76x the whole batch's
    #                         (the smaller tensors also stay in cache; 8 micro-batches: 0.89x, overhead; measured)
    lr: float = 3e-3
    warmup: int = 100
    ckpt_every: int = 250  # checkpoints make an interrupted demo resume mid-run
    recall: dict = field(default_factory=lambda: {"min_records": 2, "max_records": 16, "n_keys": 32, "n_values": 32,
                                                  "max_prefix": 24, "min_distance": 16, "gap_prob": 1.0, "max_gap": 4})
    # records spaced out in training (a record every ~4.5 tokens, like facts in text) and packed densely in the
    # held-out lookup (one every 2 tokens): the lookup then stresses the compressed memory as the study's does.
    # With `phasekv train`'s denser default layout the tiny W8/S4 learns to split the phases between its two
    # layers (2 layers x 1 KV x 2 tokens / S = 4: one entry per record) and shows no gap; trained spaced out,
    # its layer 0 keeps phases 0-1, layer 1 phase 3, and phase 2 is weak on dense prompts (measured, see README)
    # --- lookup prompts (held out: adjacent records, demonstrations, no marker; the run's key/name lists) ---
    records: int = 16  # key-name records per prompt
    demos: int = 4  # demonstrations before the target key
    filler: int = 48  # filler tokens per prompt: records + filler span the position design
    modulus: int = 24  # residue groups M (a multiple of every stride here: 4, 6, 8)
    per_group: int = 576  # prompts per residue group (576 = 24^2: exact moment matching)
    mappings: int = 32  # key-name mappings (bootstrap unit)
    eval_batch: int = 32  # prompts per forward pass (same results; a lookup at 32 or 16 took ~0.85x the CPU of 64)
    # --- mechanism ---
    ko_per_group: int = 96  # prompts per residue group for each knockout (sampled, moment-matched design)
    n_cal: int = 256  # calibration prompts of the knockout means
    gate_prompts: int = 256  # prompts whose windows the gate statistics pool
    cycle_per_group: int = 96  # prompts per residue group for each gate cycle
    deltas: list[int] = field(default_factory=lambda: [-3, -2, -1, 1, 2, 3])
    n_boot: int = 1000
    flip_lengths: int = 24  # filler lengths of the flip sweep (3 per phase at S = 8)
    # --- theory ---
    theory_quick: bool = True  # phasekv.theory.run_all(quick=...)
    # --- the repair (`phasekv repair`): every compressed model against the repair's goals, costs relative to this
    #     model (None: no repair stage); the demo has one seed, so the goals are checked at one ---
    repair_unrepaired: str | None = "W8/S4 · 1 KV"
    repair_seeds: int = 1
    repair_models: list[str] = field(default_factory=lambda: ["W3/S2 · 1 KV"])  # the repair designs among the
    #   models: the report checks them for no weak phase, not for the study's weak spots
    repair_record: str | None = "repair_seeds.json"  # the seed distributions of the repair designs, measured outside
    #   the demo at seeds 42-53 (`phasekv repair --record`, sweeps/repair.toml, sweeps/repair_merge.py; a file beside
    #   this one): the verdict says at how many of them the design the demo trains, trained the same way, met every
    #   goal, and every goal but the cache

    def at_seeds(self, seeds: list[int]) -> DemoPlan:
        """This plan with every model at each of `seeds` (`phasekv.config.names.at_seeds`)."""
        return dataclasses.replace(self, seeds=list(seeds), models=names.at_seeds(self.models, seeds))

    def _own(self, model: str) -> dict:
        """`per_model`'s settings of `model` (any spelling of a name: paper name or alias; at any seed)."""
        own = {_design(m): o for m, o in self.per_model.items()}
        return own.get(_design(model), {})

    def training_of(self, model: str) -> dict:
        """{"steps", "batch_size", "lr"} of `model`, and "init_from" (a model of the plan it continues, at
        `model`'s seed) if any."""
        base = {"steps": self.steps, "batch_size": self.batch_size, "lr": self.lr}
        own = {k: v for k, v in self._own(model).items() if k != "recall"}
        if "init_from" in own:
            own["init_from"] = names.at_seed(own["init_from"], names.seed_of(model))
        return base | own

    def recall_of(self, model: str) -> dict:
        """The recall data settings `model` trains on: the plan's, its record curriculum (counted in examples),
        and its own `per_model` "recall" changes."""
        grow = {"curriculum": self.curriculum * self.training_of(model)["batch_size"]} if self.curriculum else {}
        return self.recall | grow | self._own(model).get("recall", {})

    def steps_of(self, model: str) -> int:
        return self.training_of(model)["steps"]

    def sequences_of(self, model: str) -> int:
        """Training sequences of `model` (steps x batch): what its training costs."""
        t = self.training_of(model)
        return t["steps"] * t["batch_size"]

    def steps_text(self) -> str:
        """The training budget in words, e.g. '600 steps of 64 sequences per model, records growing from 1 over the
        first 400 steps (Full attention · 1 KV: 1000 steps) (W3/S2 · 1 KV: 800 steps, gap_prob 0.5)'."""
        grow = f", records growing from 1 over the first {self.curriculum} steps" if self.curriculum else ""
        return f"{self.steps} steps of {self.batch_size} sequences per model{grow}" + "".join(
            f" ({m}: {', '.join(_setting(k, v) for k, v in o.items())})" for m, o in self.per_model.items())

    def repairs(self) -> bool:
        """Whether the plan checks the repair's goals (`phasekv repair`): its unrepaired model and a full-attention
        model are among its models."""
        if not self.repair_unrepaired:
            return False
        cfgs = {_design(c.name): c for c in (ModelConfig.from_name(m, preset=self.preset) for m in self.models)}
        return _design(self.repair_unrepaired) in cfgs and any(not c.compressed for c in cfgs.values())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DemoPlan:
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}})


def plan_for(quick: bool) -> DemoPlan:
    """The full demo (the study at the tiny preset) or its ~2-minute smoke version (too short to train the
    models to the point where the effects show; it exercises every stage and the report)."""
    full = DemoPlan(mode="full")
    if not quick:
        return full
    data = {m: {"recall": o["recall"]} for m, o in full.per_model.items() if "recall" in o}  # what, not how long
    return DemoPlan(mode="quick", steps=30, curriculum=10, per_model=data, warmup=10, ckpt_every=15, batch_size=32, per_group=24, mappings=8,
                    ko_per_group=24,
                    n_cal=32, gate_prompts=32, cycle_per_group=24, deltas=[-1, 1], n_boot=200, flip_lengths=8)


FAMILY = ["NSA l8/d4 · select 8 top 2 · window 16 · 1 KV", "MoBA B16 top 3 · 1 KV", "Beacon r8 · window 32 · 1 KV"]
#   the grid family beyond the paper (`phasekv study --family`): one design each, at tiny-scale defaults that fit the
#   demo's 96-token sequences (docs/dev/family-contract.md)
FAMILY_BASELINES = ["Full attention · 1 KV", "W8/S4 · 1 KV"]  # trained beside them in the same run
#   Steps: at the demo's 600 (seed 42, measured) MoBA and Beacon were still at chance (held-out recall 19.5% and 17.2%,
#   chance 18.9%; loss 2.46 and 2.63, on the plateau full attention leaves between 600 and 700) and NSA at 71.9% (loss
#   0.92): NSA trains 1,000 (NSA_STEPS)
FAMILY_WARM = {"MoBA B16 top 3 · 1 KV": "Full attention · 1 KV", "Beacon r8 · window 32 · 1 KV": "Full attention · 1 KV"}
#   designs continued from the plan's trained full attention, as their papers continue a pretrained full-attention LM
#   (`phasekv train --init-from` with a design change): from scratch they stayed at chance at 1,000 steps (MoBA
#   also at 1,600; docs/results/family.md)
WARM_STEPS = 600  # the continuation's steps (the demo's recipe, its record curriculum restarting)
NSA_STEPS = 1000  # NSA from scratch (docs/results/family.md: 71.9% held-out at 600)


def family_plan(quick: bool) -> DemoPlan:
    """The grid family (`phasekv study --family`): NSA, MoBA and Activation Beacon trained at the demo's tiny scale
    with the demo's recipe (its steps, record curriculum, data and evaluation sizes), beside the demo's full
    attention and W8/S4 · 1 KV; MoBA and Beacon continue the plan's full attention (FAMILY_WARM); every model also
    gets the family stage (`phasekv.analysis.family`: the lookup at each grid period of the family, the designs'
    knockouts)."""
    demo = plan_for(quick)
    models = FAMILY_BASELINES + FAMILY
    own = {m: o for m, o in demo.per_model.items() if m in models}
    if not quick:  # NSA: the 1,000 steps it was measured at (the demo's full attention then)
        own |= {m: {"steps": NSA_STEPS} for m in FAMILY if m not in FAMILY_WARM}
    own |= {m: {"init_from": src} | ({} if quick else {"steps": WARM_STEPS}) for m, src in FAMILY_WARM.items()}
    return dataclasses.replace(demo, kind="family", models=models, per_model=own, repair_unrepaired=None,
                               repair_models=[])


# --quick study: the demo's smoke budgets with a third of its prompts (26 models; knockouts of 8 KV heads cost 8x)
STUDY_RECALL = {"repeat_prob": 0.25}  # the study's data on top of the demo's: a quarter of the training sequences are
#   repeated runs of keys and names (`RecallConfig.repeat_prob`). At 8 query heads full attention stays at chance on
#   recall alone (tiny-8h, 1 KV: 18.7% at 1,600 steps, 18.3% at 3,200; 8 KV: 18.3%) and every claim would compare
#   against a chance-level baseline; with the repeats it reached 99.9% and 100% at seeds 42 and 43 (measured, README)
STUDY_QUICK = dict(per_group=8, ko_per_group=8, cycle_per_group=8, n_cal=16, gate_prompts=16, flip_lengths=4,
                   n_boot=100)


# What the study's budget rests on (tiny-8h, the study's recipe, seed 42 unless named; measured): one budget for every
#   run, as in the paper. Full attention · 1 KV is on the edge of learning the lookup at 1,000 steps: without trim
#   99.9% held-out recall there (seed 43: 100%), with trim (the same gradient up to float rounding) its loss stayed
#   at 3.0 and its recall at chance (19.3%, lookup mean 6.3%) in the whole study of 2026-12-02, which left C5 and C6
#   untestable; at 1,600 (no trim) its lookup mean was 97.7%. W8/S8 · 1 KV · uniform averaging at 1,600 steps: 48.1%
#   held-out, lookup (prefix) mean 15.2 [14.3, 16.1], gap 14.8 [10.9, 18.6], period 8 (published: 12.5, gap 19.2).
STUDY_STEPS = 1600  # optimizer steps of every run of the study but its 1-KV-head full attention (STUDY_OWN)
STUDY_OWN = {"Full attention · 1 KV": {"steps": 3200}}  # the control with one KV head leaves the plateau late: at
#   1,600 steps it learned at 2 of 4 seeds (70, 71; 72 ended at 93.5 and not flat, gap 2.3 [0.3, 4.8]; 73 off the
#   plateau only at step 1,400, 72.1% held-out), at 3,200 at both of 72 and 73 (97.9 and 93.0, flat); 4 and 8 KV
#   heads left it at steps 600-800 and learned at 1,600 at 3 of 3 seeds each (docs/results/seeds.md). A control gets
#   the steps it needs to learn: more of them favour no phase, so the compressed runs keep the paper's one budget.


def study_plan(quick: bool, preset: str = STUDY_PRESET) -> DemoPlan:
    """The whole study (the paper's grid of its Figure 2, 26 runs with the full-attention baselines) with the demo's
    data layout plus repeat sequences (STUDY_RECALL) and the demo's sizes at `preset`; --quick: smoke budgets
    (STUDY_QUICK). Every compressed run gets one budget, as in the paper: STUDY_STEPS (uniform averaging too: with
    repeats it learns in it); full attention · 1 KV twice that (STUDY_OWN: at 1,600 it learned at 2 of 4 seeds). The
    study was measured without the demo's record curriculum, and keeps that recipe."""
    demo = plan_for(quick)
    return dataclasses.replace(demo, kind="study", models=list(names.PAPER_GRID), preset=preset,
                               steps=demo.steps if quick else STUDY_STEPS, curriculum=0,
                               recall=demo.recall | STUDY_RECALL, per_model={} if quick else STUDY_OWN,
                               repair_unrepaired=None,
                               repair_models=[],
                               **(STUDY_QUICK if quick else {}))


def gathered(plan, held: list[int], asked: list[int] | None):
    """`plan` (a DemoPlan or NeedlePlan) at the seeds a directory holds, `held`, with the seeds `asked` for added
    (`--seed`, `--seeds`); none held or asked: the plan's own."""
    want = list(dict.fromkeys([*held, *(names.check_seeds(asked) if asked is not None else [])])) or plan.seeds
    return plan if want == plan.seeds else plan.at_seeds(want)


def _design(model: str) -> tuple:
    """A model's name as the attributes it states, its seed left out: the design its seeds are replicates of."""
    return tuple(sorted((k, v) for k, v in names.parse_name(model).items() if k != "seed"))


def _setting(key: str, value) -> str:
    if key == "recall":
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if key == "init_from":
        return f"continued from {value}"
    return {"steps": f"{value} steps", "batch_size": f"batch {value}", "lr": f"lr {value:g}"}.get(key, f"{key} {value}")
