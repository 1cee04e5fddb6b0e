"""`phasekv compare`: mitigations and references side by side, at their cost.

For each evaluated model (a `phasekv eval lookup|needle --out DIR` directory): cache bytes per token relative
to full attention (and the compression ratio), training and decode cost relative to full attention
(measured here, in one process, interleaved, so machine load hits every model alike), mean accuracy, worst
residue, gap with its interval, fold consistency and the detected period; a Pareto plot of the gap against
cache size; and the acceptance check of the mitigations (compression >= R, gap <= F x the full-attention
gap, mean >= the baseline's), on point estimates and with the intervals.

Output (stable schema `phasekv.compare/1`, read by the report): DIR/summary.json, DIR/results.parquet (one
row per model, the same fields), DIR/pareto.png.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from phasekv.config import ModelConfig
from phasekv.errors import ConfigError, DataError
from phasekv.eval.figure import DPI
from phasekv.eval.protocols import is_retrieval, retrieval_protocols
from phasekv.eval.run import json_default, versions
from phasekv.io import write_figure, write_json, write_parquet
from phasekv.model.cli import cache_bytes
from phasekv.model.transformer import PhaseLM

SCHEMA = "phasekv.compare/1"
ROW_FIELDS = [  # the per-model record of summary.json["models"] and the columns of results.parquet
    "label", "model", "role", "mitigations", "eval_dir", "run_dir", "window", "stride", "n_kv_heads", "ensemble_k",
    "cache_bytes", "cache_rel", "compression", "train_cost_rel", "decode_cost_rel", "train_tokens_per_s",
    "eval_seconds", "mean", "mean_ci", "worst", "worst_ci", "worst_residue", "best", "gap", "gap_ci",
    "fold_consistency", "detected_period", "periodicity_p", "pareto",
]


@dataclass
class Bench:
    batch: int = 8  # training micro-benchmark: forward + backward on (batch, seq_len)
    seq_len: int = 80
    decode_context: int = 512  # decode micro-benchmark: prefill this many tokens, then decode one at a time
    decode_steps: int = 32
    reps: int = 5  # interleaved repetitions; the minimum time is kept (robust to a busy machine)


# ---------------------------------------------------------------- inputs


def find_summary(path: Path, protocol: str | None) -> Path:
    """DIR/summary.json of a retrieval evaluation, or the one retrieval evaluation (of `protocol`) under DIR."""
    path = Path(path)
    if (path / "summary.json").is_file() and _is_eval(path / "summary.json", None):
        return path / "summary.json"
    found = sorted(p for p in path.rglob("summary.json") if _is_eval(p, protocol))
    if not found:
        names = "/".join(p.name for p in retrieval_protocols())
        raise DataError(f"{path}: no {names} evaluation (summary.json from `phasekv eval`)"
                        + (f" with {protocol} padding" if protocol else ""))
    if len(found) > 1:
        raise DataError(f"{path}: {len(found)} evaluations found ({', '.join(str(p.parent) for p in found[:4])}); "
                        "pass the evaluation directory itself")
    return found[0]


def _is_eval(p: Path, protocol: str | None) -> bool:
    try:
        s = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(s, dict) and is_retrieval(s) and (protocol is None or s.get("protocol") == protocol)


def _model_config(s: dict) -> ModelConfig | None:
    cfg = s.get("provenance", {}).get("model_info", {}).get("config")
    if not isinstance(cfg, dict) or "config_version" not in cfg:
        return None  # a Hugging Face model: no phasekv config
    return ModelConfig.from_dict(cfg, source="evaluation summary")


def _run_info(s: dict) -> tuple[str | None, float | None]:
    """(training run dir, its training tokens/s from done.json) when the model came from `phasekv train`."""
    path = s.get("provenance", {}).get("model_info", {}).get("path")
    if not path:
        return None, None
    done = Path(path) / "done.json"
    if not done.is_file():
        return path, None
    d = json.loads(done.read_text())
    tps = d["tokens"] / d["elapsed_s"] if d.get("elapsed_s") else None
    return path, tps


def mitigations(cfg: ModelConfig | None, k: int, baseline: ModelConfig | None) -> list[str]:
    """Paper words for what distinguishes a model from the baseline's compression."""
    out = []
    if cfg is not None and cfg.compressed:
        if cfg.stagger:
            out.append("staggered windows")
        if cfg.coverage_reg:
            out.append(f"coverage reg {cfg.coverage_reg:g}")
        if cfg.stride < cfg.window:
            out.append("overlapping windows")
        if baseline is not None and cfg.n_kv_heads > baseline.n_kv_heads:
            out.append("more KV heads")
    if k > 1:
        out.append(f"phase ensemble {k}")
    return out


# ---------------------------------------------------------------- cost


def _tiny_model(cfg: ModelConfig, T: int) -> PhaseLM:
    torch.manual_seed(0)
    return PhaseLM(cfg.replace(max_seq_len=max(cfg.max_seq_len, T + 1)))


def measure_costs(configs: dict[str, ModelConfig], bench: Bench, progress=None) -> dict[str, dict]:
    """Seconds per training step (forward + backward) and per decode step of each config, min over reps."""
    models = {n: _tiny_model(c, bench.decode_context + bench.decode_steps) for n, c in configs.items()}
    train = {n: float("inf") for n in models}
    decode = {n: float("inf") for n in models}
    g = torch.Generator().manual_seed(0)
    for _ in range(bench.reps):
        for n, m in models.items():  # interleaved: every model sees the same machine load
            V = m.config.vocab_size
            ids = torch.randint(0, V, (bench.batch, bench.seq_len), generator=g)
            t = time.perf_counter()
            m(ids).float().logsumexp(-1).mean().backward()
            train[n] = min(train[n], time.perf_counter() - t)
            m.zero_grad(set_to_none=True)
            ids = torch.randint(0, V, (1, bench.decode_context + bench.decode_steps), generator=g)
            with torch.no_grad():
                cache = m.new_cache(1)
                m(ids[:, : bench.decode_context], cache=cache)
                t = time.perf_counter()
                for i in range(bench.decode_context, ids.shape[1]):
                    m(ids[:, i : i + 1], cache=cache)
                decode[n] = min(decode[n], (time.perf_counter() - t) / bench.decode_steps)
            if progress:
                progress()
    return {n: {"train_s": train[n], "decode_s": decode[n]} for n in models}


def _backbone_key(cfg: ModelConfig) -> tuple:
    return (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size)


# ---------------------------------------------------------------- the table


def compare(paths: list[Path], out: Path | None = None, reference: str | None = None, baseline: str | None = None,
            protocol: str | None = "prefix", context: int = 32768, min_compression: float = 4.0,
            max_gap_factor: float = 2.0, bench: Bench | None = None, progress: bool = False) -> dict:
    """Build the comparison (and write it under `out`); returns the summary dict (schema SCHEMA)."""
    if not paths:
        raise ConfigError("compare needs at least one evaluation directory")
    if context < 1:
        raise ConfigError(f"--context {context} must be >= 1")
    summaries = []
    for p in paths:
        f = find_summary(Path(p), protocol)
        summaries.append((f.parent, json.loads(f.read_text())))
    tasks = {(s["task"], s["protocol"], s["modulus"]) for _, s in summaries}
    if len(tasks) > 1:
        raise DataError(f"compare needs evaluations of one task, padding and modulus; got {sorted(tasks)}")
    task, proto, modulus = tasks.pop()
    labels = [s["model"] for _, s in summaries]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise DataError(f"two evaluations of the same model {dup[0]!r}; compare each model once")
    cfgs = {s["model"]: _model_config(s) for _, s in summaries}

    ref = _pick(reference, "--reference", cfgs, lambda c: c is not None and not c.compressed)
    base = _pick(baseline, "--baseline", cfgs, lambda c: False, default_name="W8/S8 · 1 KV")
    ref_cfg = cfgs.get(ref) if ref else None

    rows = []
    for d, s in summaries:
        cfg = cfgs[s["model"]]
        info = s.get("provenance", {}).get("model_info", {})
        k = int(info.get("ensemble", {}).get("k", 1))
        run_dir, tps = _run_info(s)
        worst_r = min(s["groups"], key=lambda g: g["acc"])["residue"]
        rows.append({
            "label": s["model"], "model": cfg.name if cfg else s["model"], "eval_dir": str(d), "run_dir": run_dir,
            "role": "reference" if s["model"] == ref else "baseline" if s["model"] == base else "candidate",
            "mitigations": mitigations(cfg, k, cfgs.get(base)),
            "window": cfg.window if cfg else None, "stride": (cfg.stride or None) if cfg else s.get("stride"),
            "n_kv_heads": cfg.n_kv_heads if cfg else None, "ensemble_k": k,
            "train_tokens_per_s": tps, "eval_seconds": s.get("provenance", {}).get("seconds"),
            "mean": s["mean"], "mean_ci": s["mean_ci"], "worst": s["worst"], "worst_ci": s["worst_ci"],
            "worst_residue": worst_r, "best": s["best"], "gap": s["gap"], "gap_ci": s["gap_ci"],
            "fold_consistency": s.get("fold_consistency"), "detected_period": s.get("detected_period"),
            "periodicity_p": s.get("periodicity", {}).get("p_value"),
        })
    _add_costs(rows, cfgs, ref_cfg, context, bench or Bench(), progress)
    _mark_pareto(rows)
    criteria = _criteria(rows, ref, base, min_compression, max_gap_factor)
    summary = {
        "schema": SCHEMA, "task": task, "protocol": proto, "modulus": modulus, "reference": ref, "baseline": base,
        "context": context, "bench": (bench or Bench()).__dict__, "threads": torch.get_num_threads(),
        "models": [{f: r.get(f) for f in ROW_FIELDS} for r in rows], "criteria": criteria,
        "provenance": {"inputs": [str(d) for d, _ in summaries], "versions": _versions()},
    }
    if out is not None:
        write(summary, Path(out))
    return summary


def _pick(name: str | None, flag: str, cfgs: dict, auto, default_name: str | None = None) -> str | None:
    if name is not None:
        matches = [m for m in cfgs if m == name or (cfgs[m] is not None and _same_name(cfgs[m], name)
                                                    and m == cfgs[m].name)]
        if not matches:
            raise ConfigError(f"{flag} {name!r} is not among the compared models: {', '.join(cfgs)}")
        return matches[0]
    if default_name is not None:
        return default_name if default_name in cfgs else None
    cands = [m for m, c in cfgs.items() if auto(c)]
    return min(cands, key=lambda m: cfgs[m].n_kv_heads) if cands else None


def _same_name(cfg: ModelConfig, name: str) -> bool:
    try:
        return ModelConfig.from_name(name, preset=cfg.preset, vocab_size=cfg.vocab_size).name == cfg.name
    except Exception:  # noqa: BLE001 - any unparsable name simply does not match
        return False


def _add_costs(rows: list[dict], cfgs: dict, ref_cfg: ModelConfig | None, context: int, bench: Bench,
               progress: bool) -> None:
    """Cache bytes (computed) and train/decode cost (measured) relative to the full-attention reference; a
    model without a reference among the runs is compared with its own full-attention twin."""
    twins: dict[str, ModelConfig] = {}
    for r in rows:
        cfg = cfgs[r["label"]]
        if cfg is None:
            continue
        twin = ref_cfg if ref_cfg is not None and _backbone_key(ref_cfg) == _backbone_key(cfg) else _full_twin(cfg)
        twins[r["label"]] = twin
        r["cache_bytes"] = cache_bytes(cfg, context)
        r["cache_rel"] = r["cache_bytes"] / cache_bytes(twin, context)
        r["compression"] = 1.0 / r["cache_rel"]
    if bench.reps <= 0:
        return
    unique: dict[str, ModelConfig] = {}
    for label, cfg in cfgs.items():
        if cfg is not None:
            unique.setdefault(_cost_key(cfg), cfg)
            unique.setdefault(_cost_key(twins[label]), twins[label])
    from rich.progress import Progress

    with Progress(disable=not progress) as bar:
        task = bar.add_task("measuring cost", total=bench.reps * len(unique))
        cost = measure_costs(unique, bench, progress=lambda: bar.advance(task))
    for r in rows:
        cfg = cfgs[r["label"]]
        if cfg is None:
            continue
        mine, full = cost[_cost_key(cfg)], cost[_cost_key(twins[r["label"]])]
        r["train_cost_rel"] = mine["train_s"] / full["train_s"]
        r["decode_cost_rel"] = r["ensemble_k"] * mine["decode_s"] / full["decode_s"]  # k passes per answer


def _cost_key(cfg: ModelConfig) -> str:
    return cfg.replace(seed=42, coverage_reg=0.0).name + repr(_backbone_key(cfg))  # training-only fields cost nothing


def _full_twin(cfg: ModelConfig) -> ModelConfig:
    fields = ModelConfig.__dataclass_fields__
    reset = {f: fields[f].default for f in ("gate", "tied_kv", "gate_bias", "local_window", "post_norm", "stagger",
                                            "coverage_reg")}
    return cfg.replace(window=0, stride=0, **reset)


def _mark_pareto(rows: list[dict]) -> None:
    """Pareto-optimal in (cache_rel, gap): no other model is at least as small in both and smaller in one."""
    for r in rows:
        if r.get("cache_rel") is None:
            r["pareto"] = None
            continue
        r["pareto"] = not any(
            o is not r and o.get("cache_rel") is not None and o["cache_rel"] <= r["cache_rel"] and o["gap"] <= r["gap"]
            and (o["cache_rel"] < r["cache_rel"] or o["gap"] < r["gap"]) for o in rows)


def _criteria(rows: list[dict], ref: str | None, base: str | None, min_compression: float, factor: float) -> dict:
    """The acceptance check: compression >= min_compression, gap <= factor x the reference's gap, mean >= the
    baseline's. `point`: on the estimates; `ci`: not contradicted by the 95% intervals (gap lower bound <=
    factor x the reference's upper bound, mean upper bound >= the baseline's lower bound); `strict`: implied
    by them (gap upper bound <= factor x the reference's lower bound, mean lower bound >= the baseline's upper).
    `baseline_fails` says whether the baseline itself misses the gap criterion beyond its interval, i.e. whether
    there is a weak spot to repair at all."""
    by = {r["label"]: r for r in rows}
    out = {"min_compression": min_compression, "max_gap_factor": factor, "reference": ref, "baseline": base,
           "checks": [], "passing": {"point": [], "ci": [], "strict": []}, "best": None}
    if ref is None or base is None:
        out["note"] = "needs a full-attention reference and the baseline among the compared models"
        return out
    R, B = by[ref], by[base]
    out.update(reference_gap=R["gap"], reference_gap_ci=R["gap_ci"], baseline_mean=B["mean"],
               baseline_mean_ci=B["mean_ci"], baseline_gap=B["gap"], baseline_gap_ci=B["gap_ci"],
               baseline_period_p=B.get("periodicity_p"), baseline_detected_period=B.get("detected_period"))
    # is there a weak spot to repair? The baseline must itself fail the gap criterion beyond its interval
    out["baseline_fails"] = B["gap_ci"][0] > factor * R["gap_ci"][1]
    for r in rows:
        if r["label"] in (ref, base) or r.get("compression") is None:
            continue
        ok_c = r["compression"] >= min_compression
        v = {
            "point": ok_c and r["gap"] <= factor * R["gap"] and r["mean"] >= B["mean"],
            "ci": ok_c and r["gap_ci"][0] <= factor * R["gap_ci"][1] and r["mean_ci"][1] >= B["mean_ci"][0],
            "strict": ok_c and r["gap_ci"][1] <= factor * R["gap_ci"][0] and r["mean_ci"][0] >= B["mean_ci"][1],
        }
        out["checks"].append({"label": r["label"], "compression": r["compression"], "gap": r["gap"],
                              "gap_ci": r["gap_ci"], "mean": r["mean"], "mean_ci": r["mean_ci"], **v})
        for k, ok in v.items():
            if ok:
                out["passing"][k].append(r["label"])
    eligible = [c for c in out["checks"] if c["compression"] >= min_compression]
    if eligible:  # best: smallest gap relative to the limit, ties broken by the higher mean
        out["best"] = min(eligible, key=lambda c: (c["gap"] / max(factor * R["gap"], 1e-9), -c["mean"]))["label"]
    return out


def _versions() -> dict:
    return versions()


# ---------------------------------------------------------------- outputs


def write(summary: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = pd.DataFrame(summary["models"], columns=ROW_FIELDS)
    for col in ("mean_ci", "worst_ci", "gap_ci"):
        rows[col] = rows[col].map(lambda v: None if v is None else [float(x) for x in v])
    write_parquet(out / "results.parquet", rows)
    write_json(out / "summary.json", summary, default=json_default)
    plot_pareto(summary, out / "pareto.png")


def plot_pareto(summary: dict, path: Path) -> None:
    """Gap (with its interval) against cache bytes relative to full attention; the Pareto front joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in summary["models"] if r.get("cache_rel") is not None]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if rows:
        x = np.array([r["cache_rel"] for r in rows])
        y = np.array([r["gap"] for r in rows])
        err = np.array([[r["gap"] - r["gap_ci"][0], r["gap_ci"][1] - r["gap"]] for r in rows]).T.clip(0)
        mean = np.array([r["mean"] for r in rows])
        ax.errorbar(x, y, yerr=err, fmt="none", ecolor="gray", lw=0.8, capsize=2, zorder=1)
        sc = ax.scatter(x, y, c=mean, cmap="viridis", vmin=0, vmax=100, s=46, zorder=2, edgecolors="k", lw=0.5)
        fig.colorbar(sc, ax=ax, label="mean accuracy (%)")
        front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["cache_rel"])
        ax.step([r["cache_rel"] for r in front], [r["gap"] for r in front], where="post", color="C3", lw=1,
                label="Pareto front", zorder=0)
        seen: dict[float, int] = {}  # models at the same cache size (ensembles of one model): stack their labels
        for r in sorted(rows, key=lambda r: -r["gap"]):
            key = round(float(np.log2(r["cache_rel"])), 1)  # same place on the log axis
            n = seen[key] = seen.get(key, -1) + 1
            ax.annotate(r["label"], (r["cache_rel"], r["gap"]), fontsize=6.5, xytext=(5, 3 - 9 * n),
                        textcoords="offset points")
        crit = summary.get("criteria", {})
        if crit.get("reference_gap") is not None:
            ax.axhline(crit["max_gap_factor"] * crit["reference_gap"], ls="--", color="C3", lw=0.8,
                       label=f"{crit['max_gap_factor']:g} x full-attention gap")
            ax.axvline(1 / crit["min_compression"], ls=":", color="gray", lw=0.8,
                       label=f"compression {crit['min_compression']:g}x")
        ax.set_xscale("log")
        ticks = [2.0**e for e in range(int(np.floor(np.log2(x.min()))), 1)]
        ax.set_xticks(ticks, [f"1/{round(1 / t)}" if t < 1 else "1" for t in ticks])
        ax.minorticks_off()
        ax.set_xlim(min(ticks) / 1.3, 1.6)
        ax.legend(fontsize=7, loc="best")
    ax.set_xlabel(f"cache bytes per token relative to full attention (context {summary['context']:,})")
    ax.set_ylabel("gap, best - worst residue (points)")
    ax.set_title(f"{summary['task']} · {summary['protocol']} padding · gap against cache size", fontsize=9)
    write_figure(path, fig, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def table(summary: dict):
    """A rich table of the comparison."""
    from rich.table import Table

    t = Table(title=f"{summary['task']} · {summary['protocol']} padding · M={summary['modulus']} · cache at "
                    f"{summary['context']:,} tokens · costs relative to full attention")
    cols = ["model", "cache", "compr.", "train", "decode", "mean [95%]", "worst (res.)", "gap [95%]", "fold", "period",
            "pareto"]
    for c in cols:
        t.add_column(c, justify="left" if c == "model" else "right")

    def f(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    for r in summary["models"]:
        role = {"reference": " (ref)", "baseline": " (base)"}.get(r["role"], "")
        t.add_row(r["label"] + role, f(r["cache_rel"], "{:.3f}"), f(r["compression"], "{:.1f}x"),
                  f(r["train_cost_rel"]), f(r["decode_cost_rel"]),
                  f"{r['mean']:.1f} [{r['mean_ci'][0]:.1f}, {r['mean_ci'][1]:.1f}]",
                  f"{r['worst']:.1f} ({r['worst_residue']})",
                  f"{r['gap']:.1f} [{r['gap_ci'][0]:.1f}, {r['gap_ci'][1]:.1f}]",
                  f(r["fold_consistency"], "{:.1f}"), str(r["detected_period"]),
                  "yes" if r["pareto"] else "")
    return t


def verdict_lines(summary: dict) -> list[str]:
    c = summary["criteria"]
    if c.get("note"):
        return [f"acceptance check skipped: {c['note']}"]
    lines = [f"acceptance: compression >= {c['min_compression']:g}x, gap <= {c['max_gap_factor']:g} x "
             f"{c['reference']}'s {c['reference_gap']:.1f} [{c['reference_gap_ci'][0]:.1f}, "
             f"{c['reference_gap_ci'][1]:.1f}], mean >= {c['baseline']}'s {c['baseline_mean']:.1f} "
             f"[{c['baseline_mean_ci'][0]:.1f}, {c['baseline_mean_ci'][1]:.1f}]"]
    for k, what in (("point", "on point estimates"), ("ci", "within the 95% intervals"),
                    ("strict", "beyond the 95% intervals")):
        lines.append(f"  passing {what}: {', '.join(c['passing'][k]) or 'none'}")
    if c["best"]:
        lines.append(f"  best eligible: {c['best']}")
    if not c.get("baseline_fails", True):
        lines.append(f"  warning: {c['baseline']} itself meets the gap criterion (gap {c['baseline_gap']:.1f} "
                     f"[{c['baseline_gap_ci'][0]:.1f}, {c['baseline_gap_ci'][1]:.1f}]): there is no clear weak spot to "
                     "repair, so passing says little")
    return lines
