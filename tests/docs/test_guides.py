"""The guides' command blocks run as written, at tiny budgets.

A fenced block preceded by the line `<!-- runs -->` in README.md or a page under docs/ is executed here, every block of a
page in order in one scratch directory (a later block reads what an earlier one wrote), each command in this
process through the `phasekv` command's own entry (no interpreter start per command). `<!-- runs: slow -->`
marks a block too long for `make test`: `make test-slow` runs it. Every line of a marked block must be a
`phasekv` command (comments and `\\` continuations allowed) or the set-up's activation, `source .venv/bin/activate`
(which this process needs not: tests/docs/test_shell.py runs such a block in a shell).

Tiny budgets: the options in TINY replace (or are added to) what a command says, where the command accepts
them: fewer training steps, prompts and resamples; nothing else of the command changes. `phasekv audit`
may end with its verdict codes (3 fail, 4 inconclusive: a two-step model does not retrieve); every other
command must succeed.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]  # the README's recipes and every page of the site
MARK = re.compile(r"^<!-- runs(?::\s*(slow))? -->\s*\n```(?:bash|sh|console)?\n(.*?)^```", re.M | re.S)

# command path -> {option: tiny value (None: a flag)}; "*" applies wherever a command accepts the option
TINY: dict[str, dict[str, str | None]] = {
    "*": {"--batch-size": "4", "--mappings": "2", "--n-boot": "20", "--bench-reps": "0", "--progress": None},
    "train": {"--steps": "2", "--val-sequences": "4", "--val-every": "0", "--gate-probe": "4", "--batch-size": "4",
              "--seq-len": "96"},
    "eval lookup": {"--per-group": "1", "--keep-n": None},
    "eval needle": {"--per-group": "1", "--keep-n": None, "--context": "256"},
    "eval flip": {"--lengths": "3", "--families": "words"},
    "audit": {"--modulus": "8", "--per-group": "64"},
    "analyze knockout": {"--per-group": "1", "--keep-n": None, "--n-cal": "4"},
    "analyze gates": {"--per-group": "1", "--keep-n": None, "--n-prompts": "8"},
    "analyze cycle": {"--per-group": "1", "--keep-n": None, "--delta": "1"},
    "analyze family": {"--per-group": "1", "--keep-n": None, "--ko-per-group": "1"},
    "smoke": {"--tokens": "64", "--decode": "8"},
    "repair": {"--bench-reps": "1", "--bench-batch": "2", "--bench-seq-len": "16"},
    "compare": {},
}
VERDICT_CODES = {"audit": {0, 3, 4}}
ACTIVATE = ["source", ".venv/bin/activate"]  # the set-up's environment on the shell's PATH (README: Two commands)


def blocks(slow: bool) -> list[tuple[str, list[str]]]:
    """(page, commands) for every page with marked blocks of the given kind, in page order."""
    out = []
    for page in PAGES:
        cmds = []
        for m in MARK.finditer(page.read_text()):
            if bool(m.group(1)) == slow:
                cmds += commands(m.group(2))
        if cmds:
            out.append((str(page.relative_to(DOCS if page.is_relative_to(DOCS) else ROOT)), cmds))
    return out


def commands(block: str) -> list[str]:
    lines, out = block.replace("\\\n", " ").splitlines(), []
    for line in lines:
        words = shlex.split(line, comments=True)
        if words == ACTIVATE:
            continue
        if words:
            assert words[0] == "phasekv", f"a marked block runs phasekv commands only: {line!r}"
            out.append(words[1:])
    return out


def _command(group, args: list[str]):
    """(click command, its path words) that `phasekv ARGS` runs."""
    cmd, path = group, []
    for word in args:
        sub = getattr(cmd, "commands", {}).get(word)
        if sub is None:
            break
        cmd, path = sub, [*path, word]
    return cmd, " ".join(path)


def tiny(group, args: list[str]) -> list[str]:
    cmd, path = _command(group, args)
    accepted = {o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", []))}
    want = {k: v for k, v in {**TINY["*"], **TINY.get(path, {})}.items() if k in accepted}
    if "--progress" in want:
        want["--no-progress"] = want.pop("--progress")
    out, i = [], 0
    while i < len(args):
        word = args[i]
        key = word.split("=", 1)[0]
        if key in want and want[key] is not None:
            i += 1 if "=" in word else 2  # drop the option and its value; the tiny one is appended
            continue
        out.append(word)
        i += 1
    for key, value in want.items():
        if value is None:
            if key not in out:
                out.append(key)
        else:
            out += [key, value]
    return out


def phasekv_group():
    """The `phasekv` command's click group, every room's commands mounted (once per process)."""
    import typer.main

    from phasekv import cli

    if not getattr(cli, "_docs_mounted", False):
        cli._mount()
        cli._docs_mounted = True
    return typer.main.get_command(cli.app)


def run_phasekv(args: list[str]) -> int:
    group = phasekv_group()
    argv = tiny(group, args)
    try:
        group.main(args=argv, prog_name="phasekv", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _first_failure(page: str, cmds: list[list[str]], tmp_path, monkeypatch) -> str | None:
    """Run a page's commands in order (later ones use earlier ones' outputs); the first whose exit code is not
    allowed, as a message, or None when every one exits as it should."""
    monkeypatch.chdir(tmp_path)
    for args in cmds:
        code = run_phasekv(args)
        if code not in VERDICT_CODES.get(args[0], {0}):
            return f"{page}: `phasekv {shlex.join(args)}` exited {code}"
    return None


@pytest.mark.parametrize(("page", "cmds"), blocks(slow=False), ids=lambda v: v if isinstance(v, str) else "")
def test_guide_blocks(page, cmds, tmp_path, monkeypatch):
    failure = _first_failure(page, cmds, tmp_path, monkeypatch)
    assert failure is None, failure


@pytest.mark.slow
@pytest.mark.parametrize(("page", "cmds"), blocks(slow=True), ids=lambda v: v if isinstance(v, str) else "")
def test_guide_blocks_slow(page, cmds, tmp_path, monkeypatch):
    failure = _first_failure(page, cmds, tmp_path, monkeypatch)
    assert failure is None, failure


def test_blocks_are_marked():
    """The guides mark their command blocks (a refactoring that dropped every marker would test nothing)."""
    pages = {page for page, _ in blocks(slow=False)}
    assert {"README.md", "getting-started.md", "reference/names.md", "guides/audit.md"} <= pages, pages
