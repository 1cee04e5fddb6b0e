"""`phasekv study --needle`: the long-context regime's path (train chains, needle tests, audits) at tiny budgets.
It checks the plumbing, not the effect: models this small and this briefly trained are at chance."""

import json

import torch
from typer.testing import CliRunner

from phasekv.cli import _mount, app
from phasekv.demo.needle import STAGES, plan_for


def test_plan_chains_each_model_from_its_previous_stage(tmp_path):
    plan = plan_for(quick=False)
    assert plan.train_len == 1024 and plan.per_group % 64 == 0 and plan.lengths == (1, 2, 4)
    assert list(plan.stages) == ["demo", "base", "256", "1024"] and plan.stages is STAGES and not plan.own
    for model, alias, chain in plan.runs(tmp_path):  # every chain: the demo's words, widened, then the needle's
        assert [r.alias for r in chain] == [f"{alias}-{t}" for t in ("demo", "base", "256", "1024")]
        assert [r.options.get("init_from") for r in chain] == [None, f"{chain[0].out}-wide", str(chain[1].out),
                                                               str(chain[2].out)]
        cfgs = [r.config() for r in chain]
        assert cfgs[0].data.recall.n_keys == 32 and cfgs[0].data.recall.key_words == 1 and cfgs[0].total_steps == 2000
        assert [c.seq_len for c in cfgs] == [96, 96, 256, 1024] and cfgs[-1].data.is_needle and cfgs[1].data.is_recall
        assert cfgs[1].data.recall.key_words == 2 and cfgs[1].data.recall.n_keys == 0  # the needle's words
        assert cfgs[-1].data.needle.records == 125  # the test's density at 1,024 tokens
        assert cfgs[0].arch == model
    continued = plan_for(quick=False)
    continued.continues = {"W8/S4 · 1 KV": ("Full attention · 1 KV", "base")}  # a design change from another chain
    (_, _, full), (_, alias, w8s4) = continued.runs(tmp_path)[1:]
    assert [r.alias for r in w8s4] == [f"{alias}-256", f"{alias}-1024"] and w8s4[0].options["init_from"] == str(full[1].out)


def test_quick_needle_study_end_to_end(tmp_path):
    out = tmp_path / "needle"
    _mount()
    r = CliRunner().invoke(app, ["study", "--needle", "--quick", "--out", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    result = json.loads((out / "needle.json").read_text())
    plan = plan_for(quick=True)
    assert len(result["controls"]) == len(plan.models) * len(plan.lengths)
    assert {c["context"] for c in result["controls"]} == {127, 255}  # prompts of 1x and 2x the training length
    assert not any(c["beyond_training_length"] for c in result["controls"] if c["context"] == 127)
    assert all(c["beyond_training_length"] for c in result["controls"] if c["context"] == 255)
    assert {c["exit_code"] for c in result["controls"]} <= {0, 3, 4}
    for alias in ("w8s8-1kv", "full-1kv"):
        assert (out / "needle-127" / alias / "audit.json").is_file()
        assert (out / "needle-127" / alias / "needle" / "accuracy.png").is_file()
        assert json.loads((out / "runs" / f"{alias}-128" / "config.json").read_text())["train"]["data"]["data"] == "needle"
    assert (out / "runs" / "full-1kv-demo-wide" / "model.safetensors").is_file()  # full attention's widened base
    assert {c["stride"] for c in result["controls"]} == {8}  # the full-attention control tested at period 8 too
    sizes = {(c["model"], c["context"]): c["per_group"] for c in result["controls"]}
    assert sizes == {("W8/S8 · 1 KV", 127): 8, ("W8/S8 · 1 KV", 255): 8, ("Full attention · 1 KV", 127): 16,
                     ("Full attention · 1 KV", 255): 8}  # the negative control's own size at the training length
    assert (out / "curves.png").is_file() and (out / "needle.png").is_file()
    assert "| W8/S8 · 1 KV | 127 |" in (out / "needle.md").read_text()
    # the report reads it: a "Long context" section (the controls' table, each model's audit figure) and markdown
    from phasekv.report.markdown import study_markdown
    from phasekv.report.render import render_report

    page = render_report(out, progress=False).read_text()
    assert 'id="needle"' in page and "Long context" in page and "W8/S8 · 1 KV" in page
    assert (out / "report" / "figures" / "needle-w8s8-1kv.png").is_file()
    assert (out / "report" / "figures" / "needle-full-1kv.png").is_file()
    md = study_markdown(out)
    assert "## Long context" in md and "| W8/S8 · 1 KV | 127 |" in md
    # an audit kept from a plan of another size is done again; the others are kept
    audit, other = (out / "needle-127" / a / "audit.json" for a in ("full-1kv", "w8s8-1kv"))
    result["controls"] = [c | {"per_group": 8} if c["model"] == "Full attention · 1 KV" else c for c in result["controls"]]
    (out / "needle.json").write_text(json.dumps(result))  # as if its audits had been made at another size
    stamps = audit.stat().st_mtime_ns, other.stat().st_mtime_ns
    assert CliRunner().invoke(app, ["study", "--needle", "--quick", "--out", str(out), "--no-progress"]).exit_code == 0
    assert audit.stat().st_mtime_ns != stamps[0] and other.stat().st_mtime_ns == stamps[1]
    assert {c["per_group"] for c in json.loads((out / "needle.json").read_text())["controls"]} == {8, 16}


def test_needle_study_refuses_options_it_does_not_take(tmp_path):
    """--needle runs its chains here, on the CPU: a cluster or device option is refused in one line, not ignored."""
    _mount()
    r = CliRunner().invoke(app, ["study", "--needle", "--executor", "slurm", "--device", "cuda", "--out", str(tmp_path)])
    assert r.exit_code != 0 and "--executor, --device does not apply" in str(r.exception)
    assert not any(tmp_path.iterdir())


def test_widen_a_transformers_run_copies_rows_by_word(tmp_path):
    """DeepSeek-V4's chain widens as full attention's: the rows of the words both tokenizers know, by word."""
    from phasekv.data.tokenizer import load_tokenizer
    from phasekv.demo.needle import DEMO, stage_tokenizer, widen
    from phasekv.train import load_run, train
    from phasekv.train.hfmodel import load_hf_model
    from tests.hf.tiny import v4_config, write_config

    cfg = write_config(v4_config(vocab=528), tmp_path / "config.json")
    run = tmp_path / "demo"
    train(hf_config=str(cfg), out=str(run), data="recall", recall=DEMO["recall"], steps=1, batch_size=2, seq_len=48,
          val_every=0, gate_steps="none", progress=False, threads=1)
    tok = stage_tokenizer(STAGES["base"])
    wide = widen(run, tok, tmp_path / "wide")
    (old, old_tok), new = load_run(run, hf_tokenizer=False), load_hf_model(wide)
    assert load_tokenizer(wide / "tokenizer.json").get_vocab() == tok.get_vocab()
    shared = [w for w in old_tok.get_vocab() if tok.token_to_id(w) is not None]
    assert len(shared) > 64 and tok.get_vocab_size() > old_tok.get_vocab_size()  # the demo's words and the needle's
    for get in (lambda m: m.get_input_embeddings().weight, lambda m: m.get_output_embeddings().weight):
        for w in shared[:: 7]:
            assert torch.equal(get(new)[tok.token_to_id(w)], get(old)[old_tok.token_to_id(w)])
    rest = {k: v for k, v in new.state_dict().items() if "embed" not in k and "lm_head" not in k}
    assert rest and all(torch.equal(v, old.state_dict()[k]) for k, v in rest.items())
