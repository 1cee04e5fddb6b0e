"""`phasekv audit`: the verdict and the exit code follow flatness by equivalence at --margin (--max-gap, its older
name): pass when every gap's 95% upper bound is below it."""

import json

import pytest
import typer
from typer.testing import CliRunner

from phasekv import ModelConfig, PhaseLM
from phasekv.data.tokenizer import build_word_tokenizer
from phasekv.eval.models import EvalModel
from phasekv.eval.tokens import WordTokenizer
from phasekv.mitigate import cli as mitigate_cli
from phasekv.mitigate.audit import run_audit
from tests.mitigate.test_ensemble import Planted

SMALL = dict(records=12, demos=2, filler=8, modulus=8, per_group=64)


@pytest.fixture(scope="module")
def tok():
    return WordTokenizer(build_word_tokenizer(), "word")


# a margin above the model's accuracy over chance (75% at chance ~8%) leaves no room for a gap to show: inconclusive,
# never a vacuous pass
@pytest.mark.parametrize("margin,code", [(50.0, 3), (100.5, 4)])
def test_exit_code_follows_threshold_planted(tmp_path, tok, margin, code):
    em = EvalModel(Planted(tok.vocab_size, [1, 1, 1, 0]), tok, "planted", "phasekv", 4, {"path": "planted"})
    v = run_audit(em, tmp_path, margin=margin, task="lookup", progress=False, **SMALL)
    assert v["gap"] == pytest.approx(100.0)
    assert v["exit_code"] == code and v["pass"] is (code == 0)
    assert v["periodic"] == "stride" and v["detected_period"] == 4
    assert [w["residue"] for w in v["weakest_residues"]][:2] == [3, 7]
    assert v["weakest_phases"][0] == {"phase": 3, "acc": 0.0}
    assert json.loads((tmp_path / "audit.json").read_text())["exit_code"] == code
    assert (tmp_path / "audit.png").stat().st_size > 0 and (tmp_path / "lookup" / "summary.json").is_file()


def test_flat_profile_passes(tmp_path, tok):
    em = EvalModel(Planted(tok.vocab_size, [1]), tok, "planted", "phasekv", 4, {"path": "planted"})
    v = run_audit(em, tmp_path, margin=1.0, task="lookup", progress=False, **SMALL)
    assert v["gap"] == 0 and v["exit_code"] == 0 and v["periodic"] == "none" and not v["near_chance"]


def test_cli_exit_codes(tmp_path, tok):
    model = PhaseLM(ModelConfig.from_name("W4/S4 · 1 KV", vocab_size=tok.vocab_size))
    model.save(tmp_path / "m")
    app = typer.Typer()
    mitigate_cli.register(app)
    args = ["audit", "--model", str(tmp_path / "m"), "--records", "12", "--demos", "2", "--filler", "8",
            "--modulus", "4", "--per-group", "16", "--device", "cpu"]
    # an untrained model answers at chance: inconclusive (exit 4) whatever the threshold, never a pass
    for name, flag, margin in (("a", "--max-gap", "100.5"), ("b", "--margin", "0.5")):
        r = CliRunner().invoke(app, args + ["--out", str(tmp_path / name), flag, margin])
        assert r.exit_code == 4, r.output
        assert "period" in r.output and "near chance" in r.output and "INCONCLUSIVE" in r.output
    v = json.loads((tmp_path / "b" / "audit.json").read_text())
    assert v["model"] == "W4/S4 · 1 KV" and v["task"] == "lookup" and v["stride"] == 4
    assert v["near_chance"] and not v["retrieves"] and v["verdict"] == "inconclusive" and not v["pass"]
    assert v["margin"] == 0.5 and v["rule"] == "flat: the gap's 95% upper bound below the margin δ = 0.5 points"
    r = CliRunner().invoke(app, args + ["--out", str(tmp_path / "c"), "--margin", "0"])
    assert r.exit_code != 0 and "--margin 0 must be > 0" in str(r.exception)


@pytest.mark.parametrize("margin,word", [(50.0, "fail"), (100.5, "inconclusive")])
def test_verdict_word_in_audit_json(tmp_path, tok, margin, word):
    em = EvalModel(Planted(tok.vocab_size, [1, 1, 1, 0]), tok, "planted", "phasekv", 4, {"path": "planted"})
    run_audit(em, tmp_path, margin=margin, task="lookup", progress=False, **SMALL)
    v = json.loads((tmp_path / "audit.json").read_text())
    assert v["verdict"] == word and v["retrieves"] is (word == "fail") and v["ratios"][0]["ratio"] == 4
    assert v["ratios"][0]["phase_profile"] == [100, 100, 100, 0]


def test_hf_dir_without_tokenizer_says_so(tmp_path, tok):
    """A `save_pretrained` of a model alone: the audit names the missing tokenizer and --tokenizer in one line
    (not "0 of 191 key words are single tokens"); with --tokenizer the same directory opens."""
    from phasekv.data.tokenizer import to_hf
    from phasekv.errors import CheckpointError
    from phasekv.eval.models import load

    PhaseLM(ModelConfig.from_name("full-1kv", preset="tiny", vocab_size=tok.vocab_size)).to_hf().save_pretrained(
        tmp_path / "hf")
    app = typer.Typer()
    mitigate_cli.register(app)
    r = CliRunner().invoke(app, ["audit", "--model", str(tmp_path / "hf"), "--out", str(tmp_path / "a")])
    assert isinstance(r.exception, CheckpointError), r.output
    msg = str(r.exception)
    assert "\n" not in msg and "no tokenizer" in msg and "--tokenizer" in msg and str(tmp_path / "hf") in msg
    assert not (tmp_path / "a" / "audit.json").exists()
    to_hf(build_word_tokenizer()).save_pretrained(tmp_path / "tok")
    em = load(tmp_path / "hf", tokenizer=tmp_path / "tok")
    assert em.kind == "hf" and em.tok.word_id("cat") is not None


def test_evaluation_beyond_training_length_warns_and_records_it(tmp_path, tok):
    """Prompts longer than the run was trained on: one warning line with both lengths, the summary.json and
    audit.json field; the verdict's own rules are untouched (a model at chance stays inconclusive)."""
    import io

    from rich.console import Console

    from phasekv.eval.report import print_summary
    from phasekv.eval.run import beyond_training_length
    from phasekv.mitigate.audit import print_verdict

    def audit(pattern, train_len, out):
        em = EvalModel(Planted(tok.vocab_size, pattern), tok, "planted", "phasekv", 4,
                       {"path": "planted", "train_len": train_len})
        v = run_audit(em, tmp_path / out, margin=50.0, task="lookup", progress=False, **SMALL)
        return v, json.loads((tmp_path / out / "lookup" / "summary.json").read_text())

    def printed(show, what) -> list[str]:
        buf = io.StringIO()
        show(what, Console(file=buf, width=300))
        return [line for line in buf.getvalue().splitlines() if line.startswith("warning:")]

    v, summary = audit([0], 16, "chance")
    n = summary["prompt_length"]
    assert n > 16 and summary["beyond_training_length"] == {"prompt_tokens": n, "trained_tokens": 16}
    assert v["beyond_training_length"] == summary["beyond_training_length"]
    assert json.loads((tmp_path / "chance" / "audit.json").read_text())["beyond_training_length"]["trained_tokens"] == 16
    assert v["verdict"] == "inconclusive" and v["exit_code"] == 4 and v["near_chance"]  # as at chance anywhere
    for show, what in ((print_summary, summary), (print_verdict, v)):
        lines = printed(show, what)
        assert len(lines) == 1 and f"{n:,} tokens" in lines[0] and "16-token" in lines[0] and "trained" in lines[0]
    within = EvalModel(Planted(tok.vocab_size, [1]), tok, "planted", "phasekv", 4, {"path": "p", "train_len": n})
    assert beyond_training_length(within, n) is None and beyond_training_length(within, n + 1)["prompt_tokens"] == n + 1
    unknown = EvalModel(Planted(tok.vocab_size, [1]), tok, "planted", "phasekv", 4, {"path": "p"})  # PhaseLM.save
    assert beyond_training_length(unknown, 10**6) is None
    summary["beyond_training_length"] = v["beyond_training_length"] = None  # as written within the trained length
    assert printed(print_summary, summary) == [] and printed(print_verdict, v) == []
