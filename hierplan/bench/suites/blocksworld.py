"""Blocksworld: synthetic PlanBench-style block stacking with 3 to 7 blocks (generated tasks;
``planbench`` has PlanBench's own instances).

One hand moves one clear block at a time with four actions (the PDDL ``blocksworld-4ops``
domain): ``pick_up`` a clear block from the table, ``unstack`` a clear block from another,
``put_down`` the held block on the table, ``stack`` it on a clear block. The goal, as in
PlanBench, is a set of "X is on Y" facts. :func:`validate_actions` is the plan validator: it
replays a sequence of actions from the start, checks every precondition, then the goal.

State reports look like ``<state 3: towers red,blue | yellow; hand empty>`` (towers bottom to
top, the counter grows with every action that changes the world).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hierplan.agents.prompts import PlanPrompt, StepPrompt, one_line
from hierplan.bench.base import (
    MAX_FLAT_STEPS,
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
    subgoal_step,
    tool_step,
)
from hierplan.models.base import ToolCall
from hierplan.plans.plan import Plan, Step
from hierplan.scenarios.base import Verification
from hierplan.simulator.oracle import Action
from hierplan.tools.base import Tool, tool

BLOCKS = ("red", "blue", "orange", "yellow", "white", "magenta", "black", "cyan")
TABLE = "table"
MOVES_PER_SUBGOAL = 3

BlockAction = tuple[str, ...]  # ("pick_up", x) | ("put_down", x) | ("stack", x, y) | ...


@dataclass(slots=True, frozen=True)
class World:
    """Where every block is (``below``: block -> block or ``table``) and what the hand holds."""

    below: tuple[tuple[str, str], ...]
    hand: str | None = None

    @classmethod
    def of(cls, below: Mapping[str, str], hand: str | None = None) -> World:
        """A world from a mapping (order does not matter)."""
        return cls(tuple(sorted(below.items())), hand)

    @classmethod
    def from_towers(cls, towers: Sequence[Sequence[str]], hand: str | None = None) -> World:
        """A world from towers listed bottom to top."""
        below: dict[str, str] = {}
        for tower in towers:
            for i, block in enumerate(tower):
                below[block] = TABLE if i == 0 else tower[i - 1]
        return cls.of(below, hand)

    def mapping(self) -> dict[str, str]:
        """``below`` as a dict."""
        return dict(self.below)

    def towers(self) -> list[list[str]]:
        """Towers bottom to top, ordered by their bottom block."""
        below = self.mapping()
        above = {v: k for k, v in below.items() if v != TABLE}
        out = []
        for base in sorted(b for b, v in below.items() if v == TABLE):
            tower = [base]
            while tower[-1] in above:
                tower.append(above[tower[-1]])
            out.append(tower)
        return out

    def clear(self, block: str) -> bool:
        """Whether nothing is on ``block`` (a held block is not clear)."""
        return block != self.hand and all(v != block for _, v in self.below)

    def describe(self, label: str) -> str:
        """``<label: towers a,b | c; hand empty>``."""
        towers = " | ".join(",".join(t) for t in self.towers()) or "none"
        return f"<{label}: towers {towers}; hand {self.hand or 'empty'}>"


_STATE = re.compile(r"<state (\d+): (towers [^;>]*; hand [a-z]+)>")
_EXPECTED = re.compile(r"<expected: (towers [^;>]*; hand [a-z]+)>")
_TARGET = re.compile(r"<target: towers ([^>]*)>")
_BODY = re.compile(r"towers ([^;]*); hand ([a-z]+)")
_FACT = re.compile(r"the ([a-z]+) block is on the ([a-z]+) block")
# A root goal starts "Blocksworld problem." or names where it comes from, e.g.
# "Blocksworld problem (PlanBench instance-17).": one oracle reads both.
_ROOT = re.compile(r"^Blocksworld problem(?: \([^)]*\))?\.")
_SUB = "Blocksworld sub-goal:"


def parse_world(body: str) -> World:
    """The world in the body of a state report (``towers ...; hand ...``)."""
    match = _BODY.search(body)
    if match is None:
        raise ValueError(f"not a blocksworld state: {body!r}")
    towers = [t.split(",") for t in match.group(1).split(" | ") if t and t != "none"]
    hand = None if match.group(2) == "empty" else match.group(2)
    return World.from_towers(towers, hand)


def apply(world: World, action: BlockAction) -> World:
    """The world after ``action``; :class:`ActionFailed` says which precondition fails."""
    below = world.mapping()
    name, block = action[0], action[1]
    known = set(below) | ({world.hand} if world.hand else set())
    for b in action[1:]:
        if b not in known:
            raise ActionFailed(f"there is no {b!r} block (blocks: {', '.join(sorted(known))})")
    if name in ("pick_up", "unstack"):
        if world.hand is not None:
            raise ActionFailed(f"cannot {name} {block}: the hand already holds {world.hand}")
        if not world.clear(block):
            raise ActionFailed(f"cannot {name} {block}: it is not clear")
        if name == "pick_up" and below[block] != TABLE:
            raise ActionFailed(f"cannot pick up {block}: it is on {below[block]}, use unstack")
        if name == "unstack" and below[block] != action[2]:
            raise ActionFailed(f"cannot unstack {block} from {action[2]}: it is on {below[block]}")
        del below[block]
        return World.of(below, block)
    if world.hand != block:
        raise ActionFailed(f"cannot {name} {block}: the hand holds {world.hand or 'nothing'}")
    if name == "put_down":
        below[block] = TABLE
        return World.of(below)
    target = action[2]
    if target == block or not world.clear(target):
        raise ActionFailed(f"cannot stack {block} on {target}: {target} is not clear")
    below[block] = target
    return World.of(below)


def goal_holds(world: World, goal: Mapping[str, str]) -> bool:
    """Whether every "X is on Y" fact of ``goal`` holds."""
    below = world.mapping()
    return all(below.get(x) == y for x, y in goal.items())


def validate_actions(
    start: World, goal: Mapping[str, str], actions: Sequence[BlockAction]
) -> Verification:
    """Replay ``actions`` from ``start``: every precondition, then the goal facts."""
    world = start
    for i, action in enumerate(actions, 1):
        try:
            world = apply(world, action)
        except ActionFailed as exc:
            return Verification(False, f"action {i} {' '.join(action)} is invalid: {exc}")
    if not goal_holds(world, goal):
        missing = [f"{x} on {y}" for x, y in goal.items() if world.mapping().get(x) != y]
        return Verification(
            False, f"goal not reached after {len(actions)} actions; missing: {', '.join(missing)}"
        )
    return Verification(True, f"goal reached in {len(actions)} valid actions")


def full_target(world: World, goal: Mapping[str, str]) -> dict[str, str]:
    """The arrangement the oracle aims for: the goal facts, every other block on the table."""
    blocks = [b for b, _ in world.below] + ([world.hand] if world.hand else [])
    return {b: goal.get(b, TABLE) for b in blocks}


def solve(world: World, target: Mapping[str, str]) -> list[BlockAction]:
    """Actions from ``world`` to the full arrangement ``target`` (the classic GN1 strategy).

    Move a block straight to its final place when it can go there; otherwise put a misplaced
    clear block on the table. At most two moves per block.
    """
    actions: list[BlockAction] = []
    below = world.mapping()
    hand = world.hand

    def final(b: str) -> bool:
        while True:
            if below.get(b) != target[b]:
                return False
            if target[b] == TABLE:
                return True
            b = target[b]

    def clear(b: str) -> bool:
        return b != hand and all(v != b for v in below.values())

    def place(b: str) -> None:
        dest = target[b]
        if dest == TABLE or not (clear(dest) and final(dest)):
            dest = TABLE
        actions.append(("put_down", b) if dest == TABLE else ("stack", b, dest))
        below[b] = dest

    if hand is not None:
        held, hand = hand, None
        place(held)
    while not all(final(b) for b in below):
        movable = [b for b in sorted(below) if clear(b) and not final(b)]
        ready = [
            b for b in movable if target[b] == TABLE or (clear(target[b]) and final(target[b]))
        ]
        pick = ready[0] if ready else next(b for b in movable if below[b] != TABLE)
        origin = below.pop(pick)
        actions.append(("pick_up", pick) if origin == TABLE else ("unstack", pick, origin))
        if ready:
            place(pick)
        else:
            actions.append(("put_down", pick))
            below[pick] = TABLE
    return actions


def action_text(action: BlockAction) -> str:
    """An action in words, e.g. ``Unstack blue from red``."""
    name, block = action[0], action[1]
    if name == "pick_up":
        return f"Pick up {block} from the table"
    if name == "put_down":
        return f"Put {block} down on the table"
    if name == "stack":
        return f"Stack {block} on {action[2]}"
    return f"Unstack {block} from {action[2]}"


def action_args(action: BlockAction) -> dict[str, str]:
    """The tool arguments of an action."""
    if action[0] == "stack":
        return {"block": action[1], "onto": action[2]}
    if action[0] == "unstack":
        return {"block": action[1], "from_block": action[2]}
    return {"block": action[1]}


@dataclass(slots=True)
class Problem:
    """A (sub-)goal read from prompt text: where it starts, and the facts to reach."""

    start: World
    observed: bool
    goal: dict[str, str]
    root: bool


ROOT_CLOSING = "When the goal holds, answer with the final state."


def root_goal(
    start: World,
    goal: Mapping[str, str],
    *,
    source: str | None = None,
    closing: str = ROOT_CLOSING,
) -> str:
    """The task text a model gets (``source``: where the problem comes from, if public)."""
    blocks = sorted(b for b, _ in start.below)
    facts = ", and ".join(f"the {x} block is on the {y} block" for x, y in goal.items())
    head = "Blocksworld problem" + (f" ({source})" if source else "") + "."
    return (
        f"{head} Blocks: {', '.join(blocks)}. One hand moves one block at a time: pick_up takes "
        "a clear block from the table, unstack takes a clear block off another block, put_down "
        "puts the held block on the table, stack puts it on a clear block. Towers are listed "
        f"bottom to top. Start: {start.describe('state 0')}. Goal: {facts}. {closing}"
    )


def subgoal_text(start: World, target: World) -> str:
    """The text of a sub-goal: reach the full arrangement ``target``."""
    towers = " | ".join(",".join(t) for t in target.towers())
    return (
        f"{_SUB} starting from {start.describe('expected')}, rearrange the blocks into "
        f"<target: towers {towers}> (towers bottom to top; tools pick_up, put_down, stack, "
        "unstack), then answer with the final state."
    )


def parse_problem(text: str) -> Problem | None:
    """The problem stated by a root goal or a sub-goal text, else ``None``."""
    text = one_line(text)
    if _ROOT.match(text):
        state = _STATE.search(text)
        goal_part = text.split(" Goal: ", 1)[-1].split(". ", 1)[0]
        if state is None:
            return None
        goal = {x: y for x, y in _FACT.findall(goal_part)}
        return Problem(parse_world(state.group(2)), True, goal, True)
    if text.startswith(_SUB):
        expected, target = _EXPECTED.search(text), _TARGET.search(text)
        if expected is None or target is None:
            return None
        towers = [t.split(",") for t in target.group(1).split(" | ") if t]
        goal = World.from_towers(towers).mapping()
        return Problem(parse_world(expected.group(1)), False, goal, False)
    return None


class BlocksworldOracle(SuiteOracle[Problem]):
    """What a competent model answers for blocksworld prompts."""

    def read(self, text: str) -> Problem | None:
        """The blocksworld problem or sub-goal ``text`` states."""
        return parse_problem(text)

    def plan_for(self, problem: Problem, prompt: PlanPrompt) -> Plan:
        """Actions from the latest reported state; sub-goals of a few moves when allowed."""
        seen = latest(_STATE, plan_texts(prompt))
        world = problem.start if seen is None else parse_world(seen.body)
        prefix = "p" if seen is None else f"s{seen.counter}_"
        actions = solve(world, full_target(world, problem.goal))
        goal = one_line(prompt.goal)
        if not actions:
            look = tool_step(f"{prefix}look", "Look at the blocks", "look", {}, title="Look")
            return Plan(goal=goal, steps=[look], rationale="The goal already holds.")
        if prompt.allow_subgoals and len(actions) > MAX_FLAT_STEPS:
            return Plan(
                goal=goal,
                steps=_subgoals(world, actions, prefix),
                rationale="A few moves per sub-goal, in order.",
            )
        steps = [
            tool_step(f"{prefix}{i}", action_text(a), a[0], action_args(a))
            for i, a in enumerate(actions, 1)
        ]
        return Plan(goal=goal, steps=chain(steps), rationale="One hand: strictly in order.")

    def act_for(
        self, problem: Problem, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]
    ) -> Action:
        """The next action toward the (sub-)goal, or the final state once it holds."""
        seen = latest(_STATE, step_texts(prompt, done))
        if seen is None and not problem.observed:
            return Action(tool_calls=(call("look"),))
        world = problem.start if seen is None else parse_world(seen.body)
        actions = solve(world, full_target(world, problem.goal))
        if not actions:
            label = "state 0" if seen is None else f"state {seen.counter}"
            return Action(text=f"The goal holds: {world.describe(label)}")
        first = actions[0]
        return Action(tool_calls=(call(first[0], **action_args(first)),))


def _subgoals(world: World, actions: Sequence[BlockAction], prefix: str) -> list[Step]:
    moves: list[list[BlockAction]] = [[]]
    for a in actions:
        moves[-1].append(a)
        if a[0] in ("put_down", "stack"):
            moves.append([])
    moves = [m for m in moves if m]
    steps = []
    for i in range(0, len(moves), MOVES_PER_SUBGOAL):
        chunk = [a for m in moves[i : i + MOVES_PER_SUBGOAL] for a in m]
        after = world
        for a in chunk:
            after = apply(after, a)
        text = subgoal_text(world, after)
        number = i // MOVES_PER_SUBGOAL + 1
        steps.append(subgoal_step(f"{prefix}part{number}", f"Moves, part {number}", text))
        world = after
    return chain(steps)


class BlocksEnv(LoggedWorld[BlockAction]):
    """The blocks of one run: the world, a counter, and the log of actions that happened."""

    def __init__(self, start: World) -> None:
        super().__init__()
        self.world = start

    def state(self) -> str:
        """The current state report."""
        return self.world.describe(f"state {self.counter}")

    def change(self, action: BlockAction) -> None:
        """Apply ``action`` to the world (:class:`ActionFailed` if a precondition fails)."""
        self.world = apply(self.world, action)

    def tools(self) -> list[Tool]:
        """The four actions and ``look``, acting on this world."""
        return block_tools(self)


def block_tools(world: LoggedWorld[BlockAction], *, observe: bool = True) -> list[Tool]:
    """The four actions (and ``look`` unless the world is not to be observed) on ``world``."""

    @tool
    async def pick_up(block: str) -> str:
        """Pick up a clear block from the table (the hand must be empty)."""
        return world.act(("pick_up", block), f"picked up {block}")

    @tool
    async def unstack(block: str, from_block: str) -> str:
        """Take a clear block off the block it is on (the hand must be empty)."""
        return world.act(("unstack", block, from_block), f"unstacked {block}")

    @tool
    async def put_down(block: str) -> str:
        """Put the held block down on the table."""
        return world.act(("put_down", block), f"put down {block}")

    @tool
    async def stack(block: str, onto: str) -> str:
        """Put the held block on top of a clear block."""
        return world.act(("stack", block, onto), f"stacked {block} on {onto}")

    @tool
    async def look() -> str:
        """Describe the towers (bottom to top) and what the hand holds."""
        return world.state()

    actions: list[Tool] = [pick_up, unstack, put_down, stack]
    return [*actions, look] if observe else actions


@dataclass(slots=True, frozen=True)
class BlocksInstance:
    """A generated problem: start world and goal facts."""

    start: World
    goal: dict[str, str]


def _random_towers(blocks: Sequence[str], rng: random.Random) -> list[list[str]]:
    order = list(blocks)
    rng.shuffle(order)
    towers: list[list[str]] = []
    for b in order:
        if towers and rng.random() < 0.6:
            rng.choice(towers).append(b)
        else:
            towers.append([b])
    return towers


class Blocksworld(Suite):
    """Synthetic PlanBench-style Blocksworld instances (3-7 blocks), validated action by action."""

    name = "blocksworld"
    description = (
        "synthetic: generated PlanBench-style block stacking, 3-7 blocks; validator checks "
        "every action"
    )

    def generate(self, count: int, seed: int = 0) -> list[BenchTask]:
        """``count`` different problems whose goal does not hold at the start."""
        rng = random.Random(f"blocksworld:{seed}")
        tasks: list[BenchTask] = []
        # Small worlds repeat often (three blocks allow few problems): a repeated problem
        # would count twice in the statistics as if it were a second, independent task.
        seen: set[str] = set()
        while len(tasks) < count:
            blocks = BLOCKS[: rng.randint(3, 7)]
            start = World.from_towers(_random_towers(blocks, rng))
            goal_world = World.from_towers(_random_towers(blocks, rng))
            goal = {b: v for b, v in goal_world.below if v != TABLE}
            if not goal or goal_holds(start, goal):
                continue
            text = root_goal(start, goal)
            if text in seen:
                continue
            seen.add(text)
            index = len(tasks)
            length = len(solve(start, full_target(start, goal)))
            params = {"blocks": len(blocks), "reference_actions": length}
            tasks.append(self.task(seed, index, text, params, BlocksInstance(start, goal)))
        return tasks

    def environment(self, task: BenchTask, *, latency_scale: float = 1.0) -> TaskEnv:
        """A fresh world at the start state; the verifier replays the action log."""
        instance: BlocksInstance = task.data
        env = BlocksEnv(instance.start)
        return TaskEnv(
            goal=task.goal,
            tools=env.tools(),
            verify=lambda _answer: validate_actions(instance.start, instance.goal, env.log),
        )

    def oracle(self) -> BlocksworldOracle:
        """The blocksworld oracle."""
        return BlocksworldOracle()
