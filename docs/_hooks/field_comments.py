"""Griffe extension (mkdocs.yml: the python handler's `extensions`): a dataclass field's trailing comment becomes
its docstring on the API pages, so a config's fields are documented once, where they are declared, in nanoGPT's
style:

    n_heads: int = 4  # query heads
    init_std: float | None = None  # std of every weight matrix at init; None: torch's nn.Linear variance,
    #                                token embeddings N(0, 1) (continued on comment lines indented under the text)

A field with a docstring of its own keeps it; a section comment (`# --- backbone ---`) is not a continuation.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import griffe

CONTINUED = re.compile(r"^\s*#\s{2,}(\S.*)$")  # a comment-only line whose text is indented under the field's comment


@functools.cache
def _lines(path: str) -> tuple[str, ...]:
    return tuple(Path(path).read_text().splitlines())


def trailing_comment(lines: tuple[str, ...], lineno: int, endlineno: int) -> str | None:
    """The comment after the statement on lines lineno..endlineno (1-based), with its continuation lines."""
    _, sep, text = lines[endlineno - 1].partition("  # ")
    if not sep:
        return None
    parts = [text.strip()]
    for line in lines[endlineno:]:
        more = CONTINUED.match(line)
        if more is None:
            break
        parts.append(more.group(1).strip())
    return " ".join(parts)


class FieldComments(griffe.Extension):
    def on_attribute_instance(self, *, node, attr: griffe.Attribute, agent, **kwargs) -> None:
        if attr.docstring is not None or not isinstance(node, ast.AnnAssign) or not attr.parent.is_class:
            return
        if attr.filepath is None or attr.lineno is None:
            return
        text = trailing_comment(_lines(str(attr.filepath)), attr.lineno, attr.endlineno or attr.lineno)
        if text:
            attr.docstring = griffe.Docstring(text, lineno=attr.lineno, parent=attr)
