"""lm-evaluation-harness itself (the lm-eval extra; make test-lm-eval) over `phasekv export-tasks`: its `hf` backend on
a `phasekv export` and phasekv's own model type on a compressed model score every prompt as `phasekv eval lookup`
does, prompt for prompt (the same log-probability of the answer token, the same top-1 verdict), and `phasekv
analyze lm-eval` reads its log back into the same summary. Untrained tiny models: equal scores need no skill; a
planted model (tests/mitigate/test_ensemble.py) gives top-1 verdicts that are not all wrong."""

import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from phasekv import ModelConfig, PhaseLM
from phasekv.cli import _mount, app
from phasekv.data.tokenizer import build_word_tokenizer, save_tokenizer
from phasekv.eval.export import export
from phasekv.eval.harness import export_tasks, read_samples, summarize_scored
from phasekv.eval.models import EvalModel, load
from phasekv.eval.protocols import protocol
from phasekv.eval.run import run_retrieval
from phasekv.eval.tokens import WordTokenizer
from tests.mitigate.test_ensemble import Planted

pytestmark = pytest.mark.lm_eval
pytest.importorskip("lm_eval")

LOOKUP = dict(records=12, demos=2, filler=8, modulus=8, per_group=8, keep_n=True, mappings=4)  # 64 prompts
NEEDLE = dict(context=160, modulus=8, per_group=8, keep_n=True, mappings=4)  # 16 records, 64 prompts
SAME = ("mean", "mean_ci", "gap", "gap_ci", "groups", "detected_period", "periodicity")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Untrained tiny full attention (a PhaseLM.save directory and its `phasekv export`) and W8/S8 · 1 KV."""
    root = tmp_path_factory.mktemp("lm_eval")
    tok = build_word_tokenizer()
    for name, d in (("Full attention · 1 KV", "full"), ("W8/S8 · 1 KV", "w8s8")):
        torch.manual_seed(0)
        PhaseLM(ModelConfig.from_name(name, preset="tiny", vocab_size=tok.get_vocab_size())).save(root / d)
        save_tokenizer(tok, root / d)
    export(root / "full", root / "hf")
    return root


def lm_eval(*args: str) -> None:
    """`phasekv lm-eval ARGS`: lm-eval's own command line, in this process."""
    _mount()
    r = CliRunner().invoke(app, ["lm-eval", *args, "--device", "cpu", "--batch_size", "16", "--log_samples"])
    assert r.exit_code == 0, r.output


def same_as_phasekv_eval(scored, em: EvalModel, out) -> None:
    """Every prompt's top-1 verdict and answer probability, and the summary, as `phasekv eval` gives them."""
    task = scored.meta["task"]
    ref = run_retrieval(task, em, scored.config, out / "eval", batch_size=16, interval=protocol(task).interval,
                        progress=False)
    rows = pd.read_parquet(out / "eval" / "results.parquet")
    assert (scored.rows["pid"] == rows["pid"]).all() and (scored.rows["residue"] == rows["residue"]).all()
    assert (scored.rows["correct"] == rows["correct"]).all()
    assert (scored.rows["prob"] - rows["prob"]).abs().max() < 1e-5 * max(1.0, rows["prob"].max())
    mine = summarize_scored(scored, out / "lm")
    assert {k: mine[k] for k in SAME} == {k: ref[k] for k in SAME}


def test_hf_backend_on_an_export_scores_as_phasekv_eval(models, tmp_path):
    hf = load(models / "hf")
    export_tasks(hf, tmp_path / "tasks", ["phasekv_lookup_prefix"], **LOOKUP)
    lm_eval("--model", "hf", "--model_args", f"pretrained={models / 'hf'},dtype=float32",
            "--include_path", str(tmp_path / "tasks"), "--tasks", "phasekv_lookup_prefix",
            "--output_path", str(tmp_path / "out"))
    [scored] = read_samples(tmp_path / "out")
    assert scored.model.name == "hf:hf" and scored.model.info["path"] == str(models / "hf")
    same_as_phasekv_eval(scored, hf, tmp_path / "hf")
    same_as_phasekv_eval(scored, load(models / "full"), tmp_path / "phaselm")  # the run the export came from


def test_phasekv_model_type_on_a_compressed_model(models, tmp_path):
    em = load(models / "w8s8")
    export_tasks(em, tmp_path / "tasks", ["phasekv_lookup_inseq"], **LOOKUP)
    export_tasks(em, tmp_path / "tasks", ["phasekv_needle"], **NEEDLE)
    lm_eval("--model", "phasekv", "--model_args", f"run={models / 'w8s8'}", "--include_path", str(tmp_path / "tasks"),
            "--tasks", "phasekv_lookup_inseq,phasekv_needle", "--output_path", str(tmp_path / "out"))
    scored = {s.name: s for s in read_samples(tmp_path / "out")}
    assert set(scored) == {"phasekv_lookup_inseq", "phasekv_needle"}
    for name, s in scored.items():
        assert s.model.name == "W8/S8 · 1 KV" and s.model.stride == 8
        same_as_phasekv_eval(s, em, tmp_path / name)


def test_planted_weak_phase_through_lm_eval(models, tmp_path, monkeypatch):
    """A model whose weak phase is known, run by lm-eval through --model phasekv: its top-1 verdicts, the gap and
    the period come back as `phasekv eval` finds them."""
    import phasekv.eval.lm_model as lm_model

    tok = WordTokenizer(build_word_tokenizer(), "word")
    planted = EvalModel(Planted(tok.vocab_size, [1, 1, 1, 0]), tok, "planted", "phasekv", 4, {"path": "planted"})
    monkeypatch.setattr(lm_model, "load", lambda *a, **k: planted)
    export_tasks(planted, tmp_path / "tasks", ["phasekv_lookup_prefix"], **LOOKUP)
    lm_eval("--model", "phasekv", "--model_args", "run=planted", "--include_path", str(tmp_path / "tasks"),
            "--tasks", "phasekv_lookup_prefix", "--output_path", str(tmp_path / "out"))
    [s] = read_samples(tmp_path / "out")
    assert 0 < s.rows["correct"].mean() < 1
    same_as_phasekv_eval(s, planted, tmp_path / "planted")
    summary = json.loads((tmp_path / "planted" / "lm" / "summary.json").read_text())
    assert summary["detected_period"] == 4 and summary["gap"] == 100.0


def test_generation_and_rolling_loglikelihood(models):
    """The model type's other two request kinds, against the model scored by hand: greedy generation, and
    log P(text) over lm-eval's rolling windows (one window here: the text is shorter than the model's length)."""
    from lm_eval.api.instance import Instance

    from phasekv.eval.lm_model import PhaseKVLM
    from phasekv.eval.models import last_logits

    lm = PhaseKVLM(run=str(models / "w8s8"), device="cpu", batch_size=4)
    text = "cat Adam dog Betty cat"

    def request(kind, args):
        return Instance(request_type=kind, doc={}, arguments=args, idx=0)

    ids = lm.tok_encode(text)
    want = []
    for _ in range(3):
        want.append(int(last_logits(lm.em.model, torch.tensor([ids + want])).argmax(-1)))
    [got] = lm.generate_until([request("generate_until", (text, {"until": [], "max_gen_toks": 3}))])
    assert got == lm.tok_decode(want)
    words = lm.tok_encode(text, add_special_tokens=False)
    full = [lm.prefix_token_id, *words]
    with torch.no_grad():
        logp = torch.log_softmax(lm.em.model(torch.tensor([full[:-1]]))[0].float(), -1)  # (T, V)
    by_hand = float(logp.gather(1, torch.tensor(full[1:])[:, None]).sum())
    [rolled] = lm.loglikelihood_rolling([request("loglikelihood_rolling", (text,))])
    assert rolled == pytest.approx(by_hand, abs=1e-4)


def test_generation_costs_one_prefill_and_a_step_per_token(models, monkeypatch, capsys):
    """`generate_until` through the decode cache: N new tokens, one forward of the prompt then N - 1 of one token
    (the last token needs none after it); `disable_tqdm` silences its progress."""
    from lm_eval.api.instance import Instance

    from phasekv.eval.lm_model import PhaseKVLM
    from phasekv.progress import INTERVAL_ENV

    monkeypatch.setattr(PhaseKVLM, "eot_token_id", -1)  # no early end: all N tokens
    monkeypatch.setenv(INTERVAL_ENV, "0.2")
    lm = PhaseKVLM(run=str(models / "w8s8"), device="cpu", batch_size=4)
    text, n = "cat Adam dog Betty cat", 20
    seen = []
    lm.em.model.register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape)))
    request = Instance(request_type="generate_until", doc={}, arguments=(text, {"until": [], "max_gen_toks": n}),
                       idx=0)
    [got] = lm.generate_until([request], disable_tqdm=True)
    assert seen == [(1, len(lm.tok_encode(text)))] + [(1, 1)] * (n - 1)
    assert len(got.split()) == n and capsys.readouterr().out == ""
    lm.generate_until([request])
    assert "progress: lm-eval generate_until 1/1" in capsys.readouterr().out


def test_model_args_given_as_a_string_are_read_as_lm_eval_reads_them(models):
    from phasekv.eval.harness import scored_model

    results = {"config": {"model": "hf", "model_args": f"pretrained={models / 'hf'},dtype=float32"}}
    em = scored_model(results)
    assert em.name == "hf:hf" and em.info["path"] == str(models / "hf")
    assert em.info["lm_eval"]["model_args"] == results["config"]["model_args"]
