"""Text from a plan, a model or a file, made safe to print.

Such text may hold control characters (ESC starts the escape sequences that move a terminal's
cursor, clear its screen or set its window title), bidirectional controls (they reorder the text
shown around them) and lone surrogates (a JSON ``"\\ud800"`` reads as one, and no encoding can
write it: printing it raises ``UnicodeEncodeError``). :func:`printable` shows each of them as a
visible symbol instead.

>>> printable("ok\\x1b[2J\\ud800")
'ok␛[2J�'
"""

from __future__ import annotations

import re

# Unicode's bidirectional embedding, override and isolate controls: they reorder the text
# around them as it is shown, so "cost: $1 \u202e0001$" reads "cost: $1 $1000".
BIDI_CONTROLS = "\u202a-\u202e\u2066-\u2069"
# Surrogate code points: a Python string holds them (JSON's "\ud800" escape makes one), but
# UTF-8 cannot encode them, so a terminal or a file written as UTF-8 refuses the whole text.
SURROGATES = "\ud800-\udfff"
# C0 and C1 control characters (ESC and CSI start terminal escape sequences), DEL, the
# bidirectional controls and the surrogates.
_UNPRINTABLE = re.compile(f"[\x00-\x1f\x7f-\x9f{BIDI_CONTROLS}{SURROGATES}]")
# The same but for tabs and line breaks, which a page or a multi-line answer keeps.
_HIDDEN_IN_LINES = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f{BIDI_CONTROLS}{SURROGATES}]")


def control_symbol(match: re.Match[str]) -> str:
    """A visible stand-in for the character ``match`` found: a C0 control as its Unicode
    control picture (ESC shows as ␛), DEL as ␡, anything else as the replacement character."""
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)
    return "\u2421" if code == 0x7F else "\ufffd"


def printable(text: str) -> str:
    """``text`` with its control, bidirectional and surrogate characters shown as visible
    symbols (see :func:`control_symbol`), so that printing it can neither drive the terminal
    nor fail to encode."""
    return _UNPRINTABLE.sub(control_symbol, text)


def printable_lines(text: str) -> str:
    """As :func:`printable`, but tabs and line breaks are kept: for text shown as written,
    over several lines (an answer in a page)."""
    return _HIDDEN_IN_LINES.sub(control_symbol, text)
