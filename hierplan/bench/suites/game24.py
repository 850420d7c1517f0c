"""Game of 24: combine four numbers from 1 to 13 with + - * / into 24 (synthetic draws; ``tot24``
has Tree of Thoughts' ranked puzzles).

Puzzles are drawn from the solvable multisets (1,362 of the 1,820 multisets of four numbers
from 1 to 13). The tools keep a pool of numbers: ``combine(a, op, b)`` replaces two of them by
the result, ``reset`` restores the four numbers, ``look`` shows the pool. The verifier checks
the expression left in the pool with an exact checker: it uses each number once and equals 24
in exact rational arithmetic.

Pool reports look like ``<pool 2: 4 = (8 - 4); 7; 1>``.
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from itertools import combinations_with_replacement
from types import MappingProxyType

from hierplan.agents.prompts import PlanPrompt, StepPrompt, one_line
from hierplan.bench.base import (
    ActionFailed,
    BenchTask,
    Suite,
    SuiteOracle,
    TaskEnv,
    call,
    latest,
    plan_texts,
    step_texts,
    tool_step,
)
from hierplan.models.base import ToolCall
from hierplan.plans.plan import Plan, Step
from hierplan.scenarios.base import Verification
from hierplan.simulator.oracle import Action
from hierplan.tools.base import Tool, tool

TARGET = Fraction(24)
OPS = ("+", "-", "*", "/")

Entry = tuple[Fraction, str]  # value and the expression that made it
Move = tuple[Fraction, str, Fraction]


def fmt(value: Fraction) -> str:
    """``8`` or ``8/3``."""
    return (
        str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    )


# The signs a model may write for + - * / (typographic minus, times and division signs).
OPERATOR_ALIASES: Mapping[str, str] = MappingProxyType(
    {"\u2212": "-", "\u00d7": "*", "\u00f7": "/", "\u2215": "/"}
)


def _number(value: int | float | str) -> Fraction:
    """A pool number as given: ``8``, ``"8/3"``, or a decimal such as ``2.6666666666666665``
    (a JSON number for 8/3), read as the nearest fraction with a small denominator."""
    if isinstance(value, float):
        return Fraction(value).limit_denominator(10_000)
    return Fraction(str(value).strip().replace("\u2212", "-"))


def apply_op(a: Fraction, op: str, b: Fraction) -> Fraction:
    """``a op b``; :class:`ActionFailed` for an unknown operator or a division by zero."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            raise ActionFailed("division by zero")
        return a / b
    raise ActionFailed(f"unknown operator {op!r}: use one of + - * /")


@cache
def _solve(values: tuple[Fraction, ...]) -> tuple[Move, ...] | None:
    if len(values) == 1:
        return () if values[0] == TARGET else None
    for i in range(len(values)):
        for j in range(len(values)):
            if i == j or (values[i] == values[j] and i > j):
                continue
            rest = [v for k, v in enumerate(values) if k not in (i, j)]
            for op in OPS:
                if op in "+*" and i > j:
                    continue
                if op == "/" and values[j] == 0:
                    continue
                result = apply_op(values[i], op, values[j])
                tail = _solve(tuple(sorted([*rest, result])))
                if tail is not None:
                    return ((values[i], op, values[j]), *tail)
    return None


def solve(values: Sequence[Fraction]) -> list[Move] | None:
    """Moves that turn ``values`` into 24, or ``None`` when none exist."""
    found = _solve(tuple(sorted(values)))
    return None if found is None else list(found)


@cache
def solvable_puzzles() -> tuple[tuple[int, ...], ...]:
    """Every solvable multiset of four numbers from 1 to 13, in order."""
    return tuple(
        combo
        for combo in combinations_with_replacement(range(1, 14), 4)
        if solve([Fraction(n) for n in combo]) is not None
    )


def check_expression(expression: str, numbers: Sequence[int]) -> Verification:
    """The exact checker: only + - * / on integers, each number used once, value exactly 24."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return Verification(False, f"{expression!r} is not an arithmetic expression")
    used: list[int] = []

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp):
            ops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
            op = ops.get(type(node.op))
            if op is not None:
                return apply_op(value(node.left), op, value(node.right))
        raise ValueError(f"{ast.unparse(node)!r} is not allowed: only + - * / on integers")

    try:
        result = value(tree.body)
    except (ValueError, ActionFailed) as exc:
        return Verification(False, str(exc))
    if Counter(used) != Counter(numbers):
        return Verification(
            False, f"{expression} uses {sorted(used)}, not each of {sorted(numbers)} once"
        )
    if result != TARGET:
        return Verification(False, f"{expression} = {fmt(result)}, not 24")
    return Verification(True, f"{expression} = 24")


def describe(pool: Sequence[Entry], counter: int) -> str:
    """``<pool N: 4 = (8 - 4); 7; 1>``."""
    parts = [fmt(v) if e == fmt(v) else f"{fmt(v)} = {e}" for v, e in pool]
    return f"<pool {counter}: {'; '.join(parts)}>"


_POOL = re.compile(r"<pool (\d+): ([^>]*)>")
# "Game of 24:" or, for a puzzle of a public set, "Game of 24 (Tree of Thoughts rank 901):".
_HEAD = re.compile(r"^Game of 24(?: \([^)]*\))?:")


def parse_pool(body: str) -> list[Entry]:
    """The entries of a pool report."""
    out = []
    for part in body.split("; "):
        value, _, expr = part.partition(" = ")
        out.append((Fraction(value), expr or value))
    return out


def task_text(numbers: Sequence[int], source: str | None = None) -> str:
    """The task text a model gets (``source``: where the puzzle comes from, if public)."""
    start = describe([(Fraction(n), str(n)) for n in numbers], 0)
    listed = ", ".join(map(str, numbers))
    head = "Game of 24" + (f" ({source})" if source else "") + ":"
    return (
        f"{head} use each of the numbers {listed} exactly once with + - * / to make 24. "
        "combine(a, op, b) replaces two numbers of the pool by the result, reset() restores the "
        f"four numbers, look() shows the pool. Start: {start}. When the pool holds only 24, "
        "answer with its expression."
    )


Start = tuple[int, list[Entry]]  # the start report's counter and pool


def _start(text: str) -> Start | None:
    text = one_line(text)
    if not _HEAD.match(text):
        return None
    match = _POOL.search(text)
    return None if match is None else (int(match.group(1)), parse_pool(match.group(2)))


def _arg(value: Fraction) -> int | str:
    return value.numerator if value.denominator == 1 else fmt(value)


class Game24Oracle(SuiteOracle[Start]):
    """What a competent model answers for Game of 24 prompts."""

    def read(self, text: str) -> Start | None:
        """The start of the puzzle ``text`` states."""
        return _start(text)

    def plan_for(self, start: Start, prompt: PlanPrompt) -> Plan:
        """Combines from the latest reported pool (after a reset when it is a dead end)."""
        seen = latest(_POOL, plan_texts(prompt))
        pool = start[1] if seen is None else parse_pool(seen.body)
        prefix = "" if seen is None else f"r{seen.counter}_"
        goal = one_line(prompt.goal)
        if len(pool) == 1 and pool[0][0] == TARGET:
            look = tool_step(f"{prefix}look", "Show the pool", "look", {}, title="Look")
            return Plan(goal=goal, steps=[look], rationale="The pool already holds 24.")
        steps: list[Step] = []
        moves = solve([v for v, _ in pool])
        if moves is None:
            steps.append(tool_step(f"{prefix}reset", "Reset the pool", "reset", {}, title="Reset"))
            pool = start[1]
            moves = solve([v for v, _ in pool]) or []
        steps += _move_steps(pool, moves, prefix, steps[0].id if steps else None)
        return Plan(goal=goal, steps=steps, rationale="Combine pairs until 24 is left.")

    def act_for(
        self, start: Start, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]
    ) -> Action:
        """One combine per turn toward 24; a reset from a dead end; then the expression."""
        seen = latest(_POOL, step_texts(prompt, done))
        pool = start[1] if seen is None else parse_pool(seen.body)
        if len(pool) == 1 and pool[0][0] == TARGET:
            return Action(text=f"{pool[0][1]} = 24")
        moves = solve([v for v, _ in pool])
        if not moves:
            return Action(tool_calls=(call("reset"),))
        a, op, b = moves[0]
        return Action(tool_calls=(call("combine", a=_arg(a), op=op, b=_arg(b)),))


def _move_steps(
    pool: Sequence[Entry], moves: Sequence[Move], prefix: str, after: str | None
) -> list[Step]:
    """One step per move; a step depends on the steps that made its operands."""
    entries: list[tuple[Fraction, str | None]] = [(v, after) for v, _ in pool]
    steps = []
    for i, (a, op, b) in enumerate(moves, 1):
        deps: list[str] = []
        for operand in (a, b):
            k = next(k for k, (v, _) in enumerate(entries) if v == operand)
            _, maker = entries.pop(k)
            if maker is not None:
                deps.append(maker)
        sid = f"{prefix}m{i}"
        text = f"Combine {fmt(a)} {op} {fmt(b)}"
        args = {"a": _arg(a), "op": op, "b": _arg(b)}
        steps.append(tool_step(sid, text, "combine", args, depends_on=dict.fromkeys(deps)))
        entries.append((apply_op(a, op, b), sid))
    return steps


class PoolEnv:
    """The pool of one run, a counter, and the log of what happened."""

    def __init__(self, numbers: Sequence[int]) -> None:
        self.numbers = list(numbers)
        self.start: list[Entry] = [(Fraction(n), str(n)) for n in numbers]
        self.pool = list(self.start)
        self.counter = 0
        self.log: list[str] = []

    def state(self) -> str:
        """The current pool report."""
        return describe(self.pool, self.counter)

    def combine(self, a: int | float | str, op: str, b: int | float | str) -> str:
        """Replace ``a`` and ``b`` by ``a op b``."""
        try:
            left, right = _number(a), _number(b)
        except (ValueError, ZeroDivisionError, OverflowError):
            raise ActionFailed(f"{a!r} and {b!r} must be numbers. Now: {self.state()}") from None
        op = OPERATOR_ALIASES.get(op.strip(), op.strip())
        pool = list(self.pool)
        taken = []
        for value in (left, right):
            k = next((k for k, (v, _) in enumerate(pool) if v == value), None)
            if k is None:
                raise ActionFailed(f"{fmt(value)} is not in the pool. Now: {self.state()}")
            taken.append(pool.pop(k))
        try:
            result = apply_op(taken[0][0], op, taken[1][0])
        except ActionFailed as exc:
            raise ActionFailed(f"{exc}. Now: {self.state()}") from None
        pool.append((result, f"({taken[0][1]} {op} {taken[1][1]})"))
        self.pool = pool
        self.counter += 1
        self.log.append(f"combine {fmt(left)} {op} {fmt(right)}")
        return f"{fmt(left)} {op} {fmt(right)} = {fmt(result)}. Now: {self.state()}"

    def reset(self) -> str:
        """Restore the four numbers."""
        self.pool = list(self.start)
        self.counter += 1
        self.log.append("reset")
        return f"reset. Now: {self.state()}"

    def verify(self) -> Verification:
        """The pool must hold one entry whose expression passes the exact checker."""
        if len(self.pool) != 1:
            return Verification(False, f"the pool still holds {len(self.pool)} numbers")
        expression = self.pool[0][1]
        if expression.startswith("(") and expression.endswith(")"):
            expression = expression[1:-1]
        return check_expression(expression, self.numbers)

    def tools(self) -> list[Tool]:
        """``combine``, ``reset`` and ``look`` on this pool."""

        @tool
        async def combine(a: int | float | str, op: str, b: int | float | str) -> str:
            """Replace numbers a and b of the pool (e.g. 8 or "8/3") by a op b (+ - * /)."""
            return self.combine(a, op, b)

        @tool
        async def reset() -> str:
            """Restore the pool to the four starting numbers."""
            return self.reset()

        @tool
        async def look() -> str:
            """Show the pool."""
            return self.state()

        return [combine, reset, look]


@dataclass(slots=True, frozen=True)
class Puzzle:
    """Four numbers that can make 24."""

    numbers: tuple[int, ...]


class Game24(Suite):
    """Synthetic draws of the solvable Game of 24 puzzles, with an exact checker."""

    name = "game24"
    description = (
        "synthetic: Game of 24 drawn uniformly from the 1,362 solvable puzzles; exact rational "
        "checker"
    )

    def generate(self, count: int, seed: int = 0) -> list[BenchTask]:
        """``count`` puzzles drawn without replacement (with replacement past 1,362)."""
        rng = random.Random(f"game24:{seed}")
        puzzles = list(solvable_puzzles())
        rng.shuffle(puzzles)
        tasks = []
        for index in range(count):
            numbers = list(puzzles[index % len(puzzles)])
            rng.shuffle(numbers)
            params = {"numbers": " ".join(map(str, numbers))}
            tasks.append(self.task(seed, index, task_text(numbers), params, Puzzle(tuple(numbers))))
        return tasks

    def environment(self, task: BenchTask, *, latency_scale: float = 1.0) -> TaskEnv:
        """A fresh pool; the verifier checks the expression left in it."""
        puzzle: Puzzle = task.data
        env = PoolEnv(puzzle.numbers)
        return TaskEnv(goal=task.goal, tools=env.tools(), verify=lambda _answer: env.verify())

    def oracle(self) -> Game24Oracle:
        """The Game of 24 oracle."""
        return Game24Oracle()
