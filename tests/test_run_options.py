"""Typed run options: the functions that pass :func:`hierplan.run`'s options on refuse a
misspelt one at the call, naming the nearest, before anything runs or is touched on disk."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from review_support import ROOT_GOAL, fanout_planner, recording_tool

import hierplan
from hierplan import Approve, PauseForReview
from hierplan.durable.checkpoint import CHECKPOINT_FILE

# What resume decides from the checkpoint, not its caller.
DECIDED_BY_THE_CHECKPOINT = {"checkpoint_dir"}


def test_run_takes_a_spec_or_a_goal_and_at_most_a_dozen_options() -> None:
    (goal, options) = inspect.signature(hierplan.run).parameters.values()
    assert goal.name == "goal" and options.kind is inspect.Parameter.VAR_KEYWORD
    run_options = hierplan.RunOptions.__optional_keys__
    assert len(run_options) <= 12
    # Every field of a spec but the goal is an option or only a spec's.
    given_beside = {"tools", "approver", "instruments", "listeners", "checkpoint_dir"}
    spec_fields = set(hierplan.RunSpec.model_fields) | {"strategy"}
    assert run_options - given_beside <= spec_fields
    resumed = (run_options - DECIDED_BY_THE_CHECKPOINT) | {
        "node",
        "version",
        "drop_checkpoint",
        "extra",
    }
    assert hierplan.ResumeOptions.__optional_keys__ == resumed


def test_run_sync_refuses_a_misspelt_option_naming_the_nearest() -> None:
    with pytest.raises(TypeError, match=r"run_sync\(\) .* 'stratgy': did you mean 'strategy'\?"):
        hierplan.run_sync("greet", stratgy="dag")  # type: ignore[call-arg]


def test_start_refuses_a_misspelt_option_at_the_call() -> None:
    with pytest.raises(TypeError, match=r"start\(\) .* 'budgt': did you mean 'budget'"):
        hierplan.start("greet", budgt={"usd": 0.5})  # type: ignore[call-arg]


def test_an_option_near_none_lists_what_is_taken() -> None:
    with pytest.raises(TypeError, match=r"'zzz': it takes approver, budget, checkpoint_dir"):
        hierplan.run_sync("greet", zzz=1)  # type: ignore[call-arg]


@pytest.mark.anyio
async def test_resume_refuses_a_misspelt_option_before_touching_the_run_directory(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    model = fanout_planner(2)
    tools = [recording_tool(calls)]
    paused = await hierplan.run(
        ROOT_GOAL, model=model, tools=tools, approver=PauseForReview(), checkpoint_dir=tmp_path
    )
    assert paused.status == "paused"

    def snapshot() -> dict[str, bytes]:
        found = tmp_path.rglob("*")
        return {str(p.relative_to(tmp_path)): p.read_bytes() for p in found if p.is_file()}

    before = snapshot()
    with pytest.raises(TypeError, match=r"resume\(\) .* 'tool': did you mean 'tools'\?"):
        await hierplan.resume(tmp_path, Approve(), model=model, tool=tools)  # type: ignore[call-arg]
    # run_id is run's, not resume's: the checkpoint says which run goes on
    with pytest.raises(TypeError, match=r"'run_id': it takes approver, budget"):
        await hierplan.resume(tmp_path, Approve(), model=model, tools=tools, run_id="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"resume_sync\(\) .* 'nod': did you mean 'node'\?"):
        hierplan.resume_sync(tmp_path, Approve(), nod="1")  # type: ignore[call-arg]
    assert snapshot() == before and (tmp_path / CHECKPOINT_FILE).exists()

    resumed = await hierplan.resume(tmp_path, Approve(), model=model, tools=tools)
    assert resumed.status == "succeeded", resumed.error


@pytest.mark.anyio
async def test_every_path_argument_takes_a_str(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # relative str paths, as a user types them
    result = await hierplan.run(
        scenario="data_migration",
        workdir="work/mig",
        model=hierplan.Simulator(latency_scale=0),
        settings={"seed": 1},
    )
    assert result.status == "succeeded", result.error
    assert (tmp_path / "work" / "mig").is_dir()
    written = result.write("records/run.json")
    assert written == Path("records/run.json")
    assert hierplan.RunResult.load("records/run.json").run_id == result.run_id

    calls: list[str] = []
    model = fanout_planner(2)
    tools = [recording_tool(calls)]
    paused = await hierplan.run(
        ROOT_GOAL, model=model, tools=tools, approver=PauseForReview(), checkpoint_dir="paused"
    )
    assert paused.status == "paused" and (tmp_path / "paused" / CHECKPOINT_FILE).exists()
    resumed = await hierplan.resume("paused", Approve(), model=model, tools=tools)
    assert resumed.status == "succeeded", resumed.error
    assert len(calls) == 2
