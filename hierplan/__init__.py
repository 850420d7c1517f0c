"""hierplan: hierarchical planner-executor agents with inspectable plans and exact budgets.

>>> import hierplan
>>> fast = hierplan.Simulator(latency_scale=0)
>>> result = hierplan.run_sync(scenario="data_migration", model=fast)  # doctest: +SKIP
>>> result.status, result.totals()["cost_usd"]  # doctest: +SKIP
('succeeded', 0.0155)
"""

from __future__ import annotations

from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

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
from hierplan.models.scripted import ResponseFunction, plan_response, text_response, tool_response
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
from hierplan.tools.base import Tool, Toolset, tool
from hierplan.tracing.otel import Tracing

if TYPE_CHECKING:
    from hierplan.tools.mcp import MCPServer, MCPServerStdio, MCPServerStreamableHTTP, MCPTool

try:  # the installed distribution's version, so that it is written in one place
    __version__ = _metadata.version("hierplan")
except _metadata.PackageNotFoundError:  # imported from a source tree that was not installed
    __version__ = "0+unknown"

# MCP tools need the optional ``mcp`` extra: imported on first use, with a clear message.
_MCP_NAMES = ("MCPServer", "MCPServerStdio", "MCPServerStreamableHTTP", "MCPTool")


def __getattr__(name: str) -> Any:
    if name in _MCP_NAMES:
        try:
            from hierplan.tools import mcp
        except ModuleNotFoundError as exc:
            raise ImportError(
                f"hierplan.{name} needs the MCP SDK ({exc}); install it with "
                "pip install 'hierplan[mcp]'"
            ) from None
        return getattr(mcp, name)
    raise AttributeError(f"module 'hierplan' has no attribute {name!r}")


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
    "ToolCall",
    "ToolCalled",
    "ToolError",
    "ToolExecutor",
    "ToolNotAllowedError",
    "ToolServerGone",
    "ToolTimeoutError",
    "Toolset",
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
