"""Every suite separates "the goal was reached" from "the agent reported success": a run that
gave up with the world in the goal state is its own outcome, a failure by default."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hierplan.bench.harness import BenchConfig, run_bench
from hierplan.bench.records import counts_as_success, outcome_of
from hierplan.bench.report import summarize
from hierplan.bench.suites import get_suite
from hierplan.cli import app
from hierplan.models.base import ModelRequest, ModelResponse
from hierplan.models.scripted import FunctionModel
from hierplan.simulator.model import SimulatedModel
from hierplan.simulator.profiles import PROFILES

# The suites whose verifier checks the world the tools left (parallel_qa checks the answer).
WORLD_SUITES = ("blocksworld", "crafting", "game24", "planbench", "tot24")


def giving_up(suite: str) -> FunctionModel:
    """A competent model (the ideal simulator) that does all the work, then gives up."""
    competent = SimulatedModel(
        get_suite(suite).oracle(), profile=PROFILES["ideal"], latency_scale=0
    )

    async def answer(request: ModelRequest) -> ModelResponse:
        response = await competent.request(request)
        if request.phase == "execution" and not response.tool_calls:
            return ModelResponse(text="FAILED: I give up", usage=response.usage)
        return response

    return FunctionModel(answer)


def claiming(request: ModelRequest) -> ModelResponse:
    """A model that does nothing and says it is done."""
    return ModelResponse(text="Done: the goal holds.")


def test_outcomes_by_goal_and_report() -> None:
    assert outcome_of(True, "succeeded") == "success"
    assert outcome_of(True, "failed") == "goal_reached_gave_up"
    assert outcome_of(True, "partial") == "goal_reached_gave_up"
    assert outcome_of(False, "succeeded") == "claimed_success"
    assert outcome_of(False, "failed") == "failed"
    gave_up = {"outcome": "goal_reached_gave_up", "success": False}
    assert not counts_as_success(gave_up)
    assert counts_as_success(gave_up, count_gave_up=True)
    assert counts_as_success({"success": True})  # a record from before outcomes


@pytest.mark.anyio
@pytest.mark.parametrize("suite", WORLD_SUITES)
async def test_a_run_that_gave_up_in_the_goal_state_is_not_a_success(
    suite: str, tmp_path: Path
) -> None:
    config = BenchConfig(suites=(suite,), strategies=("react",), tasks=1, latency_scale=0)
    (record,) = await run_bench(config, tmp_path, model=giving_up(suite))
    assert record["status"] == "failed" and record["agent_succeeded"] is False
    assert record["goal_reached"] is True, record["verification"]
    assert record["outcome"] == "goal_reached_gave_up"
    assert record["success"] is False
    cell = summarize([record], None).cells[0]
    assert cell.estimates["success"].mean == 0.0
    assert cell.outcomes == {"goal_reached_gave_up": 1}
    counted = summarize([record], None, count_gave_up=True).cells[0]
    assert counted.estimates["success"].mean == 1.0


@pytest.mark.anyio
@pytest.mark.parametrize("suite", [*WORLD_SUITES, "parallel_qa"])
async def test_a_claim_of_success_without_the_goal_is_a_failure(suite: str, tmp_path: Path) -> None:
    config = BenchConfig(suites=(suite,), strategies=("react",), tasks=1, latency_scale=0)
    (record,) = await run_bench(config, tmp_path, model=FunctionModel(claiming))
    assert record["status"] == "succeeded" and record["goal_reached"] is False
    assert record["outcome"] == "claimed_success" and record["success"] is False


def test_count_gave_up_is_a_reporting_choice_the_command_repeats(tmp_path: Path) -> None:
    out = tmp_path / "g"
    args = ["bench", "--suite", "game24", "--strategies", "react", "--tasks", "1", "--seeds",
            "1", "--sim-latency-scale", "0", "--no-plot", "--out", str(out)]  # fmt: skip
    assert CliRunner().invoke(app, args).exit_code == 0
    again = CliRunner().invoke(app, [*args, "--resume", "--count-gave-up"])
    assert again.exit_code == 0, again.output
    summary = (out / "summary.md").read_text()
    assert "--count-gave-up" in summary
    assert "Runs that reached the goal but gave up count as successes" in summary
