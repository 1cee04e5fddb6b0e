"""`phasekv report DIR`: render DIR/report/index.html (one self-contained file) and DIR/report/figures/*.png
from the results files of a study directory (see `phasekv.report.layout`)."""

from __future__ import annotations

import os
import shutil
import time
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
from phasekv.mitigate.repair import fresh_counts, rule_text
from phasekv.progress import Progress
from phasekv.report import checks, claims, family, figures, html, needle, published, tables
from phasekv.report.html import esc, fmt
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

    def fig(self, figure: Figure | None, caption: str, name: str) -> str:
        """The figure as figures/NAME.png and as an interactive plot in the page ("" when there is none)."""
        if figure is None:
            return ""
        png = to_png(figure, self.png_path(name))
        self.pngs.append(png)
        self.n_fig += 1
        return html.figure(f"fig{self.n_fig}", to_plotly(figure), caption, f"figures/{png.name}")

    def png_path(self, name: str) -> Path:
        return self.fig_dir / f"{name}.png"


def missing(what: str, command: str) -> str:
    return f'<p class="missing">No {what} in this directory (run <code>{esc(command)}</code>, or <code>phasekv demo</code>).</p>'


def _check_rows(items: list[checks.Check]) -> str:
    rows = []
    for c in items:
        verdict = ('<span class="na">not checked</span>' if c.passed is None else
                   '<span class="pass">shown</span>' if c.passed else '<span class="fail">not shown</span>')
        rows.append([esc(c.claim), verdict, esc(c.detail)])
    return html.table(["claim", "verdict", "numbers"], rows, cls="checks")


def section_verdicts(b: Builder) -> None:
    parts = []
    for group, items in checks.all_checks(b.study).items():
        if items:
            parts.append(f"<h3>{esc(group)}</h3>{_check_rows(items)}")
    body = "".join(parts) or missing("results", "phasekv demo")
    intro = ("<p>Every line is computed from this directory's results files: <em>shown</em> means the "
             "measured numbers (with their 95% intervals) support the claim, <em>not shown</em> means they do "
             "not. Nothing here is copied from the paper.</p>")
    b.add("verdicts", "What these numbers show", intro + body)


VERDICT_CLASS = {claims.REPRODUCED: "pass", claims.NOT_REPRODUCED: "fail", claims.UNTESTABLE: "na"}


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
    found = claims.verdicts(claims.facts(b.study))
    write_json(Layout(b.study.root).claims, [v.to_dict() for v in found], indent=1)
    rows = [[f"<b>{v.claim}</b>", f'<span class="published">{esc(published.CLAIMS[v.claim])}</span>',
             f'<span class="{VERDICT_CLASS[v.verdict]}">{esc(v.verdict)}</span>', esc(v.reason),
             f'<span class="published">{esc(_published_text(v.evidence)) or "–"}</span>'] for v in found]
    body = html.table(["", '<span class="published">claim (the paper\'s words)</span>', "verdict",
                       "measured here (95% intervals)", f'<span class="published">{esc(published.SOURCE)}</span>'],
                      rows, cls="checks")
    tally = {k: sum(v.verdict == k for v in found) for k in VERDICT_CLASS}
    body += (f"<p>{tally[claims.REPRODUCED]} reproduced, {tally[claims.NOT_REPRODUCED]} not reproduced, "
             f"{tally[claims.UNTESTABLE]} not testable here. Each verdict is computed from this directory's results "
             f"by a stated rule (<code>phasekv.report.claims</code>), under {claims.PADDING} padding unless the claim "
             "names both; published numbers are shown beside ours, never used as results. Also in "
             "<code>claims.json</code> beside this page.</p>")
    b.add("claims", "The study's claims", body)


def section_grid(b: Builder) -> None:
    """Figure 2 as a table: every run of the paper's grid, ours beside the published values; also grid.csv."""
    df = tables.grid_table(b.study)
    write_text(Layout(b.study.root).grid, df.to_csv(index=False))
    other = [p for p in b.study.lookup if p != claims.PADDING]

    rows = []
    for r in df.to_dict("records"):
        loss = f" (val. loss {r['pub_val_loss']:.3f})" if r["pub_val_loss"] == r["pub_val_loss"] else ""
        pub = (f'<span class="published">{esc(r["model"])}: {r["pub_mean"]:.1f} / {r["pub_worst"]:.1f} / '
               f'{r["pub_gap"]:.1f}{loss}</span>') if r["pub_mean"] == r["pub_mean"] else "–"
        ours = [fmt(r.get(k)) for k in ("mean", "worst", "best")] if r["run"] else ["not run here", "", ""]
        rows.append([esc(r["model"]), fmt(r["val_loss"], 3), *ours, tables.gap_text(r) if r["run"] else "",
                     _int(r.get("detected_period")) if r["run"] else "",
                     *(tables.gap_text(r, f"{p}_") if r["run"] else "" for p in other), pub])
    heads = ["model", "val. loss", "mean", "worst", "best", "gap [95%]", "period",
             *(f"{esc(p)} gap [95%]" for p in other),
             f'<span class="published">{esc(published.SOURCE)}: mean / worst / gap (val. loss)</span>']
    body = html.table(heads, rows, [a if r else None for a, r in zip(df.alias, df.run, strict=True)])
    body += (f"<p>Lookup, {claims.PADDING} padding unless named; gap = best − worst residue group, cross-fitted "
             "(so noise does not inflate it) with a bootstrap 95% interval over key–name mappings. Also in "
             "<code>grid.csv</code> beside this page.</p>")
    spread = tables.seed_spread(df)
    if spread is not None:
        body += (f"<p>Seed-to-seed spread of W8/S8 · 1 KV over {int(spread.seeds.iloc[0])} seed(s): "
                 f"{tables.spread_text(spread)}.</p>")
    b.add("grid", "The grid (Figure 2)", body)


def section_runs(b: Builder) -> None:
    df = tables.run_table(b.study)
    rows = [[esc(r.model), f"<code>{esc(r.alias)}</code>", fmt(r.backbone), fmt(r.entries_per_record, 2),
             fmt(r.steps), fmt(r.tokens), fmt(r.seed), fmt(r.seconds, 0), fmt(r.val_loss, 3), esc(str(r.status))]
            for r in df.itertuples()]
    body = html.table(["model", "alias", "backbone", "entries / record", "steps", "tokens", "seed", "train time (s)",
                       "validation loss", "status"], rows, list(df.alias))
    body += ("<p>Entries per record: compressed entries all layers and KV heads write per key–name record of a "
             "dense prompt (layers × KV heads × 2 / S). Below 1 a W = S model keeps some offsets and loses the "
             "rest, so its phase profile is all-or-nothing; the study's 28-layer W8/S8 · 1 KV has 7 and a graded "
             "profile (the retrieval tables say which each model shows).</p>")
    body += b.fig(figures.training(b.study, b.colors), "Training loss per model.", "training_loss")
    m = b.study.manifest
    if m:
        data = m.get("data") or {}
        body += ("<p>Data: " + esc(str(data.get("description", data))) + "</p>") if data else ""
    b.add("runs", "Models and training runs", body)


def _int(v) -> str:
    return "–" if v is None or v != v or not v else str(int(v))


def _p(v) -> str:
    return "–" if v is None or v != v else f"{v:.4f}"


def _summary_rows(df, published_rows: bool) -> tuple[list[list[str]], list[str]]:
    rows = []
    for r in df.itertuples():
        pub = published.counterpart(r.model) if published_rows else None
        p = published.LOOKUP_PREFIX.get(pub) if pub else None
        rows.append([
            esc(r.model), fmt(r.val_loss, 3), fmt(r.mean), fmt(r.worst), fmt(r.best),
            f"{fmt(r.gap)} [{fmt(r.gap_lo)}, {fmt(r.gap_hi)}]", fmt(r.detected_period),
            _int(r.stride), _p(r.p_value), fmt(r.profile),
            f'<span class="published">{esc(pub)}: {p[0]:.1f} / {p[1]:.1f} / {p[2]:.1f}</span>' if p else "–",
        ])
    return rows, list(df.alias)


def _selector(b: Builder) -> str:
    buttons = "".join(
        f'<button data-model="{esc(a)}"><span class="swatch" style="background:{b.colors[a]}"></span>'
        f"{esc(m.name)}</button>" for a, m in b.study.models.items())
    return (f'<div id="model-selector"><button data-model="all" class="active">all models</button>{buttons}</div>'
            "<p>Select a model (buttons or table rows) to plot it against the others in grey and to mark its "
            "stride's period boundaries (dashed).</p>")


def _padding_block(b: Builder, name: str, padding: str, stages: dict, primary: bool) -> str:
    """One padding of a retrieval protocol: the summary table (published numbers beside ours where the paper
    has them), the accuracy by residue and the fold view (PNGs named by the padding alone for the primary
    protocol, else by protocol and padding)."""
    study = b.study
    df = tables.summary_table(study, stages)
    rows, models = _summary_rows(df, (name, padding) == published.PROTOCOL)
    first = next(iter(stages.values())).summary
    body = f"<h3>{esc(padding)} padding</h3>"
    body += html.table(
        ["model", "val. loss", "mean", "worst", "best", "gap [95% CI]", "detected period", "stride",
         "periodicity p", "phase profile", f'<span class="published">{esc(published.SOURCE)}: mean / worst / gap</span>'],
        rows, models)
    interval = first.get("interval", "bootstrap")
    body += (f"<p>Accuracy in percent over {fmt(int(df.n.iloc[0]))} prompts per model "
             f"({fmt(first['groups'][0]['n'])} per residue group, M = {first.get('modulus')}); gap = best − worst "
             f"group, cross-fitted (picked on half the key–name mappings, measured on the other half) so noise "
             f"does not inflate it; its interval is a bootstrap over key–name mappings; group bands: {esc(interval)}. "
             "Phase profile: the profile folded mod S is graded (3 or more phases between 20% and 90%, as in the "
             "study), flat (all phases within 20 points) or all-or-nothing (phases kept or lost). "
             "Published values are the paper's Qwen3-0.6B-shaped models (not run here) and only the "
             "pattern, not the level, is comparable with these tiny models.</p>")
    stem = padding if primary else f"{name}_{padding}"
    body += b.fig(figures.residue(study, stages, padding, b.colors),
                  f"Accuracy by target-key position mod {first.get('modulus')} ({esc(padding)} padding), 95% bands.",
                  f"accuracy_by_residue_{stem}")
    body += b.fig(figures.fold(study, stages, padding, b.colors),
                  "Fold view: each compressed model's profile cut into stride periods and overlaid "
                  "(first period solid, later ones dashed); periodic weak spots line up.", f"fold_{stem}")
    return body


def section_retrieval(b: Builder, name: str, primary: bool) -> None:
    """A retrieval protocol's evaluations under each padding; the primary (first) one holds the model selector."""
    body = _selector(b) if primary else ""
    variants = {pad: st for pad, st in b.study.evals.get(name, {}).items() if st}
    for padding, stages in variants.items():
        body += _padding_block(b, name, padding, stages, primary)
    if not variants:
        body += missing(f"{name} evaluation", f"phasekv eval {name}")
    b.add(name, f"{name.capitalize()} accuracy by residue", body)


def _prompt_html(ex: dict, study: Study) -> str:
    marks = {i: cls for cls, idx in ex.get("highlight", {}).items() for i in idx}
    words = [f'<mark class="{marks[i]}">{esc(w)}</mark>' if i in marks else esc(w) for i, w in enumerate(ex["words"])]
    out = f'<p>{esc(ex.get("title", ""))}</p><div class="prompt">{" ".join(words)}</div>'
    answers = ex.get("answers", [])
    if answers:
        rows = [[esc(study.models[a["alias"]].name if a["alias"] in study.models else a["alias"]),
                 f"<code>{esc(a['pred'])}</code>", '<span class="pass">right</span>' if a["correct"]
                 else '<span class="fail">wrong</span>', fmt(100 * a["prob"])]
                for a in answers]
        out += html.table(["model", "top-1 answer", "", "P(right name) %"], rows, [a["alias"] for a in answers])
    return out


def section_examples(b: Builder) -> None:
    exs = b.study.examples
    if not exs:
        b.add("examples", "Example prompts", missing("example prompts", "phasekv demo"))
        return
    body = ('<p>Words as the model sees them (one token each). <mark class="target" style="background:#ffd54f">'
            'target key</mark>, <mark class="answer" style="background:#a5d6a7">answer</mark>, '
            '<mark class="query" style="background:#90caf9">query</mark>.</p>')
    body += "".join(_prompt_html(ex, b.study) for ex in exs)
    b.add("examples", "Example prompts", body)


def section_flip(b: Builder) -> None:
    study = b.study
    if not study.flip:
        b.add("flip", "Filler sweep", missing("filler sweep", "phasekv eval flip"))
        return
    rows = []
    for alias, st in study.flip.items():
        s = st.summary
        fams = s.get("families", {})
        changes = sum(sum(a != b for a, b in zip(f["winners"], f["winners"][1:], strict=False))
                      for f in fams.values())
        rows.append([esc(study.models[alias].name), fmt(s.get("stride")), fmt(s.get("rankings")), fmt(changes),
                     fmt(s.get("follow_pattern")), fmt(s.get("switching"))])
    body = html.table(["model", "stride", "rankings (family × length)", "top-candidate changes",
                       "rankings following length mod S", "winner switches with phase"], rows, list(study.flip))
    cands = next(iter(study.flip.values())).summary.get("candidates", [])
    body += (f"<p>Candidates: {', '.join(f'<code>{esc(c)}</code>' for c in cands)} (the first is the right answer). "
             "A ranking follows the pattern when its winner is the majority winner of its phase L mod S; a model "
             "whose winner never changes follows it trivially, so read it together with the changes column.</p>")
    body += b.fig(figures.flip(study, b.colors),
                  "Probability of the first candidate as filler is added one token at a time; select a model to "
                  "mark its stride.", "flip_sweep")
    b.add("flip", "Filler sweep", body)


def section_knockout(b: Builder) -> None:
    study, body = b.study, ""
    for alias, st in study.analyses.get("knockout", {}).items():
        m = study.models[alias]
        if st.results is None:
            continue
        body += b.fig(figures.knockout(st, m.name),
                      f"{esc(m.name)}: relative accuracy change when one KV head's query-head outputs at the final "
                      "position are replaced by their calibration mean (red lost, blue gained, clipped ±100%).",
                      f"knockout_{alias}")
    b.add("knockout", "Knockout maps", body or missing("knockouts", "phasekv analyze knockout"))


def section_gates(b: Builder) -> None:
    study = b.study
    plane = figures.gate_plane(study, b.colors)
    if plane is None:
        b.add("gates", "Gate concentration", missing("gate statistics", "phasekv analyze gates"))
        return
    body = b.fig(plane, "Each point is one KV head's key gate at the end of training: static effective number of "
                 "offsets (horizontal) against the per-window one (vertical). Dashed: the diagonal (same scores in "
                 "every window); dotted: the right edge W (uniform on average). Lines: training paths from step 1 "
                 "(open circle). Uniform averaging has no gate and is omitted.", "gate_plane")
    rows = []
    for alias, st in study.analyses.get("gates", {}).items():
        m = study.models[alias]
        if st.results is None or "static" not in st.results or not m.learned_gates:
            continue
        for r in tables.gate_points(st).itertuples():
            rows.append([esc(m.name), fmt(int(r.layer)), fmt(int(r.kv_head)), fmt(r.static, 2), fmt(r.per_window, 2)])
    body += html.table(["model", "layer", "KV head", "static (key)", "per-window (key)"], rows)
    b.add("gates", "Gate concentration", body)


def section_alignment(b: Builder) -> None:
    study, body = b.study, ""
    for alias, m in study.models.items():
        fig = figures.alignment(study, alias)
        if fig is None:
            continue
        body += b.fig(fig, f"{esc(m.name)}: per KV head, the key gate's static concentration, the mean key and "
                      "value gate scores by phase relative to uniform (value shifted back one offset), and the "
                      "knockout effect by phase.", f"alignment_{alias}")
    b.add("alignment", "Gate preferences vs knockout losses",
          body or missing("gate statistics with knockouts", "phasekv analyze gates / knockout"))


def section_cycle(b: Builder) -> None:
    study = b.study
    body = b.fig(figures.r2(study), "R² of predicted against observed accuracy change per model and δ "
                 f"(published range: {published.CYCLING_R2[0]:.2f}–{published.CYCLING_R2[1]:.2f}, labelled "
                 "published, not measured here).", "cycling_r2")
    grid = tables.r2_grid(study)
    if grid is not None:
        rows = [[esc(study.models[r.alias].name if r.alias in study.models else r.alias), f"{r.delta:+d}",
                 fmt(r.r2, 2), f"[{fmt(r.lo, 2)}, {fmt(r.hi, 2)}]"] for r in grid.itertuples()]
        body += html.table(["model", "δ", "R²", "95% CI"], rows)
    for alias in study.analyses.get("cycle", {}):
        body += b.fig(figures.cycle(study, alias),
                      "Observed accuracy after cycling the gates by δ (solid) against the prediction "
                      "A₀((r − δ) mod S) (dashed).", f"cycling_{alias}")
    b.add("cycling", "Gate cycling", body or missing("gate cycling", "phasekv analyze cycle"))


def section_theory(b: Builder) -> None:
    study, body = b.study, ""
    for check, st in study.theory.items():
        s = st.summary
        verdict = s.get("claim_reproduced")
        tag = '<span class="na">not stated</span>' if verdict is None else (
            '<span class="pass">reproduced</span>' if verdict else '<span class="fail">not reproduced</span>')
        body += f"<h3>{esc(check)}: {esc(s.get('check', ''))} — {tag}</h3>"
        if s.get("method"):
            body += f"<p>{esc(s['method'])}</p>"
        for png in sorted(st.path.glob("*.png")):
            dest = b.png_path(f"theory_{check}_{png.stem}")
            shutil.copyfile(png, dest)
            b.pngs.append(dest)
            body += html.image(png, f"{esc(check)}: {esc(png.stem.replace('_', ' '))}", f"figures/{dest.name}")
    b.add("theory", "Theory: the idealised induction model",
          body or missing("theory checks", "phasekv theory minimisers|flow|coverage"))


def section_compare(b: Builder) -> None:
    st = b.study.compare
    if st is None or st.summary.get("schema") != "phasekv.compare/1":
        b.add("compare", "Cost and gap", missing("comparison", "phasekv compare"))
        return
    s = st.summary

    def ci(r, k):
        lo, hi = r.get(f"{k}_ci") or (None, None)
        return f"{fmt(r[k])} [{fmt(lo)}, {fmt(hi)}]"

    rows = [[esc(r["label"]) + {"reference": " (ref)", "baseline": " (base)"}.get(r["role"], ""),
             fmt(r.get("cache_rel"), 3), fmt(r.get("cache_same_kv"), 3),
             "–" if r.get("compression") is None else f"{r['compression']:.1f}×",
             fmt(r.get("train_cost_rel"), 2), fmt(r.get("decode_cost_rel"), 2), ci(r, "mean"),
             f"{fmt(r['worst'])} ({r.get('worst_residue')})", ci(r, "gap"), fmt(r.get("fold_consistency")),
             fmt(r.get("detected_period")), "yes" if r.get("pareto") else ""] for r in s["models"]]
    aliases = [next((a for a, m in b.study.models.items() if m.name == r["model"]), None) for r in s["models"]]
    body = html.table(["model", "cache / reference", "/ same KV heads", "compression", "train cost", "decode cost", "mean [95%]",
                       "worst (residue)", "gap [95%]", "fold", "period", "Pareto"], rows, aliases)
    body += (f"<p>{esc(s['task'])}, {esc(s['protocol'])} padding; cache bytes at {s['context']:,} tokens and costs "
             f"relative to the reference {esc(s.get('reference') or 'full attention')} (the model a design replaces; "
             "beside it, the cache relative to full attention with the model's own KV heads), costs measured in one "
             "process, interleaved.</p>")
    body += "<pre>" + esc("\n".join(verdict_lines(s))) + "</pre>"
    for png in sorted(st.path.glob("*.png")):
        dest = b.png_path(f"compare_{png.stem}")
        shutil.copyfile(png, dest)
        b.pngs.append(dest)
        body += html.image(png, "Gap against cache size (Pareto front marked)", f"figures/{dest.name}")
    b.add("compare", "Cost and gap", body)


def section_repair(b: Builder) -> None:
    """The repair's goals (`phasekv repair`): every design against every goal, the misses by how much, the frontier."""
    r = b.study.repair
    if r is None:
        return  # a demo or study directory without a repair sweep: no section
    g = r["goals"]

    def ci(n, k):
        return f"{fmt(n[k])} [{fmt(n[f'{k}_ci'][0])}, {fmt(n[f'{k}_ci'][1])}]"

    def padding(m, p):
        n = m["paddings"].get(p)
        if n is None:
            return ["–"] * 3
        return [ci(n, "mean"), ci(n, "gap"), f"{n['detected_period']} ({fmt(n['periodicity_p'], 4)})"]

    rows = [[esc(m["label"]) + (" (unrepaired)" if m["role"] == "unrepaired" else ""), fmt(m["cache_ref"], 4),
             fmt(m["cache_rel"], 4), fmt(m["train_rel"], 2), fmt(m["decode_rel"], 2), *padding(m, "prefix"), *padding(m, "in-sequence"),
             '<span class="pass">every goal met</span>' if m["meets"] else
             '<span class="fail">' + esc("; ".join(m["misses"])) + "</span>"] for m in r["models"]]
    ref = r["reference_numbers"]
    rows.insert(0, [esc(r["reference"]) + " (reference)", "1", "1", "–", "–",
                    *(x for p in ("prefix", "in-sequence") for x in (
                        [ci(ref[p], "mean"), ci(ref[p], "gap"), f"{ref[p]['detected_period']}"] if p in ref else
                        ["–"] * 3)), ""])
    body = (f"<p>Goals: cache ≤ {g['max_cache']:g} of the reference's ({esc(r['reference'])}: the smallest "
            "full-attention model that meets the accuracy goals, the model a design replaces; the ratio to full "
            f"attention with the same KV heads beside it); under both paddings {esc(r['rule'])}, the periodicity "
            f"test and detected period reported, not a goal; mean within {g['max_mean_drop']:g} points of the "
            f"reference's; training and decode step ≤ {g['max_cost']:g}× the unrepaired model's (measured side by "
            f"side). Seeds: {rule_text(g['seeds'])}.</p>")
    body += html.table(["model", "cache vs reference", "vs same KV heads", "train", "decode", "prefix mean [95%]",
                        "gap [95%]", "period (p)", "in-seq. mean [95%]", "gap [95%]", "period (p)", "goals"], rows)
    designs = [d for d in r["designs"] if d.get("role") == "design"]
    measured = [d["measured"] | {"design": d["design"]} for d in designs if "measured" in d]  # the seed record's
    body += html.table(["design", "cache vs reference", "vs same KV heads", "seeds meeting every goal",
                        "95% exact interval", "every goal but the cache", "failing seeds", "worst seed",
                        "fresh seeds: every goal but the cache"],
                       [_seed_row(d) for d in [*designs, *measured, *r.get("kept", [])]])
    cls = "pass" if r["repaired"] else "fail"
    body += f'<p><b>Verdict:</b> <span class="{cls}">{esc(r["verdict"])}</span></p>'
    png = b.study.root / "repair" / "frontier.png"
    if png.is_file():
        dest = b.png_path("repair_frontier")
        shutil.copyfile(png, dest)
        b.pngs.append(dest)
        body += html.image(png, "The repair's frontier: gap against step cost, both paddings", f"figures/{dest.name}")
    b.add("repair", "Repair", body)


def _seed_row(d: dict) -> list[str]:
    """A design's seed distribution (`phasekv.mitigate.repair.seed_distribution`) as a table row."""
    lo, hi = d["rate_ci"]
    w = d["worst"]
    worst = "–" if w is None else (f"{w['seed']}: {w['padding']} gap {fmt(w['gap'])} [{fmt(w['gap_ci'][0])}, "
                                   f"{fmt(w['gap_ci'][1])}], period {w['period']} (p {fmt(w['p'], 4)})")
    kept = f" (measured by {d['source']})" if "source" in d else ""
    flat = d.get("meeting_but_cache")
    fresh = fresh_counts(d)
    return [esc(d["design"] + kept), fmt(d["cache_ref"], 4), fmt(d["cache_rel"], 4),
            f"{len(d['meeting_seeds'])} / {len(d['seeds'])}", f"{100 * lo:.0f}-{100 * hi:.0f}%",
            "–" if flat is None else f"{len(flat)} / {len(d['seeds'])}",
            ", ".join(map(str, d["failing_seeds"])) or "none", esc(worst),
            "–" if fresh is None else f"{fresh[1]} (seeds {fresh[0]})"]


def section_family(b: Builder) -> None:
    """The grid family (`phasekv study --family`): each design's lookup tested at its grid periods beside the
    baselines, its knockouts, a plain sentence each; also report/family.md. No section without the family's
    analyses."""
    parts = family.tables(b.study)
    if not parts:
        return
    write_text(Layout(b.study.root).report / "family.md", family.family_markdown(b.study))
    says = "".join(f"<li>{esc(s)}</li>" for s in family.sentences(b.study))
    body = (f"<ul>{says}</ul>" if says else "") + "".join(family.to_html(t) for t in parts)
    b.add("family", "The family", body + "<p>Also in <code>family.md</code> beside this page.</p>")


def section_needle(b: Builder) -> None:
    """The long-context regime (`phasekv study --needle`, DIR/needle.json): the controls' table (each model's needle
    audit at 1x, 2x and 4x its training length) and, per model, accuracy by residue at the training length with its
    Wilson band and the fold mod the stride (the audit's figure). No section without needle.json."""
    result = needle.load(b.study.root)
    if result is None:
        return
    rows, train_len = result["controls"], result["train_len"]
    head = (f"<p>Tiny models trained on the needle test's own task up to {train_len:,} tokens (each a chain of "
            "stages, <code>phasekv study --needle</code>), each audited with the needle test at 1x, 2x and 4x that "
            "length (Wilson intervals; flat: the gap's 95% upper bound under the margin δ). Chance: "
            f"{100 * rows[0]['chance']:.1f}% (one of the names) when the mean is read as a percentage.</p>"
            if rows else "")
    body = head + html.table([esc(h) for h in needle.HEADERS], [[esc(c) for c in needle.cells(r)] for r in rows])
    for model, alias, summary, v in needle.audits(b.study.root, rows, train_len - 1):
        body += b.fig(audit_figure(summary, v), f"{model}: needle accuracy by the target's residue at "
                      f"{train_len - 1:,} tokens (95% Wilson band, weakest residues circled) and the fold mod "
                      f"{v['stride']}; audit {v['verdict']} (exit {v['exit_code']}).", f"needle-{alias}")
    b.add("needle", "Long context", body + "<p>Also in <code>needle.md</code> beside the runs.</p>")


def section_presses(b: Builder) -> None:
    """Inference-time compression (`phasekv eval presses`, DIR/presses/): a full-attention model's lookup under
    kvpress presses beside the uncompressed model, a sentence per press. No section without the table."""
    table = presses.load_table(b.study.root)
    if table is None:
        return
    says = "".join(f"<li>{esc(s)}</li>" for s in presses.findings(table))
    head = (f"<p>{esc(table['model'])}: the lookup's context compressed at prefill by each press (kvpress), the "
            f"question after it uncompressed; {table['prompts']:,} prompts per evaluation. p (d): the residue "
            "profile's power at period d (permutation test); chunked presses lay a grid of their chunk length "
            "from cache index 0.</p>")
    body = html.table(presses.HEADERS, [[esc(c) for c in presses.cells(r)] for r in table["rows"]])
    b.add("presses", "Inference-time compression", head + f"<ul>{says}</ul>" + body)


def section_published(b: Builder) -> None:
    rows = [[f'<span class="published">{esc(k)}</span>', *(f"{x:.1f}" for x in v)]
            for k, v in published.LOOKUP_PREFIX.items()]
    body = ('<p class="published">These are the paper\'s numbers (its Figure 2 and table, its needle table, Figure 6), from Qwen3-0.6B-shaped models and '
            "DeepSeek models. They are not produced by this code and are shown only for comparison.</p>")
    body += "<h3>Controlled lookup, prefix padding (published)</h3>"
    body += html.table(['<span class="published">model (published)</span>', "mean", "worst", "gap"], rows)
    body += "<h3>Needle test, 128K tokens (published)</h3>"
    body += html.table(['<span class="published">model (published)</span>', "gap (points)"],
                       [[f'<span class="published">{esc(k)}</span>', f"{v:.1f}"] for k, v in published.NEEDLE_GAP.items()])
    body += (f'<p class="published">Published: full-attention baselines stay within {published.BASELINE_GAP_MAX} '
             f"points, compressed runs reach {published.COMPRESSED_GAP_MAX:.0f}; gate cycling R² excluding the "
             f"boundary phase {published.CYCLING_R2[0]:.2f}–{published.CYCLING_R2[1]:.2f}.</p>")
    b.add("published", "Published numbers (for comparison)", body)


def header(study: Study) -> str:
    m = study.manifest
    bits = []
    if m:
        bits.append(f"mode: {esc(str(m.get('mode', '?')))} · preset {esc(str(m.get('preset', '?')))}")
        if m.get("seconds") is not None:
            loads = [x for r in m.get("invocations", []) for x in r.get("load_average", [])]
            load = f" (1-min load average {min(loads):.1f}–{max(loads):.1f} while it ran)" if loads else ""
            bits.append(f"end-to-end wall-clock: {m['seconds'] / 60:.1f} min with {esc(str(m.get('threads', '?')))} "
                        f"thread(s){load} · {esc(str(m.get('machine', '')))}")
        if m.get("cpu_seconds") is not None:
            bits.append(f"single-core CPU time of all tasks: {m['cpu_seconds'] / 60:.1f} min, which "
                        f"{m.get('jobs', '?')} worker(s) finish in ≈ {m.get('idle_estimate_seconds', 0) / 60:.1f} min "
                        "on an otherwise idle machine (the demo's own schedule, replayed with CPU times)")
        if m.get("created"):
            bits.append(f"created {esc(m['created'])} · phasekv {esc(str(m.get('version', '')))}")
    bits.append(f"study directory: <code>{esc(str(study.root))}</code>")
    return "<h1>phasekv report: periodic weak spots of compressed KV caches</h1>" + "".join(f"<p>{x}</p>" for x in bits)


def _honest_note(study: Study) -> str:
    m = study.manifest
    note = ("These are tiny models trained for minutes on a CPU with phasekv's synthetic associative-recall data; "
            "the study's models are Qwen3-0.6B-shaped and trained on text. The report compares patterns (gap, "
            "period, fold), not levels, and says where the tiny models do not reproduce an effect.")
    if m.get("mode") == "quick":
        note += (" This is a --quick smoke run: models are trained for very few steps and evaluated on few prompts, "
                 "so most effects are expected NOT to show; run the full demo for the study's figures.")
    return f'<p class="note">{esc(note)}</p>'


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
    toc = '<nav class="toc">' + "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t, _ in b.sections) + "</nav>"
    body = _honest_note(study) + toc + "".join(f'<section id="{a}"><h2>{esc(t)}</h2>{h}</section>'
                                               for a, t, h in b.sections)
    body += (f'<p class="missing">Rendered in {time.time() - t0:.1f} s from the results files alone; PNG versions of '
             f"every figure are in <code>figures/</code> beside this file.</p>")
    page = html.page("phasekv report", header(study), body, get_plotlyjs())
    index = out / "index.html"
    return write_text(index, page)
