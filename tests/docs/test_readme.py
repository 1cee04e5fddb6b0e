"""What a newcomer meets first: the README's Python snippet runs as written, and the pages that state the
demo's time all quote the one measured on The demo's page."""

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DEMO_TIME = re.compile(r"^\*\*Time:\*\* (.+?), set-up included", re.M)  # on The demo's page, where it is measured
# the pages a newcomer reads the demo's time on
STATING_IT = [README, DOCS / "index.md", DOCS / "getting-started.md", DOCS / "study.md", DOCS / "guides" / "study.md"]
# what they said before there was one source: every page had its own
STALE = re.compile(r"~\s?6-(?:8|12) min|~10-12|about ten minutes|five models in")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def test_readme_python_runs_as_written():
    (block,) = python_blocks(README.read_text())
    names: dict = {}
    exec(compile(block, "README.md", "exec"), names)
    cfg, logits, cache = names["cfg"], names["logits"], names["cache"]
    assert logits.shape == (1, 1, cfg.vocab_size)
    assert cache.pos == names["input_ids"].shape[1] + 1
    # the snippet's comment: the prompt through the cache gives the same logits as without it
    model, prompt = names["model"], names["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model(prompt, cache=model.new_cache(1)), model(prompt), atol=1e-4, rtol=1e-4)


def demo_time() -> str:
    found = DEMO_TIME.search((DOCS / "results" / "demo.md").read_text())
    assert found is not None, "docs/results/demo.md states the demo's time on a line starting **Time:**"
    return found.group(1)


@pytest.mark.parametrize("page", STATING_IT, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_quotes_the_measured_demo_time(page):
    text = " ".join(page.read_text().split())  # a phrase may be broken across lines
    assert demo_time() in text, f"{page.name} does not say: {demo_time()}"
    assert STALE.search(text) is None, STALE.search(text).group(0)
