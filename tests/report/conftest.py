import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fixture import make_study  # noqa: E402


@pytest.fixture(scope="session")
def study_dir(tmp_path_factory):
    """A planted study directory, rendered once for the whole session."""
    from phasekv.report import render_report

    root = make_study(tmp_path_factory.mktemp("study"))
    render_report(root, progress=False)
    return root
