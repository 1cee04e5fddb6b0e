"""MkDocs hook: the command-line reference, rendered from the `phasekv` command itself at build time.

A page holding the line `<!-- cli-reference -->` gets, in its place, one section per command (walking the
typer app's groups): its help text, usage line and a table of its options as `phasekv COMMAND --help`
states them (names, help, default, required). Nothing is copied by hand, so the reference cannot drift
from the commands.
"""

from __future__ import annotations

import html
import re

MARKER = "<!-- cli-reference -->"


def _app():
    import typer.main

    from phasekv import cli

    if not getattr(cli, "_docs_mounted", False):  # the hook runs once per build; mount the rooms once
        cli._mount()
        cli._docs_mounted = True
    return typer.main.get_command(cli.app)


def _cell(text: str) -> str:
    """One Markdown table cell: a single line, pipes and angle brackets escaped."""
    text = " ".join(str(text).split())
    return html.escape(text, quote=False).replace("|", "\\|")


def _help_text(cmd) -> str:
    text = (cmd.help or "").strip()
    text = re.sub(r"\n[ \t]+", "\n", text)  # typer keeps the docstring's indentation
    return text


def _options(cmd, ctx) -> list[str]:
    rows = []
    for param in cmd.params:
        if getattr(param, "hidden", False):
            continue
        record = param.get_help_record(ctx) if param.param_type_name == "option" else None
        if param.param_type_name == "argument":
            names, help_ = param.name.upper(), getattr(param, "help", None) or ""
        elif record is None:
            continue
        else:
            names, help_ = record
        code = " ".join(names.split()).replace("|", "\\|")  # a code span: no HTML escapes, pipes escaped
        rows.append(f"| `{code}` | {_cell(help_)} |")
    if not rows:
        return []
    return ["| option | description |", "|---|---|", *rows]


def _walk(cmd, path: list[str], parent_ctx, out: list[str]) -> None:
    ctx = cmd.context_class(cmd, info_name=path[-1], parent=parent_ctx)
    subcommands = getattr(cmd, "commands", None)
    title = " ".join(path)
    depth = min(len(path) + 1, 4)
    out.append(f"{'#' * depth} `{title}`\n")
    help_text = _help_text(cmd)
    if help_text:
        out.append(help_text + "\n")
    pieces = " ".join(cmd.collect_usage_pieces(ctx))
    out.append(f"```text\n{title} {pieces}\n```\n")
    table = _options(cmd, ctx)
    if table:
        out.append("\n".join(table) + "\n")
    if subcommands:
        for name in sorted(subcommands):
            _walk(subcommands[name], [*path, name], ctx, out)


def render() -> str:
    out: list[str] = []
    _walk(_app(), ["phasekv"], None, out)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
