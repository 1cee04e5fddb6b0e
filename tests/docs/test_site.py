"""The documentation site builds with warnings as errors: a broken link, a page missing from the nav's
files, an API docstring that does not render or a command whose help cannot be rendered fails here. The built
site is then read as a newcomer meets it: opened from disk (file://), searched, its API pages and CLI help."""

import dataclasses
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phasekv.config.model import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"
ISSUE = re.compile(r"\bissues? #?\d+", re.I)  # a tracker number, which means nothing to a reader
# Debian's chromium, headless, with nothing of its own reaching the network
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=1", "--virtual-time-budget=10000"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if shutil.which("mkdocs", path=str(MKDOCS.parent)) is None:
        pytest.skip("mkdocs is not installed (pyproject's dev extras)")
    out = tmp_path_factory.mktemp("site") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def text(page: Path) -> str:
    """A built page's text: tags dropped, entities decoded, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.read_text())).split())


def test_site_builds_strict(site):
    cli = (site / "reference" / "cli.html").read_text()
    for command in ("phasekv eval lookup", "phasekv audit", "phasekv train", "phasekv analyze knockout"):
        assert f"<code>{command}</code>" in cli, command  # the CLI reference is rendered from the commands
    api = (site / "api" / "stats.html").read_text()
    assert "gap_estimate" in api and "Feldman-Cousins" in api  # docstrings rendered


def test_model_config_fields_are_documented_on_its_page(site):
    page = text(site / "api" / "model.html")
    assert "Everything that builds a PhaseLM" in page  # the class docstring
    source = (ROOT / "phasekv" / "config" / "model.py").read_text()
    for field in dataclasses.fields(ModelConfig):
        comment = re.search(rf"^    {field.name}: [^#\n]+  # (.+)$", source, re.M)
        assert comment is not None, f"ModelConfig.{field.name} has no comment where it is declared"
        assert f"{field.name} :" in page and " ".join(comment.group(1).split()) in page, field.name


def test_the_site_opened_from_disk_has_its_search_index_and_relative_links(site):
    index = (site / "search" / "search_index.js").read_text()
    assert index.startswith("var __index = {") and '"location":"getting-started.html"' in index
    for page in (site / "index.html", site / "404.html"):  # no link that works only from a domain's root
        rooted = re.findall(r'(?:href|src)="/(?!/)[^"]*"', page.read_text())
        assert not rooted, f"{page.name}: {rooted[:3]}"
        assert "unpkg.com" not in page.read_text()  # the Web Worker shim is local: no network to read the site


def test_no_tracker_numbers_in_the_site_or_the_readme(site):
    """Pages, API docstrings, the CLI reference (every command's help) and the included benchmark record."""
    found = [(page.relative_to(site), m.group(0)) for page in sorted(site.rglob("*.html"))
             for m in [ISSUE.search(text(page))] if m]
    found += [("README.md", m.group(0)) for m in [ISSUE.search((ROOT / "README.md").read_text())] if m]
    assert not found, found


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (apt-get install -y chromium)")
def test_search_works_from_file_url_in_headless_chromium(site, tmp_path):
    """The search index loads from file:// with no console error, and a query (`?q=`) finds pages."""
    url = (site / "index.html").as_uri() + "?q=stride"
    done = subprocess.run(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", url],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
    found = re.search(r'md-search-result__meta">(\d+) matching documents', done.stdout)
    assert found is not None and int(found.group(1)) > 0, done.stdout[-2000:]
