"""The public API is explicit: ``hierplan.__all__`` names exactly what the package exports."""

from __future__ import annotations

import importlib.resources
import inspect
import types

import pytest

import hierplan

EXPECTED = {
    # running
    "run", "run_sync", "start", "RunHandle", "EventStream", "RunSettings", "RunResult",
    "RunOptions", "ResumeOptions",
    "NodeRecord", "STRATEGIES", "Instrument", "RunContext", "NodeContext", "Tracing",
    # the seam instruments, planners and executors see
    "RunView", "NodeView", "StepEnv", "CallScope", "CallOutcome",
    # what a run is
    "RunSpec", "BudgetSpec", "ModelSpec", "Simulator", "start_resume",
    # events
    "RunEvent", "AnyEvent", "parse_event", "RunStarted", "NodeStarted", "NodeFinished",
    "PlanProposed", "PlanDecided", "Replanned", "StepRetried", "ToolCalled", "ModelCalled",
    "RunFinished", "BudgetReserved", "BudgetSettled", "BudgetExhausted", "BudgetOverrun",
    "Listener",
    # budgets
    "Budget", "BudgetInstrument", "Ledger", "LocalLedger",
    # reviewing plans, pausing and resuming
    "Defer", "ConsoleReviewer", "PauseForReview", "PolicyApprover", "ReviewPolicy", "resume",
    "resume_sync",
    # plans and the gate
    "Plan", "Step", "validate_plan", "topological_order", "critical_path", "Gate",
    "GateContext", "AutoApprove", "CallbackApprover", "Approve", "Edit", "Reject", "Approver",
    "Decision", "ReviewFunction",
    # models, agents, tools
    "Model", "ModelRequest", "ModelResponse", "ToolCall", "Usage", "resolve_model",
    "ScriptedModel", "FunctionModel", "SimulatedModel", "NoiseProfile", "LLMPlanner",
    "ResponseFunction", "plan_response", "text_response", "tool_response",
    "LLMExecutor", "ToolExecutor", "StepResult", "Tool", "ToolHints", "Toolset", "tool",
    "MCPServer", "MCPServerStdio", "MCPServerStreamableHTTP", "MCPTool",
    "ToolsetSpec", "MCPConfig",
    # prices and errors
    "Price", "PriceTable", "HierplanError", "UserInputError", "PlanValidationError",
    "StepFailed", "BudgetExceeded", "ToolError", "ToolServerGone", "ModelError",
    "ModelAuthError", "ToolArgsError", "ToolBlocked", "ToolNotAllowedError", "ToolTimeoutError",
    "UnexpectedModelCall",
    "__version__",
}  # fmt: skip


def test_all_names_exactly_what_is_exported() -> None:
    assert len(hierplan.__all__) == len(set(hierplan.__all__))
    assert set(hierplan.__all__) == EXPECTED


@pytest.mark.parametrize("name", sorted(hierplan.__all__))
def test_every_exported_name_exists_and_is_documented(name: str) -> None:
    member = getattr(hierplan, name)
    if inspect.isclass(member) or inspect.isfunction(member):
        assert member.__module__.startswith("hierplan."), member.__module__
        assert inspect.getdoc(member), f"hierplan.{name} has no docstring"


def test_nothing_public_is_exported_by_accident() -> None:
    public = {
        name
        for name, value in vars(hierplan).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    extra = public - set(hierplan.__all__) - {"annotations", "TYPE_CHECKING", "Any"}
    assert not extra, extra
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        hierplan.nope  # noqa: B018


def test_the_package_says_it_is_typed() -> None:
    assert (importlib.resources.files("hierplan") / "py.typed").is_file()


def test_every_run_setting_says_what_it_does() -> None:
    silent = [
        name for name, field in hierplan.RunSettings.model_fields.items() if not field.description
    ]
    assert silent == [], f"RunSettings fields without a description: {silent}"
