"""Load the rendered report in headless Chromium: no console errors, the model selector works, a screenshot."""

import shutil
import subprocess
import time

import pytest

from phasekv.report.browser import Browser, find_chromium


def _chromium() -> str | None:
    """Debian's chromium; installed with apt-get when missing (skipped only if that is impossible)."""
    exe = find_chromium()
    if exe is None and shutil.which("apt-get"):
        try:
            subprocess.run("apt-get update -qq && apt-get install -y -qq chromium", shell=True, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        except (subprocess.SubprocessError, OSError):
            return None
        exe = find_chromium()
    return exe


@pytest.fixture(scope="module")
def browser():
    if _chromium() is None:
        pytest.skip("headless chromium is not installed and `apt-get install chromium` failed (no root or no network)")
    with Browser(width=1280, height=900, timeout=45) as b:
        yield b


def _wait(b: Browser, expression: str, timeout: float = 20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = b.eval(expression)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {expression}")


def test_report_in_browser(browser, study_dir, tmp_path):
    browser.open(study_dir / "report" / "index.html")
    n_plots = browser.eval("document.querySelectorAll('.pkv-plot').length")
    assert n_plots >= 10
    # every figure slot was drawn by plotly
    _wait(browser, f"document.querySelectorAll('.pkv-plot .main-svg').length >= {n_plots}")
    assert browser.console_errors() == []

    browser.click('#model-selector button[data-model="w8s8-1kv"]')
    _wait(browser, "document.body.dataset.selected === 'w8s8-1kv'")
    state = browser.eval("""(() => {
        const plots = [...document.querySelectorAll('.pkv-plot')].filter(d => d.data.some(t => t.meta && t.meta.model));
        const res = plots.find(d => d.layout.meta && d.layout.meta.boundaries && d.layout.title.text.includes('mod'));
        const line = t => t.line && t.line.color;
        return {
          sel: res.data.filter(t => t.meta && t.meta.model === 'w8s8-1kv' && t.mode).map(line),
          other: res.data.filter(t => t.meta && t.meta.model === 'full-1kv' && t.mode).map(line),
          shapes: (res.layout.shapes || []).length,
          activeButton: document.querySelector('#model-selector button.active').dataset.model,
          dimRows: document.querySelectorAll('tr.dim').length,
        };
    })()""")
    assert state["activeButton"] == "w8s8-1kv"
    assert state["shapes"] == 24 // 8 - 1  # W8/S8's period boundaries, dashed
    assert all(c == "#c8c8c8" for c in state["other"] if c)  # other models greyed out
    assert all(c != "#c8c8c8" for c in state["sel"] if c)
    assert state["dimRows"] > 0
    shot = browser.screenshot(tmp_path / "report.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000

    browser.click('#model-selector button[data-model="all"]')
    _wait(browser, "document.body.dataset.selected === 'all'")
    assert browser.console_errors() == []
