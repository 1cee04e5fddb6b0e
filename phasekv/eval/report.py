"""Terminal tables and figures of phase-aware evaluations: accuracy by residue and the filler sweep, each
built once from its tidy table (`phasekv.eval.figure`), for an evaluation directory and the report alike."""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.table import Table

from phasekv.eval.figure import PALETTE, Figure, Guide, Panel, Trace


def _interval(ci) -> str:
    return f"[{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "-"


def profile_table(summary: dict) -> Table:
    """Per-residue accuracy with its interval and a bar; the boundary phase S-1 is marked."""
    S = summary.get("stride")
    t = Table(title=f"{summary['task']} · {summary['model']} · {summary['protocol']} padding · "
                    f"M={summary['modulus']}" + (f" · S={S}" if S else ""))
    for col in ("residue", "n", "acc %", f"95% ({summary['interval']})", ""):
        t.add_column(col, justify="right" if col != "" else "left")
    for g in summary["groups"]:
        mark = " ◂ boundary phase" if S and g["residue"] % S == S - 1 else ""
        t.add_row(str(g["residue"]), str(g["n"]), f"{g['acc']:.1f}", f"[{g['lo']:.1f}, {g['hi']:.1f}]",
                  "█" * int(round(g["acc"] / 5)) + mark)
    return t


def chance(summary: dict) -> float | None:
    """The accuracy (%) of naming one of the prompts' value words at random, or None where the summary does not
    count its word pools: what a mean must clear before its gap says anything."""
    n_values = summary.get("provenance", {}).get("word_pools", {}).get("values")
    return 100.0 / n_values if n_values else None


def summary_line(summary: dict) -> str:
    per = summary["periodicity"]
    p = per.get("p_value")
    fold = summary.get("fold_consistency")
    c = chance(summary)
    return (f"mean {summary['mean']:.1f} {_interval(summary.get('mean_ci'))}"
            f"{'' if c is None else f' (chance {c:.1f})'} · worst {summary['worst']:.1f} · "
            f"best {summary['best']:.1f} · gap {summary['gap']:.1f} {_interval(summary['gap_ci'])} points · "
            f"fold consistency {'-' if fold is None else f'{fold:.1f}'} · "
            f"period-{per.get('period')} test p = {'-' if p is None else f'{p:.4f}'} · "
            f"detected period {summary['detected_period']}")


def length_warning(beyond: dict) -> str:
    """The one line that says an evaluation ran beyond its model's training length (a summary's
    `beyond_training_length`: prompt_tokens, trained_tokens)."""
    n, t = beyond["prompt_tokens"], beyond["trained_tokens"]
    return (f"prompts of {n:,} tokens are {n / t:.1f}x the {t:,}-token sequences this model was trained on: its "
            "accuracy here measures length extrapolation as well as phase")


def print_summary(summary: dict, console: Console | None = None) -> None:
    console = console or Console()
    console.print(profile_table(summary))
    console.print(summary_line(summary))
    if summary.get("design_notice"):
        console.print(f"[yellow]notice:[/] {summary['design_notice']}")
    if summary.get("beyond_training_length"):
        console.print(f"[yellow]warning:[/] {length_warning(summary['beyond_training_length'])}")
    words = summary.get("provenance", {}).get("words") or {}
    if words.get("source") == "vocab":
        console.print(f"prompt words: the tokenizer's own single-token words (the shipped lists are split), keys "
                      f"{', '.join(words['keys'][:6])}, ...; values {', '.join(words['values'][:6])}, ...")


def profile_rows(alias: str, name: str, summary: dict, stride: int | None) -> pd.DataFrame:
    """A retrieval summary as the tidy table of the accuracy-by-residue figure: one row per residue group
    (acc, lo, hi in percent) with the model's alias, name, stride and scalar summary repeated."""
    lo, hi = summary.get("gap_ci") or (float("nan"), float("nan"))
    rows = pd.DataFrame(summary["groups"]).sort_values("residue")
    return rows.assign(model=alias, name=name, stride=stride or 0, modulus=summary.get("modulus", len(rows)),
                       gap=summary["gap"], gap_lo=lo, gap_hi=hi, period=summary.get("detected_period"))


def residue_figure(table: pd.DataFrame, padding: str, colors: dict[str, str], reference: str | None = None) -> Figure:
    """Accuracy by residue per model with its 95% band, the boundary phase S-1 marked under the axis and the
    model's period boundaries dashed; on paper one small panel per model (`reference` dashed grey in each)."""
    M = int(table["modulus"].iloc[0])
    traces, guides, titles = [], {}, {}
    for alias, p in table.groupby("model", sort=False):
        name, S, color = p["name"].iloc[0], int(p["stride"].iloc[0]), colors.get(alias, PALETTE[0])
        x = p["residue"].tolist()
        traces += [Trace("band", x, p["lo"].tolist(), p["hi"].tolist(), color=color, alpha=0.2, model=alias),
                   Trace("line", x, p["acc"].tolist(), name=name, color=color, marker="circle", size=3, model=alias,
                         hover=f"{name}<br>residue %{{x}}: %{{y:.1f}}%<extra></extra>")]
        if S:
            xs = [r for r in x if r % S == S - 1]
            traces.append(Trace("points", xs, [-1] * len(xs), color=color, marker="triangle-up", size=4,
                                model=alias))
        guides[alias] = [Guide(x=k * S - 0.5) for k in range(1, M // S)] if S else []
        r = p.iloc[0]
        titles[alias] = f"{name}\ngap {r.gap:.1f} [{r.gap_lo:.1f}, {r.gap_hi:.1f}], period {r.period}"
    panel = Panel(traces, xlabel=f"target-key position mod {M}", ylabel="accuracy (%)", ylim=(-2, 102),
                  xticks=list(range(0, M, 2 if M > 12 else 1)), facet=True, facet_titles=titles, reference=reference,
                  model_guides=guides)
    return Figure([panel], f"Accuracy by target-key position mod {M} ({padding} padding); 95% bands",
                  size=(4.6, 3.2))


def flip_rows(alias: str, name: str, summary: dict, results: pd.DataFrame, stride: int | None) -> pd.DataFrame:
    """A filler sweep as the tidy table of its figure: P(first candidate) per (family, length), with the
    model's alias, name, stride and how many rankings follow the pattern."""
    first = summary.get("candidates", [results["candidate"].iloc[0]])[0]
    follow = (f"{summary['follow_pattern']}/{summary['rankings']} rankings follow length mod S"
              if summary.get("follow_pattern") is not None else "")
    rows = results[results["candidate"] == first].sort_values(["family", "length"], kind="stable")
    return rows.assign(model=alias, name=name, stride=stride or 0, follow=follow)[
        ["model", "name", "stride", "follow", "family", "length", "candidate", "prob"]]


def flip_figure(table: pd.DataFrame, colors: dict[str, str]) -> Figure:
    """P(first candidate) against filler length, a line per filler family (dash styles), dashed lines every S
    lengths of the model; on paper one small panel per model."""
    dashes = ["solid", "dot", "dash", "dashdot", "longdash"]
    traces, guides, titles = [], {}, {}
    for alias, d in table.groupby("model", sort=False):
        name, S, color = d["name"].iloc[0], int(d["stride"].iloc[0]), colors.get(alias, PALETTE[0])
        first = d["candidate"].iloc[0]
        for i, (fam, g) in enumerate(d.groupby("family", sort=False)):
            traces.append(Trace("line", g["length"].tolist(), g["prob"].tolist(), name=f"{name} · {fam}", label=fam,
                                color=color,
                                dash=dashes[i % len(dashes)], marker="circle", size=2, model=alias,
                                hover=f"{name} · {fam}<br>length %{{x}}: P({first}) = %{{y:.3f}}<extra></extra>"))
        lo, hi = int(d["length"].min()), int(d["length"].max())
        guides[alias] = [Guide(x=x - 0.5, width=0.6) for x in range(lo + 1, hi + 1) if S and x % S == 0]
        titles[alias] = f"{name}\n{d['follow'].iloc[0]}"
    first = table["candidate"].iloc[0]
    panel = Panel(traces, xlabel="filler length (tokens)", ylabel=f"P({first})", legend=True, facet=True,
                  facet_titles=titles, model_guides=guides)
    return Figure([panel], "Filler sweep: probability of the first candidate by filler length", size=(4.5, 3.2))
