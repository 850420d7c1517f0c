"""Whole hierarchical runs on each provider, over its wire format.

The wire server answers with hierplan's own prompt parsers and the data-migration oracle, so a
real run goes through the official SDK: the root planner, sub-planners and executors calling
tools, on a 290k-row SQLite migration that the verifier then checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wire import MODELS, PROVIDERS, OracleBackend, WireServer, calls, model_options

import hierplan
from hierplan.core.events import RunEvent, ToolCalled
from hierplan.errors import ModelAuthError
from hierplan.records import RunResult
from hierplan.scenarios import get_scenario
from hierplan.scenarios.base import ScenarioEnv

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ScenarioEnv]]:
    workdir = tmp_path_factory.mktemp("migration")
    yield workdir, get_scenario("data_migration").setup(workdir)


async def migrate(
    server: WireServer,
    provider: str,
    workdir: Path,
    *,
    timeout_s: float = 5.0,
    listeners: list[Any] | None = None,
    **settings: Any,
) -> RunResult:
    return await hierplan.run(
        scenario="data_migration",
        model=hierplan.ModelSpec(
            name=MODELS[provider], **model_options(server, provider, timeout_s=timeout_s)
        ),
        workdir=workdir,
        settings=hierplan.RunSettings(retry_backoff_s=0.01, **settings),
        listeners=listeners or [],
    )


def assert_migrated(result: RunResult) -> None:
    """The run succeeded and the verifier found the target database complete."""
    assert result.status == "succeeded", result.error
    assert result.verification is not None and result.verification["ok"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_whole_hierarchical_run_over_the_wire(
    provider: str, scenario: tuple[Path, ScenarioEnv]
) -> None:
    workdir, env = scenario
    events: list[RunEvent] = []
    backend = OracleBackend(env.oracle)
    with WireServer(backend) as server:
        result = await migrate(server, provider, workdir, listeners=[events.append])
        hits = server.count()
    assert_migrated(result)
    assert not result.simulated and result.model == MODELS[provider]
    assert {n.depth for n in result.nodes()} == {1, 2, 3}
    records = calls(result)
    assert len(records) == hits == backend.calls
    planners = [n for n in result.nodes() if n.kind == "planner" and n.calls]
    executors = [n for n in result.nodes() if n.kind == "executor" and n.calls]
    assert len(planners) >= 5 and len(executors) >= 4  # root, sub-planners; model-driven leaves
    model_paths = {n.path for n in executors}
    tools_by_models = [e for e in events if isinstance(e, ToolCalled) and e.path in model_paths]
    assert tools_by_models and all(e.ok for e in tools_by_models)
    totals = result.totals()
    assert totals["unpriced_calls"] == 0 and totals["cost_usd"] > 0
    assert all(c.ok and c.usage.input_tokens > 0 and c.model == MODELS[provider] for c in records)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_run_under_30_percent_faults_completes_and_counts_every_failed_attempt(
    provider: str, scenario: tuple[Path, ScenarioEnv]
) -> None:
    workdir, env = scenario
    with WireServer(OracleBackend(env.oracle), slow_s=0.6) as server:
        server.faults.random(0.3, seed=11)
        # five retries: the run must not hinge on one call drawing five faults in a row
        result = await migrate(server, provider, workdir, timeout_s=0.3, model_retries=5)
        hits, failures, no_usage = server.count(), server.failures(), server.count("no_usage")
        # Attempts the provider took but whose usage never came back count at their worst
        # case: a reply not waited for, and (OpenAI) a reply body cut off. Anthropic's cut
        # stream has given its usage in message_start already.
        unknown = server.count("slow") + (server.count("truncated") if provider == "openai" else 0)
    assert_migrated(result)
    records = calls(result)
    assert len(records) == hits
    failed = [c for c in records if not c.ok]
    assert failures > 0 and len(failed) == failures
    assert all("failed" in c.flags for c in failed)
    assert sum("no_usage" in c.flags for c in records if c.ok) == no_usage
    assert sum("no_usage" in c.flags for c in failed) == unknown
    assert all(c.usage.total_tokens > 0 for c in failed if "no_usage" in c.flags)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_repair_attempt_fixes_an_invalid_plan(
    provider: str, scenario: tuple[Path, ScenarioEnv]
) -> None:
    workdir, env = scenario
    backend = OracleBackend(env.oracle, invalid_plans=1)
    with WireServer(backend) as server:
        result = await migrate(server, provider, workdir)
    assert result.status == "succeeded", result.error
    assert backend.repairs == 1
    repairs = [c for c in calls(result) if c.purpose == "plan-repair"]
    assert len(repairs) == 1 and repairs[0].ok
    root = result.tree
    assert len(root.plan_versions) == 1  # the invalid plan never reached the gate


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_refused_key_deep_in_the_tree_stops_the_run(
    provider: str, scenario: tuple[Path, ScenarioEnv]
) -> None:
    workdir, env = scenario
    with WireServer(OracleBackend(env.oracle)) as server:
        server.faults.script([None, None, None, "unauthorized"])
        with pytest.raises(ModelAuthError, match="HTTP 401"):
            await migrate(server, provider, workdir)


async def test_a_sub_planner_out_of_retries_fails_alone_and_its_parent_replans(
    scenario: tuple[Path, ScenarioEnv],
) -> None:
    workdir, env = scenario
    with WireServer(OracleBackend(env.oracle)) as server:
        server.faults.script([None, "server_error"])  # the first sub-planner's call
        result = await migrate(server, "openai", workdir, model_retries=0, transient_retries=0)
    assert_migrated(result)
    failed = [n for n in result.nodes() if n.status == "failed"]
    assert len(failed) == 1 and failed[0].kind == "planner" and failed[0].depth == 2
    assert failed[0].error is not None and "HTTP 500" in failed[0].error
    assert [v.reason for v in result.tree.plan_versions] == ["initial", "replan"]


async def test_a_whole_run_on_a_model_that_thinks(scenario: tuple[Path, ScenarioEnv]) -> None:
    # Sonnet 5 thinks by default: the plan tool is forced with thinking off, and executors'
    # tool loops must send each turn's thinking blocks back.
    workdir, env = scenario
    with WireServer(OracleBackend(env.oracle, thinking=True)) as server:
        result = await hierplan.run(
            scenario="data_migration",
            model=hierplan.ModelSpec(
                name="anthropic:claude-sonnet-5", **model_options(server, "anthropic")
            ),
            workdir=workdir,
        )
        assert server.count() == len(calls(result))
    assert_migrated(result)
