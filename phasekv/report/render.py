"""`phasekv report DIR`: render DIR/report/index.html (one self-contained file) and DIR/report/figures/*.png
from the results files of a study directory (see `phasekv.report.layout`).

Each `section_*` gathers one section's cells and figures and renders its template (templates/<section>.html,
`phasekv.report.html`); `render_report` puts the sections in the page."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from plotly.offline import get_plotlyjs

from phasekv.errors import DataError
from phasekv.eval import presses
from phasekv.eval.figure import PALETTE, Figure, to_plotly, to_png
from phasekv.eval.protocols import retrieval_protocols
from phasekv.io import write_json, write_text
from phasekv.mitigate.audit import audit_figure
from phasekv.mitigate.criteria import verdict_lines
from phasekv.mitigate.repair_text import fresh_counts, rule_text, worst_text
from phasekv.mitigate.results import PADDINGS, CompareRow, Lookup, Seeds
from phasekv.progress import Progress
from phasekv.report import checks, claims, family, figures, html, needle, published, tables
from phasekv.report.html import Image, Plot, Styled, fmt, interval
from phasekv.report.layout import Layout
from phasekv.report.load import Study, load_study

BASELINE_COLOR = "#222222"


def model_colors(study: Study) -> dict[str, str]:
    out, i = {}, 0
    for alias, m in study.models.items():
        if m.compressed:
            out[alias] = PALETTE[i % len(PALETTE)]
            i += 1
        else:
            out[alias] = BASELINE_COLOR
    return out


class Builder:
    """Collects sections; writes each figure's PNG into figures/ and its interactive version into the page."""

    def __init__(self, study: Study, fig_dir: Path):
        self.study, self.fig_dir = study, fig_dir
        self.colors = model_colors(study)
        self.sections: list[tuple[str, str, str]] = []  # (anchor, title, html)
        self.pngs: list[Path] = []
        self.n_fig = 0

    def add(self, anchor: str, title: str, body: str) -> None:
        self.sections.append((anchor, title, body))

    def section(self, anchor: str, title: str, template: str, **context) -> None:
        """A section rendered from templates/TEMPLATE (the macros are there as `m`)."""
        self.add(anchor, title, html.render(template, **context))

    def missing(self, anchor: str, title: str, what: str, command: str) -> None:
        """A section that says its stage has not run, and the command that runs it."""
        self.add(anchor, title, html.macro("missing")(what, command))

    def fig(self, figure: Figure | None, caption: str, name: str) -> Plot | None:
        """The figure as figures/NAME.png and as an interactive plot in the page (None when there is none)."""
        if figure is None:
            return None
        png = to_png(figure, self.fig_dir / f"{name}.png")
        self.pngs.append(png)
        self.n_fig += 1
        return html.plot(f"fig{self.n_fig}", to_plotly(figure), caption, f"figures/{png.name}")

    def image(self, png: Path, name: str, caption: str) -> Image:
        """A PNG a stage wrote (a comparison's, the repair's, a theory check's), copied to figures/NAME.png and
        embedded in the page."""
        dest = self.fig_dir / f"{name}.png"
        shutil.copyfile(png, dest)
        self.pngs.append(dest)
        return html.image(png, caption, f"figures/{dest.name}")


def _check_rows(items: list[checks.Check]) -> str:
    return html.macro("checks_table")(items)


def section_verdicts(b: Builder) -> None:
    b.section("verdicts", "What these numbers show", "verdicts.html", groups=checks.all_checks(b.study))


VERDICT_CLASS = {claims.REPRODUCED: "pass", claims.NOT_REPRODUCED: "fail", claims.VARIES: "varies",
                 claims.UNTESTABLE: "na"}
SEED_MARK = {claims.REPRODUCED: "✓", claims.NOT_REPRODUCED: "✗", claims.UNTESTABLE: "–"}  # the seed table's cells


def _published_text(evidence: dict) -> str:
    """The published numbers of a claim's evidence, in words ("name: mean / worst / gap" for table rows)."""
    def one(k, v) -> str:
        if isinstance(v, tuple | list) and len(v) == 3:
            return f"{k}: {v[0]:.1f} / {v[1]:.1f} / {v[2]:.1f}"
        return f"{k}: {'–'.join(str(x) for x in v) if isinstance(v, tuple | list) else v}"
    items = (evidence.get("published") or {}).items()
    return "; ".join(one(k, v) for k, v in items)


def section_claims(b: Builder) -> None:
    """The study's claims C1-C10 (docs: The study and its claims), each with its computed verdict; also written as report/claims.json."""
    facts = claims.facts(b.study)
    found = [v.to_dict() for v in claims.verdicts(facts)]
    write_json(Layout(b.study.root).claims, found, indent=1)
    rows = [v | {"cls": VERDICT_CLASS[v["verdict"]], "published": _published_text(v["evidence"])} for v in found]
    tally = {k: sum(v["verdict"] == k for v in found) for k in VERDICT_CLASS}
    b.section("claims", "The study's claims", "claims.html", claims=rows, source=published.SOURCE,
              tally={k: n for k, n in tally.items() if n or k != claims.VARIES}, padding=claims.PADDING,
              seeds=_seed_rows(claims.seed_table(facts)))


def _seed_rows(t: claims.SeedTable | None) -> dict | None:
    """The claims at each seed as the report's table (✓ reproduced, ✗ not, – not testable), with the claims that
    change with the seed and the models that did not learn at each seed; None with one seed."""
    if t is None:
        return None
    rows = [[c, *(Styled(SEED_MARK[by[s]], VERDICT_CLASS[by[s]]) for s in t.seeds)] for c, by in t.verdicts.items()]
    return {"headers": ["claim", *(f"seed {s}" for s in t.seeds)], "rows": rows, "varying": t.varying(),
            "unlearned": {s: ", ".join(ms) for s, ms in t.unlearned.items() if ms}}


def section_grid(b: Builder) -> None:
    """Figure 2 as a table: every design of the paper's grid, ours beside the published values (a design at several
    seeds one row: the mean over them and their range); also grid.csv."""
    df = tables.grid_table(b.study)
    write_text(Layout(b.study.root).grid, df.to_csv(index=False))
    other = [p for p in b.study.lookup if p != claims.PADDING]
    several = bool((df.n_seeds > 1).any())
    rows = []
    for r in df.to_dict("records"):
        loss = f" (val. loss {r['pub_val_loss']:.3f})" if r["pub_val_loss"] == r["pub_val_loss"] else ""
        pub = (html.published(f"{r['model']}: {r['pub_mean']:.1f} / {r['pub_worst']:.1f} / {r['pub_gap']:.1f}{loss}")
               if r["pub_mean"] == r["pub_mean"] else "–")
        ours = [tables.seed_cell(r, k) for k in ("mean", "worst", "best", "gap")] if r["run"] else ["not run here"]
        ours += [r["periods"] if several else _int(r.get("detected_period")),
                 *(tables.seed_cell(r, "gap", f"{p}_") for p in other)] if r["run"] else [""] * (len(other) + 4)
        seeds = [f"{r['seeds']} ({r['learned']} learned)" if r["run"] else ""] if several else []
        rows.append([r["model"], *seeds, fmt(r["val_loss"], 3), *ours, pub])
    headers = ["model", *(["seeds"] if several else []), "val. loss", "mean", "worst", "best", "gap [95%]",
               "period", *(f"{p} gap [95%]" for p in other),
               html.published(f"{published.SOURCE}: mean / worst / gap (val. loss)")]
    b.section("grid", "The grid (Figure 2)", "grid.html", headers=headers, rows=rows, padding=claims.PADDING,
              models=[a if r else None for a, r in zip(df.alias, df.run, strict=True)], several=several)


def section_runs(b: Builder) -> None:
    df = tables.run_table(b.study)
    rows = [[r.model, Styled(r.alias, tag="code"), fmt(r.backbone), fmt(r.entries_per_record, 2), fmt(r.steps),
             fmt(r.tokens), fmt(r.seed), fmt(r.seconds, 0), fmt(r.val_loss, 3), str(r.status)] for r in df.itertuples()]
    data = b.study.manifest.get("data") or {}
    b.section("runs", "Models and training runs", "runs.html", rows=rows, models=list(df.alias),
              training=b.fig(figures.training(b.study, b.colors), "Training loss per model.", "training_loss"),
              data=str(data.get("description", data)) if data else None)


def _int(v) -> str:
    return "–" if v is None or v != v or not v else str(int(v))


def _p(v) -> str:
    return "–" if v is None or v != v else f"{v:.4f}"


def _summary_rows(df, published_rows: bool) -> list[list]:
    rows = []
    for r in df.itertuples():
        pub = published.counterpart(r.model) if published_rows else None
        p = published.LOOKUP_PREFIX.get(pub) if pub else None
        rows.append([r.model, fmt(r.val_loss, 3), fmt(r.mean), fmt(r.worst), fmt(r.best),
                     interval(r.gap, (r.gap_lo, r.gap_hi)), fmt(r.detected_period), _int(r.stride), _p(r.p_value),
                     fmt(r.profile), html.published(f"{pub}: {p[0]:.1f} / {p[1]:.1f} / {p[2]:.1f}") if p else "–"])
    return rows


def _padding_block(b: Builder, name: str, padding: str, stages: dict, primary: bool) -> dict:
    """One padding of a retrieval protocol: the summary table (published numbers beside ours where the paper
    has them), the accuracy by residue and the fold view (PNGs named by the padding alone for the primary
    protocol, else by protocol and padding)."""
    df = tables.summary_table(b.study, stages)
    first = next(iter(stages.values())).summary
    stem = padding if primary else f"{name}_{padding}"
    return {"padding": padding, "rows": _summary_rows(df, (name, padding) == published.PROTOCOL),
            "models": list(df.alias), "prompts": fmt(int(df.n.iloc[0])), "per_group": fmt(first["groups"][0]["n"]),
            "modulus": first.get("modulus"), "interval": first.get("interval", "bootstrap"),
            "residue": b.fig(figures.residue(b.study, stages, padding, b.colors),
                             f"Accuracy by target-key position mod {first.get('modulus')} ({padding} padding), 95% bands.",
                             f"accuracy_by_residue_{stem}"),
            "fold": b.fig(figures.fold(b.study, stages, padding, b.colors),
                          "Fold view: each compressed model's profile cut into stride periods and overlaid "
                          "(first period solid, later ones dashed); periodic weak spots line up.", f"fold_{stem}")}


def section_retrieval(b: Builder, name: str, primary: bool) -> None:
    """A retrieval protocol's evaluations under each padding; the primary (first) one holds the model selector."""
    variants = {pad: st for pad, st in b.study.evals.get(name, {}).items() if st}
    b.section(name, f"{name.capitalize()} accuracy by residue", "retrieval.html", name=name,
              selector=[(a, m.name, b.colors[a]) for a, m in b.study.models.items()] if primary else None,
              source=published.SOURCE, blocks=[_padding_block(b, name, p, st, primary) for p, st in variants.items()])


def _prompt(ex: dict, study: Study) -> dict:
    """An example prompt: its words with their marks (target, answer, query) and each model's answer."""
    marks = {i: cls for cls, idx in ex.get("highlight", {}).items() for i in idx}
    answers = ex.get("answers", [])
    rows = [[study.models[a["alias"]].name if a["alias"] in study.models else a["alias"], Styled(a["pred"], tag="code"),
             Styled("right", "pass") if a["correct"] else Styled("wrong", "fail"), fmt(100 * a["prob"])] for a in answers]
    return {"title": ex.get("title", ""), "words": [(w, marks.get(i)) for i, w in enumerate(ex["words"])],
            "rows": rows, "models": [a["alias"] for a in answers]}


def section_examples(b: Builder) -> None:
    if not b.study.examples:
        return b.missing("examples", "Example prompts", "example prompts", "phasekv demo")
    b.section("examples", "Example prompts", "examples.html", examples=[_prompt(ex, b.study) for ex in b.study.examples])


def section_flip(b: Builder) -> None:
    study = b.study
    if not study.flip:
        return b.missing("flip", "Filler sweep", "filler sweep", "phasekv eval flip")
    rows = []
    for alias, st in study.flip.items():
        s = st.summary
        changes = sum(sum(a != b for a, b in zip(f["winners"], f["winners"][1:], strict=False))
                      for f in s.get("families", {}).values())
        rows.append([study.models[alias].name, fmt(s.get("stride")), fmt(s.get("rankings")), fmt(changes),
                     fmt(s.get("follow_pattern")), fmt(s.get("switching"))])
    b.section("flip", "Filler sweep", "flip.html", rows=rows, models=list(study.flip),
              candidates=next(iter(study.flip.values())).summary.get("candidates", []),
              sweep=b.fig(figures.flip(study, b.colors), "Probability of the first candidate as filler is added one "
                          "token at a time; select a model to mark its stride.", "flip_sweep"))


def section_knockout(b: Builder) -> None:
    study = b.study
    figs = [b.fig(figures.knockout(st, study.models[alias].name),
                  f"{study.models[alias].name}: relative accuracy change when one KV head's query-head outputs at the "
                  "final position are replaced by their calibration mean (red lost, blue gained, clipped ±100%).",
                  f"knockout_{alias}")
            for alias, st in study.analyses.get("knockout", {}).items() if st.results is not None]
    b.section("knockout", "Knockout maps", "figures.html", figures=[f for f in figs if f],
              missing=("knockouts", "phasekv analyze knockout"))


def section_gates(b: Builder) -> None:
    study = b.study
    plane = figures.gate_plane(study, b.colors)
    if plane is None:
        return b.missing("gates", "Gate concentration", "gate statistics", "phasekv analyze gates")
    rows = []
    for alias, st in study.analyses.get("gates", {}).items():
        m = study.models[alias]
        if st.results is None or "static" not in st.results or not m.learned_gates:
            continue
        for r in tables.gate_points(st).itertuples():
            rows.append([m.name, fmt(int(r.layer)), fmt(int(r.kv_head)), fmt(r.static, 2), fmt(r.per_window, 2)])
    b.section("gates", "Gate concentration", "gates.html", rows=rows, plane=b.fig(
        plane, "Each point is one KV head's key gate at the end of training: static effective number of offsets "
        "(horizontal) against the per-window one (vertical). Dashed: the diagonal (same scores in every window); "
        "dotted: the right edge W (uniform on average). Lines: training paths from step 1 (open circle). Uniform "
        "averaging has no gate and is omitted.", "gate_plane"))


def section_alignment(b: Builder) -> None:
    figs = [b.fig(figures.alignment(b.study, alias), f"{m.name}: per KV head, the key gate's static concentration, "
                  "the mean key and value gate scores by phase relative to uniform (value shifted back one offset), and "
                  "the knockout effect by phase.", f"alignment_{alias}") for alias, m in b.study.models.items()]
    b.section("alignment", "Gate preferences vs knockout losses", "figures.html", figures=[f for f in figs if f],
              missing=("gate statistics with knockouts", "phasekv analyze gates / knockout"))


def section_cycle(b: Builder) -> None:
    study = b.study
    r2 = b.fig(figures.r2(study), "R² of predicted against observed accuracy change per model and δ (published "
               f"range: {published.CYCLING_R2[0]:.2f}–{published.CYCLING_R2[1]:.2f}, labelled published, not measured "
               "here).", "cycling_r2")
    grid = tables.r2_grid(study)
    rows = [] if grid is None else [
        [study.models[r.alias].name if r.alias in study.models else r.alias, f"{r.delta:+d}", fmt(r.r2, 2),
         f"[{fmt(r.lo, 2)}, {fmt(r.hi, 2)}]"] for r in grid.itertuples()]
    cycles = [b.fig(figures.cycle(study, alias), "Observed accuracy after cycling the gates by δ (solid) against the "
                    "prediction A₀((r − δ) mod S) (dashed).", f"cycling_{alias}") for alias in study.analyses.get("cycle", {})]
    cycles = [f for f in cycles if f]
    if r2 is None and grid is None and not cycles:
        return b.missing("cycling", "Gate cycling", "gate cycling", "phasekv analyze cycle")
    b.section("cycling", "Gate cycling", "cycling.html", r2=r2, rows=rows, cycles=cycles)


def section_theory(b: Builder) -> None:
    found = [{"name": name, "summary": st.summary,
                "images": [b.image(png, f"theory_{name}_{png.stem}", f"{name}: {png.stem.replace('_', ' ')}")
                           for png in sorted(st.path.glob("*.png"))]} for name, st in b.study.theory.items()]
    if not found:
        return b.missing("theory", "Theory: the idealised induction model", "theory checks",
                         "phasekv theory minimisers|flow|coverage")
    b.section("theory", "Theory: the idealised induction model", "theory.html", checks=found)


def section_compare(b: Builder) -> None:
    st = b.study.compare
    if st is None or st.summary.get("schema") != "phasekv.compare/1":
        return b.missing("compare", "Cost and gap", "comparison", "phasekv compare")
    s = st.summary
    found = [CompareRow.from_dict(r) for r in s["models"]]
    rows = [[r.label + {"reference": " (ref)", "baseline": " (base)"}.get(r.role, ""), fmt(r.cache_rel, 3),
             fmt(r.cache_same_kv, 3), "–" if r.compression is None else f"{r.compression:.1f}×",
             fmt(r.train_cost_rel, 2), fmt(r.decode_cost_rel, 2), interval(r.mean, r.mean_ci),
             f"{fmt(r.worst)} ({r.worst_residue})", interval(r.gap, r.gap_ci), fmt(r.fold_consistency),
             fmt(r.detected_period), "yes" if r.pareto else ""] for r in found]
    b.section("compare", "Cost and gap", "compare.html", s=s, rows=rows, verdict="\n".join(verdict_lines(s)),
              models=[next((a for a, m in b.study.models.items() if m.name == r.model), None) for r in found],
              images=[b.image(png, f"compare_{png.stem}", "Gap against cache size (Pareto front marked)")
                      for png in sorted(st.path.glob("*.png"))])


def _repair_numbers(n: Lookup | None, with_p: bool = True) -> list[str]:
    """A model's lookup under one padding in the repair's table: mean and gap with their intervals, its detected
    period (with the periodicity test's p)."""
    if n is None:
        return ["–"] * 3
    period = f"{n.detected_period} ({fmt(n.periodicity_p, 4)})" if with_p else str(n.detected_period)
    return [interval(n.mean, n.mean_ci), interval(n.gap, n.gap_ci), period]


def section_repair(b: Builder) -> None:
    """The repair's goals (`phasekv repair`): every design against every goal, the misses by how much, the frontier."""
    r = b.study.repair
    if r is None:
        return  # a demo or study directory without a repair sweep: no section
    ref = r.reference_numbers
    rows = [[r.reference + " (reference)", "1", "1", "–", "–",
             *(x for p in PADDINGS for x in _repair_numbers(ref.get(p), with_p=False)), ""]]
    rows += [[m.label + (" (unrepaired)" if m.role == "unrepaired" else ""), fmt(m.cache_ref, 4), fmt(m.cache_rel, 4),
              fmt(m.train_rel, 2), fmt(m.decode_rel, 2), *(x for p in PADDINGS for x in _repair_numbers(m.paddings.get(p))),
              Styled("every goal met", "pass") if m.meets else Styled("; ".join(m.misses), "fail")] for m in r.models]
    designs = [d for d in r.designs if d.role == "design"]
    measured = [replace(d.measured, design=d.design) for d in designs if d.measured is not None]  # the seed record's
    png = b.study.root / "repair" / "frontier.png"
    b.section("repair", "Repair", "repair.html", r=r, seeds=rule_text(r.goals.seeds), rows=rows,
              seed_rows=[_seed_row(d) for d in [*designs, *measured, *(r.kept or [])]],
              frontier=b.image(png, "repair_frontier", "The repair's frontier: gap against step cost, both paddings")
              if png.is_file() else None)


def _seed_row(d: Seeds) -> list[str]:
    """A design's seed distribution (`phasekv.mitigate.repair.seed_distribution`) as a table row."""
    lo, hi = d.rate_ci
    fresh = fresh_counts(d)
    return [d.design + ("" if d.source is None else f" (measured by {d.source})"), fmt(d.cache_ref, 4),
            fmt(d.cache_rel, 4), f"{len(d.meeting_seeds)} / {len(d.seeds)}", f"{100 * lo:.0f}-{100 * hi:.0f}%",
            "–" if d.meeting_but_cache is None else f"{len(d.meeting_but_cache)} / {len(d.seeds)}",
            ", ".join(map(str, d.failing_seeds)) or "none", "–" if d.worst is None else worst_text(d.worst),
            "–" if fresh is None else f"{fresh[1]} (seeds {fresh[0]})"]


def section_family(b: Builder) -> None:
    """The grid family (`phasekv study --family`): each design's lookup tested at its grid periods beside the
    baselines, its knockouts, a plain sentence each; also report/family.md. No section without the family's
    analyses."""
    parts = family.tables(b.study)
    if not parts:
        return
    write_text(Layout(b.study.root).report / "family.md", family.family_markdown(b.study))
    b.section("family", "The family", "family.html", sentences=family.sentences(b.study), tables=parts)


def section_needle(b: Builder) -> None:
    """The long-context regime (`phasekv study --needle`, DIR/needle.json): the controls' table (each model's needle
    audit at 1x, 2x and 4x its training length) and, per model, accuracy by residue at the training length with its
    Wilson band and the fold mod the stride (the audit's figure). No section without needle.json."""
    result = needle.load(b.study.root)
    if result is None:
        return
    rows, n = result["controls"], result["train_len"] - 1
    audits = [b.fig(audit_figure(summary, v), f"{model}: needle accuracy by the target's residue at {n:,} tokens (95% "
                    f"Wilson band, weakest residues circled) and the fold mod {v['stride']}; audit {v['verdict']} (exit "
                    f"{v['exit_code']}).", f"needle-{alias}") for model, alias, summary, v in needle.audits(b.study.root, rows, n)]
    b.section("needle", "Long context", "needle.html", train_len=result["train_len"], rows=[needle.cells(r) for r in rows],
              headers=needle.HEADERS, chance=100 * rows[0]["chance"] if rows else None, audits=audits)


def section_presses(b: Builder) -> None:
    """Inference-time compression (`phasekv eval presses`, DIR/presses/): a full-attention model's lookup under
    kvpress presses beside the uncompressed model, a sentence per press. No section without the table."""
    table = presses.load_table(b.study.root)
    if table is None:
        return
    b.section("presses", "Inference-time compression", "presses.html", table=table, findings=presses.findings(table),
              headers=presses.HEADERS, rows=[presses.cells(r) for r in table["rows"]])


def section_published(b: Builder) -> None:
    b.section("published", "Published numbers (for comparison)", "published.html",
              lookup=[[html.published(k), *(f"{x:.1f}" for x in v)] for k, v in published.LOOKUP_PREFIX.items()],
              needle=[[html.published(k), f"{v:.1f}"] for k, v in published.NEEDLE_GAP.items()],
              baseline_max=published.BASELINE_GAP_MAX, compressed_max=published.COMPRESSED_GAP_MAX,
              cycling=published.CYCLING_R2)


def render_report(root: str | os.PathLike, progress: bool = True) -> Path:
    """Render ROOT/report/index.html and ROOT/report/figures/*.png; returns the index path."""
    study = load_study(root)
    if not study.has_results() and not study.models:
        raise DataError(f"{root}: no results to report (expected runs/, eval/, analysis/ or theory/ inside)")
    out = Layout(root).report
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    b = Builder(study, fig_dir)
    t0 = time.time()
    retrieval = [p.name for p in retrieval_protocols() if p.study]
    steps = [("claims", section_claims), ("grid", section_grid), ("verdicts", section_verdicts), ("runs", section_runs),
             *((n, partial(section_retrieval, name=n, primary=i == 0)) for i, n in enumerate(retrieval)),
             *((f.__name__.removeprefix("section_"), f) for f in (
                 section_examples, section_flip, section_knockout, section_gates, section_alignment, section_cycle,
                 section_compare, section_repair, section_family, section_needle, section_presses, section_theory,
                 section_published))]
    with Progress(disable=not progress, transient=True) as prog:
        task = prog.add_task("report", total=len(steps))
        for label, step in steps:
            prog.update(task, description=f"report: {label}")
            step(b)
            prog.advance(task)
    loads = [x for r in study.manifest.get("invocations", []) for x in r.get("load_average", [])]
    page = html.render("page.html", m=study.manifest, loads=loads, root=str(study.root), sections=b.sections,
                       seconds=time.time() - t0, css=html.static("report.css"), script=html.static("report.js"),
                       plotly=html.Markup(get_plotlyjs()))
    return write_text(out / "index.html", page)
