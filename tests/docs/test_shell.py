"""Getting started followed literally: its command block runs in a shell that has done only the README's set-up
(`make demo` or `make test` made .venv; the shell's PATH does not hold .venv/bin), from its first line on, each
`phasekv` command at the tiny budgets of test_guides. The commands that write nothing run in `make test`, the whole
block in `make test-slow`."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.test_guides import ACTIVATE, DOCS, MARK, phasekv_group, tiny

GETTING_STARTED = DOCS / "getting-started.md"


def shell_lines(cheap_only: bool) -> list[str]:
    """The first marked block of Getting started as shell lines: the activation as written, every `phasekv` line
    at tiny budgets; with cheap_only, only the commands without `--out`."""
    block = MARK.search(GETTING_STARTED.read_text()).group(2)
    group, out = phasekv_group(), []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words == ACTIVATE:
            out.append(shlex.join(words))
        elif words and not (cheap_only and "--out" in words):
            out.append(shlex.join(["phasekv", *tiny(group, words[1:])]))
    return out


def run_in_fresh_shell(lines: list[str], where: Path) -> subprocess.CompletedProcess:
    """`lines` in bash (stopping at the first failure) in `where`, beside a `.venv` that is the environment running
    these tests, with that environment off the PATH as in a shell that has not activated it."""
    venv = Path(sys.prefix)
    if sys.prefix == sys.base_prefix or not (venv / "bin" / "activate").exists():
        pytest.skip("the tests do not run from a virtual environment like the set-up's .venv")
    (where / ".venv").symlink_to(venv)
    bins = {(venv / "bin").resolve(), Path(sys.executable).parent.resolve()}
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() not in bins)
    if shutil.which("phasekv", path=path):
        pytest.skip(f"a phasekv outside the environment is on the PATH ({shutil.which('phasekv', path=path)})")
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PATH": path}
    return subprocess.run(["bash", "-c", "set -e\n" + "\n".join(lines)], cwd=where, env=env, capture_output=True,
                          text=True, timeout=600)


def test_getting_started_opens_with_the_activation():
    lines = shell_lines(cheap_only=True)
    assert lines[0] == shlex.join(ACTIVATE) and lines[1].startswith("phasekv info"), lines


def test_getting_started_cheap_commands_run_after_the_readme_set_up(tmp_path):
    done = run_in_fresh_shell(shell_lines(cheap_only=True), tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = " ".join(done.stdout.split())  # the terminal width may break a line anywhere
    assert "W8/S8 · 1 KV" in said and "max |decode - parallel|" in said, said[-2000:]


@pytest.mark.slow
def test_getting_started_runs_after_the_readme_set_up(tmp_path):
    done = run_in_fresh_shell(shell_lines(cheap_only=False), tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "runs" / "eval" / "w8s8" / "summary.json").exists()


def test_without_the_activation_phasekv_is_not_found(tmp_path):
    """The shell these tests give the block is one where `phasekv` alone is not found (what a newcomer met)."""
    done = run_in_fresh_shell(shell_lines(cheap_only=True)[1:2], tmp_path)
    assert done.returncode == 127 and "phasekv" in done.stderr, done.stderr
