"""The pages whose examples the tests run as written: README.md and every page under docs/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """README.md, then the documentation site's pages (docs/*.md) in name order."""
    return [README, *sorted(DOCS.glob("*.md"))]


def page(name: str) -> str:
    """The text of the documentation page ``docs/<name>``."""
    return (DOCS / name).read_text(encoding="utf-8")


def label(path: Path) -> str:
    """A page's path from the repository's root, as tests name it."""
    return path.relative_to(ROOT).as_posix()


def fences(text: str) -> list[tuple[str, str]]:
    """Every fenced code block of ``text`` as (info string, body), in order."""
    found: list[tuple[str, str]] = []
    current: list[str] | None = None
    info = ""
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current, info = [], line[3:].strip()
                continue
            found.append((info, "\n".join(current) + "\n"))
            current = None
        elif current is not None:
            current.append(line)
    return found


def blocks(text: str, info: str) -> list[str]:
    """The bodies of the fenced blocks of ``text`` whose info string is ``info``."""
    return [body for found, body in fences(text) if found == info]


FILE_INFO = re.compile(r'python (?:file=(\S+)|title="([^"]+)")')


def file_blocks(text: str) -> dict[str, str]:
    """Blocks marked ```python title="NAME" (or ```python file=NAME): files that a page's
    examples use, written before they run."""
    files: dict[str, str] = {}
    for info, body in fences(text):
        match = FILE_INFO.fullmatch(info)
        if match:
            files[match.group(1) or match.group(2)] = body
    return files


def headings(text: str) -> list[tuple[int, int, str]]:
    """The Markdown headings of ``text`` outside code blocks, as (line index, level, title)."""
    found: list[tuple[int, int, str]] = []
    in_fence = False
    for index, line in enumerate(text.splitlines()):
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and (heading := re.fullmatch(r"(#+) (.*)", line)):
            found.append((index, len(heading.group(1)), heading.group(2).strip()))
    return found


def section(text: str, title: str) -> str:
    """The part of ``text`` under the heading ``title`` (of any level), up to the next heading
    of the same level or a higher one; raises ValueError when there is no such heading."""
    lines = text.splitlines()
    found = headings(text)
    for n, (start, level, name) in enumerate(found):
        if name == title:
            end = next((i for i, other, _ in found[n + 1 :] if other <= level), len(lines))
            return "\n".join(lines[start:end])
    raise ValueError(f"no heading {title!r}")
