"""Credentials taken out of text before it is kept or shown.

:func:`redact` replaces, in any text:

- the user information of a URL (``http://user:secret@host/v1`` becomes
  ``http://REDACTED@host/v1``) and the values of its query and fragment parameters whose names
  say they hold a secret (``key``, ``token``, ``secret``, ``password``, ``signature``,
  ``credential``, ``session``...: ``?api_key=REDACTED``), with a word that keeps the URL a URL;
- API keys of the common shapes: OpenAI's ``sk-...`` and ``sk-proj-...``, Anthropic's
  ``sk-ant-...``, AWS access key ids (``AKIA...``), and ``Bearer <token>``;
- a value written after a name that says it is secret (``api_key: ...``, ``password=...``);

these by ``[REDACTED]``.

:func:`redact_data` does the same to every string of JSON-like data. Run records, reports,
benchmark files and traces pass what they keep through them.

>>> redact("GET http://bob:hunter2@example.com/v1?api_key=abc123 with sk-proj-Abc123xyz789")
'GET http://REDACTED@example.com/v1?api_key=REDACTED with [REDACTED]'
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from hierplan.text import map_strings

REDACTED = "[REDACTED]"
"""What stands in for a credential taken out of text."""
IN_URL = "REDACTED"
"""What stands in for the user information or a secret parameter of a URL: a word a URL may
hold where they were, so that the URL still reads as one (``[`` in its user information would
not)."""

# The user information of a URL: what comes between "scheme://" and the last "@" before the
# host. Quotes, angle brackets and spaces end it, so that in JSON ("url": "http://host",
# "mail": "a@b") the "@" of a later value is not taken for one.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#\s\"'<>\\`]+@")
# A query or fragment parameter whose name says it holds a secret (a fragment carries an
# OAuth access_token); its value runs to the next "&", "#", space or quote.
_SECRET_PARAM = re.compile(
    r"(?i)([?&#][a-z0-9_.\-]*(?:key|token|secret|passw|pwd|signature|credential|session)"
    r"[a-z0-9_.\-]*=|[?&#](?:auth|sig|pass)=)"
    r"[^&#\s\"'<>]+"
)
_KEYS = re.compile(
    # OpenAI (sk-..., sk-proj-...) and Anthropic (sk-ant-...) keys; not "task-" or "risk-"
    r"(?<![A-Za-z0-9])sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{8,}"
    r"|\bAKIA[0-9A-Z]{16}\b"  # AWS access key ids
    r"|(?i:\bbearer)\s+[A-Za-z0-9._~+/\-]{8,}=*"
    # "api_key: ...", "password=...": the name says that the value is a secret.
    r"|(?i:api[_-]?key|secret|password|token)[\"']?\s*[:=]\s*[\"']?"
    r"(?!\[?REDACTED)[^\s\"',}]{8,}"
)


# No credential of the shapes above is shorter ("a://b@c", "?key=x").
_SHORTEST = 6


def redact(text: str) -> str:
    """``text`` with the credentials it holds replaced (see the module's description for what
    is taken out, and by what)."""
    if len(text) < _SHORTEST:
        return text
    if "://" in text:
        text = _USERINFO.sub(rf"\1{IN_URL}@", text)
    if "=" in text:
        text = _SECRET_PARAM.sub(rf"\1{IN_URL}", text)
    return _KEYS.sub(REDACTED, text)


def redact_data(value: Any, *, keep: Collection[str] = ()) -> Any:
    """``value`` (JSON-like: dicts, lists and scalars) with every string redacted, as a new
    value; the input is not changed. The values of the keys in ``keep`` are left as they are:
    names that must stay as written (a step's id, which other fields refer to)."""
    return map_strings(value, redact, keep=keep)
