"""Terminal tables and figures of phase-aware evaluations (accuracy by residue, flip sweeps)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from phasekv.io import write_figure


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


def summary_line(summary: dict) -> str:
    per = summary["periodicity"]
    p = per.get("p_value")
    fold = summary.get("fold_consistency")
    return (f"mean {summary['mean']:.1f} {_interval(summary.get('mean_ci'))} · worst {summary['worst']:.1f} · "
            f"best {summary['best']:.1f} · gap {summary['gap']:.1f} {_interval(summary['gap_ci'])} points · "
            f"fold consistency {'-' if fold is None else f'{fold:.1f}'} · "
            f"period-{per.get('period')} test p = {'-' if p is None else f'{p:.4f}'} · "
            f"detected period {summary['detected_period']}")


def print_summary(summary: dict, console: Console | None = None) -> None:
    console = console or Console()
    console.print(profile_table(summary))
    console.print(summary_line(summary))
    if summary.get("design_notice"):
        console.print(f"[yellow]notice:[/] {summary['design_notice']}")


def _save(fig, path: Path) -> None:
    write_figure(path, fig, dpi=130, bbox_inches="tight")


def plot_profile(summary: dict, path: Path) -> None:
    """Accuracy by residue with its 95% band; dashed lines at the stride's period boundaries, triangles
    under the axis at the boundary phase S-1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = summary["groups"]
    r = [x["residue"] for x in g]
    acc, lo, hi = [x["acc"] for x in g], [x["lo"] for x in g], [x["hi"] for x in g]
    M, S = summary["modulus"], summary.get("stride")
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.fill_between(r, lo, hi, alpha=0.25, color="C0", lw=0)
    periodic = bool(S) and 0 < S < M
    step = S if periodic else M
    for start in range(0, M, step):  # solid within a stride period, dotted across a period boundary
        seg = slice(start, min(start + step, M))
        ax.plot(r[seg], acc[seg], "o-", color="C0", ms=3, label=summary["model"] if start == 0 else None)
        if start + step < M:
            ax.plot(r[start + step - 1 : start + step + 1], acc[start + step - 1 : start + step + 1], ":", color="C0")
    if periodic:
        for b in range(S, M, S):
            ax.axvline(b - 0.5, ls="--", color="gray", lw=0.8)
        ax.plot([x for x in r if x % S == S - 1], [-4] * (M // S), "^", color="gray", ms=5, clip_on=False)
    ax.set_xlim(-0.5, M - 0.5)
    ax.set_ylim(-6, 103)
    ax.set_xlabel(f"target position mod {M}")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"{summary['task']} · {summary['protocol']} padding · gap {summary['gap']:.1f} "
                 f"[{summary['gap_ci'][0]:.1f}, {summary['gap_ci'][1]:.1f}] · period {summary['detected_period']}",
                 fontsize=9)
    ax.legend(fontsize=8, loc="best")
    _save(fig, path)
    plt.close(fig)


def plot_flip(rows, stride: int | None, path: Path, candidates: list[str]) -> None:
    """P(candidate) against filler length, one panel per family, dashed lines every S lengths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = list(dict.fromkeys(rows["family"]))
    fig, axes = plt.subplots(len(fams), 1, figsize=(7, 2.2 * len(fams)), sharex=True, squeeze=False)
    for ax, fam in zip(axes[:, 0], fams, strict=True):
        d = rows[rows["family"] == fam]
        for i, c in enumerate(candidates):
            dc = d[d["candidate"] == c]
            ax.plot(dc["length"], dc["prob"], "o-", ms=3, color=f"C{i}", label=repr(c))
        if stride:
            for b in range(int(d["length"].min()), int(d["length"].max()) + 1):
                if b % stride == 0:
                    ax.axvline(b - 0.5, ls="--", color="gray", lw=0.8)
        ax.set_ylabel("P")
        ax.set_title(f"filler: {fam}", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("filler length L (tokens)" + (f", dashed every S={stride}" if stride else ""))
    _save(fig, path)
    plt.close(fig)
