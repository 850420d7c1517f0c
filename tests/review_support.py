"""Shared pieces of the plan-review tests: a fan-out planner, a recording tool, the sample data."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hierplan
from hierplan.agents.prompts import parse_plan_prompt
from hierplan.core.events import NodeStarted, RunEvent
from hierplan.models.base import ModelRequest, ModelResponse
from hierplan.models.scripted import FunctionModel
from hierplan.plans.plan import Plan, Step
from hierplan.scenarios.data_migration.database import build_source
from hierplan.tools.base import Tool, tool

ROOT_GOAL = "Collect the parts"


def part_goal(i: int) -> str:
    """The goal of sub-goal ``i`` in the fan-out plan."""
    return f"Collect part {i}"


def fanout_planner(
    parts: int, *, prompts: list[str] | None = None, alternative: bool = True
) -> FunctionModel:
    """A planner whose root plan has ``parts`` independent sub-goals of one tool step each.

    After a rejection (the feedback says so) the root plan gains a ``summary`` step, so that a
    new plan differs from the rejected one. Every planning prompt is kept in ``prompts``.
    """

    def answer(request: ModelRequest) -> ModelResponse:
        prompt = parse_plan_prompt(request.messages)
        assert prompt is not None, "only planning calls are expected"
        if prompts is not None:
            prompts.append(request.messages[-1].content)
        if prompt.goal == ROOT_GOAL:
            steps = [
                Step(
                    id=f"part{i}",
                    title=f"Part {i}",
                    instruction=part_goal(i),
                    kind="subgoal",
                    estimate_tokens=1000 * i,
                )
                for i in range(1, parts + 1)
            ]
            if alternative and (prompt.feedback or "").startswith("The reviewer rejected"):
                steps.append(
                    Step(
                        id="summary",
                        title="Summarise",
                        instruction="Summarise the parts",
                        tool="record",
                        args={"text": "summary"},
                        depends_on=[s.id for s in steps],
                    )
                )
            plan = Plan(goal=ROOT_GOAL, steps=steps)
        else:
            plan = Plan(
                goal=prompt.goal,
                steps=[
                    Step(
                        id="do",
                        title="Do it",
                        instruction=f"Record {prompt.goal}",
                        tool="record",
                        args={"text": prompt.goal},
                    )
                ],
            )
        data = plan.model_dump(mode="json", exclude_none=True)
        return ModelResponse(output=data, text="")

    return FunctionModel(answer, name="fanout")


def recording_tool(calls: list[str]) -> Tool:
    """A ``record`` tool that appends its text to ``calls``."""

    @tool
    def record(text: str) -> str:
        """Record a text."""
        calls.append(text)
        return f"recorded {text}"

    return record


def executor_starts(into: list[str]) -> Callable[[RunEvent], None]:
    """A listener that keeps the goal of every executor node that starts."""

    def listen(event: RunEvent) -> None:
        if isinstance(event, NodeStarted) and event.kind == "executor":
            into.append(event.goal)

    return listen


@pytest.fixture(scope="session")
def source_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample shop database, built once per test session."""
    return build_source(tmp_path_factory.mktemp("source") / "source.db")


def migration_dir(source: Path, where: Path) -> Path:
    """A run directory that already holds the sample source database (saves building it)."""
    where.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, where / "source.db")
    return where


def run_kwargs(**extra: Any) -> dict[str, Any]:
    """Arguments for a quick, noise-free data-migration run."""
    return {
        "scenario": "data_migration",
        "model": hierplan.Simulator(profile="ideal", latency_scale=0),
        **extra,
    }
