"""A local server speaking the OpenAI and Anthropic wire formats, for tests and benchmarks.

See :mod:`wire.server` for the faults it injects and :mod:`wire.backends` for what it answers.
No test reaches a real provider: the adapters under test talk to this server on 127.0.0.1.
"""

from hierplan.records import CallRecord, RunResult

from .backends import (
    OracleBackend,
    RepeatBackend,
    Reply,
    ScriptBackend,
    WireCall,
    WireError,
    conform,
    plan_reply,
)
from .server import FAULT_KINDS, NOT_FAILURES, Faults, Hit, WireServer

__all__ = [
    "FAULT_KINDS",
    "MODELS",
    "NOT_FAILURES",
    "PROVIDERS",
    "TEST_KEY",
    "Faults",
    "Hit",
    "OracleBackend",
    "RepeatBackend",
    "Reply",
    "ScriptBackend",
    "WireCall",
    "WireError",
    "WireServer",
    "calls",
    "conform",
    "model_options",
    "plan_reply",
]

MODELS = {"openai": "openai:gpt-5-mini", "anthropic": "anthropic:claude-haiku-4-5"}
"""A priced model of each provider, as the runs over the wire name them."""

PROVIDERS = tuple(MODELS)

TEST_KEY = "test-key"


def model_options(server: WireServer, provider: str, **extra: object) -> dict[str, object]:
    """``model_options`` that point a run's ``provider`` model at ``server``."""
    return {"base_url": server.base_url(provider), "api_key": TEST_KEY, **extra}


def calls(result: RunResult) -> list[CallRecord]:
    """Every model call record of a run, node by node."""
    return [call for node in result.nodes() for call in node.calls]
