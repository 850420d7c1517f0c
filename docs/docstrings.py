"""A griffe extension that shows hierplan's docstrings well in the API reference.

The docstrings are written for Sphinx and for doctest, and the API pages render them as
Markdown, where two of their constructs come out wrong:

- a role such as :class:`Plan` or :func:`~hierplan.run` would show the role's name before the
  code; it becomes plain code, keeping only the last part of a name written with ``~`` (as
  Sphinx shows it);
- a doctest example (``>>>`` lines and the output after them) would read as nested block
  quotes; it becomes a ``pycon`` code block, without its ``# doctest:`` directives.

mkdocs.yml names this file in the mkdocstrings handler's ``extensions``; the package itself is
not changed.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(~?)([^`]+)`")
DIRECTIVE = re.compile(r"\s*# doctest:.*$")


def _plain(match: re.Match[str]) -> str:
    short, name = match.groups()
    return f"`{name.rsplit('.', 1)[-1] if short else name}`"


def without_roles(text: str) -> str:
    """``text`` with every Sphinx role written as plain code."""
    return ROLE.sub(_plain, text)


def fenced_doctests(text: str) -> str:
    """``text`` with each doctest example (from a ``>>>`` line to the next blank line) in a
    fenced ``pycon`` block, indented as the example was."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.lstrip().startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        example: list[str] = []
        while i < len(lines) and lines[i].strip():
            current = lines[i]
            if current.lstrip().startswith((">>>", "...")):
                current = DIRECTIVE.sub("", current)
            example.append(current[len(indent) :] if current.startswith(indent) else current)
            i += 1
        if out and out[-1].strip():
            out.append("")
        out += [f"{indent}```pycon", *(f"{indent}{e}" for e in example), f"{indent}```"]
    return "\n".join(out)


class SphinxDocstrings(griffe.Extension):
    """Rewrites each docstring as :func:`without_roles` and :func:`fenced_doctests` say."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fenced_doctests(without_roles(obj.docstring.value))
