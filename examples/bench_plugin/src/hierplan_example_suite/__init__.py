"""An example benchmark suite and strategy that a package adds to hierplan through entry points.

- ``hanoi``: Towers of Hanoi with 2 to 4 disks on pegs A, B and C. The tools ``move`` and
  ``look`` act on the run's own pegs; the verifier replays every move from the start (each one
  legal, then every disk on the target peg); the oracle solves the puzzle from any legal state,
  so that the offline simulator runs it.
- ``dag-once``: one DAG plan whose independent steps run in parallel, never replanned.

State reports look like ``<pegs 2: A 3 | B 2,1 | C ->`` (disks bottom to top, the counter
grows with every move).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from hierplan.agents.prompts import PlanPrompt, StepPrompt, one_line
from hierplan.bench.base import (
    ActionFailed,
    BenchTask,
    LoggedWorld,
    Suite,
    SuiteOracle,
    TaskEnv,
    call,
    chain,
    latest,
    plan_texts,
    step_texts,
    tool_step,
)
from hierplan.hierarchy.planning import PlanPolicy
from hierplan.hierarchy.strategies import PlanBased
from hierplan.models.base import ToolCall
from hierplan.plans.plan import Plan
from hierplan.scenarios.base import Verification
from hierplan.simulator.oracle import Action
from hierplan.tools.base import Tool, tool

PEGS = ("A", "B", "C")
Pegs = dict[str, list[int]]  # peg -> disks, bottom to top (a larger number is a larger disk)
Move = tuple[str, str]

_HEAD = "Towers of Hanoi:"
_STATE = re.compile(r"<pegs (\d+): ([^>]*)>")
_TARGET = re.compile(r"onto peg ([ABC])")


def describe(pegs: Pegs, counter: int) -> str:
    """``<pegs N: A 3,2,1 | B - | C ->``."""
    parts = [f"{p} {','.join(map(str, pegs[p])) or '-'}" for p in PEGS]
    return f"<pegs {counter}: {' | '.join(parts)}>"


def parse_pegs(body: str) -> Pegs:
    """The pegs of a state report's body."""
    pegs: Pegs = {}
    for part in body.split(" | "):
        peg, _, disks = part.partition(" ")
        pegs[peg] = [] if disks == "-" else [int(d) for d in disks.split(",")]
    return pegs


def apply(pegs: Pegs, move: Move) -> Pegs:
    """The pegs after ``move``; :class:`ActionFailed` says why it is not legal."""
    source, target = move
    if source not in PEGS or target not in PEGS or source == target:
        raise ActionFailed(f"cannot move from {source!r} to {target!r}: name two pegs of A, B, C")
    if not pegs[source]:
        raise ActionFailed(f"peg {source} is empty")
    disk = pegs[source][-1]
    if pegs[target] and pegs[target][-1] < disk:
        raise ActionFailed(f"disk {disk} cannot go on the smaller disk {pegs[target][-1]}")
    after = {p: list(d) for p, d in pegs.items()}
    after[target].append(after[source].pop())
    return after


def solve(pegs: Pegs, target: str) -> list[Move]:
    """Moves from any legal ``pegs`` that put every disk on ``target``."""
    where = {disk: peg for peg, disks in pegs.items() for disk in disks}
    moves: list[Move] = []

    def put(disk: int, dest: str) -> None:  # disks 1..disk onto dest
        if disk == 0:
            return
        source = where[disk]
        if source == dest:
            put(disk - 1, dest)
            return
        spare = next(p for p in PEGS if p not in (source, dest))
        put(disk - 1, spare)
        moves.append((source, dest))
        where[disk] = dest
        put(disk - 1, dest)

    put(len(where), target)
    return moves


def task_text(pegs: Pegs, target: str) -> str:
    """The task text a model gets."""
    disks = sum(len(d) for d in pegs.values())
    return (
        f"{_HEAD} move all {disks} disks onto peg {target}, one disk at a time, never a larger "
        "disk on a smaller one. move(source, target) moves the top disk of a peg; look() shows "
        f"the pegs (disks bottom to top). Start: {describe(pegs, 0)}. When every disk is on peg "
        f"{target}, answer with the final pegs."
    )


@dataclass(slots=True, frozen=True)
class Problem:
    """A puzzle read from prompt text: its start and its target peg."""

    start: Pegs
    target: str


def read(text: str) -> Problem | None:
    """The puzzle ``text`` states, else ``None``."""
    text = one_line(text)
    state, target = _STATE.search(text), _TARGET.search(text)
    if not text.startswith(_HEAD) or state is None or target is None:
        return None
    return Problem(parse_pegs(state.group(2)), target.group(1))


class HanoiOracle(SuiteOracle[Problem]):
    """What a competent model answers for a Towers of Hanoi prompt."""

    def read(self, text: str) -> Problem | None:
        """The puzzle ``text`` states."""
        return read(text)

    def plan_for(self, problem: Problem, prompt: PlanPrompt) -> Plan:
        """Every move from the latest reported pegs, in order."""
        seen = latest(_STATE, plan_texts(prompt))
        pegs = problem.start if seen is None else parse_pegs(seen.body)
        prefix = "m" if seen is None else f"s{seen.counter}_"
        moves = solve(pegs, problem.target) or [("look", "")]
        steps = [
            tool_step(f"{prefix}{i}", "Look at the pegs", "look", {})
            if source == "look"
            else tool_step(f"{prefix}{i}", f"Move {source} to {target}", "move",
                           {"source": source, "target": target})
            for i, (source, target) in enumerate(moves, 1)
        ]  # fmt: skip
        return Plan(goal=one_line(prompt.goal), steps=chain(steps), rationale="One disk at a time.")

    def act_for(
        self, problem: Problem, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]
    ) -> Action:
        """The next move, or the final pegs once every disk is on the target."""
        seen = latest(_STATE, step_texts(prompt, done))
        pegs = problem.start if seen is None else parse_pegs(seen.body)
        moves = solve(pegs, problem.target)
        if not moves:
            return Action(text=f"Done: {describe(pegs, 0 if seen is None else seen.counter)}")
        source, target = moves[0]
        return Action(tool_calls=(call("move", source=source, target=target),))


class HanoiWorld(LoggedWorld[Move]):
    """The pegs of one run."""

    def __init__(self, start: Pegs) -> None:
        super().__init__()
        self.pegs = {p: list(d) for p, d in start.items()}

    def state(self) -> str:
        """The current state report."""
        return describe(self.pegs, self.counter)

    def change(self, action: Move) -> None:
        """Make the move, if it is legal."""
        self.pegs = apply(self.pegs, action)

    def tools(self) -> list[Tool]:
        """``move`` and ``look`` on these pegs."""

        @tool
        async def move(source: str, target: str) -> str:
            """Move the top disk of peg ``source`` onto peg ``target``."""
            return self.act((source, target), f"moved {source} to {target}")

        @tool
        async def look() -> str:
            """Show the pegs (disks bottom to top)."""
            return self.state()

        return [move, look]


def verify(start: Pegs, target: str, moves: Sequence[Move]) -> Verification:
    """Replay ``moves`` from ``start``: each legal, then every disk on ``target``."""
    pegs = start
    for i, move in enumerate(moves, 1):
        try:
            pegs = apply(pegs, move)
        except ActionFailed as exc:
            return Verification(False, f"move {i} is illegal: {exc}")
    disks = sum(len(d) for d in start.values())
    if len(pegs[target]) != disks:
        return Verification(False, f"{len(pegs[target])} of {disks} disks on peg {target}")
    return Verification(True, f"every disk on peg {target} in {len(moves)} moves")


class Hanoi(Suite):
    """Towers of Hanoi, 2 to 4 disks: an example suite from outside hierplan."""

    name = "hanoi"
    description = "synthetic: Towers of Hanoi, 2-4 disks (an example package's suite)"

    def generate(self, count: int, seed: int = 0) -> list[BenchTask]:
        """``count`` puzzles: all disks on one peg, to move onto another."""
        rng = random.Random(f"hanoi:{seed}")
        tasks = []
        for index in range(count):
            disks = rng.randint(2, 4)
            source, target = rng.sample(PEGS, 2)
            start: Pegs = {p: [] for p in PEGS}
            start[source] = list(range(disks, 0, -1))
            params = {"disks": disks, "moves": 2**disks - 1}
            tasks.append(self.task(seed, index, task_text(start, target), params, (start, target)))
        return tasks

    def environment(self, task: BenchTask, *, latency_scale: float = 1.0) -> TaskEnv:
        """Fresh pegs; the verifier replays the moves that happened."""
        start, target = task.data
        world = HanoiWorld(start)
        return TaskEnv(
            goal=task.goal,
            tools=world.tools(),
            verify=lambda _answer: verify(start, target, world.log),
        )

    def oracle(self) -> HanoiOracle:
        """The Towers of Hanoi oracle."""
        return HanoiOracle()


class DagOnce(PlanBased):
    """One DAG plan, independent steps in parallel, never replanned."""

    name = "dag-once"
    policy = PlanPolicy(flat=True, replan_on_failure=False)
