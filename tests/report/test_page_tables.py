"""The report says what it said when it was recorded (`page_tables.RECORD`): every table cell for cell (its text and
the marks in it: a verdict's colour, a published number's style), every verdict, paragraph and caption of two
planted directories, section by section."""

import json

import pytest
from page_tables import RECORD, extras_study, record


@pytest.fixture(scope="module")
def pages(study_dir, tmp_path_factory):
    from phasekv.report import render_report

    extras = extras_study(tmp_path_factory.mktemp("extras"))
    render_report(extras, progress=False)
    return record(study_dir, extras)


@pytest.mark.parametrize("name", ["study", "extras"])
def test_every_cell_as_recorded(pages, name):
    got, want = pages[name], json.loads(RECORD.read_text())[name]
    assert list(got) == list(want)  # the sections, in order
    for section, blocks in want.items():
        assert len(got[section]) == len(blocks), section
        for i, (g, w) in enumerate(zip(got[section], blocks, strict=True)):
            if "rows" in w:
                assert g.get("class") == w["class"] and len(g["rows"]) == len(w["rows"]), (section, i)
                for row, (gr, wr) in enumerate(zip(g["rows"], w["rows"], strict=True)):
                    assert gr == wr, (section, i, row)
            else:
                assert g == w, (section, i)


def test_the_templates_ship_with_the_package():
    """pyproject's package data holds every template, so an installed phasekv renders its report."""
    import tomllib
    from fnmatch import fnmatch
    from pathlib import Path

    import phasekv

    root = Path(__file__).parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["phasekv"]
    package = Path(phasekv.__file__).parent
    templates = sorted((package / "report" / "templates").iterdir())
    assert templates and all(any(fnmatch(str(t.relative_to(package)), p) for p in patterns) for t in templates)
