"""Streamed dispatch: a first plan's steps run as their lines are written, each checked on
its own; review, extra validators and budgets still see the plan whole; a refused line cancels
the planning call and the plan is repaired with what ran kept.

Each test that shows a step starting before its planning call ends makes the model wait, mid
plan, for an event only that step's tool sets: were the step not started while the plan is
still being written, the run could not finish (``fail_after``), whatever the scheduling order.
"""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_streaming import FanOutOracle

import hierplan
from hierplan import RunResult, RunSpec, ScriptedModel, tool
from hierplan.agents.prompts import RUNNING_RESULT
from hierplan.core.settings import RunSettings
from hierplan.hierarchy.gate import DEFAULT_VALIDATORS, CallbackApprover, Gate, GateContext
from hierplan.models.base import ModelResponse
from hierplan.models.scripted import StreamedText
from hierplan.plans.decisions import Approve
from hierplan.plans.plan import Plan, PlanProblem
from hierplan.records import CallRecord, NodeRecord
from hierplan.simulator.profiles import NoiseProfile, Simulator

pytestmark = pytest.mark.anyio


class Lookups:
    """A ``lookup`` tool whose calls are recorded; a call with ``key`` in ``opens`` sets its
    event (the model waits on it mid plan)."""

    def __init__(self, opens: dict[int, anyio.Event] | None = None) -> None:
        self.opens = opens or {}
        self.keys: list[int] = []

        @tool
        def lookup(key: int) -> int:
            """Look a key up."""
            self.keys.append(key)
            if key in self.opens:
                self.opens[key].set()
            return key * 10

        self.tool = lookup


@tool
def fragile(key: int) -> int:
    """Fails on every key."""
    raise RuntimeError(f"no {key}")


async def run(model: Any, lookups: Lookups, **options: Any) -> RunResult:
    spec = RunSpec(
        goal="look things up",
        model=model,
        strategy="dag",
        settings=RunSettings(retry_backoff_s=0, **options.pop("settings", {})),
        gate=options.pop("gate", None),
    )
    tools = [lookups.tool, *options.pop("tools", ())]
    with anyio.fail_after(20):
        return await hierplan.run(spec, tools=tools, **options)


def planning_call(record: NodeRecord, index: int = 0) -> CallRecord:
    return [c for c in record.calls if c.phase == "planning"][index]


def ended(call: CallRecord) -> float:
    return call.started_at + call.duration_s


async def test_a_step_starts_while_its_plan_is_still_being_written() -> None:
    opened = anyio.Event()
    lookups = Lookups({1: opened})
    model = ScriptedModel([StreamedText(("1. lookup(1)\n", opened, "2. lookup(2)\n"))])
    result = await run(model, lookups)
    model.assert_complete()
    assert result.status == "succeeded"
    assert lookups.keys == [1, 2]
    first, second = result.tree.children
    call = planning_call(result.tree)
    assert first.started_at is not None and first.started_at < ended(call)
    for child in (first, second):
        assert child.parsed_at is not None and child.dispatched_at is not None
        assert child.started_at is not None
        assert child.parsed_at <= child.dispatched_at <= child.started_at
    assert first.dispatched_at is not None and second.parsed_at is not None
    assert first.dispatched_at < second.parsed_at
    (version,) = result.tree.plan_versions
    assert (version.decision, version.decided_by, version.reason) == (
        "approved",
        "stream",
        "initial",
    )
    assert [s.id for s in version.plan.steps] == ["1", "2"]
    assert call.ok and "stream_closed" not in call.flags


async def test_the_simulator_streams_a_plan_whose_first_step_starts_before_the_call_ends() -> None:
    profile = NoiseProfile(latency_median_s=0.02, latency_per_output_token_s=0.002)
    lookups = Lookups()
    model = Simulator(profile=profile, oracle=FanOutOracle(keys=8))
    result = await run(model, lookups)
    assert result.status == "succeeded"
    assert sorted(lookups.keys) == list(range(1, 9))
    call = planning_call(result.tree)
    firsts = [c.tool_calls[0].started_at for c in result.tree.children]
    assert min(firsts) < ended(call)
    assert result.tree.plan_versions[0].decided_by == "stream"


@pytest.mark.parametrize("gated", ["approver", "validator", "setting"])
async def test_a_plan_someone_asked_to_see_whole_is_not_streamed(gated: str) -> None:
    """A reviewer, an extra validator, or stream_plans off: the plan is gated whole, before
    any of its steps runs."""
    seen: list[Plan] = []

    def review(plan: Plan, ctx: GateContext) -> Approve:
        seen.append(plan)
        return Approve(by="reviewer")

    def one_lookup_at_most(plan: Plan, ctx: GateContext) -> list[PlanProblem]:
        seen.append(plan)
        return []

    choices: dict[str, dict[str, Any]] = {
        "approver": {"approver": CallbackApprover(review)},
        "validator": {"gate": Gate(validators=(*DEFAULT_VALIDATORS, one_lookup_at_most))},
        "setting": {"settings": {"stream_plans": False}},
    }
    options = choices[gated]
    lookups = Lookups()
    model = ScriptedModel([StreamedText(("1. lookup(1)\n", "2. lookup(2)\n"))])
    result = await run(model, lookups, **options)
    assert result.status == "succeeded"
    call = planning_call(result.tree)
    for child in result.tree.children:
        assert child.parsed_at is None and child.dispatched_at is None
        assert child.started_at is not None and child.started_at >= ended(call)
    (version,) = result.tree.plan_versions
    assert version.decided_by != "stream"
    if gated != "setting":
        assert [len(p.steps) for p in seen] == [2]


@pytest.mark.parametrize(
    ("line", "said"),
    [('2. lookup("two")', "expected integer, got string 'two'"), ("2. erase(2)", "erase")],
)
async def test_a_refused_line_cancels_the_call_and_the_plan_is_repaired_keeping_what_ran(
    line: str, said: str
) -> None:
    """Line 2 fails its checks (arguments against the tool's schema; a tool the node does not
    have): the stream stops there (the model would wait for ever after it: only a cancel ends
    the call), step 1 runs to its end, and the repaired plan keeps its result rather than
    running it again."""
    never = anyio.Event()
    lookups = Lookups()
    model = ScriptedModel(
        [
            StreamedText((f"1. lookup(1)\n{line}\n", never, "3. lookup(3)\n")),
            ModelResponse(text="1. lookup(1)\n2. lookup(2) after 1"),
        ]
    )
    result = await run(model, lookups)
    model.assert_complete()
    assert result.status == "succeeded"
    assert lookups.keys == [1, 2]  # step 1 ran once
    first, second = result.tree.plan_versions
    assert (first.decision, first.decided_by) == ("invalid", "stream")
    assert said in first.problems[0]
    assert (second.reason, second.decision) == ("retry", "approved")
    cut = planning_call(result.tree, 0)
    assert not cut.ok and "stream_closed" in cut.flags
    assert cut.usage.output_tokens < 20  # what it wrote, not its max_tokens
    repair_prompt = model.requests[1].messages[-1].content
    assert said in repair_prompt and "PROGRESS" in repair_prompt
    assert [c.step_id for c in result.tree.children] == ["1", "2"]


async def test_a_line_that_refers_to_no_step_above_is_refused_before_its_tool_runs() -> None:
    """A streamed step runs as soon as it is read: ``$9`` (no such step) must not reach a tool
    that takes text as the string "$9"."""
    echoed: list[str] = []

    @tool
    def echo(text: str) -> str:
        """Say it back."""
        echoed.append(text)
        return text

    lookups = Lookups()
    model = ScriptedModel(
        [
            StreamedText(("1. lookup(1)\n2. echo($9)\n", anyio.Event())),
            ModelResponse(text='1. lookup(1)\n2. echo("nine")'),
        ]
    )
    result = await run(model, lookups, tools=[echo])
    model.assert_complete()
    assert result.status == "succeeded"
    assert echoed == ["nine"] and lookups.keys == [1]  # step 1 kept, not run again
    first = result.tree.plan_versions[0]
    assert first.decision == "invalid" and "$9 is no step above" in first.problems[0]


async def test_an_unreadable_first_line_gets_the_planners_repair() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [StreamedText(("what a nice goal\n", anyio.Event())), ModelResponse(text="1. lookup(4)")]
    )
    result = await run(model, lookups)
    model.assert_complete()
    assert result.status == "succeeded" and lookups.keys == [4]
    assert (
        model.requests[1]
        .messages[-1]
        .content.startswith("REPAIR: that plan was invalid: plan line 1")
    )
    assert [c.purpose for c in result.tree.calls] == ["plan", "plan-repair"]
    assert "stream_closed" in result.tree.calls[0].flags


async def test_a_step_that_fails_while_the_plan_streams_leads_to_a_replan() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [
            StreamedText(("1. fragile(1)\n", "2. lookup(2) after 1\n")),
            ModelResponse(text="1. lookup(3)"),
        ]
    )
    result = await run(model, lookups, tools=[fragile], settings={"max_retries": 0})
    model.assert_complete()
    assert result.status == "succeeded" and lookups.keys == [3]
    assert [v.reason for v in result.tree.plan_versions] == ["initial", "replan"]
    assert "step '1' failed" in model.requests[1].messages[1].content


async def test_a_step_written_after_a_failure_that_does_not_depend_on_it_still_runs() -> None:
    """Line 2 is written only once step 1 has failed (the model waits for it): it does not
    depend on step 1, so it runs in the first plan, and the replan builds on its result (done,
    or still to come when the replan is asked for) rather than writing it again."""
    failed = anyio.Event()

    @tool
    async def flaky(key: int) -> int:
        """Fails, and says so."""
        failed.set()
        raise RuntimeError(f"no {key}")

    lookups = Lookups()
    model = ScriptedModel(
        [
            StreamedText(("1. flaky(1)\n", failed, "2. lookup(2)\n3. lookup($1) after 2\n")),
            ModelResponse(text="4. lookup(4) after 2"),
        ]
    )
    result = await run(model, lookups, tools=[flaky], settings={"max_retries": 0})
    model.assert_complete()
    assert result.status == "succeeded"
    assert lookups.keys == [2, 4]  # step 2 ran once, before the replan; step 3 never
    by_step = {c.step_id: c.status for c in result.tree.children}
    assert by_step == {"1": "failed", "2": "succeeded", "3": "cancelled", "4": "succeeded"}
    replan_prompt = model.requests[1].messages[-1].content  # step 2 is in its PROGRESS
    assert '"2": "20"' in replan_prompt or f'"2": "{RUNNING_RESULT}"' in replan_prompt


LINES = "1. lookup(1)\n2. lookup(2) after 1\n3. lookup(3)\n4. lookup(4) after 2, 3\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, len(LINES) - 1), unique=True, max_size=12))
def test_however_the_text_is_cut_into_deltas_the_same_plan_runs(cuts: list[int]) -> None:
    edges = [0, *sorted(cuts), len(LINES)]
    parts = tuple(LINES[a:b] for a, b in itertools.pairwise(edges))
    lookups = Lookups()
    model = ScriptedModel([StreamedText(parts)])
    result = anyio.run(run, model, lookups)
    assert result.status == "succeeded"
    assert sorted(lookups.keys) == [1, 2, 3, 4]
    (version,) = result.tree.plan_versions
    assert [(s.id, s.depends_on) for s in version.plan.steps] == [
        ("1", []),
        ("2", ["1"]),
        ("3", []),
        ("4", ["2", "3"]),
    ]
    by_step = {c.step_id: c for c in result.tree.children}
    four, two, three = by_step["4"], by_step["2"], by_step["3"]
    assert four.started_at is not None and two.finished_at is not None
    assert three.finished_at is not None and four.started_at >= max(
        two.finished_at, three.finished_at
    )


async def test_a_replan_streams_and_its_steps_build_on_the_done_ones() -> None:
    opened = anyio.Event()
    lookups = Lookups({10: opened})
    model = ScriptedModel(
        [
            StreamedText(("1. lookup(1)\n", "2. fragile(2) after 1\n")),
            # the replan writes only what is left; 3 builds on done step 1, and starts
            # before the replan's call ends (the call waits on the event 3's tool sets)
            StreamedText(("3. lookup($1)\n", opened, "4. lookup(4)\n")),
        ]
    )
    result = await run(model, lookups, tools=[fragile], settings={"max_retries": 0})
    model.assert_complete()
    assert result.status == "succeeded"
    assert lookups.keys == [1, 10, 4]  # done step 1 did not run again
    assert "write only the steps still to do" in model.requests[1].messages[1].content
    replan = result.tree.plan_versions[1]
    assert (replan.reason, replan.decided_by, replan.decision) == ("replan", "stream", "approved")
    assert [s.id for s in replan.plan.steps] == ["1", "3", "4"]
    assert replan.diff is not None and replan.diff.summary() == (
        "+2 -1 ~0 (added: 3, 4; removed: 2)"
    )
    by_step = {c.step_id: c for c in result.tree.children}
    assert [c.step_id for c in result.tree.children] == ["1", "2", "3", "4"]
    three = by_step["3"]
    assert three.started_at is not None and three.started_at < ended(planning_call(result.tree, 1))
    assert three.parsed_at is not None and three.dispatched_at is not None


async def test_a_streamed_replan_runs_a_redone_step_again_and_not_a_copied_one() -> None:
    @tool
    def check(value: int) -> int:
        """Accepts 50 only."""
        if value != 50:
            raise RuntimeError(f"not {value}")
        return value

    lookups = Lookups()
    model = ScriptedModel(
        [
            StreamedText(("1. lookup(1)\n", "2. lookup(2)\n", "3. check($1) after 2\n")),
            # 2 copied unchanged stands; 1 redone with other work runs again, and so does
            # 3, which builds on it
            StreamedText(("2. lookup(2)\n", "1. lookup(5)\n", "3. check($1) after 2\n")),
        ]
    )
    result = await run(model, lookups, tools=[check], settings={"max_retries": 0})
    model.assert_complete()
    assert result.status == "succeeded" and result.answer == "50"
    assert sorted(lookups.keys) == [1, 2, 5]
    statuses = [(c.step_id, c.status) for c in result.tree.children]
    assert statuses == [
        ("1", "succeeded"),
        ("2", "succeeded"),
        ("3", "failed"),
        ("1", "succeeded"),
        ("3", "succeeded"),
    ]


async def test_a_refused_line_in_a_streamed_replan_gets_a_repair_keeping_what_ran() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [
            StreamedText(("1. lookup(1)\n", "2. fragile(2) after 1\n")),
            StreamedText(("3. lookup(3)\n", "4. nope(4)\n", "5. lookup(5)\n")),
            ModelResponse(text="6. lookup(6) after 3"),
        ]
    )
    result = await run(model, lookups, tools=[fragile], settings={"max_retries": 0})
    model.assert_complete()
    assert result.status == "succeeded"
    assert sorted(lookups.keys) == [1, 3, 6]  # 3 ran once, before the refused line
    versions = [(v.reason, v.decided_by, v.decision) for v in result.tree.plan_versions]
    assert versions[:2] == [("initial", "stream", "approved"), ("replan", "stream", "invalid")]
    assert versions[2][0] == "retry" and versions[2][2] == "approved"
    assert "nope" in (result.tree.plan_versions[1].problems or [""])[0]
    # the repair was asked of the plan as written so far: step 3 done or still running (the
    # repair is asked for without waiting for it)
    repair_prompt = model.requests[2].messages[1].content
    assert "FEEDBACK:" in repair_prompt
    assert '"3": "30"' in repair_prompt or f'"3": "{RUNNING_RESULT}"' in repair_prompt


class Held:
    """A ``held`` tool whose calls wait until ``release`` is set; the first ``failures`` calls
    then fail."""

    def __init__(self, failures: int = 0) -> None:
        self.release = anyio.Event()
        self.calls = 0

        @tool
        async def held(key: int) -> int:
            """Look a key up, slowly."""
            self.calls += 1
            await self.release.wait()
            if self.calls <= failures:
                raise RuntimeError(f"no {key} yet")
            return key * 100

        self.tool = held

    def repair(self, text: str, prompts: list[str]) -> Any:
        """A script item: the repair ``text``, which releases the held calls as it is asked
        for (so that they end only after it was)."""

        def answer(request: Any) -> ModelResponse:
            prompts.append(request.messages[1].content)
            self.release.set()
            return ModelResponse(text=text)

        return answer


async def test_a_repair_is_asked_for_while_dispatched_steps_run_and_may_build_on_them() -> None:
    # Step 1 ends only once the repair has been asked for: waiting for it first would hang.
    held, prompts = Held(), list[str]()
    model = ScriptedModel(
        [StreamedText(("1. held(1)\n", "2. nope(2)\n")), held.repair("3. lookup($1)", prompts)]
    )
    lookups = Lookups()
    result = await run(model, lookups, tools=[held.tool])
    model.assert_complete()
    assert result.status == "succeeded" and result.answer == "1000"
    assert held.calls == 1 and lookups.keys == [100]  # 1 ran once; 3 built on its result
    assert f'"1": "{RUNNING_RESULT}"' in prompts[0]
    assert [s.id for s in result.tree.plan_versions[-1].plan.steps] == ["1", "3"]


async def test_a_running_step_the_repair_kept_that_failed_meanwhile_runs_again() -> None:
    held, prompts = Held(failures=1), list[str]()
    model = ScriptedModel(
        [StreamedText(("1. held(1)\n", "2. nope(2)\n")), held.repair("3. lookup($1)", prompts)]
    )
    lookups = Lookups()
    result = await run(model, lookups, tools=[held.tool], settings={"max_retries": 0})
    model.assert_complete()
    assert result.status == "succeeded" and result.answer == "1000"
    assert held.calls == 2 and lookups.keys == [100]


async def run_early(
    items: list[Any], held: Held, **options: Any
) -> tuple[RunResult, Lookups, ScriptedModel]:
    """Run a scripted model's ``items`` with ``lookup``, ``fragile`` and ``held`` (no
    retries), and check that the script was used up."""
    model = ScriptedModel(items)
    lookups = Lookups()
    settings = {"max_retries": 0, **options.pop("settings", {})}
    result = await run(model, lookups, tools=[fragile, held.tool], settings=settings, **options)
    model.assert_complete()
    return result, lookups, model


async def test_a_replan_is_asked_for_as_a_step_fails_and_may_build_on_steps_still_running() -> None:
    # Step 2 ends only once the replan has been asked for: waiting for it first would hang.
    held, prompts = Held(), list[str]()
    result, lookups, _ = await run_early(
        [
            StreamedText(("1. lookup(1)\n2. held(2)\n3. fragile(3)\n4. lookup($3) after 1, 2\n",)),
            held.repair("3. lookup(3)\n4. lookup($3) after 1, 2", prompts),
        ],
        held,
    )
    assert result.status == "succeeded" and result.answer == "300"
    assert held.calls == 1 and sorted(lookups.keys) == [1, 3, 30]  # 2 ran once, kept
    assert f'"2": "{RUNNING_RESULT}"' in prompts[0]  # (1 may be done, or running too)
    versions = [(v.reason, v.decided_by) for v in result.tree.plan_versions]
    assert versions == [("initial", "stream"), ("replan", "stream")]
    by_child = [(c.step_id, c.status) for c in result.tree.children]
    assert by_child == [
        ("1", "succeeded"),
        ("2", "succeeded"),
        ("3", "failed"),
        ("4", "succeeded"),  # cancelled by the failure, then run by the replan unchanged
        ("3", "succeeded"),
    ]


async def test_a_waiting_step_an_early_replan_redoes_does_not_start_in_the_old_plan() -> None:
    held, prompts = Held(), list[str]()
    result, lookups, _ = await run_early(
        [
            # 3 waits for 1, which is held until the replan is asked for
            StreamedText(("1. held(1)\n2. fragile(2)\n3. lookup(5) after 1\n",)),
            held.repair("3. lookup(7) after 1", prompts),
        ],
        held,
    )
    assert result.status == "succeeded" and result.answer == "70"
    assert lookups.keys == [7]  # the old step 3 never ran
    old = next(c for c in result.tree.children if c.step_id == "3")
    assert old.status == "cancelled" and "replaced" in (old.error or "")


async def test_a_running_step_an_early_replan_kept_that_fails_fails_its_dependents() -> None:
    held, prompts = Held(failures=1), list[str]()
    result, lookups, model = await run_early(
        [
            StreamedText(("1. held(1)\n2. fragile(2)\n",)),
            held.repair("3. lookup($1)", prompts),  # builds on 1, which then fails
            ModelResponse(text="4. lookup(4)"),
        ],
        held,
    )
    assert result.status == "succeeded" and result.answer == "40"
    assert held.calls == 1 and lookups.keys == [4]  # 1 did not run again; 3 never ran
    assert "step '1' failed" in model.requests[2].messages[-1].content  # the second replan's
    by_child = {c.step_id: (c.status, c.error) for c in result.tree.children}
    assert by_child["3"] == ("cancelled", "dependency '1' failed")


class Releases:
    """A pause in a scripted stream that releases ``held``'s calls: the lines before it have
    been read when the model reaches it."""

    def __init__(self, held: Held) -> None:
        self.held = held

    async def wait(self) -> None:
        self.held.release.set()


async def test_a_step_built_on_one_an_early_replan_redoes_does_not_start_in_the_old_plan() -> None:
    held = Held()
    result, lookups, _ = await run_early(
        [
            StreamedText(("1. held(1)\n2. fragile(2)\n3. lookup($1) after 1\n",)),
            StreamedText(("1. lookup(9)\n", Releases(held))),  # 1 redone: the old 3 is stale
        ],
        held,
    )
    assert result.status == "succeeded" and result.answer == "90"
    assert lookups.keys == [9]  # the old 3 never started
    old = next(c for c in result.tree.children if c.step_id == "3")
    assert old.status == "cancelled" and "dropped" in (old.error or "")


async def test_a_node_that_gives_up_in_an_early_replan_ends_partial_and_the_run_returns() -> None:
    held = Held()
    model = ScriptedModel(
        [
            StreamedText(("1. held(1)\n2. fragile(2)\n",)),
            # a refused line, and no repair allowed
            StreamedText(("3. lookup($1)\n", Releases(held), "4. nope(4)\n")),
        ]
    )
    lookups = Lookups()
    settings = {"max_retries": 0, "max_invalid_plans": 0}
    result = await run(model, lookups, tools=[fragile, held.tool], settings=settings)
    model.assert_complete()
    assert result.status == "partial" and "1 invalid plan" in (result.error or "")
    assert lookups.keys == [100]  # 3 ran on the result of 1
    assert {c.status for c in result.tree.children} <= {"succeeded", "failed", "cancelled"}


async def test_the_repair_of_an_early_replan_shows_the_done_steps_it_kept_as_done() -> None:
    held, prompts = Held(), list[str]()

    def repair(request: Any) -> ModelResponse:
        prompts.append(request.messages[-1].content)
        return ModelResponse(text="4. lookup($1)\n5. lookup($2)")

    result, _, _ = await run_early(
        [
            StreamedText(("1. lookup(1)\n2. held(2)\n3. fragile(3) after 1\n",)),
            StreamedText(("4. lookup($1)\n", Releases(held), "5. nope(5)\n")),
            repair,
        ],
        held,
    )
    assert result.status == "succeeded"
    assert '"1": "10"' in prompts[0]  # done before the replan was asked for


def release_on_replan(held: Held) -> Any:
    """A run listener that releases ``held``'s calls when a revised plan is announced."""

    def listen(event: Any) -> None:
        if event.type == "replanned":
            held.release.set()

    return listen


async def test_a_waiting_step_an_early_replan_drops_does_not_start_in_the_old_plan() -> None:
    held = Held()
    model = ScriptedModel(
        [
            StreamedText(
                ("1. held(1)\n2. fragile(2)\n3. lookup($1) after 1\n4. lookup($3) after 2, 3\n",)
            ),
            ModelResponse(text="5. lookup(5)"),  # 3 (waiting on 1) is no longer needed
        ]
    )
    lookups = Lookups()
    result = await run(
        model,
        lookups,
        tools=[fragile, held.tool],
        settings={"max_retries": 0},
        listeners=[release_on_replan(held)],
    )
    model.assert_complete()
    assert result.status == "succeeded" and result.answer == "50"
    assert lookups.keys == [5]  # the old 3 never started
    old = next(c for c in result.tree.children if c.step_id == "3")
    assert old.status == "cancelled" and "dropped" in (old.error or "")


async def test_the_repair_of_an_early_replan_keeps_steps_it_redoes_from_starting() -> None:
    held = Held()
    model = ScriptedModel(
        [
            StreamedText(("1. held(1)\n2. fragile(2)\n3. lookup($1) after 1\n",)),
            StreamedText(('4. lookup("x")\n',)),  # the replan's first line is refused
            ModelResponse(text="1. lookup(9)\n3. lookup($1) after 1"),  # redoes 1, and 3 on it
        ]
    )
    lookups = Lookups()
    result = await run(
        model,
        lookups,
        tools=[fragile, held.tool],
        settings={"max_retries": 0},
        listeners=[release_on_replan(held)],
    )
    model.assert_complete()
    assert result.status == "succeeded" and result.answer == "900"
    assert lookups.keys == [9, 90]  # not the old 3, on the old 1's result


async def test_a_node_that_gives_up_after_a_refused_line_leaves_no_step_pending() -> None:
    model = ScriptedModel(
        [StreamedText(("1. fragile(1)\n2. lookup($1) after 1\n", "3. nope(3)\n"))]
    )
    settings = {"max_retries": 0, "max_invalid_plans": 0}
    result = await run(model, Lookups(), tools=[fragile], settings=settings)
    model.assert_complete()
    assert result.status == "failed"
    by_step = {c.step_id: (c.status, c.error) for c in result.tree.children}
    assert by_step["2"] == ("cancelled", "dependency '1' failed")


async def test_a_done_step_a_streamed_revision_drops_is_not_a_result_of_the_node() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [
            StreamedText(("1. lookup(1)\n", "2. lookup(2)\n", "3. fragile($1) after 2\n")),
            StreamedText(("4. fragile(4)\n",)),  # builds on nothing done: 1 and 2 drop out
        ]
    )
    result = await run(
        model, lookups, tools=[fragile], settings={"max_retries": 0, "max_replans": 1}
    )
    model.assert_complete()
    assert [s.id for s in result.tree.plan_versions[-1].plan.steps] == ["4"]
    # the node's plan reached nothing: it failed, rather than ending partial on results its
    # plan no longer has
    assert result.tree.status == "failed" and result.tree.output is None


async def test_a_repair_of_a_plan_cut_short_keeps_no_done_step_it_does_not_use() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [
            # 1 was to feed line 2, which is refused (no such tool)
            StreamedText(("1. lookup(1)\n", "2. nope($1)\n")),
            ModelResponse(text="3. lookup(3)"),  # the repair does without 1's result
        ]
    )
    result = await run(model, lookups)
    model.assert_complete()
    assert result.status == "succeeded" and result.answer == "30"
    assert [s.id for s in result.tree.plan_versions[-1].plan.steps] == ["3"]


async def test_each_streamed_step_s_arguments_are_checked_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A streamed step's arguments are checked when its line is read, not again with every
    line after it, nor when its tool is called."""
    from hierplan.tools.schema import schema_problems as real

    checked: list[Any] = []

    def counted(schema: Any, value: Any, *args: Any, **kwargs: Any) -> list[str]:
        checked.append(value)
        return real(schema, value, *args, **kwargs)

    monkeypatch.setattr("hierplan.tools.base.schema_problems", counted)
    lookups = Lookups()
    lines = "".join(f"{k}. lookup({k})\n" for k in range(1, 11))
    model = ScriptedModel([StreamedText((lines,))])
    result = await run(model, lookups)
    model.assert_complete()
    assert result.status == "succeeded"
    assert result.tree.plan_versions[0].decided_by == "stream"
    assert sorted(lookups.keys) == list(range(1, 11))
    assert sorted(c["key"] for c in checked) == list(range(1, 11))
