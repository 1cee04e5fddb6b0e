"""`phasekv audit` on the grid family: every grid period planned by the family's rule (`plan_period`), a grid the
prompts cannot test named in the output, and the documented exit codes (no crash on the position design)."""

import json

import pytest
import typer
from typer.testing import CliRunner

from phasekv import ModelConfig, PhaseLM
from phasekv.data.tokenizer import build_word_tokenizer
from phasekv.eval.tokens import WordTokenizer
from phasekv.mitigate import cli as mitigate_cli

# the demo's 90-token lookup layout (79 target positions: a modulus above 27 cannot hold an exact design), few prompts
LAYOUT = ["--records", "16", "--demos", "4", "--filler", "48", "--modulus", "8", "--per-group", "64"]


@pytest.mark.parametrize("arch,tested,untested", [
    ("MoBA B16 top 3 · 1 KV", {16: 16}, []),  # B = 16: 32 needs 94 positions, so the gap alone at 16
    ("Beacon r8 · window 32 · 1 KV", {8: 16}, [32]),  # r = 8 at 16; w = 32: mod 32 needs 94 positions
])
def test_audit_on_a_grid_design_plans_what_fits(tmp_path, arch, tested, untested):
    tok = WordTokenizer(build_word_tokenizer(), "word")
    PhaseLM(ModelConfig.from_name(arch, preset="tiny", vocab_size=tok.vocab_size)).save(tmp_path / "m")
    app = typer.Typer()
    mitigate_cli.register(app)
    r = CliRunner().invoke(app, ["audit", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "a"), *LAYOUT,
                                 "--device", "cpu"])
    assert r.exit_code == 4, r.output  # untrained: at chance, inconclusive (a documented code, not 2)
    v = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert {t["ratio"]: t["modulus"] for t in v["ratios"]} == tested
    assert [t["ratio"] for t in v["untested"]] == untested
    for ratio in untested:
        assert f"ratio {ratio}" in r.output and "not tested" in r.output and "94 target positions" in r.output
