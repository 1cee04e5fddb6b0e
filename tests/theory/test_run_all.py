import json

import pytest

from phasekv.theory import run_all


@pytest.mark.slow
def test_run_all_quick_reproduces_every_claim(tmp_path):
    result = run_all(tmp_path, quick=True)
    for check in ["minimisers", "flow", "coverage"]:
        assert result[check]["claim_reproduced"], check
        assert json.loads((tmp_path / check / "summary.json").read_text())["claim_reproduced"]
        assert (tmp_path / check / "results.parquet").exists()
