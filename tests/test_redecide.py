"""A plan's tool call that the tool refuses is decided again by one executor call."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from tracing_support import Telemetry

import hierplan
from hierplan import Plan, RunResult, ScriptedModel, Step, tool
from hierplan.errors import ModelError, ToolError, ToolServerGone
from hierplan.models.scripted import plan_response, text_response, tool_response
from hierplan.scenarios.data_migration.oracle import parse_call

pytestmark = pytest.mark.anyio

TABLES = {"orders": 40, "items": 90}
attempts: list[Any] = []


@tool
def count_rows(table: str) -> int:
    """Count the rows of a table."""
    attempts.append(table)
    if table not in TABLES:
        raise ToolError(
            f"unknown table {table!r}: the tables are {', '.join(TABLES)}", retryable=False
        )
    return TABLES[table]


@tool
def flaky(table: str) -> int:
    """Fails as a network error does: trying again may help."""
    raise ToolError("connection reset", retryable=True)


@tool
def gone(table: str) -> int:
    """A tool whose server has exited."""
    raise ToolServerGone("the server exited")


@tool
def now() -> datetime:
    """The time, as an object no JSON encoder writes."""
    return datetime(2026, 1, 1)


@tool
def at_hour(hour: int) -> int:
    """An hour of the day."""
    attempts.append(hour)
    if not 0 <= hour < 24:
        raise ToolError(f"no hour {hour}", retryable=False)
    return hour


resets: list[str] = []


@tool
def wobbly(table: str) -> int:
    """Refuses an unknown table; the first call with a known one drops its connection."""
    attempts.append(table)
    if table not in TABLES:
        raise ToolError(f"unknown table {table!r}", retryable=False)
    if not resets:
        resets.append(table)
        raise ToolError("connection reset", retryable=True)
    return TABLES[table]


def one_step(tool_name: str = "count_rows", table: str = "ordres") -> Plan:
    step = Step(
        id="n", title="Count", instruction="count the orders", tool=tool_name, args={"table": table}
    )
    return Plan(goal="the goal", steps=[step])


async def go(model: ScriptedModel, **settings: Any) -> RunResult:
    attempts.clear()
    result = await hierplan.run(
        "the goal",
        model=model,
        strategy="dag",
        tools=[count_rows, flaky, gone, now, at_hour, wobbly],
        settings={"retry_backoff_s": 0, "max_replans": 0, "max_retries": 0, **settings},
    )
    model.assert_complete()
    return result


async def test_a_refused_call_is_decided_again_with_its_error_in_view() -> None:
    model = ScriptedModel(
        [plan_response(one_step()), tool_response(("count_rows", {"table": "orders"}))]
    )
    result = await go(model)
    assert (result.status, result.answer) == ("succeeded", "40")
    assert [r.purpose for r in model.requests] == ["plan", "redecide"]
    assert attempts == ["ordres", "orders"]
    (step,) = result.tree.children
    assert (step.status, step.output) == ("succeeded", "40")
    assert [c.purpose for c in step.calls] == ["redecide"]
    # The executor sees the step, then the call the plan made and the tool's error, as its
    # own loop would have them; it may call the step's tool only.
    request = model.requests[1]
    assert "STEP: count the orders" in request.messages[1].content
    failed, error = request.messages[-2:]
    assert [(c.name, c.arguments) for c in failed.tool_calls] == [
        ("count_rows", {"table": "ordres"})
    ]
    assert error.role == "tool" and error.tool_call_id == failed.tool_calls[0].id
    assert error.content.startswith("ERROR: unknown table 'ordres'")
    assert [t.name for t in request.tools] == ["count_rows"]


async def test_the_trace_names_the_model_of_a_call_decided_again() -> None:
    telemetry = Telemetry()
    model = ScriptedModel(
        [plan_response(one_step()), tool_response(("count_rows", {"table": "orders"}))]
    )
    attempts.clear()
    await hierplan.run(
        "the goal",
        model=model,
        strategy="dag",
        tools=[count_rows],
        instruments=[telemetry.tracing()],
        settings={"retry_backoff_s": 0, "max_replans": 0, "max_retries": 0},
    )
    spans = {s.name: s for s in telemetry.finished() if s.name != "invoke_agent planner"}
    step = dict(spans["invoke_agent executor"].attributes or {})
    assert step["hierplan.calls"] == 1
    assert (
        step["gen_ai.request.model"]
        == dict(spans[f"chat {model.name}"].attributes or {})["gen_ai.request.model"]
    )


async def test_no_call_or_a_failed_call_fails_the_step_with_both_errors() -> None:
    model = ScriptedModel([plan_response(one_step()), text_response("no idea")])
    result = await go(model)
    (step,) = result.tree.children
    assert result.status != "succeeded" and step.status == "failed"
    assert step.error is not None
    assert step.error.startswith("unknown table 'ordres'")
    assert "decided again, no call to count_rows was made" in step.error

    model = ScriptedModel(
        [plan_response(one_step()), tool_response(("count_rows", {"table": "order"}))]
    )
    result = await go(model)
    (step,) = result.tree.children
    assert step.status == "failed" and attempts == ["ordres", "order"]
    assert step.error is not None
    assert "decided again, the call failed too: unknown table 'order'" in step.error


async def test_a_replan_follows_when_the_call_decided_again_fails() -> None:
    fixed = one_step(table="items")
    model = ScriptedModel(
        [plan_response(one_step()), text_response("no idea"), plan_response(fixed)]
    )
    result = await go(model, max_replans=1)
    assert (result.status, result.answer) == ("succeeded", "90")
    assert [r.purpose for r in model.requests] == ["plan", "redecide", "replan"]


async def test_off_or_a_failure_that_may_pass_is_not_decided_again() -> None:
    result = await go(ScriptedModel([plan_response(one_step())]), redecide_tool_calls=False)
    (step,) = result.tree.children
    assert step.status == "failed" and attempts == ["ordres"]
    assert step.error is not None and step.error.startswith("unknown table 'ordres'")

    result = await go(ScriptedModel([plan_response(one_step("flaky", "orders"))]))
    (step,) = result.tree.children
    assert step.status == "failed" and step.calls == []

    # A server that is gone would refuse any call: no model is asked.
    result = await go(ScriptedModel([plan_response(one_step("gone", "orders"))]))
    (step,) = result.tree.children
    assert step.status == "failed" and step.calls == []
    assert step.error is not None and step.error.startswith("the server exited")


async def test_the_call_decided_again_is_retried_as_it_is_and_the_model_asked_once() -> None:
    resets.clear()
    model = ScriptedModel(
        [plan_response(one_step("wobbly")), tool_response(("wobbly", {"table": "orders"}))]
    )
    result = await go(model, max_retries=1)
    assert (result.status, result.answer) == ("succeeded", "40")
    assert [r.purpose for r in model.requests] == ["plan", "redecide"]
    # The plan's call, the new one (its connection dropped), then the new one again.
    assert attempts == ["ordres", "orders", "orders"]
    (step,) = result.tree.children
    assert step.attempts == 2 and [c.purpose for c in step.calls] == ["redecide"]


async def test_the_prompt_shows_the_plan_s_arguments_as_written() -> None:
    # The argument refers to a result no JSON encoder writes: the prompt shows the reference,
    # the dependency's text is among its inputs.
    steps = [
        Step(id="t", title="Now", instruction="the time", tool="now", args={}),
        Step(
            id="h",
            title="Hour",
            instruction="the hour of $t",
            tool="at_hour",
            args={"hour": "$t"},
            depends_on=["t"],
        ),
    ]
    model = ScriptedModel(
        [
            plan_response(Plan(goal="the goal", steps=steps)),
            tool_response(("at_hour", {"hour": 0})),
        ]
    )
    result = await go(model)
    assert (result.status, result.answer) == ("succeeded", "0")
    failed = model.requests[1].messages[-2]
    assert [c.arguments for c in failed.tool_calls] == [{"hour": "$t"}]
    assert "2026-01-01T00:00:00" in model.requests[1].messages[1].content


async def test_a_redecision_the_budget_cannot_pay_for_leaves_the_failure_as_it_was() -> None:
    # The script has no answer for a redecision: the budget refuses its call before it is made.
    model = ScriptedModel([plan_response(one_step())])
    attempts.clear()
    result = await hierplan.run(
        "the goal",
        model=model,
        strategy="dag",
        tools=[count_rows],
        budget=hierplan.BudgetSpec(tokens=6000),
        settings={"max_replans": 0, "max_retries": 0, "executor_max_tokens": 100_000},
    )
    (step,) = result.tree.children
    assert step.status == "failed" and step.calls == []
    assert step.error is not None and step.error.startswith("unknown table 'ordres'")
    assert "(not decided again: node 1.1 (on the account of node 1) is out of budget" in (
        step.error
    )
    # The refusal counts on the account it was asked of: the planner's.
    assert result.tree.budget is not None and result.tree.budget["refused"] == 1
    assert result.budget is not None and result.budget["refused_calls"] == 1


async def test_a_redecision_that_fails_for_a_while_is_asked_again_at_the_next_attempt() -> None:
    overloaded = ModelError("the provider is overloaded", retryable=True)
    model = ScriptedModel(
        [plan_response(one_step()), overloaded, tool_response(("count_rows", {"table": "orders"}))]
    )
    # Past the model's and the node's own retries of it (none here), the attempt fails as one
    # that may pass.
    result = await go(model, model_retries=0, transient_retries=0, max_retries=1)
    assert (result.status, result.answer) == ("succeeded", "40")
    assert [r.purpose for r in model.requests] == ["plan", "redecide", "redecide"]
    # The refused call is made once: the second attempt goes straight to the model.
    assert attempts == ["ordres", "orders"]
    (step,) = result.tree.children
    assert step.attempts == 2
    # Without a next attempt the step fails at once, saying why it was not decided again.
    model = ScriptedModel([plan_response(one_step()), overloaded])
    result = await go(model, model_retries=0, transient_retries=0)
    (step,) = result.tree.children
    assert step.status == "failed" and step.error is not None
    assert "(not decided again: the provider is overloaded)" in step.error


def test_the_migration_oracle_reads_a_direct_call_and_the_closest_table() -> None:
    tables = ["orders", "order_items", "customers"]
    assert parse_call('copy_rows("orders")', tables) == ("copy", ["orders"])
    assert parse_call('create_table("orders_x")', tables) == ("schema", ["orders"])
    assert parse_call('verify_table("customers_x")', tables) == ("verify", ["customers"])
    assert parse_call('create_indexes("zzz")', tables) is None
    assert parse_call('drop_table("orders")', tables) is None
