"""The press table (`phasekv eval presses`): its Markdown, its sentences and the report's section
"Inference-time compression", from a presses.json written as the sweep writes it."""

from phasekv.eval.presses import findings, markdown
from phasekv.io import write_json
from phasekv.report.load import load_study
from phasekv.report.render import Builder, section_presses


def _row(press, padding, mean, gap, period, p4, p8, chunk=None, kept=(40, 40)):
    return {"press": press, "padding": padding, "dir": f"{padding}/x", "n_prompts": 2304, "chunk": chunk,
            "mean": mean, "mean_ci": [mean - 2, mean + 2], "worst": mean - gap, "best": mean + 1, "gap": gap,
            "gap_ci": [max(0.0, gap - 5), gap + 5], "detected_period": period, "p": {"4": p4, "8": p8},
            "arguments": None, "batch_size": 1,
            "cache": None if press == "none" else {"context": 81, "question": 9, "kept_per_layer": [list(kept)] * 2}}


TABLE = {"model": "qwen3:full-1kv-hf", "per_group": 96, "modulus": 24, "prompts": 2304, "periods": [4, 8], "rows": [
    _row("none", "prefix", 96.0, 2.0, 1, 0.9, 0.8),
    _row("snapkv:0.5", "prefix", 94.0, 3.0, 1, 0.5, 0.4),
    _row("chunkkv(snapkv,8):0.5", "prefix", 70.0, 30.0, 8, 0.2, 0.0001, chunk=8, kept=(33, 40)),
    _row("chunkkv(snapkv,8):0.5", "in-sequence", 45.0, 12.0, 24, 0.6, 0.3, chunk=8, kept=(33, 33)),
]}


def test_markdown_and_sentences_say_which_press_depends_on_phase():
    md = markdown(TABLE)
    assert "| chunkkv(snapkv,8):0.5 | prefix | 33-40 of 81 | 70.0 [68.0, 72.0] | 40.0 | 71.0 | 30.0 [25.0, 35.0] " \
           "| 8 | 0.2000 | 0.0001 |" in md
    assert "| none | prefix | all | 96.0 [94.0, 98.0] |" in md
    says = findings(TABLE)
    assert says[0].startswith("none: no phase dependence detected")
    assert says[1].startswith("snapkv: no phase dependence detected")
    assert says[2].startswith("chunkkv(snapkv,8): retrieval depends on phase at period 8 (chunkkv(snapkv,8):0.5, "
                              "prefix: p 0.0001)")
    assert "0.5 in-sequence: mean 45.0, gap 12.0 [7.0, 17.0]" in says[2]


def test_report_section_from_the_table(tmp_path):
    b = Builder(load_study(tmp_path), tmp_path / "figures")
    section_presses(b)
    assert b.sections == []  # no table, no section
    write_json(tmp_path / "presses" / "presses.json", TABLE)
    section_presses(b)
    [(anchor, title, page)] = b.sections
    assert (anchor, title) == ("presses", "Inference-time compression")
    assert "chunkkv(snapkv,8): retrieval depends on phase at period 8" in page
    assert "33-40 of 81" in page
