"""hierplan: hierarchical planner-executor agents with inspectable plans and exact budgets.

>>> import hierplan
>>> result = hierplan.run_sync(scenario="data_migration", sim_latency_scale=0)  # doctest: +SKIP
>>> result.status, result.totals()["cost_usd"]  # doctest: +SKIP
('succeeded', 0.0155)
"""

from __future__ import annotations

from hierplan.agents.executor import LLMExecutor, StepResult, ToolExecutor
from hierplan.agents.models import (
    FunctionModel,
    Model,
    ModelRequest,
    ModelResponse,
    NoiseProfile,
    ScriptedModel,
    SimulatedModel,
    ToolCall,
    Usage,
    resolve_model,
)
from hierplan.agents.planner import LLMPlanner
from hierplan.agents.tools import Tool, tool
from hierplan.budgets.budget import Budget, Ledger, LocalLedger
from hierplan.budgets.instrument import BudgetInstrument
from hierplan.budgets.pricing import Price, PriceTable
from hierplan.errors import (
    BudgetExceeded,
    HierplanError,
    ModelAuthError,
    ModelError,
    PlanValidationError,
    StepFailed,
    UserInputError,
)
from hierplan.hierarchy.context import Instrument, NodeContext, RunContext, RunSettings
from hierplan.hierarchy.events import RunEvent
from hierplan.hierarchy.gate import (
    Approve,
    AutoApprove,
    CallbackApprover,
    Defer,
    Edit,
    Gate,
    GateContext,
    Reject,
)
from hierplan.hierarchy.plan import Plan, Step, critical_path, topological_order, validate_plan
from hierplan.hierarchy.record import NodeRecord, RunResult
from hierplan.hierarchy.resume import resume, resume_sync
from hierplan.hierarchy.run import run, run_sync
from hierplan.hierarchy.strategies import STRATEGIES
from hierplan.review import ConsoleReviewer, PauseForReview, PolicyApprover, ReviewPolicy
from hierplan.tracing.otel import Tracing

__version__ = "0.1.0"

__all__ = [
    "STRATEGIES",
    "Approve",
    "AutoApprove",
    "Budget",
    "BudgetExceeded",
    "BudgetInstrument",
    "CallbackApprover",
    "ConsoleReviewer",
    "Defer",
    "Edit",
    "FunctionModel",
    "Gate",
    "GateContext",
    "HierplanError",
    "Instrument",
    "LLMExecutor",
    "LLMPlanner",
    "Ledger",
    "LocalLedger",
    "Model",
    "ModelAuthError",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "NodeContext",
    "NodeRecord",
    "NoiseProfile",
    "PauseForReview",
    "Plan",
    "PlanValidationError",
    "PolicyApprover",
    "Price",
    "PriceTable",
    "Reject",
    "ReviewPolicy",
    "RunContext",
    "RunEvent",
    "RunResult",
    "RunSettings",
    "ScriptedModel",
    "SimulatedModel",
    "Step",
    "StepFailed",
    "StepResult",
    "Tool",
    "ToolCall",
    "ToolExecutor",
    "Tracing",
    "Usage",
    "UserInputError",
    "__version__",
    "critical_path",
    "resolve_model",
    "resume",
    "resume_sync",
    "run",
    "run_sync",
    "tool",
    "topological_order",
    "validate_plan",
]
