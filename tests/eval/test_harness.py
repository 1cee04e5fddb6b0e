"""phasekv's tests as lm-evaluation-harness tasks (`phasekv.eval.harness`): the exported documents are phasekv's
prompts, and a results directory in lm-eval's layout reads back into the summary and verdict `phasekv eval` and
`phasekv audit` give. The logs here are written in lm-eval's format from phasekv's own scores; lm-eval itself
runs in tests/eval/test_lm_eval.py (make test-lm-eval)."""

import json
import math

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from phasekv.data.tokenizer import build_word_tokenizer
from phasekv.errors import DataError
from phasekv.eval import cli as eval_cli
from phasekv.eval.harness import _document, export_tasks, read_samples
from phasekv.eval.models import EvalModel
from phasekv.eval.prompts import RetrievalPrompts, lookup_config
from phasekv.eval.run import run_retrieval
from phasekv.eval.tokens import WordTokenizer
from phasekv.mitigate import cli as mitigate_cli
from phasekv.mitigate.audit import audit_scored, run_audit
from tests.mitigate.test_ensemble import Planted

LAYOUT = dict(records=12, demos=2, filler=8, modulus=8, per_group=64)
TASK = "phasekv_lookup_prefix"


@pytest.fixture(scope="module")
def planted():
    tok = WordTokenizer(build_word_tokenizer(), "word")
    return EvalModel(Planted(tok.vocab_size, [1, 1, 1, 0]), tok, "planted", "phasekv", 4, {"path": "planted"})


@pytest.fixture(scope="module")
def exported(planted, tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    metas = export_tasks(planted, root / "tasks", [TASK], **LAYOUT)
    summary = run_retrieval("lookup", planted, lookup_config(planted.info, padding="prefix", **LAYOUT),
                            root / "eval", batch_size=64, progress=False)  # `phasekv eval lookup`
    return root, metas, summary


def lm_eval_log(out, tasks, scores: pd.DataFrame, model: dict, alter=None, keep=None):
    """A results directory as `lm_eval --log_samples --output_path OUT` writes it (OUT/<model>/results_DATE.json
    and samples_TASK_DATE.jsonl), each document scored (log P, is_greedy, and the task's metric acc) from phasekv's
    rows `scores`."""
    date = "2026-12-04T12-00-00.000000"
    d = out / "model"
    d.mkdir(parents=True)
    config = json.loads((tasks / f"{TASK}.yaml").read_text())
    write = {"configs": {TASK: config}, "config": {"model": "phasekv", "model_args": {"run": "x"}, **model},
             "total_evaluation_time_seconds": "1.5"}
    (d / f"results_{date}.json").write_text(json.dumps(write))
    by_pid = scores.set_index("pid")
    lines = []
    for line in (tasks / f"{TASK}.jsonl").read_text().splitlines():
        doc = json.loads(line)
        if keep is not None and not keep(doc):
            continue
        r = by_pid.loc[doc["pid"]]
        ctx = alter(doc["text"]) if alter else doc["text"]
        lines.append(json.dumps({"doc_id": doc["pid"], "doc": doc, "target": doc["target"],
                                 "arguments": {"gen_args_0": {"arg_0": ctx, "arg_1": doc["target"]}},
                                 "resps": [[[str(math.log(r["prob"])), str(bool(r["correct"]))]]],
                                 "acc": int(r["correct"])}))
    (d / f"samples_{TASK}_{date}.jsonl").write_text("\n".join(lines) + "\n")
    return out


def test_documents_are_phasekvs_prompts(planted, exported):
    root, metas, _ = exported
    config = json.loads((root / "tasks" / f"{TASK}.yaml").read_text())  # JSON: YAML reads it as it is
    assert config["output_type"] == "loglikelihood" and config["doc_to_text"] == "text"
    assert config["doc_to_target"] == "target" and config["metric_list"][0]["metric"] == "acc"
    assert config["dataset_kwargs"]["data_files"]["test"] == str((root / "tasks" / f"{TASK}.jsonl").resolve())
    docs = [json.loads(x) for x in (root / "tasks" / f"{TASK}.jsonl").read_text().splitlines()]
    prompts = RetrievalPrompts(lookup_config(planted.info, padding="prefix", **LAYOUT), planted.tok)
    assert len(docs) == len(prompts) == metas[TASK]["prompts"]["n_prompts"] == 8 * 64
    for d in docs[::37]:
        p = prompts.prompt(d["pid"])
        assert planted.tok.encode(d["text"]) == p.ids and planted.tok.encode(d["text"] + d["target"]) == p.ids + [
            p.answer]
        assert (d["residue"], d["target_pos"], d["mapping"], d["answer"]) == (p.residue, p.target_pos, p.mapping,
                                                                                p.answer)
        assert d["target_pos"] % 8 == d["residue"] and d["padding"] == "prefix"


def test_a_word_that_is_not_one_token_is_refused(planted):
    prompts = RetrievalPrompts(lookup_config(planted.info, **LAYOUT), planted.tok)
    p = prompts.prompt(0)
    p.answer_word = "zebraxq"  # not in the word-level vocabulary: the continuation is not the answer's one token
    with pytest.raises(DataError, match="token-exactly"):
        _document(p, prompts)


def test_read_back_gives_phasekv_evals_summary_and_audit(planted, exported, tmp_path):
    root, _, ev = exported
    model = {"phasekv": {"name": "planted", "kind": "phasekv", "stride": 4, "info": {"path": "planted"}}}
    out = lm_eval_log(tmp_path / "lm", root / "tasks", pd.read_parquet(root / "eval" / "results.parquet"), model)
    [s] = read_samples(out)
    assert s.name == TASK and s.model.name == "planted" and s.model.stride == 4 and s.seconds == 1.5
    v = audit_scored(s, tmp_path / "audit", margin=50.0)
    ref = run_audit(planted, tmp_path / "ref", margin=50.0, task="lookup", progress=False, **LAYOUT)
    mine = json.loads((tmp_path / "audit" / "lookup" / "summary.json").read_text())
    theirs = json.loads((root / "eval" / "summary.json").read_text())
    for k in ("mean", "mean_ci", "gap", "gap_ci", "groups", "detected_period", "periodicity", "fold_consistency"):
        assert mine[k] == theirs[k], k
    assert mine["provenance"]["lm_eval"]["task"] == TASK and ev["detected_period"] == 4
    for k in ("gap", "gap_ci", "detected_period", "periodic", "exit_code", "weakest_phases", "untested"):
        assert v[k] == ref[k], k
    tests = [[{k: t[k] for k in ("ratio", "modulus", "gap", "period_p_value")} for t in x["ratios"]] for x in (v, ref)]
    assert tests[0] == tests[1] and tests[0][0]["ratio"] == 4
    assert v["exit_code"] == 3 and (tmp_path / "audit" / "audit.png").stat().st_size > 0


def test_cli_audit_and_analyze(exported, tmp_path):
    root, _, _ = exported
    model = {"phasekv": {"name": "planted", "kind": "phasekv", "stride": 4, "info": {}}}
    out = lm_eval_log(tmp_path / "lm", root / "tasks", pd.read_parquet(root / "eval" / "results.parquet"), model)
    app, analyze = typer.Typer(), typer.Typer()
    mitigate_cli.register(app)
    mitigate_cli.register_analyze(analyze)
    app.add_typer(analyze, name="analyze")
    r = CliRunner().invoke(app, ["audit", "--lm-eval", str(out), "--out", str(tmp_path / "a"), "--max-gap", "50"])
    assert r.exit_code == 3 and "FAIL" in r.output, r.output
    # a margin above the model's accuracy over chance (75%) leaves no room for a gap to show: never a vacuous pass
    r = CliRunner().invoke(app, ["audit", "--lm-eval", str(out), "--out", str(tmp_path / "b"), "--max-gap", "101"])
    assert r.exit_code == 4 and "INCONCLUSIVE" in r.output, r.output
    r = CliRunner().invoke(app, ["analyze", "lm-eval", str(out), "--out", str(tmp_path / "c")], terminal_width=200)
    said = " ".join(r.output.split())  # the console wraps at its own width
    assert r.exit_code == 0 and "detected period 4" in said and "gap 100.0" in said, r.output
    assert (tmp_path / "c" / TASK / "lookup" / "results.parquet").is_file()


@pytest.mark.parametrize("case", ["shifted", "limited"])
def test_a_log_that_is_not_the_exported_prompts_is_refused(exported, tmp_path, case):
    root, _, _ = exported
    scores = pd.read_parquet(root / "eval" / "results.parquet")
    kw = {"alter": lambda t: "Question: " + t} if case == "shifted" else {"keep": lambda d: d["pid"] < 100}
    out = lm_eval_log(tmp_path / "lm", root / "tasks", scores, {}, **kw)
    with pytest.raises(DataError, match="few-shot" if case == "shifted" else "--limit"):
        read_samples(out)


def test_export_tasks_cli_fails_before_writing(tmp_path):
    app = typer.Typer()
    eval_cli.register(app)
    app.command("unused")(lambda: None)
    r = CliRunner().invoke(app, ["export-tasks", str(tmp_path / "t"), "--model", str(tmp_path / "missing")])
    assert r.exit_code != 0 and not (tmp_path / "t").exists()
    r = CliRunner().invoke(app, ["export-tasks", str(tmp_path / "t"), "--model", str(tmp_path), "--tasks", "nope"])
    assert r.exit_code != 0 and "unknown phasekv task 'nope'" in str(r.exception) and not (tmp_path / "t").exists()
