"""Pausing at the gate and resuming from the checkpoint, through the library API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from review_support import (
    ROOT_GOAL,
    executor_starts,
    fanout_planner,
    migration_dir,
    part_goal,
    recording_tool,
    run_kwargs,
    source_db,
)

import hierplan
from hierplan import Approve, CallbackApprover, Defer, Edit, GateContext, Plan, Reject
from hierplan.agents.prompts import parse_step_prompt
from hierplan.core.events import NodeStarted
from hierplan.core.settings import RunSettings
from hierplan.durable.checkpoint import CHECKPOINT_FILE, PENDING_DIR, RESUMING_FILE
from hierplan.errors import UserInputError
from hierplan.models.base import ModelRequest, ModelResponse
from hierplan.models.scripted import FunctionModel, plan_response
from hierplan.plans.plan import Step, load_plan
from hierplan.review import PauseForReview, PolicyApprover
from hierplan.runner import resume as resume_module
from hierplan.tools.base import tool

__all__ = ["source_db"]


async def _defer(plan: Plan, ctx: GateContext) -> Defer:
    return Defer(by="test")


@pytest.mark.anyio
async def test_root_pause_runs_nothing_and_resume_does_not_plan_again(tmp_path: Path) -> None:
    calls: list[str] = []
    started: list[str] = []
    model = fanout_planner(3)
    result = await hierplan.run(
        ROOT_GOAL,
        model=model,
        tools=[recording_tool(calls)],
        approver=PolicyApprover(PauseForReview(), "root"),
        listeners=[executor_starts(started)],
        checkpoint_dir=tmp_path,
    )
    assert result.status == "paused"
    assert calls == [] and started == []
    assert model.calls == 1  # the root plan only
    assert (tmp_path / CHECKPOINT_FILE).exists()
    pending = load_plan(tmp_path / PENDING_DIR / "1.yaml")
    assert [s.id for s in pending.steps] == ["part1", "part2", "part3"]

    resumed = await hierplan.resume(
        tmp_path,
        Approve(by="alice"),
        model=model,
        tools=[recording_tool(calls)],
        listeners=[executor_starts(started)],
    )
    assert resumed.status == "succeeded", resumed.error
    assert resumed.run_id == result.run_id
    assert sorted(calls) == [part_goal(i) for i in (1, 2, 3)]
    assert model.calls == 1 + 3  # the root plan was not asked for again
    root = resumed.tree.plan_versions
    assert [(h.decision, h.by) for h in root[0].history] == [
        ("pending", "pause"),
        ("approved", "alice"),
    ]
    assert not (tmp_path / CHECKPOINT_FILE).exists()
    assert not (tmp_path / RESUMING_FILE).exists()
    assert not (tmp_path / PENDING_DIR).exists()


@pytest.mark.anyio
async def test_reject_on_resume_sends_the_reason_to_the_planner(tmp_path: Path) -> None:
    prompts: list[str] = []
    calls: list[str] = []
    model = fanout_planner(2, prompts=prompts)
    common: dict[str, Any] = {
        "model": model,
        "tools": [recording_tool(calls)],
        "approver": PolicyApprover(PauseForReview(), "root"),
    }
    first = await hierplan.run(ROOT_GOAL, checkpoint_dir=tmp_path, **common)
    assert first.status == "paused"
    second = await hierplan.resume(tmp_path, Reject("add a summary step", by="bob"), **common)
    assert second.status == "paused"
    assert "FEEDBACK: The reviewer rejected your last plan: add a summary step" in prompts[-1]
    versions = second.tree.plan_versions
    assert [v.decision for v in versions] == ["rejected", "pending"]
    assert versions[1].reason == "retry"
    assert versions[1].diff is not None and versions[1].diff.added == ("summary",)
    assert calls == []
    third = await hierplan.resume(tmp_path, Approve(by="bob"), **common)
    assert third.status == "succeeded", third.error
    assert sorted(calls) == sorted([part_goal(1), part_goal(2), "summary"])


@pytest.mark.anyio
async def test_edit_on_resume_runs_the_edited_plan(tmp_path: Path) -> None:
    calls: list[str] = []
    model = fanout_planner(3)
    common: dict[str, Any] = {"model": model, "tools": [recording_tool(calls)]}
    await hierplan.run(ROOT_GOAL, approver=PauseForReview(), checkpoint_dir=tmp_path, **common)
    pending = load_plan(tmp_path / PENDING_DIR / "1.yaml")
    edited = pending.model_copy(update={"steps": pending.steps[:1]})
    result = await hierplan.resume(tmp_path, Edit(edited, by="carol"), **common)
    assert result.status == "succeeded", result.error
    assert calls == [part_goal(1)]
    versions = result.tree.plan_versions
    assert [(v.reason, v.decision, v.decided_by) for v in versions] == [
        ("initial", "edited", "carol"),
        ("edit", "approved", "carol"),
    ]


@pytest.mark.anyio
async def test_bad_resume_decisions_change_nothing(tmp_path: Path) -> None:
    calls: list[str] = []
    model = fanout_planner(2)
    common: dict[str, Any] = {"model": model, "tools": [recording_tool(calls)]}
    await hierplan.run(ROOT_GOAL, approver=PauseForReview(), checkpoint_dir=tmp_path, **common)
    saved = (tmp_path / CHECKPOINT_FILE).read_text()
    cyclic = Plan(
        goal=ROOT_GOAL,
        steps=[
            Step(id="a", title="A", instruction="a", depends_on=["b"]),
            Step(id="b", title="B", instruction="b", depends_on=["a"]),
        ],
    )
    with pytest.raises(UserInputError, match="dependency cycle among steps: a -> b -> a"):
        await hierplan.resume(tmp_path, Edit(cyclic), **common)
    unknown = Plan(
        goal=ROOT_GOAL,
        steps=[Step(id="a", title="A", instruction="a", tool="drop_everything", args={})],
    )
    with pytest.raises(UserInputError, match="'drop_everything', which is unknown"):
        await hierplan.resume(tmp_path, Edit(unknown), **common)
    with pytest.raises(UserInputError, match=r"node 1\.4 has no pending plan; pending: 1"):
        await hierplan.resume(tmp_path, Approve(), node="1.4", **common)
    with pytest.raises(UserInputError, match="pass the same tools"):
        await hierplan.resume(tmp_path, Approve(), model=model)
    # A decision of another type is refused before the checkpoint is touched.
    with pytest.raises(TypeError, match=r"Approve\(\), Edit\(plan\), Reject\(reason\).*'approve'"):
        await hierplan.resume(tmp_path, "approve", **common)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Edit needs a Plan, not str"):
        await hierplan.resume(tmp_path, Edit("not a plan"), **common)  # type: ignore[arg-type]
    assert (tmp_path / CHECKPOINT_FILE).read_text() == saved
    assert not (tmp_path / RESUMING_FILE).exists()
    assert calls == []
    assert model.calls == 1


@pytest.mark.anyio
async def test_an_edited_plan_for_another_goal_is_refused(tmp_path: Path) -> None:
    calls: list[str] = []
    model = fanout_planner(2)
    common: dict[str, Any] = {"model": model, "tools": [recording_tool(calls)]}
    await hierplan.run(ROOT_GOAL, approver=PauseForReview(), checkpoint_dir=tmp_path, **common)
    saved = (tmp_path / CHECKPOINT_FILE).read_text()
    pending = load_plan(tmp_path / PENDING_DIR / "1.yaml")
    other = pending.model_copy(update={"goal": "Collect the\n other parts"})
    with pytest.raises(UserInputError, match=r"'Collect the other parts', but node 1 waits"):
        await hierplan.resume(tmp_path, Edit(other), **common)
    assert (tmp_path / CHECKPOINT_FILE).read_text() == saved and calls == []
    spaced = pending.model_copy(update={"goal": f"  {ROOT_GOAL.replace(' ', chr(10))} "})
    done = await hierplan.resume(tmp_path, Edit(spaced), **common)
    assert done.status == "succeeded", done.error


@pytest.mark.anyio
async def test_several_pending_subgoals_are_decided_one_node_at_a_time(tmp_path: Path) -> None:
    calls: list[str] = []
    model = fanout_planner(3)
    common: dict[str, Any] = {
        "model": model,
        "tools": [recording_tool(calls)],
        "approver": PolicyApprover(PauseForReview(), "all"),
    }
    await hierplan.run(ROOT_GOAL, checkpoint_dir=tmp_path, **common)
    second = await hierplan.resume(tmp_path, Approve(by="dan"), **common)
    assert second.status == "paused"
    pending = json.loads((tmp_path / CHECKPOINT_FILE).read_text())["pending"]
    assert pending == ["1.1", "1.2", "1.3"]  # all three sub-goals reached the gate; none lost
    with pytest.raises(UserInputError, match="3 plans are pending"):
        await hierplan.resume(tmp_path, Edit(Plan(goal="x", steps=[])), **common)
    # Deciding one node records its decision; the run stays paused while others wait.
    third = await hierplan.resume(tmp_path, Approve(by="erin"), node="1.2", **common)
    assert third.status == "paused"
    assert calls == []
    assert json.loads((tmp_path / CHECKPOINT_FILE).read_text())["pending"] == ["1.1", "1.3"]
    last = await hierplan.resume(tmp_path, Approve(by="dan"), **common)
    assert last.status == "succeeded", last.error
    assert sorted(calls) == [part_goal(i) for i in (1, 2, 3)]
    assert model.calls == 4  # root and three sub-goals, each planned once
    deciders = {n.path: n.plan_versions[0].decided_by for n in last.tree.children}
    assert deciders == {"1.1": "dan", "1.2": "erin", "1.3": "dan"}


@pytest.mark.anyio
async def test_running_steps_finish_and_are_not_run_again(tmp_path: Path, source_db: Path) -> None:
    """copy_customers waits for a decision while copy_catalog's first copy is running."""
    workdir = migration_dir(source_db, tmp_path / "run")
    catalog_copying = anyio.Event()

    def listen(event: hierplan.RunEvent) -> None:
        if (
            isinstance(event, NodeStarted)
            and event.kind == "executor"
            and event.goal == 'copy_rows("products")'
        ):
            catalog_copying.set()

    async def review(plan: Plan, ctx: GateContext) -> Approve | Defer:
        if ctx.step is not None and ctx.step.id == "copy_customers":
            await catalog_copying.wait()
            return Defer(by="ticket-7")
        return Approve(by="auto")

    first_starts: list[str] = []
    first = await hierplan.run(
        approver=CallbackApprover(review),
        listeners=[listen, executor_starts(first_starts)],
        checkpoint_dir=workdir,
        **run_kwargs(workdir=workdir),
    )
    assert first.status == "paused"
    customers = next(n for n in first.tree.children if n.step_id == "copy_customers")
    catalog = next(n for n in first.tree.children if n.step_id == "copy_catalog")
    assert customers.plan_versions[-1].decision == "pending"
    copies = {c.goal: c.status for c in catalog.children}
    # The copy that was running finished; the one that depends on it did not start.
    assert copies == {
        'copy_rows("products")': "succeeded",
        'copy_rows("inventory")': "pending",
    }
    assert catalog.status == "paused"
    assert not any(g == 'copy_rows("customers")' for g in first_starts)

    second_starts: list[str] = []
    second = await hierplan.resume(
        workdir, Approve(by="ticket-7"), listeners=[executor_starts(second_starts)]
    )
    assert second.status == "succeeded", second.error
    assert second.verification is not None and second.verification["ok"]
    assert not set(first_starts) & set(second_starts)  # nothing that ran ran again
    every_copy = [g for g in first_starts + second_starts if g.startswith("copy_rows(")]
    assert len(every_copy) == len(set(every_copy)) == 14
    statuses = {n.status for n in second.nodes()}
    assert statuses == {"succeeded"}


@pytest.mark.anyio
async def test_callback_timeout_defers(tmp_path: Path) -> None:
    model = fanout_planner(1)

    async def slow(plan: Plan, ctx: GateContext) -> Approve:
        await anyio.sleep(30)
        return Approve()

    result = await hierplan.run(
        ROOT_GOAL,
        model=model,
        tools=[recording_tool([])],
        approver=CallbackApprover(slow, name="slow-ticket", timeout_s=0.05),
        checkpoint_dir=tmp_path,
    )
    assert result.status == "paused"
    decided = result.tree.plan_versions[0]
    assert (decided.decision, decided.decided_by) == ("pending", "slow-ticket")
    assert "no decision within 0.05 s" in decided.note


@pytest.mark.anyio
async def test_pause_without_checkpoint_dir_says_so() -> None:
    result = await hierplan.run(
        ROOT_GOAL, model=fanout_planner(1), tools=[recording_tool([])], approver=PauseForReview()
    )
    assert result.status == "paused"
    assert result.error is not None and "no checkpoint_dir" in result.error


@pytest.mark.anyio
async def test_as_needed_resumes_its_decomposition_without_a_second_attempt(
    tmp_path: Path,
) -> None:
    planner = fanout_planner(2)
    attempts: list[str] = []

    def answer(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            return planner.function(request)  # type: ignore[return-value]
        step = parse_step_prompt(request.messages)
        assert step is not None
        attempts.append(step.instruction)
        if step.instruction == ROOT_GOAL:
            return ModelResponse(text="FAILED: too big to do at once")
        return ModelResponse(text=f"did {step.instruction}")

    model = FunctionModel(answer)
    common: dict[str, Any] = {
        "model": model,
        "strategy": "as-needed",
        "approver": PolicyApprover(PauseForReview(), "root"),
    }
    first = await hierplan.run(ROOT_GOAL, checkpoint_dir=tmp_path, **common)
    assert first.status == "paused"
    assert attempts == [ROOT_GOAL]
    result = await hierplan.resume(tmp_path, Approve(by="fay"), **common)
    assert result.status == "succeeded", result.error
    assert attempts == [ROOT_GOAL, part_goal(1), part_goal(2)]  # the root is not tried again
    assert model.calls == 1 + 1 + 2  # one attempt, one plan, two sub-goal attempts


@pytest.mark.anyio
async def test_replans_made_before_a_pause_still_count_after_resume(tmp_path: Path) -> None:
    # max_replans is per node and per run: a pause between replans does not start it afresh.
    from hierplan.core.settings import RunSettings
    from hierplan.models.scripted import plan_response
    from hierplan.tools.base import tool

    proposals: list[str] = []

    def planner(request: ModelRequest) -> ModelResponse:
        proposals.append(f"try{len(proposals) + 1}")
        step = Step(id=proposals[-1], title="Try", instruction="try it", tool="broken", args={})
        return plan_response(Plan(goal=ROOT_GOAL, steps=[step]))

    @tool
    def broken() -> str:
        """Always fails."""
        raise RuntimeError("still broken")

    async def first_replan_waits(plan: Plan, ctx: GateContext) -> Approve | Defer:
        return Defer(by="test") if ctx.reason == "replan" and ctx.version == 2 else Approve()

    common: dict[str, Any] = {
        "model": FunctionModel(planner),
        "tools": [broken],
        "approver": CallbackApprover(first_replan_waits),
        "settings": RunSettings(max_replans=1, max_retries=0),
    }
    first = await hierplan.run(ROOT_GOAL, checkpoint_dir=tmp_path, **common)
    assert first.status == "paused"
    assert [v.reason for v in first.tree.plan_versions] == ["initial", "replan"]
    resumed = await hierplan.resume(tmp_path, Approve(by="dana"), **common)
    assert resumed.status == "failed"
    assert proposals == ["try1", "try2"]  # the one replan allowed was made before the pause
    assert [v.reason for v in resumed.tree.plan_versions] == ["initial", "replan"]


@pytest.mark.anyio
async def test_a_run_directory_moved_while_paused_resumes_on_its_own_files(
    tmp_path: Path, source_db: Path
) -> None:
    first_dir = migration_dir(source_db, tmp_path / "first")
    paused = await hierplan.run(
        approver=PauseForReview(), checkpoint_dir=first_dir, **run_kwargs(workdir=first_dir)
    )
    assert paused.status == "paused"
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    first_dir.rename(moved)
    done = await hierplan.resume(moved, Approve(by="alice"))
    assert done.status == "succeeded", done.error
    assert done.verification is not None and done.verification["ok"]
    # The migration happened in the moved directory; nothing recreated the old one.
    assert (moved / "target.db").stat().st_size > 0 and not first_dir.exists()


@pytest.mark.anyio
async def test_a_hand_edited_checkpoint_is_refused_clearly_and_stays_resumable(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    common: dict[str, Any] = {"model": fanout_planner(2), "tools": [recording_tool(calls)]}
    await hierplan.run(ROOT_GOAL, approver=PauseForReview(), checkpoint_dir=tmp_path, **common)
    path = tmp_path / CHECKPOINT_FILE
    saved = path.read_text()
    edits = [
        (("spec", "budget"), {"euro": 1}, r"the checkpoint's run is invalid \(budget.euro: "),
        (("spec", "settings", "max_depth"), "two", r"settings are invalid \(max_depth: "),
        (("results", "1.1"), {"output": None}, r"not a hierplan checkpoint .*first, at results"),
        (
            ("workflow_span",),
            {"trace_id": "not hex", "span_id": "0"},
            r"not a hierplan checkpoint .*first, at workflow_span.trace_id: String should match",
        ),
    ]
    for (*parents, key), value, problem in edits:
        data = json.loads(saved)
        inner = data
        for name in parents:
            inner = inner.setdefault(name, {}) if inner.get(name) is None else inner[name]
        inner[key] = value
        path.write_text(json.dumps(data))
        with pytest.raises(UserInputError, match=problem):
            await hierplan.resume(tmp_path, Approve(), **common)
        assert path.exists() and not (tmp_path / RESUMING_FILE).exists()
    path.write_text(saved)
    done = await hierplan.resume(tmp_path, Approve(), **common)
    assert done.status == "succeeded" and len(calls) == 2


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("written_by", "problem"),
    [
        (
            "newer",
            r"checkpoint format 3; this hierplan reads formats 1 and 2: it was written by a newer",
        ),
        (
            "older",
            r"checkpoint format 0; this hierplan reads formats 1 and 2: resume it with the",
        ),
    ],
)
async def test_a_checkpoint_of_another_format_says_so_whatever_its_fields(
    tmp_path: Path, written_by: str, problem: str
) -> None:
    calls: list[str] = []
    common: dict[str, Any] = {"model": fanout_planner(2), "tools": [recording_tool(calls)]}
    await hierplan.run(ROOT_GOAL, approver=PauseForReview(), checkpoint_dir=tmp_path, **common)
    path = tmp_path / CHECKPOINT_FILE
    saved = path.read_text()
    data = json.loads(saved)
    if written_by == "newer":
        data.update(format=3, plans={})  # a field this hierplan does not know
    else:
        data["format"] = 0
        del data["spec"]  # a field this hierplan needs
    path.write_text(json.dumps(data))
    with pytest.raises(UserInputError, match=problem):
        await hierplan.resume(tmp_path, Approve(), **common)
    assert path.exists() and calls == []
    path.write_text(saved)
    done = await hierplan.resume(tmp_path, Approve(), **common)
    assert done.status == "succeeded" and len(calls) == 2


@pytest.mark.anyio
async def test_of_two_resumes_started_together_the_second_says_the_first_took_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    common: dict[str, Any] = {"model": fanout_planner(2), "tools": [recording_tool(calls)]}
    await hierplan.run(ROOT_GOAL, approver=PauseForReview(), checkpoint_dir=tmp_path, **common)
    prepare = resume_module.resumed_spec

    def other_resume_claims_it_first(*args: Any) -> hierplan.RunSpec:
        # Another process renames the checkpoint after this one has read it.
        (tmp_path / CHECKPOINT_FILE).rename(tmp_path / RESUMING_FILE)
        return prepare(*args)

    monkeypatch.setattr(resume_module, "resumed_spec", other_resume_claims_it_first)
    with pytest.raises(UserInputError, match=r"another resume of .* took its checkpoint first"):
        await hierplan.resume(tmp_path, Approve(), **common)
    assert (tmp_path / RESUMING_FILE).exists() and calls == []  # the other resume's, untouched


@pytest.mark.anyio
async def test_an_edited_copy_kept_beside_the_pending_plans_is_not_deleted(tmp_path: Path) -> None:
    calls: list[str] = []
    common: dict[str, Any] = {"model": fanout_planner(2), "tools": [recording_tool(calls)]}
    await hierplan.run(ROOT_GOAL, approver=PauseForReview(), checkpoint_dir=tmp_path, **common)
    pending = tmp_path / PENDING_DIR
    mine = pending / "1-mine.yaml"
    mine.write_text((pending / "1.yaml").read_text().replace("Collect part 2", "Collect part 9"))
    (pending / "notes.yaml").write_text("why: part 2 is wrong\n")
    done = await hierplan.resume(tmp_path, Edit(load_plan(mine), by="alice"), **common)
    # The two steps run at once: the order of their calls is the scheduler's, not the plan's.
    assert done.status == "succeeded" and sorted(calls) == ["Collect part 1", "Collect part 9"]
    assert not (pending / "1.yaml").exists()
    assert sorted(p.name for p in pending.iterdir()) == ["1-mine.yaml", "notes.yaml"]


@pytest.mark.anyio
async def test_an_interrupted_resume_says_how_to_go_on(tmp_path: Path) -> None:
    common: dict[str, Any] = {"model": fanout_planner(2), "tools": [recording_tool([])]}
    await hierplan.run(ROOT_GOAL, approver=PauseForReview(), checkpoint_dir=tmp_path, **common)
    (tmp_path / CHECKPOINT_FILE).rename(tmp_path / RESUMING_FILE)  # as a killed resume leaves it
    with pytest.raises(UserInputError, match=f"rename {RESUMING_FILE} to {CHECKPOINT_FILE}"):
        await hierplan.resume(tmp_path, Approve(), **common)


@pytest.mark.anyio
async def test_each_nodes_budget_counts_what_it_spent_before_and_after_pauses(
    tmp_path: Path, source_db: Path
) -> None:
    straight_dir = migration_dir(source_db, tmp_path / "straight")
    straight = await hierplan.run(budget={"usd": 0.05}, **run_kwargs(workdir=straight_dir))
    paused_dir = migration_dir(source_db, tmp_path / "paused")
    result = await hierplan.run(
        approver=PolicyApprover(PauseForReview(), "all"),
        checkpoint_dir=paused_dir,
        budget={"usd": 0.05},
        **run_kwargs(workdir=paused_dir),
    )
    pauses = 0
    while result.status == "paused":
        pauses += 1
        result = await hierplan.resume(
            paused_dir, Approve(by="alice"), approver=PolicyApprover(PauseForReview(), "all")
        )
    assert pauses >= 3 and result.status == straight.status == "succeeded", result.error

    def spent(run: hierplan.RunResult) -> dict[str, tuple[int, int, int]]:
        return {
            n.path: (
                n.budget["spent_tokens"],
                n.budget["planning_tokens"],
                n.budget["limit_tokens"] or 0,
            )
            for n in run.nodes()
            if n.budget is not None
        }

    # The same calls were made, paused or not: every node's figures are the same.
    assert spent(result) == spent(straight)
    assert result.budget is not None and straight.budget is not None
    levels = [(lv["depth"], lv["spent_tokens"]) for lv in result.budget["levels"]]
    assert levels == [(lv["depth"], lv["spent_tokens"]) for lv in straight.budget["levels"]]


def _unbalanced(run: hierplan.RunResult) -> list[tuple[str, str, float, float, float]]:
    """Every node's figures where its allocation is not what it spent plus what it released."""
    out: list[tuple[str, str, float, float, float]] = []
    for n in run.nodes():
        b = n.budget
        if b is None:
            continue
        for unit, tolerance in (("tokens", 0.0), ("usd", 1e-12)):
            allocated, spent = b[f"allocated_{unit}"], b[f"spent_{unit}"]
            released = b[f"released_{unit}"]
            if abs(allocated - spent - released) > tolerance:
                out.append((n.path, unit, allocated, spent, released))
    return out


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("review_policy", "allocation"),
    [(None, "equal"), ("all", "equal"), ("all", "on-demand")],
    ids=["one-resume", "a-resume-per-sub-plan", "a-resume-per-sub-plan-on-demand"],
)
async def test_each_nodes_allocation_is_what_it_spent_and_released_over_all_resumes(
    tmp_path: Path, source_db: Path, review_policy: str | None, allocation: str
) -> None:
    budget: dict[str, Any] = {"usd": 0.03, "tokens": 200_000, "allocation": allocation}
    straight_dir = migration_dir(source_db, tmp_path / "straight")
    straight = await hierplan.run(budget=budget, **run_kwargs(workdir=straight_dir))
    assert straight.status == "succeeded" and _unbalanced(straight) == []
    paused_dir = migration_dir(source_db, tmp_path / "paused")
    approver = (
        PauseForReview()
        if review_policy is None
        else PolicyApprover(PauseForReview(), review_policy)
    )
    result = await hierplan.run(
        approver=approver,
        checkpoint_dir=paused_dir,
        budget=budget,
        **run_kwargs(workdir=paused_dir),
    )
    # One pause: the resumed run approves the later plans; else each sub-plan pauses it.
    again = None if review_policy is None else approver
    resumes = 0
    while result.status == "paused":
        resumes += 1
        result = await hierplan.resume(paused_dir, Approve(by="alice"), approver=again)
    assert result.status == "succeeded", result.error
    assert resumes == 1 if review_policy is None else resumes >= 3
    # What went back at a pause was taken again by the resumed part: counted once, a node's
    # figures add up as in a run that never paused, for every node, in tokens and in USD.
    assert _unbalanced(result) == []
    nodes = [n for n in result.nodes() if n.budget is not None]
    assert len(nodes) == len([n for n in straight.nodes() if n.budget is not None])
    assert all(n.budget is not None and n.budget["overrun_tokens"] == 0 for n in nodes)


@pytest.mark.anyio
async def test_a_resume_stopped_before_its_run_starts_leaves_the_run_paused(
    tmp_path: Path, source_db: Path
) -> None:
    paused_dir = migration_dir(source_db, tmp_path / "paused")
    paused = await hierplan.run(
        approver=PauseForReview(), checkpoint_dir=paused_dir, **run_kwargs(workdir=paused_dir)
    )
    assert paused.status == "paused"
    before = (paused_dir / CHECKPOINT_FILE).read_text()
    with anyio.CancelScope() as scope:
        scope.cancel()  # the caller's deadline, an interrupt: reached while the scenario reopens
        await hierplan.resume(paused_dir, Approve(by="alice"))
    assert (paused_dir / CHECKPOINT_FILE).read_text() == before
    assert not (paused_dir / RESUMING_FILE).exists()
    done = await hierplan.resume(paused_dir, Approve(by="alice"))
    assert done.status == "succeeded", done.error


class _Parts:
    """Tools that record their calls: ``fetch`` a value, ``use`` it, ``bad`` (fails its first
    ``bad_fails`` calls) and ``ok``; and the run options of a run whose replans wait for a
    decision (``replans_wait`` says which)."""

    def __init__(self, bad_fails: int = 1_000) -> None:
        self.calls: list[str] = []
        self.bad_fails = bad_fails

        @tool
        def fetch(s: str) -> str:
            """Fetch a value."""
            self.calls.append(f"fetch {s}")
            return f"value of {s}"

        @tool
        def use(v: str) -> str:
            """Use a value."""
            self.calls.append(f"use {v}")
            return f"used {v}"

        @tool
        def bad() -> str:
            """Fails its first calls."""
            self.calls.append("bad")
            if self.bad_fails > 0:
                self.bad_fails -= 1
                raise RuntimeError("broken")
            return "fine at last"

        @tool
        def ok() -> str:
            """Succeeds."""
            return "fine"

        self.tools = [fetch, use, bad, ok]

    def options(self, planner: Any, max_replans: int = 1, **settings: Any) -> dict[str, Any]:
        async def replans_wait(plan: Plan, ctx: GateContext) -> Approve | Defer:
            # the root's replans only (a sub-planner's are approved at once)
            root = ctx.path == "1"
            return Defer(by="test") if ctx.reason == "replan" and root else Approve()

        return {
            "model": FunctionModel(planner),
            "tools": self.tools,
            "approver": CallbackApprover(replans_wait),
            "settings": RunSettings(max_replans=max_replans, max_retries=0, **settings),
        }


def _direct(step_id: str, tool_name: str, args: dict[str, Any], *deps: str) -> Step:
    return Step(
        id=step_id,
        title=step_id,
        instruction=f"do {step_id}",
        tool=tool_name,
        args=args,
        depends_on=list(deps),
    )


def _revised(request: ModelRequest) -> bool:
    return "CURRENT PLAN" in request.messages[-1].content


@pytest.mark.anyio
async def test_a_revision_approved_on_resume_runs_again_what_it_redoes(tmp_path: Path) -> None:
    # The revision paused for review redoes 'fetch' with other arguments; 'use' is written
    # again unchanged but was built on the old fetch. Neither result from before the pause
    # stands for the revised plan: both run again.
    parts = _Parts()

    def planner(request: ModelRequest) -> ModelResponse:
        new = _revised(request)
        steps = [
            _direct("fetch", "fetch", {"s": "new" if new else "old"}),
            _direct("use", "use", {"v": "$fetch"}, "fetch"),
            _direct("check", "ok" if new else "bad", {}, "use"),  # last: nothing it stops
        ]
        return plan_response(Plan(goal=ROOT_GOAL, steps=steps))

    common = parts.options(planner)
    first = await hierplan.run(ROOT_GOAL, checkpoint_dir=tmp_path, **common)
    assert first.status == "paused"
    assert parts.calls == ["fetch old", "use value of old", "bad"]
    resumed = await hierplan.resume(tmp_path, Approve(by="dana"), **common)
    assert resumed.status == "succeeded", resumed.error
    assert parts.calls[3:] == ["fetch new", "use value of new"]
    uses = [c for c in resumed.tree.children if c.step_id == "use"]
    assert [c.status for c in uses] == ["succeeded", "succeeded"]
    assert uses[-1].output == "used value of new"  # the one the revised plan answers with


@pytest.mark.anyio
async def test_an_edit_on_resume_that_rewords_a_done_step_keeps_it_done(tmp_path: Path) -> None:
    # The edit changes only the wording of a direct call, which is no work: the step stays
    # done, with its record (no second child left pending), through a second pause too.
    parts = _Parts()
    plans = 0

    def planner(request: ModelRequest) -> ModelResponse:
        nonlocal plans
        plans += 1
        steps = [
            _direct("fetch", "fetch", {"s": "old"}),
            _direct("use", "use", {"v": "$fetch"}, "fetch"),
            _direct("check", "ok" if plans >= 3 else "bad", {}, "use"),
        ]
        return plan_response(Plan(goal=ROOT_GOAL, steps=steps))

    common = parts.options(planner, max_replans=2)
    assert (await hierplan.run(ROOT_GOAL, checkpoint_dir=tmp_path, **common)).status == "paused"
    pending = load_plan(tmp_path / PENDING_DIR / "1.yaml")
    reworded = [
        s.model_copy(update={"instruction": "fetch the old value"}) if s.id == "fetch" else s
        for s in pending.steps
    ]
    edit = Edit(pending.model_copy(update={"steps": reworded}), by="carol")
    second = await hierplan.resume(tmp_path, edit, **common)
    assert second.status == "paused"
    children = [(c.step_id, c.status, c.goal) for c in second.tree.children]
    assert ("fetch", "succeeded", "fetch the old value") in children
    assert [c for c in children if c[0] == "fetch"] == [
        ("fetch", "succeeded", "fetch the old value")
    ]
    third = await hierplan.resume(tmp_path, Approve(by="dana"), **common)
    assert third.status == "succeeded", third.error
    assert parts.calls.count("fetch old") == 1 and parts.calls.count("use value of old") == 1


@pytest.mark.anyio
async def test_a_sub_goal_built_on_a_step_redone_on_resume_plans_again(tmp_path: Path) -> None:
    # The sub-goal depends on 'fetch'; its sub-planner used the old value and ended partial.
    # The revision approved on resume redoes 'fetch': the sub-goal gets a new sub-planner on
    # the new input, as it would had the revision been approved without a pause.
    parts = _Parts(bad_fails=2)
    sub = "Use the fetched value"

    def planner(request: ModelRequest) -> ModelResponse:
        text = request.messages[-1].content
        if sub in text.split("\n", 1)[0]:
            value = "value of new" if "value of new" in text else "value of old"
            steps = [_direct("a", "use", {"v": value}), _direct("b", "bad", {})]
            return plan_response(Plan(goal=sub, steps=steps))
        goal_step = Step(
            id="sub", title="sub", instruction=sub, kind="subgoal", depends_on=["fetch"]
        )
        fetch = _direct("fetch", "fetch", {"s": "new" if _revised(request) else "old"})
        return plan_response(Plan(goal=ROOT_GOAL, steps=[fetch, goal_step]))

    common = parts.options(planner)
    assert (await hierplan.run(ROOT_GOAL, checkpoint_dir=tmp_path, **common)).status == "paused"
    resumed = await hierplan.resume(tmp_path, Approve(by="dana"), **common)
    assert resumed.status == "succeeded", resumed.error
    assert "used value of new" in resumed.answer and "value of old" not in resumed.answer
