"""What a benchmark suite is: generated tasks, per-task tools and a verifier, and an oracle.

A :class:`Suite` generates :class:`BenchTask` objects deterministically from a seed. For each
run, :meth:`Suite.environment` builds a fresh :class:`TaskEnv`: the goal text, tools acting on
that run's own state, and a verifier that checks the outcome against ground truth (the world
state, or the gold answer), never against what the agent says it did.

A suite's oracle (one per suite, knowing no task) reads the same prompt text a real model gets
and answers what a competent model would: hierarchical plans when sub-goals are allowed and
the work is large, flat plans otherwise, executor actions, and repairs on replans. The current
state of the world comes from the prompt too: every tool reports the state it leaves, tagged
with a counter, and the oracle believes the most recent report it can read.
"""

from __future__ import annotations

import random
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Generic, TypeVar

from hierplan.agents.prompts import PlanPrompt, StepPrompt
from hierplan.errors import ToolError
from hierplan.models.base import ToolCall
from hierplan.plans.plan import Plan, Step
from hierplan.records import RunResult
from hierplan.scenarios.base import Verification
from hierplan.simulator.oracle import Action, Oracle
from hierplan.tools.base import Tool

# A competent planner splits work longer than this into sub-goals when sub-goals are allowed.
MAX_FLAT_STEPS = 8

# A task's id is ``<suite>-<task seed>-<index>`` (``game24-0-3``): a goals file of
# ``hierplan batch`` names a task by it, so a benchmark makes no task it could not name.
MAX_TASK_SEED = 999_999_999
MAX_TASK_INDEX = 9_999


class ActionFailed(ToolError):
    """An action whose preconditions do not hold; trying it again unchanged cannot help."""

    retryable = False


@dataclass(slots=True, frozen=True)
class BenchTask:
    """One generated task: its goal text, parameters, and the suite's own instance data.

    ``critical_path_s`` is the least wall time its tools need with unlimited parallelism
    (from the gold DAG), when the suite's tools take time; ``None`` otherwise. ``name`` is
    the task's name in the public set it comes from (a PlanBench instance's file name, a
    Game of 24 puzzle's rank and numbers); ``None`` for a generated task.
    """

    suite: str
    index: int
    task_id: str
    goal: str
    params: dict[str, Any]
    data: Any = field(repr=False, compare=False)
    critical_path_s: float | None = None
    name: str | None = None

    @property
    def display_name(self) -> str:
        """The public name, else the id."""
        return self.name or self.task_id


@dataclass(slots=True)
class TaskEnv:
    """A task set up for one run: its goal, tools on fresh state, and its verifier.

    ``verify`` takes the run's final answer (suites that check the world ignore it).
    ``check_run``, when given, reads the finished run's record and names why the run left the
    suite's setting (e.g. a model called a tool where the setting allows only a plan written
    at once), or returns ``None``; a run out of its setting fails whatever the world holds.
    """

    goal: str
    tools: list[Tool]
    verify: Callable[[str], Verification]
    check_run: Callable[[RunResult], str | None] | None = None


@dataclass(slots=True, frozen=True)
class Published:
    """A published figure measured on a public task set, and the setting it was measured in.

    ``success`` is a share (0.74 for 74%); ``setting`` says how the model was run (prompting,
    tools, replanning); ``tasks`` which tasks it was measured on, ``split`` the split they
    make (``None``: the whole set); ``suite`` names the suite that runs in the same setting,
    ``None`` when no suite does (the figure is shown for its tasks only).
    """

    model: str
    method: str
    success: float
    setting: str
    tasks: str
    source: str
    suite: str | None = None
    split: str | None = None


class Suite(ABC):
    """A named family of verifiable tasks: generated, or read from a public task set.

    A suite from outside the package registers under the ``hierplan.suites`` entry point
    group, naming its :class:`Suite` subclass (see ``hierplan bench --list``).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    source: ClassVar[str | None] = None
    """For a public task set: where it comes from, its licence and its paper."""
    splits: ClassVar[tuple[str, ...]] = ()
    """The splits of a public set (the first is the default); ``()`` when it has none."""
    published: ClassVar[tuple[Published, ...]] = ()
    """Published figures measured on its tasks."""
    setting: ClassVar[str] = "interactive: tools, and replanning as the strategy does"
    """How its runs are made, to compare with the published figures' settings."""
    fixed_strategy: ClassVar[str | None] = None
    """A suite that is a fixed setting (PlanBench's own) runs under this strategy only."""
    fixed_settings: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    """Run settings the suite's setting fixes (they win over ``--set``)."""

    @property
    def split(self) -> str | None:
        """The split the tasks come from (``None`` for a suite without splits)."""
        return None

    def with_split(self, split: str) -> Suite:
        """This suite on ``split``; a suite without splits has only its whole set."""
        raise ValueError(f"{self.name} has no splits")

    def size(self) -> int | None:
        """How many tasks there are (in the split), ``None`` for a generated suite."""
        return None

    @abstractmethod
    def generate(self, count: int, seed: int = 0) -> list[BenchTask]:
        """``count`` tasks, the same for the same ``seed``."""

    @abstractmethod
    def environment(self, task: BenchTask, *, latency_scale: float = 1.0) -> TaskEnv:
        """Fresh state, tools and verifier for one run of ``task``."""

    @abstractmethod
    def oracle(self) -> Oracle:
        """The simulator's oracle for this suite (it reads prompts; it knows no task)."""

    def task(
        self,
        seed: int,
        index: int,
        goal: str,
        params: dict[str, Any],
        data: Any,
        critical_path_s: float | None = None,
        *,
        name: str | None = None,
    ) -> BenchTask:
        """The ``index``-th task generated from ``seed``, with its id ``<suite>-<seed>-<index>``
        (``name``: its name in the public set it comes from)."""
        return BenchTask(
            suite=self.name,
            index=index,
            task_id=f"{self.name}-{seed}-{index}",
            goal=goal,
            params=params,
            data=data,
            critical_path_s=critical_path_s,
            name=name,
        )


ItemT = TypeVar("ItemT")


def public_selection(items: Sequence[ItemT], count: int, seed: int, key: str) -> list[ItemT]:
    """``count`` items of a public set (at most all of them): in the set's own order with seed
    0, so that the first tasks are the set's first; a random sample without replacement,
    drawn from ``key`` and ``seed``, with any other seed."""
    chosen = list(items)
    if seed:
        random.Random(f"{key}:{seed}").shuffle(chosen)
    return chosen[: max(0, count)]


ActionT = TypeVar("ActionT")


class LoggedWorld(ABC, Generic[ActionT]):
    """The world of one run, changed by tools one action at a time.

    ``counter`` numbers the state reports (it grows with every action that changes the world);
    ``log`` holds the actions that happened, for a verifier to replay from the start.
    """

    def __init__(self, *, report: bool = True) -> None:
        self.counter = 0
        self.log: list[ActionT] = []
        self.report = report

    @abstractmethod
    def state(self) -> str:
        """The current state report."""

    @abstractmethod
    def change(self, action: ActionT) -> None:
        """Apply ``action`` to the world, or raise :class:`ActionFailed` leaving it as it was."""

    def act(self, action: ActionT, done: str) -> str:
        """Apply ``action``; the result (or the error) reports the state, unless the world
        was made not to report it (a plan that runs blind)."""
        try:
            self.change(action)
        except ActionFailed as exc:
            if not self.report:
                raise
            raise ActionFailed(f"{exc}. Now: {self.state()}") from None
        self.counter += 1
        self.log.append(action)
        return f"{done}. Now: {self.state()}" if self.report else done


ProblemT = TypeVar("ProblemT")


class SuiteOracle(ABC, Generic[ProblemT]):
    """An oracle that answers only prompts whose text states a problem of its suite.

    :meth:`read` finds the problem in a planner's goal or an executor's instruction; any other
    prompt gets ``None``, so that the simulator says no oracle covers it rather than guess.
    """

    @abstractmethod
    def read(self, text: str) -> ProblemT | None:
        """The problem ``text`` states, or ``None`` when it is not one of this suite's."""

    @abstractmethod
    def plan_for(self, problem: ProblemT, prompt: PlanPrompt) -> Plan:
        """The plan a competent model writes for ``problem``."""

    @abstractmethod
    def act_for(
        self, problem: ProblemT, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]
    ) -> Action:
        """The next action a competent executor takes on ``problem``."""

    def plan(self, prompt: PlanPrompt) -> Plan | None:
        """The plan for a planning (or replanning) prompt, or ``None`` if not this suite's."""
        problem = self.read(prompt.goal)
        return None if problem is None else self.plan_for(problem, prompt)

    def act(self, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]) -> Action | None:
        """The next action for a step, or ``None`` if the step is not this suite's."""
        problem = self.read(prompt.instruction)
        return None if problem is None else self.act_for(problem, prompt, done)


@dataclass(slots=True, frozen=True)
class Observation:
    """A state report found in prompt text: its counter and its body."""

    counter: int
    body: str


def latest(pattern: re.Pattern[str], texts: Iterable[str]) -> Observation | None:
    """The report with the highest counter among ``texts`` (``pattern``: counter, body)."""
    best: Observation | None = None
    for text in texts:
        for match in pattern.finditer(text):
            found = Observation(int(match.group(1)), match.group(2))
            if best is None or found.counter > best.counter:
                best = found
    return best


def plan_texts(prompt: PlanPrompt) -> list[str]:
    """The texts of a planning prompt that may report the state: inputs, progress, failure."""
    texts = [*prompt.inputs.values(), *prompt.progress.values()]
    if prompt.failure:
        texts.append(prompt.failure)
    return texts


def step_texts(prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]) -> list[str]:
    """The texts of an executor prompt that may report the state: inputs and tool results."""
    return [*prompt.inputs.values(), *(text for _, text in done)]


def chain(steps: Sequence[Step]) -> list[Step]:
    """``steps`` made sequential: each depends on the one before (for one-hand worlds)."""
    out: list[Step] = []
    for i, s in enumerate(steps):
        deps = [] if i == 0 else [steps[i - 1].id]
        out.append(s.model_copy(update={"depends_on": deps}))
    return out


def tool_step(
    step_id: str,
    instruction: str,
    tool: str,
    args: dict[str, Any],
    *,
    title: str | None = None,
    depends_on: Iterable[str] = (),
) -> Step:
    """A task step that calls ``tool`` with ``args``; its title is the instruction unless given."""
    return Step(
        id=step_id,
        title=title or instruction,
        instruction=instruction,
        tool=tool,
        args=args,
        depends_on=list(depends_on),
    )


def subgoal_step(step_id: str, title: str, instruction: str) -> Step:
    """A sub-goal step: ``instruction`` goes to a sub-planner."""
    return Step(id=step_id, title=title, instruction=instruction, kind="subgoal")


def slug(text: str) -> str:
    """``text`` as a step-id fragment: lowercase letters, digits and underscores."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:40] or "x"


def call(name: str, **arguments: Any) -> ToolCall:
    """A tool call for an oracle action, with a fresh random id.

    The simulator numbers ids again per transcript; unique ids matter when the oracle answers
    over a provider's wire format, where tool results are matched to calls by id.
    """
    return ToolCall(f"call_{uuid.uuid4().hex[:16]}", name, arguments)
