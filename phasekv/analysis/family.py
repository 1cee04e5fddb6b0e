"""The grid family beyond the paper (NSA, MoBA, Activation Beacon): lookup accuracy by phase at every grid period
of a design, and the knockouts that say which part of a design fails where.

Each design names its grid periods (`grids()` of its attention modules: NSA {"d", "l'"}, MoBA {"B"}, Beacon
{"r", "w"}; a study compressor its stride {"S"}). A period g is tested on residues t mod M_g:

    M_g = M          the lookup's own modulus when g divides it and g < M (one evaluation serves every such g)
    M_g = k g        else the smallest multiple (k >= 2) whose position design fits the prompt's target positions,
                     with about the lookup's number of prompts: the largest exact N (a multiple of M_g^2) not above
                     M N / M_g that fits, else N_g = max(16, M N / M_g) kept (sampled from an exact design)
    M_g = g          else only the gap (accuracy depends on t mod g or not); the period test needs M_g > g
    none             when not even M_g = g fits: not determinable with these prompts

(the audit's rule, `phasekv.eval.ratios.plan_period`: a 90-token lookup has 79 target positions, and an exact design
at M needs at least 3M - 2 of them, so M <= 27).

Knockouts, through each design's evaluation hooks on its attention modules (None: the model as trained):

    NSA     branch_gates     "cmp", "sel", "win", "cmp+sel+win": those branches' gates fixed to 1, the others 0
    MoBA    oracle_blocks    (B,) the block of the target record forced into every later query's selection
    Beacon  beacon_knockout  {i}: beacon i of every completed window (raw offsets i r .. i r + r - 1) removed

Every condition runs on the same prompts as the model as trained ("learned"), so its accuracy change by phase is
paired. Gate statistics: NSA's branch gates at the query, by the target's phase (read from the gate projection);
Beacon's attention at the query on each beacon index of the completed windows and on its own window, by the beacon
that holds the target (recomputed from the layer's inputs with its own projections).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from phasekv.analysis.common import as_eval_model, provenance, write_outputs
from phasekv.analysis.hooks import attention_modules
from phasekv.analysis.knockout import effect_table, spread_pids
from phasekv.eval.design import exact_unit
from phasekv.eval.models import score
from phasekv.eval.prompts import PADDINGS, Prompt, PromptConfig, RetrievalPrompts
from phasekv.eval.ratios import MIN_PER_GROUP, PeriodPlan, plan_period, ratio_tests
from phasekv.eval.run import COLUMNS, run_retrieval
from phasekv.eval.stats import retrieves, summarize
from phasekv.progress import progress_bar

ALPHA = 0.01  # level of a period test that calls a weak spot periodic (the audit's)
NSA_BRANCHES = ("cmp", "sel", "win", "cmp+sel+win")  # NSA knockouts: only these branches open
BRANCH_WORDS = {"cmp": "compressed only", "sel": "selected only", "win": "window only",
                "cmp+sel+win": "all three (gates 1)"}
HOOKS = ("branch_gates", "oracle_blocks", "beacon_knockout")  # the designs' knockout hooks (one per design)
LEARNED = "learned"  # the condition of the model as trained


# ---------------------------------------------------------------- grids and their moduli


def model_grids(model) -> dict[str, int]:
    """Grid periods of a model (`ModelConfig.grids`): a design's own, a study compressor's stride {"S": S}, none for
    full attention or a model without a phasekv config."""
    grids = getattr(getattr(model, "config", None), "grids", None)
    return {k: int(v) for k, v in grids.items()} if isinstance(grids, dict) else {}


@dataclass
class GridPlan(PeriodPlan):
    """How one grid period is tested (`phasekv.eval.ratios.plan_period`, the audit's rule)."""

    grid: str  # its name: "d", "l'", "B", "r", "w", "S"


def plan_grid(grid: str, period: int, cfg: PromptConfig) -> GridPlan:
    """The modulus and N that test `period` with the lookup prompts `cfg` (module docstring)."""
    return GridPlan(**dataclasses.asdict(plan_period(f"grid {grid}", period, cfg)), grid=grid)


def plan_grids(grids: dict[str, int], cfg: PromptConfig) -> list[GridPlan]:
    return [plan_grid(g, p, cfg) for g, p in grids.items()]


def grid_tests(summary: dict, plans: list[GridPlan]) -> list[dict]:
    """Per grid tested on the modulus of `summary` (an evaluation's groups): the profile folded at its period, the
    weakest phase, its power at the period with a permutation p (None for a gap-only test), and the evaluation's
    gap and detected period at that modulus."""
    M = len(summary["groups"])
    out = []
    for plan in (p for p in plans if p.modulus == M):
        (t,) = ratio_tests(summary, {plan.period: [plan.grid]})
        out.append({"grid": plan.grid, "period": plan.period, "modulus": M, "test": plan.test,
                    "phase_profile": t["phase_profile"], "weakest_phase": t["weakest_phase"],
                    "phase_gap": t["phase_gap"], "power": t["period_power"], "p_value": t["period_p_value"],
                    "gap": summary["gap"], "gap_ci": summary["gap_ci"], "mean": summary["mean"],
                    "detected_period": summary["detected_period"],
                    "weak_spot": weak_spot(plan.test, t["period_p_value"], summary["gap_ci"])})
    return out


def weak_spot(test: str | None, p_value: float | None, gap_ci) -> bool | None:
    """A periodic weak spot at a grid: the profile's power at its period significant at ALPHA and the gap's 95%
    interval above 0 (None where the period cannot be tested: a gap-only or undeterminable grid)."""
    if test != "period" or p_value is None:
        return None
    return bool(p_value < ALPHA and gap_ci[0] > 0)


# ---------------------------------------------------------------- knockout conditions


@dataclass(frozen=True)
class Condition:
    """One way to run the model: a hook of its attention modules set to a value (None hook: as trained)."""

    name: str  # "learned", "cmp", "oracle (name's block)", "beacon 2 out", ...
    hook: str | None = None  # attribute of every attention module (HOOKS)
    value: object = None  # what it is set to, or a function of the batch's prompts giving it

    def resolve(self, batch: list[Prompt], device) -> object:
        return self.value(batch, device) if callable(self.value) else self.value


def design_hook(model) -> str | None:
    """The knockout hook the model's attention modules have (HOOKS), or None (a study model)."""
    attn = attention_modules(model)[0]
    return next((h for h in HOOKS if hasattr(attn, h)), None)


def _oracle(block: int, offset: int) -> Callable:
    """The oracle block per prompt: the block holding the target key (offset 0) or its name (offset 1)."""
    return lambda batch, device: torch.tensor([(p.target_pos + offset) // block for p in batch], device=device)


def conditions(model, grids: dict[str, int], key_tokens: int = 1) -> list[Condition]:
    """The model as trained, then its design's knockouts (none for a study model)."""
    hook = design_hook(model)
    out = [Condition(LEARNED)]
    if hook == "branch_gates":
        out += [Condition(b, hook, b) for b in NSA_BRANCHES]
    elif hook == "oracle_blocks":
        out += [Condition("oracle (key's block)", hook, _oracle(grids["B"], 0)),
                Condition("oracle (name's block)", hook, _oracle(grids["B"], key_tokens))]
    elif hook == "beacon_knockout":
        out += [Condition(f"beacon {i} out", hook, {i}) for i in range(grids["w"] // grids["r"])]
    return out


@contextmanager
def applied(model, cond: Condition, batch: list[Prompt]):
    """Inside the block every attention module's hook holds the condition's value; restored after."""
    if cond.hook is None:
        yield
        return
    mods = attention_modules(model)
    value = cond.resolve(batch, next(model.parameters()).device)
    old = [getattr(m, cond.hook) for m in mods]
    for m in mods:
        setattr(m, cond.hook, value)
    try:
        yield
    finally:
        for m, v in zip(mods, old, strict=True):
            setattr(m, cond.hook, v)


@torch.no_grad()
def run_conditions(em, cfg: PromptConfig, conds: list[Condition], pids: list[int], batch_size: int = 32,
                   probe: Callable | None = None, advance: Callable | None = None) -> pd.DataFrame:
    """Per-prompt rows (`phasekv.eval.run.COLUMNS` + condition) of every condition on the prompts `pids`.
    `probe(batch)`: a context manager run around the learned condition's batches (gate statistics)."""
    prompts = RetrievalPrompts(cfg, em.tok)
    frames = []
    for cond in conds:
        rows: list[dict] = []
        for s in range(0, len(pids), batch_size):
            batch = [prompts.prompt(p) for p in pids[s : s + batch_size]]
            read = probe(batch) if probe is not None and cond.name == LEARNED else _nothing()
            with applied(em.model, cond, batch), read:
                rows += next(score(em.model, em.tok, batch, cfg.padding, batch_size))
        frames.append(pd.DataFrame(rows, columns=COLUMNS).assign(condition=cond.name))
        if advance is not None:
            advance(1)
    return pd.concat(frames, ignore_index=True)


@contextmanager
def _nothing():
    yield


def condition_summaries(rows: pd.DataFrame, modulus: int, plans: list[GridPlan], chance: float,
                        n_boot: int = 1000) -> list[dict]:
    """Per condition: mean [95%], worst, best, gap [95%], detected period, and each grid's test at `modulus`."""
    out = []
    tested = [p for p in plans if p.modulus == modulus]
    stride = min((p.period for p in tested if p.period < modulus), default=None)
    for name, r in rows.groupby("condition", sort=False):
        s = summarize(r["target_pos"] % modulus, r["mapping"], r["correct"].astype(bool), modulus, stride,
                      n_boot=n_boot, n_perm=2000).to_dict()
        out.append({"condition": name, **{k: s[k] for k in ("mean", "mean_ci", "worst", "best", "gap", "gap_ci",
                                                             "detected_period")},
                    "retrieves": retrieves(s["mean_ci"], chance), "n": int(len(r)),
                    "groups": [g["acc"] for g in s["groups"]], "grids": grid_tests(s, tested)})
    return out


def masking(conds: list[dict]) -> dict | None:
    """NSA: do the exact branches mask the compressed branch's weak phases? The compressed-only profile has a
    periodic weak spot at a grid while the model as trained has none (at every tested grid). None for other
    designs."""
    by = {c["condition"]: c for c in conds}
    if "cmp" not in by or LEARNED not in by:
        return None
    cmp_weak = [g["grid"] for g in by["cmp"]["grids"] if g["weak_spot"]]
    whole_weak = [g["grid"] for g in by[LEARNED]["grids"] if g["weak_spot"]]
    determinable = any(g["weak_spot"] is not None for g in by["cmp"]["grids"])
    return {"compressed_weak_at": cmp_weak, "learned_weak_at": whole_weak, "compressed_retrieves": by["cmp"]["retrieves"],
            "masks": (bool(cmp_weak) and not whole_weak) if determinable and by["cmp"]["retrieves"] else None}


def beacon_table(rows: pd.DataFrame, window: int, ratio: int) -> pd.DataFrame:
    """Beacon knockouts by the beacon that holds the target key: accuracy per condition and target group (the
    target's beacon index i = (t mod w) // r in a completed window, or "raw" in the query's own window), with the
    change from the learned condition (points). Positions come from the lookup's design: descriptive, not
    moment-matched by group; the comparison with the learned condition is paired (same prompts)."""
    raw = rows["target_pos"] // window == rows["query_pos"] // window
    group = np.where(raw, "raw", ((rows["target_pos"] % window) // ratio).astype(str))
    t = rows.assign(group=group, correct=rows["correct"].astype(float)).groupby(
        ["condition", "group"], sort=False)["correct"].agg(["sum", "count"]).reset_index()
    t["acc"] = 100 * t["sum"] / t["count"]
    clean = t[t["condition"] == LEARNED].set_index("group")["acc"]
    t["change"] = t["acc"] - t["group"].map(clean)
    return t.rename(columns={"sum": "correct", "count": "n"})


# ---------------------------------------------------------------- NSA's gates


@contextmanager
def nsa_gate_probe(model, store: list):
    """Reads NSA's branch gates at the query: every attention module's `gate` projection (sigmoid of its output,
    (B, T, H x 3): per head, one logit per branch cmp, sel, win) at the last position, appended to `store` as
    (B, layers, 3) per batch (mean over heads)."""
    mods = attention_modules(model)
    got: list = [None] * len(mods)

    def hook(i):
        def fn(m, args, out):
            g = torch.sigmoid(out[:, -1].float())  # (B, 3 H)
            got[i] = g.view(g.shape[0], -1, 3).mean(1)  # (B, 3)
        return fn

    handles = [m.gate.register_forward_hook(hook(i)) for i, m in enumerate(mods)]
    try:
        yield
        store.append(torch.stack(got, 1).cpu())  # (B, layers, 3)
    finally:
        for h in handles:
            h.remove()


def gate_table(store: list, rows: pd.DataFrame, plans: list[GridPlan]) -> pd.DataFrame:
    """Mean branch gate at the query by layer and the target's phase at every grid: columns grid, phase, layer,
    cmp, sel, win."""
    g = torch.cat(store).numpy()  # (N, layers, 3)
    learned = rows[rows["condition"] == LEARNED].reset_index(drop=True)
    out = []
    for plan in plans:
        phase = learned["target_pos"].to_numpy() % plan.period
        for ph in range(plan.period):
            sel = phase == ph
            for layer in range(g.shape[1]):
                m = g[sel, layer].mean(0)
                out.append({"grid": plan.grid, "period": plan.period, "phase": ph, "layer": layer, "n": int(sel.sum()),
                            "cmp": float(m[0]), "sel": float(m[1]), "win": float(m[2])})
    return pd.DataFrame(out)


# ---------------------------------------------------------------- Beacon's attention on its beacons


def beacon_probs(attn, h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The last raw slot's attention probabilities (B, H, T_s) over the stream slots pos (T_s,), recomputed from a
    Beacon layer's inputs h (B, T_s, d) with its own projections, as its forward scores them (which it does not
    keep)."""
    from phasekv.attention.beacon import is_beacon, rope_position, visible

    cfg = attn.cfg
    r, w, n_kv = cfg.beacon_ratio, cfg.beacon_window, cfg.n_kv_heads
    beacon, rope = is_beacon(pos, r), rope_position(pos, r)  # (T_s,) each
    qi = int(torch.nonzero(~beacon).flatten()[-1])  # the last raw slot: the query
    q = attn._rope(attn.q_norm(attn._heads(attn.q_proj(h[:, qi : qi + 1]), cfg.n_heads)), rope[qi : qi + 1])  # (B, H, 1, D)
    k = attn._rope(attn.k_norm(attn._project(h, beacon, attn.k_proj, attn.beacon_k, n_kv)), rope)  # (B, n_kv, T_s, D)
    mask = visible(pos[qi : qi + 1], pos, r, w, frozenset(attn.beacon_knockout or ()))  # (1, T_s)
    scores = q.unflatten(1, (n_kv, -1)) @ k[:, :, None].transpose(-1, -2) * q.shape[-1] ** -0.5  # (B, n_kv, g, 1, T_s)
    return scores.masked_fill(~mask, float("-inf")).softmax(-1).flatten(1, 3)  # (B, H, T_s)


def beacon_attention(attn, h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The last raw slot's attention (mean over heads, `beacon_probs`) on the beacons of completed windows, summed by
    beacon index i = 0..w/r-1, and on its own window's slots (last column): (B, w / r + 1), rows summing to 1."""
    r, w = attn.cfg.beacon_ratio, attn.cfg.beacon_window
    probs = beacon_probs(attn, h, pos).mean(1)  # (B, T_s)
    span = w + w // r  # stream slots per window
    column = torch.where(pos // span == pos[-1] // span, w // r, (pos // (r + 1)) % (w // r))  # (T_s,)
    return probs.new_zeros(probs.shape[0], w // r + 1).index_add_(1, column, probs)


@contextmanager
def beacon_attention_probe(model, store: list):
    """Reads every layer's `beacon_attention` at the query, appended to `store` as (B, layers, w / r + 1)."""
    mods = attention_modules(model)
    got: list = [None] * len(mods)

    def pre(i):
        def fn(m, args):
            got[i] = beacon_attention(m, args[0], args[1]).cpu()
        return fn

    handles = [m.register_forward_pre_hook(pre(i)) for i, m in enumerate(mods)]
    try:
        yield
        if all(g is not None for g in got):  # (a model without Beacon layers reads nothing)
            store.append(torch.stack(got, 1))  # (B, layers, w / r + 1)
    finally:
        for h in handles:
            h.remove()


def beacon_attention_table(store: list, rows: pd.DataFrame, window: int, ratio: int) -> pd.DataFrame:
    """Mean attention of the query on each beacon index and on its own window, by layer and by the beacon that holds
    the target key ("raw": the target in the query's own window): columns layer, target, n, beacon 0.., own window."""
    a = torch.cat(store).numpy()  # (N, layers, w / r + 1)
    learned = rows[rows["condition"] == LEARNED].reset_index(drop=True)
    raw = (learned["target_pos"] // window == learned["query_pos"] // window).to_numpy()
    target = np.where(raw, "raw", ((learned["target_pos"] % window) // ratio).astype(str))
    names = [f"beacon {i}" for i in range(window // ratio)] + ["own window"]
    out = []
    for layer in range(a.shape[1]):
        for t in dict.fromkeys(sorted(target, key=lambda x: (x == "raw", x))):
            sel = target == t
            out.append({"layer": layer, "target": t, "n": int(sel.sum()),
                        **dict(zip(names, a[sel, layer].mean(0).tolist(), strict=True))})
    return pd.DataFrame(out)


# ---------------------------------------------------------------- the whole analysis


def lookup_plans(cfg: PromptConfig, plans: list[GridPlan]) -> list[PromptConfig]:
    """The lookup evaluations the grids need beyond the lookup's own modulus (one per other modulus)."""
    extra = {p.modulus: p.config(cfg) for p in plans if p.modulus is not None and p.modulus != cfg.modulus}
    return [extra[m] for m in sorted(extra)]


def _evaluation(em, cfg: PromptConfig, out: Path, given: Path | None, stride: int | None, batch_size: int,
                progress: bool) -> dict:
    """A lookup's summary: a finished evaluation `given` (its summary.json) or one run into `out`."""
    if given is not None and (given / "summary.json").is_file():
        s = json.loads((given / "summary.json").read_text())
        if s.get("modulus") == cfg.modulus and s.get("protocol") == cfg.padding:
            return s
    return run_retrieval("lookup", em, cfg, out, batch_size=batch_size, stride=stride, progress=progress)


def analyze_family(em, cfg: PromptConfig, out, grids: dict[str, int] | None = None,
                   evals: dict[str, Path] | None = None, ko_per_group: int = 96, batch_size: int = 32,
                   n_boot: int = 1000, knockouts: bool = True, progress: bool = True) -> dict:
    """A model's family analysis (an EvalModel or a directory), on the lookup prompts `cfg` (prefix padding's;
    the in-sequence padding is evaluated too): the lookup at every modulus its grids need under both paddings, the
    grid tests, the design's knockouts (prefix padding, `ko_per_group` prompts per group of each knockout modulus)
    and NSA's gates by phase. `grids`: periods to test (default: the model's own, `model_grids`); `evals`:
    padding -> a finished lookup at cfg's modulus to reuse. Writes OUT/summary.json, OUT/results.parquet (the
    knockouts' effect table), OUT/prompts.parquet, OUT/gates.parquet (NSA), OUT/beacons.parquet and
    OUT/beacon_attention.parquet (Beacon) and
    OUT/lookup-<padding>-m<M>/; returns the summary."""
    em = as_eval_model(em)
    out = Path(out)
    grids = model_grids(em.model) if grids is None else grids
    plans = plan_grids(grids, cfg)
    stride_of = {m: min((p.period for p in plans if p.modulus == m and p.period < m), default=None)
                 for m in {cfg.modulus, *(p.modulus for p in plans if p.modulus is not None)}}
    lookup = {}
    for padding in PADDINGS:
        base = dataclasses.replace(cfg, padding=padding)
        sums = [_evaluation(em, base, out / f"lookup-{padding}-m{base.modulus}", (evals or {}).get(padding),
                            stride_of[base.modulus], batch_size, progress)]
        sums += [_evaluation(em, c, out / f"lookup-{padding}-m{c.modulus}", None, stride_of[c.modulus], batch_size,
                             progress) for c in lookup_plans(base, plans)]
        s0 = sums[0]
        lookup[padding] = {"modulus": s0["modulus"], "n_prompts": s0["n_prompts"],
                           **{k: s0[k] for k in ("mean", "mean_ci", "worst", "best", "gap", "gap_ci",
                                                 "detected_period")},
                           "grids": sorted((t for s in sums for t in grid_tests(s, plans)),
                                           key=lambda t: list(grids).index(t["grid"]))}
    prompts = RetrievalPrompts(cfg, em.tok)
    chance = 100.0 / len(prompts.values)
    summary = {"analysis": "family", "model": em.name, "design": getattr(em.model.config, "family", None),
               "grids": grids, "plans": [dataclasses.asdict(p) for p in plans], "chance": chance,
               "lookup": lookup, "alpha": ALPHA}
    tables: dict[str, pd.DataFrame] = {}
    conds = conditions(em.model, grids, cfg.key_tokens) if knockouts else [Condition(LEARNED)]
    effect = pd.DataFrame()
    if len(conds) > 1:
        summary["knockouts"], effect, tables = _knockouts(em, cfg, plans, conds, ko_per_group, batch_size, n_boot,
                                                          chance, progress)
    summary["provenance"] = provenance(em, cfg)
    write_outputs(out, effect, summary, **tables)
    return summary


def _knockouts(em, cfg: PromptConfig, plans: list[GridPlan], conds: list[Condition], ko_per_group: int,
               batch_size: int, n_boot: int, chance: float, progress: bool) -> tuple[dict, pd.DataFrame, dict]:
    """The design's knockouts under prefix padding at every modulus its tested grids use."""
    moduli = sorted({p.modulus for p in plans if p.test is not None}) or [cfg.modulus]
    runs, frames, effects, tables = [], [], [], {}
    hook = conds[1].hook
    nsa = hook == "branch_gates"
    grids = {p.grid: p.period for p in plans}
    store: list = []
    reader = {"branch_gates": nsa_gate_probe, "beacon_knockout": beacon_attention_probe}.get(hook)
    for m in moduli:
        n = max(MIN_PER_GROUP, round(ko_per_group * cfg.modulus / m))
        c = dataclasses.replace(cfg, padding="prefix", modulus=m, per_group=n, keep_n=n % exact_unit(m) != 0)
        pids = spread_pids(len(RetrievalPrompts(c, em.tok)), m * n)
        probe = (lambda batch: reader(em.model, store)) if reader and m == moduli[0] else None
        with progress_bar(progress, len(conds), f"family knockouts · {em.name} · M={m}") as advance:
            rows = run_conditions(em, c, conds, pids, batch_size, probe, advance).assign(modulus=m)
        runs.append({"modulus": m, "per_group": n, "conditions": condition_summaries(rows, m, plans, chance, n_boot)})
        frames.append(rows)
        units = rows.assign(unit=rows["condition"].replace(LEARNED, "clean"), layer=-1, kv_head=-1)
        for p in [p for p in plans if p.modulus == m and p.period < m] or [None]:
            e = effect_table(units, m, p.period if p else None)  # residue rows (mod m), phase rows (mod the period)
            effects.append(e.assign(grid=(e["grouping"] == "phase").map({True: p.grid if p else None, False: None})))
        if store and m == moduli[0]:
            tables["gates" if nsa else "beacon_attention"] = (
                gate_table(store, rows, [p for p in plans if p.modulus == m]) if nsa
                else beacon_attention_table(store, rows, grids["w"], grids["r"]))
    ko = {"hook": hook, "padding": "prefix", "runs": runs}
    if nsa:
        ko["masking"] = masking(runs[0]["conditions"])
    if hook == "beacon_knockout":
        tables["beacons"] = beacon_table(pd.concat(frames, ignore_index=True), grids["w"], grids["r"])
    effect = pd.concat(effects, ignore_index=True).drop_duplicates(["unit", "grouping", "modulus", "group", "grid"])
    tables["prompts"] = pd.concat(frames, ignore_index=True)
    return ko, effect, tables


def reading(summary: dict, padding: str = "prefix") -> str:
    """The design's result in one plain sentence: a periodic weak spot at which grid or none (with the gap and p),
    and for NSA whether the exact branches mask the compressed branch's weak phases."""
    lk = summary["lookup"].get(padding)
    if lk is None:
        return f"{summary['model']}: no {padding} lookup."
    if lk["mean_ci"][0] <= 2 * summary["chance"]:
        return (f"{summary['model']} ({padding} padding): mean {lk['mean']:.1f}% [{lk['mean_ci'][0]:.1f}, "
                f"{lk['mean_ci'][1]:.1f}], its interval not above twice chance ({2 * summary['chance']:.1f}%): it does "
                "not retrieve, so its phase profile says nothing.")
    parts = []
    for t in lk["grids"]:
        where = f"{t['grid']} = {t['period']} (mod {t['modulus']})"
        gap = f"gap {t['gap']:.1f} [{t['gap_ci'][0]:.1f}, {t['gap_ci'][1]:.1f}]"
        if t["test"] == "gap":
            dep = "depends on" if t["gap_ci"][0] > 0 else "does not measurably depend on"
            parts.append(f"accuracy {dep} t mod {t['period']} ({gap}; a period above {t['period']} cannot be tested "
                         f"with these prompts)")
        elif t["weak_spot"]:
            parts.append(f"a periodic weak spot at {where}: weakest phase {t['weakest_phase']}, {gap}, p = "
                         f"{t['p_value']:.4f}")
        else:
            parts.append(f"no periodic weak spot at {where} ({gap}, p = {t['p_value']:.4f})")
    untested = [p["grid"] for p in summary["plans"] if p["test"] is None]
    if untested:
        parts.append(f"{', '.join(untested)} not determinable at this prompt length")
    text = f"{summary['model']} ({padding} padding): " + "; ".join(parts) + "."
    mask = (summary.get("knockouts") or {}).get("masking")
    if mask is not None:
        if mask["masks"] is None:
            why = "its compressed branch alone does not retrieve" if not mask["compressed_retrieves"] else \
                "no grid's period can be tested"
            text += f" Whether the exact branches mask the compressed branch cannot be said: {why}."
        elif mask["masks"]:
            text += (f" Its exact branches mask the compressed branch: compressed-only is periodic at "
                     f"{', '.join(mask['compressed_weak_at'])} while the model as trained is not.")
        else:
            text += (" Its exact branches mask nothing here: compressed-only is "
                     + (f"periodic at {', '.join(mask['compressed_weak_at'])}" if mask["compressed_weak_at"]
                        else "not periodic at any tested grid")
                     + (f", and so is the model as trained ({', '.join(mask['learned_weak_at'])})."
                        if mask["learned_weak_at"] else "."))
    return text
