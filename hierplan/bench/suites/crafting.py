"""Crafting: TextCraft-style synthetic recipes of depth 2 to 4 (no game data).

Base items are fetched with ``get``; every other item is made by a crafting command such as
``craft 4 ember plank using 1 oak log`` (one application yields 4). The target's recipe tree is
2 to 4 levels deep, and the task lists a few commands that are not needed. Success is the
target item in the final inventory; :func:`validate_actions` replays every action.

Inventory reports look like ``<inventory 5: 2 oak log, 1 iron rod>``.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
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
    latest,
    plan_texts,
    slug,
    subgoal_step,
    tool_step,
)
from hierplan.models.base import ToolCall
from hierplan.plans.plan import Plan, Step
from hierplan.scenarios.base import Verification
from hierplan.simulator.oracle import Action
from hierplan.tools.base import Tool, tool

BASE_ITEMS = (
    "oak log", "iron ore", "river sand", "clay", "coal", "flint", "wool", "reed", "copper ore",
    "quartz", "resin", "feather", "bone", "salt", "amber", "moss", "slate", "tallow",
)  # fmt: skip
ADJECTIVES = (
    "ember", "frost", "dusk", "storm", "glow", "hollow", "silver", "thorn", "ash", "tide",
    "sun", "moon", "rune", "brass", "mist", "stone",
)  # fmt: skip
NOUNS = (
    "plank", "ingot", "rod", "gear", "lens", "plate", "rope", "brick", "shard", "coil", "frame",
    "lantern", "compass", "bellows", "loom", "hinge", "spindle", "kettle", "anvil", "charm",
)  # fmt: skip
MAX_GET = 64
MAX_ACTIONS = 28

Inventory = dict[str, int]


@dataclass(slots=True, frozen=True)
class Recipe:
    """One crafting command: ``craft <makes> <item> using <ingredients>``."""

    item: str
    makes: int
    ingredients: tuple[tuple[str, int], ...]

    def text(self) -> str:
        """The command as the task states it."""
        uses = ", ".join(f"{n} {name}" for name, n in self.ingredients)
        return f"craft {self.makes} {self.item} using {uses}"


@dataclass(slots=True, frozen=True)
class CraftInstance:
    """A generated task: the target, every recipe listed (with distractors), base items."""

    target: str
    count: int
    recipes: tuple[Recipe, ...]
    base: tuple[str, ...]
    depth: int


def apply(
    inventory: Inventory,
    action: tuple[str, str, int],
    book: Mapping[str, Recipe],
    base: Sequence[str],
) -> Inventory:
    """The inventory after ``("get"|"craft", item, n)``; :class:`ActionFailed` says why not."""
    kind, item, n = action
    out = dict(inventory)
    if n < 1:
        raise ActionFailed(f"cannot {kind} {n} {item}: the number must be at least 1")
    if kind == "get":
        if item not in base:
            raise ActionFailed(
                f"cannot get {item!r}: only base items can be fetched ({', '.join(base)})"
            )
        if n > MAX_GET:
            raise ActionFailed(f"cannot get {n} {item}: at most {MAX_GET} at a time")
        out[item] = out.get(item, 0) + n
        return out
    recipe = book.get(item)
    if recipe is None:
        raise ActionFailed(f"there is no crafting command for {item!r}")
    short = [
        f"{need * n} {name} (have {out.get(name, 0)})"
        for name, need in recipe.ingredients
        if out.get(name, 0) < need * n
    ]
    if short:
        raise ActionFailed(f"cannot craft {item} {n} time(s): need {', '.join(short)}")
    for name, need in recipe.ingredients:
        out[name] -= need * n
        if out[name] == 0:
            del out[name]
    out[item] = out.get(item, 0) + recipe.makes * n
    return out


def validate_actions(
    instance: CraftInstance, actions: Sequence[tuple[str, str, int]]
) -> Verification:
    """Replay ``actions`` from an empty inventory; the target must end in the inventory."""
    book = {r.item: r for r in instance.recipes}
    inventory: Inventory = {}
    for i, action in enumerate(actions, 1):
        try:
            inventory = apply(inventory, action, book, instance.base)
        except ActionFailed as exc:
            return Verification(False, f"action {i} is invalid: {exc}")
    have = inventory.get(instance.target, 0)
    if have < instance.count:
        return Verification(
            False,
            f"{instance.target} is not in the final inventory (have {have}, need {instance.count})",
        )
    return Verification(True, f"{have} {instance.target} crafted in {len(actions)} actions")


def describe(inventory: Mapping[str, int], counter: int) -> str:
    """``<inventory N: 2 oak log, 1 iron rod>``."""
    items = ", ".join(f"{n} {name}" for name, n in sorted(inventory.items()) if n > 0)
    return f"<inventory {counter}: {items or 'empty'}>"


_INVENTORY = re.compile(r"<inventory (\d+): ([^>]*)>")
_COMMAND = re.compile(r"craft (\d+) ([a-z][a-z ]*?) using ([^;.]+)")
_USES = re.compile(r"(\d+) ([a-z][a-z ]*[a-z])")
_BASE = re.compile(r"Base items, fetched with get: ([a-z ,]+)\.")
_ROOT = re.compile(r"^Crafting task: craft (\d+) ([a-z][a-z ]*?)\. ")
_SUB = re.compile(r"^Crafting sub-goal: craft (\d+) ([a-z][a-z ]*?)\. ")


def parse_inventory(body: str) -> Inventory:
    """The inventory in the body of a report."""
    if body.strip() == "empty":
        return {}
    return {name: int(n) for n, name in _USES.findall(body)}


@dataclass(slots=True)
class Problem:
    """A (sub-)goal read from text: what to craft, the commands and the base items."""

    target: str
    count: int
    book: dict[str, Recipe]
    base: tuple[str, ...]
    root: bool


def parse_problem(text: str) -> Problem | None:
    """The problem a root goal or a sub-goal states, else ``None``."""
    text = one_line(text)
    head = _ROOT.match(text) or _SUB.match(text)
    base = _BASE.search(text)
    if head is None or base is None:
        return None
    book = {}
    for makes, item, uses in _COMMAND.findall(text.split("Crafting commands", 1)[-1]):
        ingredients = tuple((name, int(n)) for n, name in _USES.findall(uses))
        book[item] = Recipe(item, int(makes), ingredients)
    return Problem(
        target=head.group(2),
        count=int(head.group(1)),
        book=book,
        base=tuple(b.strip() for b in base.group(1).split(",")),
        root=text.startswith("Crafting task"),
    )


def heights(book: Mapping[str, Recipe]) -> dict[str, int]:
    """Levels: base items 0, a crafted item one more than its highest ingredient."""
    memo: dict[str, int] = {}

    def level(item: str) -> int:
        if item not in memo:
            recipe = book.get(item)
            memo[item] = 0 if recipe is None else 1 + max(level(n) for n, _ in recipe.ingredients)
        return memo[item]

    for item in book:
        level(item)
    return memo


def solve(
    problem: Problem, inventory: Mapping[str, int]
) -> tuple[dict[str, int], list[tuple[str, int, int]]]:
    """What to get and craft from ``inventory``: ``(gets, [(item, times, height)])``.

    Demands are added up over the whole recipe tree, consumers before ingredients, so shared
    ingredients are fetched once and crafts of one height never compete.
    """
    level = heights(problem.book)
    demand: Counter[str] = Counter({problem.target: problem.count})
    gets: dict[str, int] = {}
    crafts: list[tuple[str, int, int]] = []
    for item in sorted(level, key=lambda i: (-level[i], i)):
        deficit = demand[item] - inventory.get(item, 0)
        if deficit <= 0:
            continue
        recipe = problem.book.get(item)
        if recipe is None:
            gets[item] = deficit
            continue
        times = math.ceil(deficit / recipe.makes)
        crafts.append((item, times, level[item]))
        for name, n in recipe.ingredients:
            demand[name] += n * times
            level.setdefault(name, 0)
    for item in sorted(demand):
        if item not in level and demand[item] > inventory.get(item, 0):
            gets[item] = demand[item] - inventory.get(item, 0)
    crafts.sort(key=lambda c: (c[2], c[0]))
    return gets, crafts


def closure(book: Mapping[str, Recipe], item: str) -> list[Recipe]:
    """The recipes needed to make ``item``, ingredients first."""
    out: list[Recipe] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        recipe = book.get(name)
        if recipe is None or name in seen:
            return
        seen.add(name)
        for ingredient, _ in recipe.ingredients:
            visit(ingredient)
        out.append(recipe)

    visit(item)
    return out


def task_text(head: str, recipes: Sequence[Recipe], base: Sequence[str]) -> str:
    """A root or sub-goal text: the head, the commands and the base items."""
    commands = "; ".join(r.text() for r in recipes)
    return (
        f"{head} Crafting commands: {commands}. Base items, fetched with get: "
        f"{', '.join(base)}. Use get(item, count) for base items and craft(item, times) to "
        "apply a command that many times; when done, answer with the inventory."
    )


def subgoal_text(book: Mapping[str, Recipe], base: Sequence[str], item: str, count: int) -> str:
    """The text of a sub-goal: craft ``count`` of ``item``, with only the commands it needs."""
    recipes = closure(book, item)
    used = sorted({n for r in recipes for n, _ in r.ingredients if n not in book})
    return task_text(
        f"Crafting sub-goal: craft {count} {item}.", recipes, [b for b in base if b in used]
    )


class CraftingOracle(SuiteOracle[Problem]):
    """What a competent model answers for crafting prompts."""

    def read(self, text: str) -> Problem | None:
        """The crafting task or sub-goal ``text`` states."""
        return parse_problem(text)

    def plan_for(self, problem: Problem, prompt: PlanPrompt) -> Plan:
        """Gets and crafts from the latest reported inventory; sub-goals per ingredient."""
        seen = latest(_INVENTORY, plan_texts(prompt))
        inventory = {} if seen is None else parse_inventory(seen.body)
        prefix = "" if seen is None else f"r{seen.counter}_"
        gets, crafts = solve(problem, inventory)
        goal = one_line(prompt.goal)
        if not crafts and not gets:
            look = tool_step(
                f"{prefix}inventory", "Show the inventory", "inventory", {}, title="Inventory"
            )
            return Plan(goal=goal, steps=[look], rationale="The target is already there.")
        if prompt.allow_subgoals and len(gets) + len(crafts) > MAX_FLAT_STEPS:
            return Plan(
                goal=goal,
                steps=_subgoal_steps(problem, inventory, prefix),
                rationale="One sub-goal per crafted ingredient, then the final craft.",
            )
        return Plan(
            goal=goal,
            steps=_flat_steps(problem, gets, crafts, prefix),
            rationale="Fetch the base items, then craft bottom up.",
        )

    def act_for(
        self, problem: Problem, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]
    ) -> Action:
        """All fetches at once, then the crafts of one level per turn, then the answer."""
        # The executor's own ledger: what its successful calls added and used. Sibling steps
        # may share the inventory, so it does not count on their items.
        inventory: Inventory = {}
        book = problem.book
        for c, _ in done:
            action = _action_of(c)
            if action is not None:
                try:
                    inventory = apply(inventory, action, book, problem.base)
                except ActionFailed:
                    continue
        gets, crafts = solve(problem, inventory)
        if gets:
            return Action(tool_calls=tuple(call("get", item=i, count=n) for i, n in gets.items()))
        if crafts:
            low = crafts[0][2]
            return Action(
                tool_calls=tuple(call("craft", item=i, times=t) for i, t, h in crafts if h == low)
            )
        seen = latest(_INVENTORY, [text for _, text in done])
        report = "" if seen is None else f" <inventory {seen.counter}: {seen.body}>"
        return Action(text=f"Crafted {problem.count} {problem.target}.{report}")


def _action_of(c: ToolCall) -> tuple[str, str, int] | None:
    key = {"get": "count", "craft": "times"}.get(c.name)
    if key is None:
        return None
    try:
        return (c.name, str(c.arguments.get("item")), int(c.arguments.get(key, 1)))
    except (TypeError, ValueError):
        return None


def _get_step(step_id: str, item: str, count: int) -> Step:
    return tool_step(step_id, f"Get {count} {item}", "get", {"item": item, "count": count})


def _craft_step(step_id: str, item: str, times: int, depends_on: Sequence[str]) -> Step:
    return tool_step(
        step_id,
        f"Craft {item} {times} times",
        "craft",
        {"item": item, "times": times},
        title=f"Craft {item}",
        depends_on=depends_on,
    )


def _flat_steps(
    problem: Problem, gets: Mapping[str, int], crafts: Sequence[tuple[str, int, int]], prefix: str
) -> list[Step]:
    made: dict[str, str] = {}
    steps: list[Step] = []
    for item, n in gets.items():
        sid = f"{prefix}get_{slug(item)}"
        made[item] = sid
        steps.append(_get_step(sid, item, n))
    for item, times, _ in crafts:
        sid = f"{prefix}craft_{slug(item)}"
        deps = [made[n] for n, _ in problem.book[item].ingredients if n in made]
        made[item] = sid
        steps.append(_craft_step(sid, item, times, deps))
    return steps


def _subgoal_steps(problem: Problem, inventory: Mapping[str, int], prefix: str) -> list[Step]:
    recipe = problem.book[problem.target]
    times = math.ceil((problem.count - inventory.get(problem.target, 0)) / recipe.makes)
    steps: list[Step] = []
    for name, n in recipe.ingredients:
        need = n * times - inventory.get(name, 0)
        if need <= 0:
            continue
        sid = f"{prefix}{'make' if name in problem.book else 'get'}_{slug(name)}"
        if name in problem.book:
            text = subgoal_text(problem.book, problem.base, name, need)
            steps.append(subgoal_step(sid, f"Make {need} {name}", text))
        else:
            steps.append(_get_step(sid, name, need))
    final_id = f"{prefix}craft_{slug(problem.target)}"
    final = _craft_step(final_id, problem.target, times, [s.id for s in steps])
    return [*steps, final]


class CraftEnv(LoggedWorld[tuple[str, str, int]]):
    """The inventory of one run, a counter, and the log of actions that happened."""

    def __init__(self, instance: CraftInstance) -> None:
        super().__init__()
        self.instance = instance
        self.book = {r.item: r for r in instance.recipes}
        self.inventory: Inventory = {}

    def state(self) -> str:
        """The current inventory report."""
        return describe(self.inventory, self.counter)

    def change(self, action: tuple[str, str, int]) -> None:
        """Apply ``action`` to the inventory (:class:`ActionFailed` if it cannot be done)."""
        self.inventory = apply(self.inventory, action, self.book, self.instance.base)

    def tools(self) -> list[Tool]:
        """``get``, ``craft`` and ``inventory`` on this inventory."""

        @tool
        async def get(item: str, count: int) -> str:
            """Fetch ``count`` of a base item into the inventory."""
            return self.act(("get", item, count), f"got {count} {item}")

        @tool
        async def craft(item: str, times: int = 1) -> str:
            """Apply the crafting command that makes ``item``, ``times`` times."""
            return self.act(("craft", item, times), f"crafted {item} {times} time(s)")

        @tool
        async def inventory() -> str:
            """List what the inventory holds."""
            return self.state()

        return [get, craft, inventory]


class _Names:
    """Unique fictional item names from a seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def new(self) -> str:
        while True:
            name = f"{self.rng.choice(ADJECTIVES)} {self.rng.choice(NOUNS)}"
            if name not in self.used:
                self.used.add(name)
                return name


def _make_tree(
    depth: int,
    rng: random.Random,
    names: _Names,
    base: Sequence[str],
    book: dict[str, Recipe],
    pool: dict[int, list[str]],
) -> str:
    """A crafted item of exactly ``depth`` levels; lower items are sometimes reused."""
    if depth == 0:
        return rng.choice(base)
    reuse = [i for i in pool.get(depth, []) if rng.random() < 0.2]
    if reuse:
        return reuse[0]
    item = names.new()
    parts = [_make_tree(depth - 1, rng, names, base, book, pool)]
    for _ in range(rng.randint(1, 2)):
        parts.append(_make_tree(rng.randint(0, depth - 1), rng, names, base, book, pool))
    counts: dict[str, int] = {}
    for p in parts:
        counts[p] = counts.get(p, 0) + rng.randint(1, 2 if p in book else 3)
    book[item] = Recipe(item, rng.choice((1, 1, 1, 2, 4)), tuple(counts.items()))
    pool.setdefault(depth, []).append(item)
    return item


def generate_instance(rng: random.Random) -> CraftInstance:
    """One task: a target 2-4 levels deep plus three unneeded commands."""
    while True:
        depth = rng.randint(2, 4)
        names = _Names(rng)
        base = rng.sample(BASE_ITEMS, 8)
        book: dict[str, Recipe] = {}
        target = _make_tree(depth, rng, names, base, book, {})
        problem = Problem(target, 1, dict(book), tuple(base), True)
        gets, crafts = solve(problem, {})
        if len(gets) + len(crafts) > MAX_ACTIONS or max(gets.values(), default=0) > MAX_GET:
            continue
        for _ in range(3):
            item = names.new()
            uses = tuple((b, rng.randint(1, 3)) for b in rng.sample(base, 2))
            book[item] = Recipe(item, rng.choice((1, 2)), uses)
        recipes = list(book.values())
        rng.shuffle(recipes)
        return CraftInstance(target, 1, tuple(recipes), tuple(sorted(base)), depth)


class Crafting(Suite):
    """TextCraft-style crafting with synthetic recipes 2-4 levels deep."""

    name = "crafting"
    description = (
        "synthetic: TextCraft-style generated recipes, depth 2-4; target must end in the inventory"
    )

    def generate(self, count: int, seed: int = 0) -> list[BenchTask]:
        """``count`` crafting tasks."""
        rng = random.Random(f"crafting:{seed}")
        tasks = []
        for index in range(count):
            inst = generate_instance(rng)
            problem = Problem(
                inst.target, inst.count, {r.item: r for r in inst.recipes}, inst.base, True
            )
            gets, crafts = solve(problem, {})
            head = (
                f"Crafting task: craft {inst.count} {inst.target}. The inventory starts empty: "
                f"{describe({}, 0)}. Some commands are not needed."
            )
            params = {"depth": inst.depth, "reference_actions": len(gets) + len(crafts)}
            tasks.append(
                self.task(seed, index, task_text(head, inst.recipes, inst.base), params, inst)
            )
        return tasks

    def environment(self, task: BenchTask, *, latency_scale: float = 1.0) -> TaskEnv:
        """An empty inventory; the verifier replays the action log."""
        instance: CraftInstance = task.data
        env = CraftEnv(instance)
        return TaskEnv(
            goal=task.goal,
            tools=env.tools(),
            verify=lambda _answer: validate_actions(instance, env.log),
        )

    def oracle(self) -> CraftingOracle:
        """The crafting oracle."""
        return CraftingOracle()
