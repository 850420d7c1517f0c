"""A local server speaking the OpenAI and Anthropic wire formats, for tests and benchmarks.

See :mod:`wire.server` for the faults it injects and :mod:`wire.backends` for what it answers.
No test reaches a real provider: the adapters under test talk to this server on 127.0.0.1.
"""

from .backends import OracleBackend, Reply, ScriptBackend, WireCall, WireError, conform
from .server import FAULT_KINDS, NOT_FAILURES, Faults, Hit, WireServer

__all__ = [
    "FAULT_KINDS",
    "NOT_FAILURES",
    "Faults",
    "Hit",
    "OracleBackend",
    "Reply",
    "ScriptBackend",
    "WireCall",
    "WireError",
    "WireServer",
    "conform",
]
