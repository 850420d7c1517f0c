"""Rendering as a terminal is sent it, for the tests of what hierplan prints."""

from __future__ import annotations

import io
import re

from rich.console import Console, RenderableType

# What must never reach a terminal from a plan or a run: C0 and C1 controls (but the line breaks
# the rendering itself makes), DEL, the bidirectional controls and the surrogates.
UNPRINTABLE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def render(*parts: RenderableType, width: int = 160) -> str:
    """What a terminal would be sent, written as UTF-8 that refuses what it cannot encode."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    console = Console(file=stream, width=width, color_system=None, force_terminal=False)
    for part in parts:
        console.print(part)
    stream.flush()
    return raw.getvalue().decode("utf-8")
