"""`phasekv study --needle`: the long-context regime's path (train chains, needle tests, audits) at tiny budgets.
It checks the plumbing, not the effect: models this small and this briefly trained are at chance."""

import json

from typer.testing import CliRunner

from phasekv.cli import _mount, app
from phasekv.demo.needle import STAGES, plan_for


def test_plan_chains_each_model_from_its_previous_stage(tmp_path):
    plan = plan_for(quick=False)
    assert plan.train_len == 1024 and plan.per_group % 64 == 0 and plan.lengths == (1, 2, 4)
    assert list(plan.stages) == ["base", "256", "1024"] and plan.stages is STAGES
    chains = {model: (alias, chain) for model, alias, chain in plan.runs(tmp_path)}
    alias, full = chains.pop("Full attention · 1 KV")  # its own chain: the demo's words, widened, then the needle's
    assert [r.alias for r in full] == [f"{alias}-{t}" for t in ("demo", "base", "256", "1024")]
    assert [r.options.get("init_from") for r in full] == [None, f"{full[0].out}-wide", str(full[1].out),
                                                         str(full[2].out)]
    assert full[0].config().data.recall.n_keys == 32 and full[0].config().data.recall.key_words == 1
    assert [r.config().seq_len for r in full] == [96, 96, 256, 1024]
    for model, (alias, chain) in chains.items():
        assert [r.options.get("init_from") for r in chain] == [None, str(chain[0].out), str(chain[1].out)]
        cfgs = [r.config() for r in chain]
        assert [c.seq_len for c in cfgs] == [96, 256, 1024] and cfgs[-1].data.is_needle and cfgs[0].data.is_recall
        assert cfgs[0].data.recall.key_words == 2 and cfgs[0].data.recall.n_keys == 0  # the needle's words
        assert cfgs[-1].data.needle.records == 125  # the test's density at 1,024 tokens
        assert chain[0].alias == f"{alias}-base" and cfgs[0].arch == model
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


def test_needle_study_refuses_options_it_does_not_take(tmp_path):
    """--needle runs its chains here, on the CPU: a cluster or device option is refused in one line, not ignored."""
    _mount()
    r = CliRunner().invoke(app, ["study", "--needle", "--executor", "slurm", "--device", "cuda", "--out", str(tmp_path)])
    assert r.exit_code != 0 and "--executor, --device does not apply" in str(r.exception)
    assert not any(tmp_path.iterdir())
