"""Many runs in one process and one event loop, isolated from each other."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import anyio
import pytest
from capitals import CAPITALS, CapitalsOracle, CapitalsScenario, goal_for, local_tools
from eventcheck import check_events
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from tracing_support import Telemetry

import hierplan
from hierplan import RunSettings
from hierplan.core.events import RunEvent

RUNS = 50
COUNTRIES = sorted(CAPITALS)

# Module-level containers that are allowed, and why.
ALLOWED_MUTABLE = {
    # Handed to provider SDKs as the structured-output schema: it must be a real dict, and
    # adapters cache their rewrite of it by identity. Nothing writes to it.
    "hierplan.agents.prompts.PLAN_SCHEMA",
    "hierplan.agents.planner.PLAN_SCHEMA",  # the same object, imported
}


def _module_containers() -> dict[str, int]:
    """The size of every container a hierplan module holds at its top level, allowed or not."""
    sizes: dict[str, int] = {}
    for info in pkgutil.walk_packages(hierplan.__path__, "hierplan."):
        if info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if not name.startswith("__") and isinstance(value, list | dict | set | bytearray):
                sizes[f"{info.name}.{name}"] = len(value)
    return sizes


def test_runs_leave_nothing_behind_in_modules() -> None:
    """Runs with tools of their own (new tool specs each time) grow no module-level container:
    a long-lived process does not keep every run's tool schemas."""

    def one_run(i: int) -> None:
        tools = local_tools()
        extra = [hierplan.tool(lambda x: x, name=f"t{i}_{k}", description="d") for k in range(5)]
        result = hierplan.run_sync(
            goal_for([["peru"]], a=i, b=1),
            tools=[*tools, *extra],
            model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=CapitalsOracle()),
        )
        assert result.status == "succeeded", result.error

    one_run(0)  # first use fills what is filled once (compiled schemas, imports)
    before = _module_containers()
    for i in range(1, 6):
        one_run(i)
    after = _module_containers()
    grown = {
        name: (before.get(name), size) for name, size in after.items() if size != before.get(name)
    }
    assert not grown, f"module-level containers grew with use: {grown}"


def test_no_module_level_mutable_state() -> None:
    """Nothing a run could change is shared by every run through a module (no hidden globals)."""
    found = []
    for info in pkgutil.walk_packages(hierplan.__path__, "hierplan."):
        if info.name.endswith(".__main__"):
            continue  # running it is the CLI
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.startswith("__") or f"{info.name}.{name}" in ALLOWED_MUTABLE:
                continue
            if isinstance(value, list | dict | set | bytearray):
                found.append(f"{info.name}.{name} ({type(value).__name__})")
    assert not found, "module-level mutable state: " + ", ".join(found)
    with pytest.raises(TypeError):
        hierplan.STRATEGIES["mine"] = hierplan.STRATEGIES["dag"]  # type: ignore[index]


def _settings(i: int) -> RunSettings:
    return RunSettings(concurrency=1 + i % 4, seed=i, max_retries=i % 3, max_steps=10 + i)


def _budget_tokens(i: int) -> int:
    """Every tenth run gets too small a budget for its work (but enough for its first call);
    the others enough, each its own."""
    return 2000 if i % 10 == 0 else 8000 + 100 * i


@pytest.mark.anyio
async def test_fifty_concurrent_runs_with_own_settings_and_budgets_do_not_interfere() -> None:
    results: dict[int, hierplan.RunResult] = {}
    events: dict[int, list[RunEvent]] = {}

    async def one(i: int) -> None:
        # each run: its own countries, numbers, tools (with their own delays) and settings
        group = [COUNTRIES[(i + k) % len(COUNTRIES)] for k in range(4)]
        async with hierplan.start(
            hierplan.RunSpec(
                goal=goal_for([group], a=i, b=1000),
                settings=_settings(i),
                run_id=f"run-{i}",
                model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=CapitalsOracle()),
                budget={"tokens": _budget_tokens(i)},
            ),
            tools=local_tools(0.001 * (i % 5)),
        ) as handle:
            events[i] = [event async for event in handle.events()]
            results[i] = await handle.result()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(RUNS):
                tg.start_soon(one, i)
    peaks = []
    for i in range(RUNS):
        result = results[i]
        assert result.run_id == f"run-{i}"
        check_events(events[i], result)  # every event of run i is run i's, in causal order
        # each run spends from its own budget only: the small ones run out, the others do not
        assert result.budget is not None
        assert result.budget["limit"]["tokens"] == _budget_tokens(i)
        spent = result.budget["spent"]["tokens"]
        totals = result.totals()
        assert spent == totals["input_tokens"] + totals["output_tokens"] <= _budget_tokens(i)
        if i % 10 == 0:
            assert result.status == "partial" and result.budget["exhausted"], i
            continue
        assert result.status == "succeeded", (i, result.error)
        assert f"{i + 1000}" in result.answer
        others = {f"{j + 1000}" for j in range(RUNS) if j != i}
        assert not any(o in result.answer.split() for o in others)
        assert result.settings == _settings(i).model_dump(mode="json")
        peak = result.stats["peak_concurrent_leaves"]
        assert peak <= _settings(i).concurrency  # its own limit, not another run's
        peaks.append(peak)
    assert max(peaks) > 1  # leaves of a run did run concurrently


@pytest.mark.anyio
async def test_concurrent_scenario_runs_get_their_own_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a workdir, each run of a scenario works in a directory of its own."""
    monkeypatch.chdir(tmp_path)
    results: list[hierplan.RunResult] = []

    async def one(seed: int) -> None:
        result = await hierplan.run(
            scenario=CapitalsScenario(),
            model=hierplan.Simulator(latency_scale=0, profile="ideal"),
            settings={"seed": seed},
        )
        results.append(result)

    async with anyio.create_task_group() as tg:
        for seed in range(5):
            tg.start_soon(one, seed)
    assert [r.status for r in results] == ["succeeded"] * 5
    assert all(r.verification is not None and r.verification["ok"] for r in results)
    dirs = sorted(p.name for p in (tmp_path / "runs" / "scenarios" / "capitals").iterdir())
    assert dirs == sorted(r.run_id for r in results)


@pytest.mark.anyio
async def test_concurrent_runs_trace_to_their_own_tracer_providers() -> None:
    """Each run's spans go to the tracer provider it was given, and only there."""
    telemetries = [Telemetry() for _ in range(6)]
    results: dict[int, hierplan.RunResult] = {}

    async def one(i: int) -> None:
        results[i] = await hierplan.run(
            goal_for([["france", "peru"]], a=i, b=1),
            tools=local_tools(0.002),
            instruments=[telemetries[i].tracing()],
            model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=CapitalsOracle()),
        )

    async with anyio.create_task_group() as tg:
        for i in range(len(telemetries)):
            tg.start_soon(one, i)
    trace_ids = set()
    for i, telemetry in enumerate(telemetries):
        spans = telemetry.finished()
        (workflow,) = [s for s in spans if s.parent is None]
        assert (workflow.attributes or {})["hierplan.run_id"] == results[i].run_id
        assert len({s.context.trace_id for s in spans}) == 1
        trace_ids.add(workflow.context.trace_id)
        agents = [s for s in spans if s.name.startswith("invoke_agent")]
        assert len(agents) == len(list(results[i].nodes()))
    assert len(trace_ids) == len(telemetries)
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)  # no global was set
