"""hierplan: hierarchical planner-executor agents with inspectable plans and exact budgets.

>>> import hierplan
>>> fast = hierplan.Simulator(latency_scale=0)
>>> result = hierplan.run_sync(scenario="data_migration", model=fast)  # doctest: +SKIP
>>> result.status, result.totals()["cost_usd"]  # doctest: +SKIP
('succeeded', 0.0155)
"""

from __future__ import annotations

import importlib
from types import MappingProxyType as _MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hierplan.agents.executor import LLMExecutor, ToolExecutor
    from hierplan.agents.planner import LLMPlanner
    from hierplan.budgets.budget import Budget
    from hierplan.budgets.instrument import BudgetInstrument
    from hierplan.budgets.ledger import Ledger, LocalLedger
    from hierplan.core.calls import CallOutcome
    from hierplan.core.events import (
        AnyEvent,
        BudgetExhausted,
        BudgetOverrun,
        BudgetReserved,
        BudgetSettled,
        Listener,
        ModelCalled,
        NodeFinished,
        NodeStarted,
        PlanDecided,
        PlanProposed,
        Replanned,
        RunEvent,
        RunFinished,
        RunStarted,
        StepRetried,
        ToolCalled,
        parse_event,
    )
    from hierplan.core.instrument import CallScope, Instrument
    from hierplan.core.results import StepResult
    from hierplan.core.settings import RunSettings
    from hierplan.core.views import NodeView, RunView, StepEnv
    from hierplan.errors import (
        BudgetExceeded,
        HierplanError,
        ModelAuthError,
        ModelError,
        PlanValidationError,
        StepFailed,
        ToolArgsError,
        ToolBlocked,
        ToolError,
        ToolNotAllowedError,
        ToolServerGone,
        ToolTimeoutError,
        UnexpectedModelCall,
        UserInputError,
    )
    from hierplan.hierarchy.context import NodeContext, RunContext
    from hierplan.hierarchy.gate import (
        Approver,
        AutoApprove,
        CallbackApprover,
        Gate,
        GateContext,
        ReviewFunction,
    )
    from hierplan.hierarchy.strategies import STRATEGIES
    from hierplan.models import (
        FunctionModel,
        Model,
        ModelRequest,
        ModelResponse,
        ScriptedModel,
        ToolCall,
        Usage,
    )
    from hierplan.models.scripted import (
        ResponseFunction,
        plan_response,
        text_response,
        tool_response,
    )
    from hierplan.plans.decisions import Approve, Decision, Defer, Edit, Reject
    from hierplan.plans.plan import Plan, Step, critical_path, topological_order, validate_plan
    from hierplan.pricing import Price, PriceTable
    from hierplan.records import NodeRecord, RunResult
    from hierplan.review import ConsoleReviewer, PauseForReview, PolicyApprover, ReviewPolicy
    from hierplan.runner.handle import EventStream, RunHandle, start
    from hierplan.runner.models import resolve_model
    from hierplan.runner.resume import ResumeOptions, resume, resume_sync, start_resume
    from hierplan.runner.run import RunOptions, run, run_sync
    from hierplan.runner.spec import BudgetSpec, ModelSpec, RunSpec
    from hierplan.simulator.model import SimulatedModel
    from hierplan.simulator.profiles import NoiseProfile, Simulator
    from hierplan.tools.base import Tool, ToolHints, Toolset, tool
    from hierplan.tools.config import MCPConfig, ToolsetSpec
    from hierplan.tools.mcp import MCPServer, MCPServerStdio, MCPServerStreamableHTTP, MCPTool
    from hierplan.tracing.otel import Tracing

    __version__: str

# The module that defines each public name. A name is imported when it is first used, not by
# ``import hierplan``: the ``hierplan`` command's entry point (:mod:`hierplan.__main__`) is in
# this package, and must be ready for a Ctrl-C before the imports the command needs (most of a
# second) begin. A program that uses a name imports what defines it then.
_MODULES = _MappingProxyType(
    {
        "LLMExecutor": "hierplan.agents.executor",
        "ToolExecutor": "hierplan.agents.executor",
        "LLMPlanner": "hierplan.agents.planner",
        "Budget": "hierplan.budgets.budget",
        "BudgetInstrument": "hierplan.budgets.instrument",
        "Ledger": "hierplan.budgets.ledger",
        "LocalLedger": "hierplan.budgets.ledger",
        "CallOutcome": "hierplan.core.calls",
        "AnyEvent": "hierplan.core.events",
        "BudgetExhausted": "hierplan.core.events",
        "BudgetOverrun": "hierplan.core.events",
        "BudgetReserved": "hierplan.core.events",
        "BudgetSettled": "hierplan.core.events",
        "Listener": "hierplan.core.events",
        "ModelCalled": "hierplan.core.events",
        "NodeFinished": "hierplan.core.events",
        "NodeStarted": "hierplan.core.events",
        "PlanDecided": "hierplan.core.events",
        "PlanProposed": "hierplan.core.events",
        "Replanned": "hierplan.core.events",
        "RunEvent": "hierplan.core.events",
        "RunFinished": "hierplan.core.events",
        "RunStarted": "hierplan.core.events",
        "StepRetried": "hierplan.core.events",
        "ToolCalled": "hierplan.core.events",
        "parse_event": "hierplan.core.events",
        "CallScope": "hierplan.core.instrument",
        "Instrument": "hierplan.core.instrument",
        "StepResult": "hierplan.core.results",
        "RunSettings": "hierplan.core.settings",
        "NodeView": "hierplan.core.views",
        "RunView": "hierplan.core.views",
        "StepEnv": "hierplan.core.views",
        "BudgetExceeded": "hierplan.errors",
        "HierplanError": "hierplan.errors",
        "ModelAuthError": "hierplan.errors",
        "ModelError": "hierplan.errors",
        "PlanValidationError": "hierplan.errors",
        "StepFailed": "hierplan.errors",
        "ToolArgsError": "hierplan.errors",
        "ToolBlocked": "hierplan.errors",
        "ToolError": "hierplan.errors",
        "ToolNotAllowedError": "hierplan.errors",
        "ToolServerGone": "hierplan.errors",
        "ToolTimeoutError": "hierplan.errors",
        "UnexpectedModelCall": "hierplan.errors",
        "UserInputError": "hierplan.errors",
        "NodeContext": "hierplan.hierarchy.context",
        "RunContext": "hierplan.hierarchy.context",
        "Approver": "hierplan.hierarchy.gate",
        "AutoApprove": "hierplan.hierarchy.gate",
        "CallbackApprover": "hierplan.hierarchy.gate",
        "Gate": "hierplan.hierarchy.gate",
        "GateContext": "hierplan.hierarchy.gate",
        "ReviewFunction": "hierplan.hierarchy.gate",
        "STRATEGIES": "hierplan.hierarchy.strategies",
        "FunctionModel": "hierplan.models",
        "Model": "hierplan.models",
        "ModelRequest": "hierplan.models",
        "ModelResponse": "hierplan.models",
        "ScriptedModel": "hierplan.models",
        "ToolCall": "hierplan.models",
        "Usage": "hierplan.models",
        "ResponseFunction": "hierplan.models.scripted",
        "plan_response": "hierplan.models.scripted",
        "text_response": "hierplan.models.scripted",
        "tool_response": "hierplan.models.scripted",
        "Approve": "hierplan.plans.decisions",
        "Decision": "hierplan.plans.decisions",
        "Defer": "hierplan.plans.decisions",
        "Edit": "hierplan.plans.decisions",
        "Reject": "hierplan.plans.decisions",
        "Plan": "hierplan.plans.plan",
        "Step": "hierplan.plans.plan",
        "critical_path": "hierplan.plans.plan",
        "topological_order": "hierplan.plans.plan",
        "validate_plan": "hierplan.plans.plan",
        "Price": "hierplan.pricing",
        "PriceTable": "hierplan.pricing",
        "NodeRecord": "hierplan.records",
        "RunResult": "hierplan.records",
        "ConsoleReviewer": "hierplan.review",
        "PauseForReview": "hierplan.review",
        "PolicyApprover": "hierplan.review",
        "ReviewPolicy": "hierplan.review",
        "EventStream": "hierplan.runner.handle",
        "RunHandle": "hierplan.runner.handle",
        "start": "hierplan.runner.handle",
        "resolve_model": "hierplan.runner.models",
        "ResumeOptions": "hierplan.runner.resume",
        "resume": "hierplan.runner.resume",
        "resume_sync": "hierplan.runner.resume",
        "start_resume": "hierplan.runner.resume",
        "RunOptions": "hierplan.runner.run",
        "run": "hierplan.runner.run",
        "run_sync": "hierplan.runner.run",
        "BudgetSpec": "hierplan.runner.spec",
        "ModelSpec": "hierplan.runner.spec",
        "RunSpec": "hierplan.runner.spec",
        "SimulatedModel": "hierplan.simulator.model",
        "NoiseProfile": "hierplan.simulator.profiles",
        "Simulator": "hierplan.simulator.profiles",
        "Tool": "hierplan.tools.base",
        "ToolHints": "hierplan.tools.base",
        "Toolset": "hierplan.tools.base",
        "tool": "hierplan.tools.base",
        "MCPConfig": "hierplan.tools.config",
        "ToolsetSpec": "hierplan.tools.config",
        "Tracing": "hierplan.tracing.otel",
    }
)

# MCP tools need the optional ``mcp`` extra: imported on first use, with a clear message.
_MCP_NAMES = ("MCPServer", "MCPServerStdio", "MCPServerStreamableHTTP", "MCPTool")


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = getattr(importlib.import_module(_MODULES[name]), name)
    elif name in _MCP_NAMES:
        try:
            from hierplan.tools import mcp
        except ModuleNotFoundError as exc:
            raise ImportError(
                f"hierplan.{name} needs the MCP SDK ({exc}); install it with "
                "pip install 'hierplan[mcp]'"
            ) from None
        value = getattr(mcp, name)
    elif name == "__version__":
        value = _version()
    else:
        raise AttributeError(f"module 'hierplan' has no attribute {name!r}")
    globals()[name] = value  # found once: later uses do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _version() -> str:
    """The installed distribution's version, so that it is written in one place."""
    from importlib import metadata

    try:
        return metadata.version("hierplan")
    except metadata.PackageNotFoundError:  # imported from a source tree that was not installed
        return "0+unknown"


__all__ = [
    "STRATEGIES",
    "AnyEvent",
    "Approve",
    "Approver",
    "AutoApprove",
    "Budget",
    "BudgetExceeded",
    "BudgetExhausted",
    "BudgetInstrument",
    "BudgetOverrun",
    "BudgetReserved",
    "BudgetSettled",
    "BudgetSpec",
    "CallOutcome",
    "CallScope",
    "CallbackApprover",
    "ConsoleReviewer",
    "Decision",
    "Defer",
    "Edit",
    "EventStream",
    "FunctionModel",
    "Gate",
    "GateContext",
    "HierplanError",
    "Instrument",
    "LLMExecutor",
    "LLMPlanner",
    "Ledger",
    "Listener",
    "LocalLedger",
    "MCPConfig",
    "MCPServer",
    "MCPServerStdio",
    "MCPServerStreamableHTTP",
    "MCPTool",
    "Model",
    "ModelAuthError",
    "ModelCalled",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ModelSpec",
    "NodeContext",
    "NodeFinished",
    "NodeRecord",
    "NodeStarted",
    "NodeView",
    "NoiseProfile",
    "PauseForReview",
    "Plan",
    "PlanDecided",
    "PlanProposed",
    "PlanValidationError",
    "PolicyApprover",
    "Price",
    "PriceTable",
    "Reject",
    "Replanned",
    "ResponseFunction",
    "ResumeOptions",
    "ReviewFunction",
    "ReviewPolicy",
    "RunContext",
    "RunEvent",
    "RunFinished",
    "RunHandle",
    "RunOptions",
    "RunResult",
    "RunSettings",
    "RunSpec",
    "RunStarted",
    "RunView",
    "ScriptedModel",
    "SimulatedModel",
    "Simulator",
    "Step",
    "StepEnv",
    "StepFailed",
    "StepResult",
    "StepRetried",
    "Tool",
    "ToolArgsError",
    "ToolBlocked",
    "ToolCall",
    "ToolCalled",
    "ToolError",
    "ToolExecutor",
    "ToolHints",
    "ToolNotAllowedError",
    "ToolServerGone",
    "ToolTimeoutError",
    "Toolset",
    "ToolsetSpec",
    "Tracing",
    "UnexpectedModelCall",
    "Usage",
    "UserInputError",
    "__version__",
    "critical_path",
    "parse_event",
    "plan_response",
    "resolve_model",
    "resume",
    "resume_sync",
    "run",
    "run_sync",
    "start",
    "start_resume",
    "text_response",
    "tool",
    "tool_response",
    "topological_order",
    "validate_plan",
]
