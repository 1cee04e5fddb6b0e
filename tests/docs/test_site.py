"""The documentation site builds with warnings as errors: a broken link, a page missing from the nav's
files, an API docstring that does not render or a command whose help cannot be rendered fails here."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="mkdocs is not installed (pyproject's dev extras)")
def test_site_builds_strict(tmp_path):
    mkdocs = Path(sys.executable).parent / "mkdocs"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    cli = (site / "reference" / "cli.html").read_text()
    for command in ("phasekv eval lookup", "phasekv audit", "phasekv train", "phasekv analyze knockout"):
        assert f"<code>{command}</code>" in cli, command  # the CLI reference is rendered from the commands
    api = (site / "api" / "stats.html").read_text()
    assert "gap_estimate" in api and "Feldman-Cousins" in api  # docstrings rendered

