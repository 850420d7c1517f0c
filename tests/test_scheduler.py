"""The DAG scheduler: ordering, no barriers, limits, failures, cancellation, deadlines."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hierplan.core.results import StepResult
from hierplan.errors import StepFailed
from hierplan.hierarchy.scheduler import Slots, run_dag, run_streamed_dag
from hierplan.plans.plan import Plan, Step

pytestmark = pytest.mark.anyio


def plan_of(deps: dict[str, list[str]]) -> Plan:
    return Plan(
        goal="g",
        steps=[Step(id=k, title=k, instruction=k, depends_on=v) for k, v in deps.items()],
    )


class Recorder:
    """A run_step that records start and finish order and the peak concurrency."""

    def __init__(self, delays: dict[str, float] | None = None, fail: set[str] | None = None):
        self.delays = delays or {}
        self.fail = fail or set()
        self.events: list[tuple[str, str]] = []
        self.running = 0
        self.peak = 0
        self.runs: dict[str, int] = {}

    async def __call__(self, step: Step, inputs: dict[str, StepResult]) -> StepResult:
        self.events.append(("start", step.id))
        self.runs[step.id] = self.runs.get(step.id, 0) + 1
        assert sorted(inputs) == sorted(step.depends_on)
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await anyio.sleep(self.delays.get(step.id, 0))
        finally:
            self.running -= 1
        self.events.append(("end", step.id))
        if step.id in self.fail:
            raise StepFailed(f"{step.id} broke")
        return StepResult(step.id, step.id)

    def index(self, kind: str, sid: str) -> int:
        return self.events.index((kind, sid))


async def test_steps_start_after_their_dependencies() -> None:
    rec = Recorder()
    plan = plan_of({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]})
    out = await run_dag(plan, rec)
    assert out.complete and sorted(out.results) == ["a", "b", "c", "d"]
    assert rec.index("start", "b") > rec.index("end", "a")
    assert rec.index("start", "d") > max(rec.index("end", "b"), rec.index("end", "c"))


async def test_no_level_barrier() -> None:
    """A step starts the moment its own dependencies finish, not when its level does."""
    rec = Recorder(delays={"slow": 0.3, "fast": 0.0, "after_fast": 0.0})
    plan = plan_of({"slow": [], "fast": [], "after_fast": ["fast"], "join": ["slow", "after_fast"]})
    await run_dag(plan, rec)
    assert rec.index("end", "after_fast") < rec.index("end", "slow")


async def test_per_plan_limit_is_respected() -> None:
    rec = Recorder(delays={k: 0.02 for k in "abcdefgh"})
    plan = plan_of({k: [] for k in "abcdefgh"})
    await run_dag(plan, rec, max_running=3)
    assert rec.peak == 3


async def test_steps_past_the_limit_wait_as_queue_entries_not_as_tasks() -> None:
    """A wide plan under a limit holds as many tasks as the limit, not one per step."""
    tasks_seen: list[int] = []
    before = len(anyio.get_running_tasks())

    async def step_run(step: Step, inputs: dict[str, StepResult]) -> StepResult:
        tasks_seen.append(len(anyio.get_running_tasks()) - before)
        await anyio.lowlevel.checkpoint()
        return StepResult(step.id, step.id)

    plan = plan_of({f"s{i}": [] for i in range(200)} | {"join": [f"s{i}" for i in range(200)]})
    out = await run_dag(plan, step_run, max_running=4)
    assert out.complete and len(tasks_seen) == 201
    assert max(tasks_seen) == 4  # the four steps' own tasks, never the 196 waiting ones


async def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_running must be at least 1, not 0"):
        await run_dag(plan_of({"a": []}), Recorder(), max_running=0)


async def test_failure_cancels_dependents_and_independent_branches_go_on() -> None:
    rec = Recorder(fail={"b"})
    plan = plan_of({"a": [], "b": ["a"], "c": ["b"], "d": ["c"], "e": ["a"]})
    out = await run_dag(plan, rec)
    assert set(out.failed) == {"b"}
    assert out.cancelled == {"c": "dependency 'b' failed", "d": "dependency 'b' failed"}
    assert set(out.results) == {"a", "e"}
    assert not out.complete and out.not_started == []


async def test_stop_on_failure_starts_nothing_new_but_lets_running_steps_finish() -> None:
    rec = Recorder(delays={"slow": 0.2}, fail={"bad"})
    plan = plan_of({"bad": [], "slow": [], "after_slow": ["slow"], "after_bad": ["bad"]})
    out = await run_dag(plan, rec, stop_on_failure=True)
    assert set(out.failed) == {"bad"}
    assert "slow" in out.results
    assert sorted(out.not_started) == ["after_bad", "after_slow"]


@pytest.mark.parametrize("max_running", [None, 2])
async def test_stop_on_failure_starts_no_step_whose_task_had_not_run_yet(
    max_running: int | None,
) -> None:
    """A step that fails before its sibling's task first runs (a budget refused at once,
    say) stops the sibling from starting at all, with a limit or without."""
    started: list[str] = []

    async def step_run(step: Step, inputs: dict[str, StepResult]) -> StepResult:
        started.append(step.id)
        if step.id == "bad":
            raise StepFailed("refused before any await")
        await anyio.lowlevel.checkpoint()
        return StepResult(step.id, step.id)

    plan = plan_of({"bad": [], "other": []})
    out = await run_dag(plan, step_run, max_running=max_running, stop_on_failure=True)
    assert started == ["bad"]
    assert set(out.failed) == {"bad"} and out.not_started == ["other"]


async def test_a_plan_can_go_on_after_stopping_on_a_failure() -> None:
    rec = Recorder(delays={"slow": 0.05}, fail={"bad"})
    plan = plan_of(
        {"bad": [], "slow": [], "after_slow": ["slow"], "after_bad": ["bad"], "last": ["after_bad"]}
    )
    first = await run_dag(plan, rec, stop_on_failure=True)
    rest = await run_dag(plan, rec, done=first.results, failed=first.failed)
    # the failed step does not run again; its dependents are cancelled, the others run
    assert rec.runs == {"bad": 1, "slow": 1, "after_slow": 1}
    assert set(rest.failed) == {"bad"} and set(rest.results) == {"slow", "after_slow"}
    assert rest.cancelled == {
        "after_bad": "dependency 'bad' failed",
        "last": "dependency 'bad' failed",
    }
    assert rest.not_started == []


async def test_a_failed_step_does_not_run_again_when_its_dependency_finishes() -> None:
    rec = Recorder()
    plan = plan_of({"a": [], "b": ["a"], "c": ["b"]})
    out = await run_dag(plan, rec, failed={"b": StepFailed("b broke before")}, max_running=2)
    assert rec.runs == {"a": 1}
    assert set(out.failed) == {"b"} and out.cancelled == {"c": "dependency 'b' failed"}
    assert out.not_started == []


async def test_done_steps_are_not_run_again() -> None:
    rec = Recorder()
    plan = plan_of({"a": [], "b": ["a"]})
    out = await run_dag(plan, rec, done={"a": StepResult("old", "old")})
    assert rec.runs == {"b": 1}
    assert out.results["a"].text == "old"


async def test_outer_cancellation_stops_every_step() -> None:
    rec = Recorder(delays={k: 10 for k in "abc"})
    plan = plan_of({"a": [], "b": [], "c": []})
    with anyio.move_on_after(0.1) as scope:
        await run_dag(plan, rec)
    assert scope.cancelled_caught
    assert rec.running == 0
    assert [e for e in rec.events if e[0] == "end"] == []


@st.composite
def random_dags(draw: st.DrawFn) -> tuple[dict[str, list[str]], int, int]:
    n = draw(st.integers(1, 30))
    deps: dict[str, list[str]] = {}
    for i in range(n):
        earlier = [f"s{j}" for j in range(i)]
        deps[f"s{i}"] = (
            draw(st.lists(st.sampled_from(earlier), unique=True, max_size=4)) if earlier else []
        )
    names = list(deps)
    random.Random(draw(st.integers(0, 1000))).shuffle(names)  # plan order need not be topological
    limit = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 10_000))
    return {k: deps[k] for k in names}, limit, seed


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(random_dags())
def test_random_dags_run_each_step_once_after_its_dependencies(
    case: tuple[dict[str, list[str]], int, int],
) -> None:
    deps, limit, seed = case
    rng = random.Random(seed)
    rec = Recorder(delays={k: rng.choice((0, 0, 0.001, 0.003)) for k in deps})

    async def main() -> None:
        await run_dag(plan_of(deps), rec, max_running=limit)

    anyio.run(main)
    assert rec.runs == {k: 1 for k in deps}
    for sid, ds in deps.items():
        for d in ds:
            assert rec.index("start", sid) > rec.index("end", d)
    assert rec.peak <= limit


async def test_slots_serve_waiters_in_order_and_forget_a_cancelled_waiter() -> None:
    slots = Slots(2)
    await slots.acquire()
    await slots.acquire()  # both slots held: everyone below waits
    order: list[str] = []
    scopes: list[anyio.CancelScope] = []

    async def waiter(name: str) -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await slots.acquire()
            order.append(name)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for name in ("first", "cancelled", "third"):
                tg.start_soon(waiter, name)
                await anyio.wait_all_tasks_blocked()
            scopes[1].cancel()
            await anyio.wait_all_tasks_blocked()
            slots.release()  # to "first"
            await anyio.wait_all_tasks_blocked()
            assert order == ["first"]
            slots.release()  # to "third": the cancelled waiter left the queue
    assert order == ["first", "third"]
    assert slots.free == 0  # "first" and "third" hold the two slots
    slots.release()
    slots.release()
    assert slots.free == 2


def test_the_leaf_overhead_profile_runs_at_a_small_size(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "profile_leaves.py"
    spec = importlib.util.spec_from_file_location("profile_leaves", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    figures = module.main(["--n", "100", "--repeats", "1"])
    [row] = figures["rows"]
    assert row["n"] == 100 and row["cpu_ratio"] > 0 and row["wall_ratio"] > 0
    assert "bare cpu" in capsys.readouterr().out


async def test_a_streamed_plan_starts_the_independent_steps_written_after_a_failure() -> None:
    """Step a fails before line b is written; b does not depend on a, so it runs, and c, which
    does, is cancelled. (No checkpoint lies between the event and the failure reaching the
    scheduler: the source reads on only once the failure is known.)"""
    failed = anyio.Event()
    ran: list[str] = []

    async def run_step(step: Step, inputs: dict[str, StepResult]) -> StepResult:
        ran.append(step.id)
        if step.id == "a":
            failed.set()
            raise StepFailed("a broke")
        return StepResult(step.id, step.id)

    async def written() -> AsyncIterator[Step]:
        yield Step(id="a", title="a", instruction="a")
        await failed.wait()
        yield Step(id="b", title="b", instruction="b")
        yield Step(id="c", title="c", instruction="c", depends_on=["a"])

    out = await run_streamed_dag(written(), run_step)
    assert ran == ["a", "b"]
    assert list(out.failed) == ["a"] and list(out.results) == ["b"]
    assert out.cancelled == {"c": "dependency 'a' failed"} and out.not_started == []
