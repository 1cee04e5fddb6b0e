"""The protocol registry: a protocol registered once is found by the evaluation, compare, audit, demo and report."""

import dataclasses
import json

import pytest

from phasekv.data.tokenizer import build_word_tokenizer
from phasekv.demo.plan import plan_for
from phasekv.demo.runner import build_tasks
from phasekv.errors import ConfigError
from phasekv.eval import protocols
from phasekv.eval.models import EvalModel
from phasekv.eval.run import run_retrieval
from phasekv.eval.tokens import WordTokenizer
from phasekv.mitigate.audit import run_audit
from phasekv.mitigate.compare import Bench, compare
from phasekv.report import load_study, render_report
from phasekv.report.layout import Layout
from tests.mitigate.test_ensemble import Planted

SMALL = dict(records=12, demos=2, filler=8, modulus=8, per_group=64)


@pytest.fixture
def toy(monkeypatch):
    """A test-only retrieval protocol: the lookup with one demonstration, run by the study under prefix padding."""
    def fit(em, context=None, **options):
        return protocols.lookup_config(em.info, **{**options, "demos": 1})

    proto = dataclasses.replace(protocols.LOOKUP, name="toy", fit=fit, study=("prefix",), audits=None)
    monkeypatch.setitem(protocols.PROTOCOLS, "toy", proto)
    return proto


def test_known_protocols():
    assert [p.name for p in protocols.retrieval_protocols()] == ["lookup", "needle"]
    assert protocols.LOOKUP.stage("prefix") == "lookup-prefix" and protocols.FLIP.stage(None) == "flip"
    assert protocols.LOOKUP.task("in-sequence") == "lookup in-sequence"
    assert protocols.is_retrieval({"task": "needle", "groups": []}) and not protocols.is_retrieval({"task": "flip"})
    with pytest.raises(ConfigError, match="unknown evaluation protocol 'nope'"):
        protocols.protocol("nope")


def test_a_registered_protocol_is_evaluated_compared_audited_run_and_reported(toy, tmp_path):
    tok = WordTokenizer(build_word_tokenizer(), "word")
    em = EvalModel(Planted(tok.vocab_size, [1, 1, 1, 0]), tok, "planted", "phasekv", 4, {"path": "planted"})
    # evaluation: its summary and figure
    lay = Layout(tmp_path / "study")
    out = lay.evaluation(toy.stage("prefix")) / "planted"
    s = run_retrieval("toy", em, toy.fit(em, **SMALL), out, progress=False)
    assert s["task"] == "toy" and s["demos"] == 1 and (out / toy.figure).stat().st_size > 0
    # compare finds it among other directories; the audit runs it by name
    c = compare([lay.root / "eval"], bench=Bench(reps=0))
    assert c["task"] == "toy" and [r["label"] for r in c["models"]] == ["planted"]
    v = run_audit(em, tmp_path / "audit", task="toy", progress=False, **SMALL)
    assert v["task"] == "toy" and v["detected_period"] == 4
    with pytest.raises(ConfigError, match="--task must be auto, lookup, needle or toy"):
        run_audit(em, tmp_path / "audit", task="flip", progress=False)
    # the demo runs it for every model; the report reads it and gives it a section
    names = {t.name for t in build_tasks(tmp_path / "demo", plan_for(quick=True))}
    assert "toy prefix w8s8-1kv" in names and "lookup prefix w8s8-1kv" in names
    study = load_study(lay.root)
    assert list(study.evals["toy"]["prefix"]) == ["planted"]
    html = render_report(lay.root, progress=False).read_text()
    assert '<section id="toy"><h2>Toy accuracy by residue</h2>' in html
    assert json.loads((out / "summary.json").read_text())["gap"] == pytest.approx(100.0)
