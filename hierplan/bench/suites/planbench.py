"""PlanBench: its 501 Blocksworld plan-generation instances, in two settings.

The instances (``instance-1.pddl`` ... ``instance-501.pddl``, 4 or 5 blocks) and the 4-operator
domain come from PlanBench's repository, shipped with their MIT licence in
``hierplan/bench/data/planbench_blocksworld/`` (``SOURCE.md`` there names the commit). They are
read as PDDL (:mod:`hierplan.bench.suites.pddl`), and every run is checked by executing its
actions against the domain's preconditions and effects from the instance's initial state, then
the instance's goal: the check VAL makes.

- ``planbench``: interactive. The four actions are tools that report the blocks after each
  move, ``look`` shows them, and a strategy may replan after a failure.
- ``planbench_oneshot``: PlanBench's own setting, the one its published figures were measured
  in: the plan is written at once and runs as written, without looking at the blocks and
  without replanning. It runs under ``plan-execute`` with replans and retries off, its tools
  report nothing, and a run in which a model acted during execution (rather than the plan's
  steps running as written) is out of the setting and fails.

A task is named as PlanBench names it: by its file name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from hierplan.bench.base import (
    BenchTask,
    LoggedWorld,
    Published,
    Suite,
    TaskEnv,
    public_selection,
)
from hierplan.bench.suites import pddl
from hierplan.bench.suites.blocksworld import (
    TABLE,
    BlockAction,
    BlocksworldOracle,
    World,
    block_tools,
    root_goal,
)
from hierplan.records import RunResult
from hierplan.scenarios.base import Verification

SOURCE = (
    "PlanBench (Valmeekam et al., NeurIPS 2023 Datasets and Benchmarks), "
    "github.com/karthikv792/LLMs-Planning at b008bc4, plan-bench/instances/blocksworld/"
    "generated_basic; MIT licence"
)

# The tools' names and PDDL's.
OPERATORS: Mapping[str, str] = MappingProxyType(
    {"pick_up": "pick-up", "put_down": "put-down", "stack": "stack", "unstack": "unstack"}
)

ONESHOT_SETTING = "plan written at once, no tools to observe, no replanning (plan-execute)"

PUBLISHED: tuple[Published, ...] = tuple(
    Published(
        model=model,
        method="zero-shot plan generation",
        success=success,
        setting=(
            "one-shot: the plan written at once from the problem's description, no tools, "
            "no replanning; checked by VAL"
        ),
        tasks="the 501 Blocksworld instances",
        source="Valmeekam et al. 2024, LLMs Still Can't Plan; Can LRMs?",
        suite="planbench_oneshot",
    )
    for model, success in (("o1-preview", 0.974), ("claude-3.5-sonnet", 0.532), ("gpt-4o", 0.32))
)


def data_text(*parts: str) -> str:
    """The text of a file of the shipped PlanBench set."""
    path = resources.files("hierplan.bench").joinpath("data", "planbench_blocksworld", *parts)
    return path.read_text("utf-8")


@cache
def load_domain() -> pddl.Domain:
    """The 4-operator Blocksworld domain (``domain.pddl``)."""
    return pddl.parse_domain(data_text("domain.pddl"))


@dataclass(slots=True, frozen=True)
class Instance:
    """A PlanBench instance: its number, its file name and its problem."""

    number: int
    file: str
    problem: pddl.Problem


_FILE = re.compile(r"^instance-(\d+)\.pddl$")


@cache
def load_instances() -> tuple[Instance, ...]:
    """Every instance, by number (``instance-1.pddl`` first)."""
    data = resources.files("hierplan.bench").joinpath("data", "planbench_blocksworld")
    folder = data.joinpath("instances")
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match is not None:
            problem = pddl.parse_problem(entry.read_text("utf-8"))
            found.append(Instance(int(match.group(1)), entry.name, problem))
    return tuple(sorted(found, key=lambda i: i.number))


def world_of(state: frozenset[pddl.Atom]) -> World:
    """The towers and the hand a Blocksworld state's atoms describe."""
    below: dict[str, str] = {}
    hand = None
    for atom in state:
        if atom[0] == "on":
            below[atom[1]] = atom[2]
        elif atom[0] == "ontable":
            below[atom[1]] = TABLE
        elif atom[0] == "holding":
            hand = atom[1]
    return World.of(below, hand)


def goal_facts(problem: pddl.Problem) -> dict[str, str]:
    """The goal's "X is on Y" facts (PlanBench's goals have no other kind)."""
    other = [pddl.render(a) for a in problem.goal if a[0] != "on"]
    if other:
        raise ValueError(f"{problem.name}: goal atoms other than (on x y): {', '.join(other)}")
    return {a[1]: a[2] for a in problem.goal}


def to_pddl(action: BlockAction) -> pddl.GroundAction:
    """A tool's action as the domain's: ``("stack", "a", "b")`` is ``(stack a b)``."""
    return OPERATORS.get(action[0], action[0]), tuple(action[1:])


class PlanBenchWorld(LoggedWorld[BlockAction]):
    """The blocks of one run as PDDL atoms, changed by the domain's own effects."""

    def __init__(self, instance: Instance, *, report: bool = True) -> None:
        super().__init__(report=report)
        self.problem = instance.problem
        self.atoms = instance.problem.init

    def state(self) -> str:
        """The state report (towers bottom to top, and the hand)."""
        return world_of(self.atoms).describe(f"state {self.counter}")

    def change(self, action: BlockAction) -> None:
        """Apply ``action`` if its preconditions hold (:class:`ActionFailed` names one that
        does not)."""
        self.atoms = pddl.apply(load_domain(), self.problem.objects, self.atoms, to_pddl(action))

    def verify(self) -> Verification:
        """Replay every action that happened from the initial state, then check the goal."""
        plan = [to_pddl(a) for a in self.log]
        return pddl.validate_plan(load_domain(), self.problem, plan)


class PlanBench(Suite):
    """PlanBench's Blocksworld instances, interactive: tools that report, and replanning."""

    name = "planbench"
    description = (
        "public: PlanBench's 501 Blocksworld instances, interactive (tools report the blocks, "
        "replanning as the strategy does); PDDL validator"
    )
    source = SOURCE
    published = PUBLISHED

    def size(self) -> int:
        """The 501 instances."""
        return len(load_instances())

    def generate(self, count: int, seed: int = 0) -> list[BenchTask]:
        """The first ``count`` instances by number (seed 0), or a sample of them."""
        chosen = public_selection(load_instances(), count, seed, self.name)
        return [self._task(seed, index, inst) for index, inst in enumerate(chosen)]

    def _task(self, seed: int, index: int, instance: Instance) -> BenchTask:
        start = world_of(instance.problem.init)
        goal = goal_facts(instance.problem)
        params: dict[str, Any] = {
            "instance": instance.file,
            "blocks": len(instance.problem.objects),
            "goal_facts": len(goal),
        }
        text = self.goal_text(instance, start, goal)
        return self.task(seed, index, text, params, instance, name=instance.file)

    def goal_text(self, instance: Instance, start: World, goal: Mapping[str, str]) -> str:
        """The task text a model gets."""
        return root_goal(start, goal, source=f"PlanBench {instance.file.removesuffix('.pddl')}")

    def environment(self, task: BenchTask, *, latency_scale: float = 1.0) -> TaskEnv:
        """The blocks at the instance's initial state; the verifier replays the actions."""
        world = PlanBenchWorld(task.data)
        return TaskEnv(goal=task.goal, tools=block_tools(world), verify=lambda _a: world.verify())

    def oracle(self) -> BlocksworldOracle:
        """A Blocksworld planner (blocks out of place go to the table, then each to its
        place): it solves every instance."""
        return BlocksworldOracle()


ONESHOT_CLOSING = (
    "PlanBench's setting: write the whole plan at once, each step one action (pick_up, "
    "unstack, put_down or stack with its blocks). It runs as written, without looking at the "
    "blocks and without replanning, and is checked action by action."
)


def acted_during_execution(result: RunResult) -> str | None:
    """Why a run left PlanBench's setting: a model acted while the plan ran (a step that was
    not one action); ``None`` when the plan's steps ran as written."""
    for node in result.nodes():
        if any(call.phase == "execution" for call in node.calls):
            return (
                "out of PlanBench's setting: a model acted during execution (a plan step was not "
                "one action), where the plan must be written at once and run as written"
            )
    return None


class PlanBenchOneShot(PlanBench):
    """PlanBench's own setting: the plan written at once, run blind, never replanned."""

    name = "planbench_oneshot"
    description = (
        "public: PlanBench's 501 Blocksworld instances in PlanBench's setting (plan written "
        "at once, no tools to observe, no replanning; plan-execute only); PDDL validator"
    )
    setting = ONESHOT_SETTING
    fixed_strategy = "plan-execute"
    fixed_settings = MappingProxyType(
        {"max_replans": 0, "max_retries": 0, "redecide_tool_calls": False}
    )

    def goal_text(self, instance: Instance, start: World, goal: Mapping[str, str]) -> str:
        """The task text a model gets: the problem, and the setting."""
        source = f"PlanBench {instance.file.removesuffix('.pddl')}"
        return root_goal(start, goal, source=source, closing=ONESHOT_CLOSING)

    def environment(self, task: BenchTask, *, latency_scale: float = 1.0) -> TaskEnv:
        """The four actions only, reporting nothing; the plan's actions are replayed."""
        world = PlanBenchWorld(task.data, report=False)
        return TaskEnv(
            goal=task.goal,
            tools=block_tools(world, observe=False),
            verify=lambda _a: world.verify(),
            check_run=acted_during_execution,
        )
