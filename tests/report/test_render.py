import json
import re
from html.parser import HTMLParser

import pytest

from phasekv.errors import DataError
from phasekv.report import checks, load_study, published, render_report


class _Text(HTMLParser):
    """Text and table cells of a page, ignoring <script> and <style> (what a reader without JS sees)."""

    def __init__(self):
        super().__init__()
        self.skip, self.text, self.cells, self.sections = 0, [], [], []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        if tag == "section":
            self.sections.append(dict(attrs).get("id"))

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip:
            self.text.append(data)


@pytest.fixture(scope="module")
def page(study_dir):
    html = (study_dir / "report" / "index.html").read_text()
    parser = _Text()
    parser.feed(html)
    return html, " ".join(parser.text), parser.sections


def test_every_section_is_present(page):
    _, _, sections = page
    assert sections == ["claims", "grid", "verdicts", "runs", "lookup", "examples", "flip", "knockout", "gates", "alignment",
                        "cycling", "compare", "theory", "published"]


def test_self_contained_no_network(page):
    html, _, _ = page
    assert "Plotly" in html and len(html) > 3_000_000  # plotly.js inlined
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)=["']https?://""", html)
    assert "<script src=" not in html


def test_tables_readable_without_javascript(page, study_dir):
    _, text, _ = page
    study = load_study(study_dir)
    s = study.lookup["prefix"]["w8s8-1kv"].summary
    # the W8/S8 row of the summary table, straight from its summary.json
    assert "W8/S8 · 1 KV" in text
    assert f"{s['gap']:.1f} [{s['gap_ci'][0]:.1f}, {s['gap_ci'][1]:.1f}]" in text
    assert f"{s['mean']:.1f}" in text


def test_published_numbers_labelled(page):
    html, text, _ = page
    assert "published (paper)" in text
    for name, (mean, worst, gap) in published.LOOKUP_PREFIX.items():
        assert f"{name}: {mean:.1f} / {worst:.1f} / {gap:.1f}" in text  # beside our rows, labelled
    # published numbers sit only in cells marked as published (page body, figure data and images removed)
    body = re.sub(r"<script.*?</script>|src=\"data:[^\"]*\"", "", html.split("<main>", 1)[1], flags=re.S)
    for v in ("75.3", "39.8", "40.2"):
        hits = list(re.finditer(re.escape(v), body))
        assert hits, v
        for m in hits:
            assert "published" in body[max(0, m.start() - 300): m.start()].lower(), v


def test_pngs_beside_every_figure(study_dir, page):
    html, _, _ = page
    figs = study_dir / "report" / "figures"
    linked = set(re.findall(r'href="figures/([^"]+\.png)"', html))
    assert linked and linked == {p.name for p in figs.glob("*.png")}
    for p in figs.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    n_plots = html.count('class="pkv-plot"')
    assert n_plots >= 10 and n_plots <= len(linked)


def test_verdicts_follow_the_numbers(study_dir):
    study = load_study(study_dir)
    got = {c.claim: c.passed for c in checks.lookup_checks(study, "prefix")}
    # planted: compressed models have a weak boundary phase, full attention is flat
    assert got["W8/S8 · 1 KV: detected period equals the stride S=8"]
    assert got["W6/S6 · 1 KV: detected period equals the stride S=6"]
    assert got["W8/S4 · 1 KV: detected period equals the stride S=4"]
    assert got["W8/S8 · 1 KV · uniform averaging: still periodic without a learned gate"]
    assert got["W8/S8 · 1 KV: gap above Full attention · 1 KV's, intervals not overlapping"]
    assert got["Full attention · 1 KV: retrieves well above chance (mean's interval above 2× chance)"]
    assert got["Full attention · 1 KV: flat (gap's 95% upper bound below δ = 3.5)"]


def test_verdict_fails_when_numbers_do_not_show_it(study_dir, tmp_path):
    import shutil

    from phasekv.report.render import _check_rows

    root = tmp_path / "flat"
    shutil.copytree(study_dir / "eval", root / "eval")
    path = root / "eval" / "lookup-prefix" / "w8s8-1kv" / "summary.json"
    s = json.loads(path.read_text())
    s["gap_ci"] = [0.0, 20.0]
    s["detected_period"] = 1
    path.write_text(json.dumps(s))
    full = root / "eval" / "lookup-prefix" / "full-1kv" / "summary.json"
    f = json.loads(full.read_text())
    f["mean"], f["mean_ci"] = 7.0, [6.0, 8.0]  # at chance (1 of 16): its flatness says nothing
    full.write_text(json.dumps(f))
    result = checks.lookup_checks(load_study(root), "prefix")
    got = {c.claim: c.passed for c in result}
    assert got["W8/S8 · 1 KV: detected period equals the stride S=8"] is False
    assert got["W8/S8 · 1 KV: gap above Full attention · 1 KV's, intervals not overlapping"] is False
    assert got["W8/S4 · 1 KV: detected period equals the stride S=4"] is True
    assert got["Full attention · 1 KV: retrieves well above chance (mean's interval above 2× chance)"] is False
    assert got["Full attention · 1 KV: flat (gap's 95% upper bound below δ = 3.5)"] is None
    assert "not shown" in _check_rows(result) and "not checked" in _check_rows(result)


def test_missing_stages_are_said_missing(tmp_path, study_dir):
    import shutil

    root = tmp_path / "partial"
    shutil.copytree(study_dir / "eval" / "lookup-prefix" / "full-1kv", root / "eval" / "lookup-prefix" / "full-1kv")
    render_report(root, progress=False)
    html = (root / "report" / "index.html").read_text()
    assert "No knockouts in this directory" in html
    assert "No theory checks in this directory" in html


def test_empty_or_missing_dir_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="no such study directory"):
        render_report(tmp_path / "nope", progress=False)
    with pytest.raises(DataError, match="no results to report"):
        render_report(tmp_path, progress=False)


def test_example_prompt_highlighted(page):
    html, _, _ = page
    assert '<mark class="target">cat</mark> <mark class="answer">anna</mark>' in html


def test_entries_per_record_explains_capacity():
    """Layers x KV heads x tokens per record / S: 1.0 for the tiny W8/S4 (every record can have its own entry),
    0.5 for W8/S8; said in the gap check's numbers; unknown without provenance."""
    def summary(key_tokens=1, separator=None):
        return {"provenance": {"model_info": {"config": {"n_layers": 2, "n_kv_heads": 1}},
                               "prompt_config": {"key_tokens": key_tokens, "separator": separator}}}

    assert checks.entries_per_record(summary(), 4)[0] == 1.0
    assert checks.entries_per_record(summary(), 8)[0] == 0.5
    assert checks.entries_per_record(summary(2, ";"), 8)[0] == 1.0  # four-token records
    assert checks.entries_per_record({"provenance": {"fixture": True}}, 8) is None


def test_run_table_says_each_models_regime(study_dir):
    """The runs table gives each model's backbone and compressed entries per record; the retrieval tables its
    phase profile (graded, flat, all-or-nothing)."""
    from phasekv.report import tables

    study = load_study(study_dir)
    runs = tables.run_table(study).set_index("alias")
    assert runs.loc["w8s8-1kv", "backbone"] == "tiny" and runs.loc["w8s8-1kv", "entries_per_record"] == 0.5
    assert runs.loc["full-1kv", "entries_per_record"] is None
    profile = tables.summary_table(study, study.lookup["prefix"]).set_index("alias").profile
    assert profile.isna()["full-1kv"] and set(profile.dropna()) <= {"graded", "flat", "all-or-nothing"}


def test_profile_kind():
    from phasekv.eval.stats import phase_profile, profile_kind

    assert phase_profile([10, 20, 30, 40, 50, 60], 3).tolist() == [25, 35, 45]
    assert profile_kind([68.2, 71.5, 77.7, 44.6, 48.3, 22.9, 62.2, 6.2]) == "graded"  # the study's seed 42
    assert profile_kind([6.0, 99.3, 99.7, 5.2, 5.7, 6.4, 23.1, 22.1]) == "all-or-nothing"  # the demo's W8/S8
    assert profile_kind([95, 97, 96, 94]) == "flat"


def test_markdown_tables_say_what_the_report_says(study_dir):
    """`phasekv report DIR --markdown`: one row per claim, one per run of the grid, from claims.json / grid.csv."""
    import json

    from phasekv.report.markdown import study_markdown

    text = study_markdown(study_dir)
    claims = json.loads((study_dir / "report" / "claims.json").read_text())
    assert [c["claim"] for c in claims] == [f"C{i}" for i in range(1, 12)]
    for c in claims:
        assert f"| {c['claim']} | {c['verdict']} | " in text
    grid = text.split("## The grid")[1]
    assert "| model | prefix: mean |" in grid and "in-sequence: mean" in grid
    assert "| Full attention · 1 KV | " in grid and "| W8/S8 · 1 KV | " in grid


def test_markdown_without_a_rendered_report_is_a_one_line_error(tmp_path):
    from phasekv.errors import DataError
    from phasekv.report.markdown import study_markdown

    with pytest.raises(DataError, match="render the report first"):
        study_markdown(tmp_path)
