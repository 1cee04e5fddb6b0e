"""The scripts in examples/ run as documented, at tiny budgets (`--tiny`), through their `main`."""

import importlib.util
import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_audit_hf_checkpoint(tmp_path, capsys):
    verdict = example("audit_hf_checkpoint").main(["--tiny", "--config", "qwen3", "--out", str(tmp_path)])
    # two training steps do not learn the lookup: the audit must say so, never pass
    assert verdict["verdict"] == "inconclusive" and verdict["exit_code"] == 4
    saved = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert saved["verdict"] == "inconclusive" and saved["task"] == "lookup"
    assert (tmp_path / "audit" / "audit.png").stat().st_size > 0
    assert "inconclusive (exit code 4)" in capsys.readouterr().out


def test_compare_designs(tmp_path):
    summaries = example("compare_designs").main(["--tiny", "--out", str(tmp_path)])
    assert list(summaries) == ["W8/S8 · 1 KV", "W8/S4 · 1 KV"]
    assert [s["stride"] for s in summaries.values()] == [8, 4]
    assert all(len(s["groups"]) == 24 for s in summaries.values())
    assert (tmp_path / "phase_profiles.png").stat().st_size > 0


def test_paddings_fold(tmp_path):
    summaries = example("paddings_fold").main(["--tiny", "--out", str(tmp_path)])
    assert [s["protocol"] for s in summaries.values()] == ["prefix", "in-sequence"]
    assert (tmp_path / "fold.png").stat().st_size > 0


def test_bad_design_name_is_one_line(tmp_path):
    from phasekv.errors import ModelNameError

    with pytest.raises(ModelNameError, match="unknown part"):
        example("compare_designs").main(["W8/S8 · 1 KV · no such thing", "--tiny", "--out", str(tmp_path)])
