"""The taxonomy of planning commitment, each strategy a small class on one skeleton.

=============  ==================================================================
``react``      no plan: one agent loop over the goal with every tool (the baseline)
``plan-execute`` plan once (flat), execute the steps one at a time, never replan
``replan``     flat plan, one step at a time, replan after every step and failure
``dag``        one flat DAG plan (LLMCompiler-style), steps in parallel, replan on failure
``hierarchical`` sub-goals to sub-planners down to ``max_depth``, parallel, replan on failure
``as-needed``  ADaPT-style: attempt directly; decompose only what fails, recursively
=============  ==================================================================

All of them use the same planner, gate, scheduler, executors and instruments, so that a
comparison between them measures the strategy and nothing else.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

from hierplan.core.results import StepResult
from hierplan.core.settings import STRATEGY_NAMES, registered_strategies, strategy_names
from hierplan.errors import UserInputError
from hierplan.hierarchy.context import NodeContext
from hierplan.hierarchy.leaf import run_task_node
from hierplan.hierarchy.nodes import run_as_needed_node, run_planner_node
from hierplan.hierarchy.planning import PlanPolicy
from hierplan.plans.plan import Step
from hierplan.records import NodeKind


def goal_step(goal: str) -> Step:
    """The pseudo-step that stands for a whole goal (ReAct and as-needed roots)."""
    return Step(id="goal", title="goal", instruction=goal)  # run() bounds its length


class Strategy(ABC):
    """A way to run the root node. ``root_kind`` is the kind of the root's record."""

    name: ClassVar[str]
    root_kind: ClassVar[NodeKind] = "planner"

    @abstractmethod
    async def run(self, root: NodeContext) -> StepResult:
        """Run the root node to the end; raise :class:`StepFailed` if it does not succeed."""


class React(Strategy):
    """No plan: one tool-calling loop over the goal."""

    name = "react"
    root_kind = "executor"

    async def run(self, root: NodeContext) -> StepResult:
        return await run_task_node(root, goal_step(root.record.goal), {}, react=True, max_retries=0)


class PlanBased(Strategy):
    """A strategy defined by its :class:`PlanPolicy`."""

    policy: ClassVar[PlanPolicy]

    async def run(self, root: NodeContext) -> StepResult:
        return await run_planner_node(root, self.policy, {})


class PlanExecute(PlanBased):
    """Plan once, execute all, in order."""

    name = "plan-execute"
    policy = PlanPolicy(flat=True, sequential=True, replan_on_failure=False)


class Replan(PlanBased):
    """Interleaved: replan after every step and every failure."""

    name = "replan"
    policy = PlanPolicy(flat=True, sequential=True, replan_each_step=True)


class Dag(PlanBased):
    """One DAG plan, parallel steps, replan on failure."""

    name = "dag"
    policy = PlanPolicy(flat=True)


class Hierarchical(PlanBased):
    """Recursive decomposition into sub-goals down to ``max_depth``."""

    name = "hierarchical"
    policy = PlanPolicy()


class AsNeeded(Strategy):
    """Try first; decompose only what fails (ADaPT)."""

    name = "as-needed"
    policy: ClassVar[PlanPolicy] = PlanPolicy(as_needed=True)

    async def run(self, root: NodeContext) -> StepResult:
        # The root is plan level 1, which every max_depth allows: it may always decompose.
        return await run_as_needed_node(root, goal_step(root.record.goal), {}, self.policy)


STRATEGIES: Mapping[str, type[Strategy]] = {
    cls.name: cls for cls in (React, PlanExecute, Replan, Dag, Hierarchical, AsNeeded)
}
STRATEGIES = MappingProxyType(STRATEGIES)  # read-only: shared by every run
assert tuple(STRATEGIES) == STRATEGY_NAMES


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``: a built-in one, or one an installed package registers
    under the ``hierplan.strategies`` entry point group; a clear error lists the known ones."""
    if name in STRATEGIES:
        return STRATEGIES[name]()
    ep = registered_strategies().get(name)
    if ep is None:
        raise UserInputError(
            f"unknown strategy {name!r}: choose one of {', '.join(strategy_names())}"
        )
    try:
        loaded = ep.load()
    except Exception as exc:  # a broken package: say which, not a traceback
        raise UserInputError(f"cannot load strategy {name!r} ({ep.value}): {exc}") from None
    if not (isinstance(loaded, type) and issubclass(loaded, Strategy)) or loaded.name != name:
        raise UserInputError(
            f"strategy {name!r} ({ep.value}) is not a Strategy subclass whose name is {name!r}"
        )
    return loaded()
