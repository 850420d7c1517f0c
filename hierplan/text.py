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
from collections.abc import Callable, Collection
from typing import Any

# Unicode's bidirectional embedding, override and isolate controls: they reorder the text
# around them as it is shown, so "cost: $1 \u202e0001$" reads "cost: $1 $1000".
BIDI_CONTROLS = "\u202a-\u202e\u2066-\u2069"
# Surrogate code points: a Python string holds them (JSON's "\ud800" escape makes one), but
# UTF-8 cannot encode them, so a terminal or a file written as UTF-8 refuses the whole text.
SURROGATES = "\ud800-\udfff"
# C0 and C1 control characters (ESC and CSI start terminal escape sequences), DEL, the
# bidirectional controls and the surrogates.
_UNPRINTABLE = re.compile(f"[\x00-\x1f\x7f-\x9f{BIDI_CONTROLS}{SURROGATES}]")
_SURROGATE = re.compile(f"[{SURROGATES}]")
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


def encodable(text: str) -> str:
    """``text`` with each surrogate replaced by U+FFFD, so that it can be written as UTF-8
    (a model's JSON reply may hold a ``"\\ud800"`` escape, which reads as one)."""
    return _SURROGATE.sub("\ufffd", text)


def map_strings(value: Any, change: Callable[[str], str], *, keep: Collection[str] = ()) -> Any:
    """``value`` (JSON-like: dicts, lists and scalars) with ``change`` applied to every string,
    as a new value; the input is not changed. The values of the keys in ``keep`` are left as
    they are. Dict keys are field names and are kept too."""
    if isinstance(value, str):
        return change(value)
    if not isinstance(value, dict | list | tuple):
        return value
    top = _empty_copy(value)
    # Without recursion: a plan's arguments may nest as deep as a JSON reader allows.
    pending: list[tuple[Any, Any]] = [(value, top)]
    while pending:
        source, copy = pending.pop()
        slots = source.items() if isinstance(source, dict) else enumerate(source)
        for slot, item in slots:
            if isinstance(item, str):
                copy[slot] = item if slot in keep else change(item)
            elif isinstance(item, dict | list | tuple) and slot not in keep:
                inner = _empty_copy(item)
                copy[slot] = inner
                pending.append((item, inner))
            else:
                copy[slot] = item
    return top


def _empty_copy(container: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> Any:
    """A container to fill with ``container``'s items by key or index: a dict with its keys
    in order, or a list of its length."""
    if isinstance(container, dict):
        return dict.fromkeys(container)
    return [None] * len(container)


def replace_strings(
    data: dict[str, Any] | list[Any], change: Callable[[str], str], *, keep: Collection[str] = ()
) -> None:
    """Apply ``change`` to every string of ``data`` (JSON-like, as ``json.loads`` or a JSON
    dump makes it: dicts, lists and scalars) in place, but for the values of the keys in
    ``keep``. For data just made to be written (a run's record): no copy of it is made, which
    halves the time of the walk."""
    pending: list[Any] = [data]
    while pending:
        container = pending.pop()
        if type(container) is dict:
            for key, item in container.items():
                kind = type(item)  # exact types, faster than isinstance on the hot path
                if key in keep:
                    continue
                if kind is str:
                    container[key] = change(item)
                elif kind is dict or kind is list:
                    pending.append(item)
        else:
            for index, item in enumerate(container):
                kind = type(item)
                if kind is str:
                    container[index] = change(item)
                elif kind is dict or kind is list:
                    pending.append(item)
