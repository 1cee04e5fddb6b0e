"""Package attributes imported on first use (`phasekv.lazy.exports`)."""

import subprocess
import sys

import pytest

import phasekv
import phasekv.report
from phasekv.config import ModelConfig
from phasekv.report.load import load_study


def test_exports_resolve_on_first_read_and_unknown_names_say_which_package():
    assert phasekv.ModelConfig is ModelConfig and phasekv.report.load_study is load_study
    with pytest.raises(AttributeError, match="module 'phasekv.report' has no attribute 'nothing'"):
        phasekv.report.nothing  # noqa: B018


def test_reading_the_layout_does_not_import_the_renderer():
    """A demo worker imports `phasekv.report.layout`; the renderer (scipy.stats, matplotlib) waits for the report."""
    code = "import sys, phasekv.report.layout; print('phasekv.report.render' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
