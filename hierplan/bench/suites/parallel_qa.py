"""ParallelQA-style questions over a generated fictional knowledge base.

A question combines facts (``the rainfall of Varnholt``) with sums, differences and products,
fan-out 2 to 5 at the top and depth 1 to 3. Facts must be looked up (they are fictional), and
``lookup`` takes simulated time, like a search API; the arithmetic tools take a little too. The
gold answer and the critical-path latency bound (the least time the tools need with unlimited
parallelism) come from the gold DAG of the question.

Sub-expressions are written in brackets, so that any sub-question reads as a question itself:
``What is [the sum of [the area of Quilmer] and [the result of [...] minus [...]]]?``
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from types import MappingProxyType

import anyio

from hierplan.agents.prompts import RUNNING_RESULT, PlanPrompt, StepPrompt, one_line
from hierplan.bench.base import (
    MAX_FLAT_STEPS,
    ActionFailed,
    BenchTask,
    Suite,
    SuiteOracle,
    TaskEnv,
    call,
    subgoal_step,
    tool_step,
)
from hierplan.models.base import ToolCall
from hierplan.plans.plan import Plan, Step
from hierplan.scenarios.base import Verification
from hierplan.simulator.oracle import Action
from hierplan.tools.base import Tool, tool

SYLLABLES = (
    "var", "nol", "quil", "mer", "tor", "ben", "kas", "lor", "dun", "fel", "gar", "hal", "isk",
    "jor", "kel", "mor", "nes", "osk", "pel", "ryn", "sal", "tam", "ul", "ves", "wen", "yar",
)  # fmt: skip
ATTRIBUTES = (
    "population", "area", "elevation", "rainfall", "bridge count", "school count",
    "museum count", "harbor depth",
)  # fmt: skip
ENTITIES = 60
LOOKUP_S = (0.3, 1.2)
ARITHMETIC_S = 0.05
OPS: Mapping[str, str] = MappingProxyType(
    {"sum": "add", "product": "multiply", "difference": "subtract"}
)
ARG_NAMES = ("a", "b", "c", "d", "e")

Fact = tuple[str, str]  # (entity, attribute)


@dataclass(slots=True, frozen=True)
class Expr:
    """A question's expression: a fact to look up, or an operation on sub-expressions."""

    op: str
    children: tuple[Expr, ...] = ()
    fact: Fact | None = None

    def phrase(self) -> str:
        """The expression in words, sub-expressions in brackets."""
        if self.fact is not None:
            return f"the {self.fact[1]} of {self.fact[0]}"
        parts = [f"[{c.phrase()}]" for c in self.children]
        if self.op == "difference":
            return f"the result of {parts[0]} minus {parts[1]}"
        return f"the {self.op} of {', '.join(parts[:-1])} and {parts[-1]}"

    def leaves(self) -> list[Fact]:
        """Facts used, left to right."""
        if self.fact is not None:
            return [self.fact]
        return [f for c in self.children for f in c.leaves()]

    def nodes(self) -> list[Expr]:
        """Operations, children before parents."""
        if self.fact is not None:
            return []
        return [n for c in self.children for n in c.nodes()] + [self]


def evaluate(expr: Expr, values: Mapping[Fact, float]) -> float:
    """The value of ``expr`` with the facts in ``values``."""
    if expr.fact is not None:
        return values[expr.fact]
    args = [evaluate(c, values) for c in expr.children]
    return combine(expr.op, args)


def combine(op: str, args: Sequence[float]) -> float:
    """Apply ``op`` (sum, product, difference) to ``args``."""
    if op == "sum":
        return float(sum(args))
    if op == "difference":
        return args[0] - args[1]
    out = 1.0
    for a in args:
        out *= a
    return out


def _split(text: str) -> tuple[list[str], str]:
    """Top-level ``[...]`` items of ``text``, and the text outside them."""
    items: list[str] = []
    outside: list[str] = []
    depth = start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth == 0:
                start = i + 1
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                items.append(text[start:i])
        elif depth == 0:
            outside.append(ch)
    return items, "".join(outside)


_LEAF = re.compile(r"^the ([a-z][a-z ]*[a-z]) of ([A-Z][a-z]+)$")


def parse_expr(phrase: str) -> Expr | None:
    """The expression a phrase states (the inverse of :meth:`Expr.phrase`), else ``None``."""
    leaf = _LEAF.match(phrase)
    if leaf is not None and "[" not in phrase:
        return Expr("lookup", fact=(leaf.group(2), leaf.group(1)))
    items, outside = _split(phrase)
    kids = [parse_expr(i) for i in items]
    if not kids or any(k is None for k in kids):
        return None
    children = tuple(k for k in kids if k is not None)
    for op in ("sum", "product"):
        if outside.startswith(f"the {op} of ") and len(children) >= 2:
            return Expr(op, children)
    if outside.startswith("the result of ") and " minus " in outside and len(children) == 2:
        return Expr("difference", children)
    return None


def question_text(expr: Expr) -> str:
    """The task text a model gets."""
    return (
        "Answer with the lookup and arithmetic tools (the facts are fictional: look them up, do "
        f"not guess). What is [{expr.phrase()}]? Answer with the number only."
    )


def subgoal_text(expr: Expr) -> str:
    """A sub-question as a sub-goal."""
    return (
        f"Compute [{expr.phrase()}] with the lookup and arithmetic tools; answer with the "
        "number only."
    )


def parse_problem(text: str) -> Expr | None:
    """The expression a question or sub-goal asks for, else ``None``."""
    text = one_line(text)
    for head in ("Answer with the lookup and arithmetic tools", "Compute ["):
        if text.startswith(head):
            rest = text.split("What is ", 1)[-1] if head.startswith("Answer") else text[8:]
            items, _ = _split(rest)
            return parse_expr(items[0]) if items else None
    return None


def number(value: float) -> float:
    """``value`` as an int when it is whole (tools answer ``12``, not ``12.0``)."""
    return int(value) if float(value).is_integer() else value


def _fmt(value: float) -> str:
    return str(number(value))


class ParallelQAOracle(SuiteOracle[Expr]):
    """What a competent model answers for ParallelQA prompts."""

    def read(self, text: str) -> Expr | None:
        """The expression the question or sub-goal ``text`` asks for."""
        return parse_problem(text)

    def plan_for(self, expr: Expr, prompt: PlanPrompt) -> Plan:
        """The question's DAG: lookups in parallel, then the arithmetic; sub-goals if large.

        Step ids follow the expression, so a replan keeps the lookups that are done.
        """
        goal = one_line(prompt.goal)
        steps = _dag_steps(expr)
        if prompt.allow_subgoals and len(steps) > MAX_FLAT_STEPS:
            split = _subgoal_steps(expr)
            if split is not None:
                steps = split
        return Plan(
            goal=goal,
            steps=_keep_or_redo(steps, prompt),
            rationale="All lookups at once, then the arithmetic.",
        )

    def act_for(
        self, expr: Expr, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]
    ) -> Action:
        """All missing lookups in one turn, then every operation whose inputs are known."""
        facts: dict[Fact, float] = {}
        results: dict[tuple[str, tuple[tuple[str, float], ...]], float] = {}
        for c, text in done:
            value = _value(text)
            if value is None:
                continue
            if c.name == "lookup":
                facts[(str(c.arguments.get("entity")), str(c.arguments.get("attribute")))] = value
            else:
                results[(c.name, _key(c.arguments))] = value
        missing = [f for f in dict.fromkeys(expr.leaves()) if f not in facts]
        if missing:
            return Action(
                tool_calls=tuple(call("lookup", entity=e, attribute=a) for e, a in missing)
            )
        known: dict[int, float] = {}
        ready: dict[tuple[str, tuple[tuple[str, float], ...]], ToolCall] = {}
        for node in expr.nodes():
            args = [facts[c.fact] if c.fact else known.get(id(c)) for c in node.children]
            if any(a is None for a in args):
                continue
            arguments = {
                k: number(v) for k, v in zip(ARG_NAMES, args, strict=False) if v is not None
            }
            value = results.get((OPS[node.op], _key(arguments)))
            if value is None:
                ready[(OPS[node.op], _key(arguments))] = call(OPS[node.op], **arguments)
            else:
                known[id(node)] = value
        if id(expr) in known:
            return Action(text=_fmt(known[id(expr)]))
        return Action(tool_calls=tuple(ready.values()))


def _keep_or_redo(steps: Sequence[Step], prompt: PlanPrompt) -> list[Step]:
    """On a replan, keep the ids of steps already done or still running (their results carry
    over), and give a new id to a done step whose output is not a number, so that it runs
    again.

    A step of the current plan is the same as a new one when it has the new step's id, less
    any ``r`` suffixes earlier replans added, and the same tool: ids follow the expression.
    """
    current = {
        str(s.get("id")).rstrip("r"): (str(s.get("id")), s.get("tool"))
        for s in (prompt.current_plan or {}).get("steps", [])
    }
    renames: dict[str, str] = {}
    for step in steps:
        old, tool = current.get(step.id, (None, None))
        if old is None or tool != step.tool:
            continue
        output = prompt.progress.get(old)
        wrong = output not in (None, RUNNING_RESULT) and _value(output) is None
        renames[step.id] = old + "r" if wrong else old
    if not renames:
        return list(steps)

    def ref(value: object) -> object:
        if isinstance(value, str) and value.startswith("$") and value[1:] in renames:
            return "$" + renames[value[1:]]
        return value

    return [
        s.model_copy(
            update={
                "id": renames.get(s.id, s.id),
                "depends_on": [renames.get(d, d) for d in s.depends_on],
                "args": None if s.args is None else {k: ref(v) for k, v in s.args.items()},
            }
        )
        for s in steps
    ]


def _key(arguments: Mapping[str, object]) -> tuple[tuple[str, float], ...]:
    out = []
    for k, v in sorted(arguments.items()):
        if isinstance(v, int | float) and not isinstance(v, bool):
            out.append((k, float(v)))
    return tuple(out)


def _value(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _lookup_step(step_id: str, fact: Fact) -> Step:
    entity, attribute = fact
    args = {"entity": entity, "attribute": attribute}
    return tool_step(step_id, f"Look up the {attribute} of {entity}", "lookup", args)


def _operation_step(step_id: str, node: Expr, refs: Sequence[str]) -> Step:
    """The step computing ``node`` from the outputs of the steps ``refs``, in order."""
    return tool_step(
        step_id,
        node.phrase(),
        OPS[node.op],
        {k: f"${r}" for k, r in zip(ARG_NAMES, refs, strict=False)},
        title=f"Compute the {node.op}",
        depends_on=dict.fromkeys(refs),
    )


def _dag_steps(expr: Expr, prefix: str = "") -> list[Step]:
    facts = list(dict.fromkeys(expr.leaves()))
    ids = {f: f"{prefix}f{i}" for i, f in enumerate(facts, 1)}
    steps = [_lookup_step(ids[f], f) for f in facts]
    names: dict[int, str] = {}
    for i, node in enumerate(expr.nodes(), 1):
        refs = [ids[c.fact] if c.fact else names[id(c)] for c in node.children]
        names[id(node)] = f"{prefix}c{i}"
        steps.append(_operation_step(f"{prefix}c{i}", node, refs))
    return steps


def _subgoal_steps(expr: Expr) -> list[Step] | None:
    if expr.fact is not None or all(c.fact is not None for c in expr.children):
        return None
    steps: list[Step] = []
    refs: list[str] = []
    for i, child in enumerate(expr.children, 1):
        if child.fact is not None:
            steps.append(_lookup_step(f"f{i}", child.fact))
        else:
            steps.append(subgoal_step(f"part{i}", f"Compute part {i}", subgoal_text(child)))
        refs.append(steps[-1].id)
    steps.append(_operation_step("answer", expr, refs))
    return steps


@dataclass(slots=True, frozen=True)
class QAInstance:
    """A question, its gold answer, and the knowledge base it is asked over."""

    expr: Expr
    answer: float
    kb: Mapping[Fact, int]


def lookup_seconds(fact: Fact) -> float:
    """How long looking ``fact`` up takes (deterministic, like a search API's round trip)."""
    digest = hashlib.sha256(f"{fact[0]}|{fact[1]}".encode()).digest()
    low, high = LOOKUP_S
    return low + (high - low) * digest[0] / 255


def critical_path_s(expr: Expr) -> float:
    """The least time the tools need for ``expr`` with unlimited parallelism (gold DAG)."""
    if expr.fact is not None:
        return lookup_seconds(expr.fact)
    return ARITHMETIC_S + max(critical_path_s(c) for c in expr.children)


# A number as a model writes one: a sign, thousands in groups of three ("1,026,401"),
# decimals, an exponent; not digits inside a word.
_NUMBER = re.compile(
    r"(?<![A-Za-z_\d])-?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\d])"
)


def numbers_in(text: str) -> list[Decimal]:
    """Every number written in ``text``, exactly (a typographic minus is a minus)."""
    text = text.replace("\u2212", "-")
    found = []
    for match in _NUMBER.finditer(text):
        written = match.group(0)
        if not any(ch.isdigit() for ch in written) or written[-1:] in "eE":
            continue
        try:
            found.append(Decimal(written.replace(",", "")))
        except InvalidOperation:
            continue
    return found


def check_answer(answer: str, gold: float) -> Verification:
    """The answer must hold one number, equal to the (integer) gold answer exactly.

    An answer naming several numbers ("7 (not 829)") is not one final answer, whichever of
    them is right; ``829.0`` is 829, ``829.5`` and ``1026402`` (for 1,026,401) are not.
    """
    exact = Decimal(int(gold)) if float(gold).is_integer() else Decimal(str(gold))
    found = numbers_in(answer)
    if not found:
        return Verification(False, f"no number in the answer (gold {_fmt(gold)})")
    if len(found) > 1:
        listed = ", ".join(_fmt(float(v)) for v in found[:5])
        return Verification(
            False, f"not one final answer: {len(found)} numbers ({listed}) (gold {_fmt(gold)})"
        )
    (value,) = found
    if value == exact:
        return Verification(True, f"answer {_fmt(gold)} is correct")
    return Verification(False, f"answer {value} is wrong (gold {_fmt(gold)})")


class QAEnv:
    """The tools of one run over the knowledge base, with simulated latency."""

    def __init__(self, kb: Mapping[Fact, int], latency_scale: float) -> None:
        self.kb = kb
        self.scale = latency_scale

    async def _wait(self, seconds: float) -> None:
        if self.scale > 0:
            await anyio.sleep(seconds * self.scale)

    def tools(self) -> list[Tool]:
        """``lookup``, ``add``, ``subtract`` and ``multiply``."""

        @tool
        async def lookup(entity: str, attribute: str) -> int:
            """Look up a numeric fact, e.g. the population of a place."""
            await self._wait(lookup_seconds((entity, attribute)))
            value = self.kb.get((entity, attribute))
            if value is None:
                raise ActionFailed(f"no fact known for the {attribute} of {entity}")
            return value

        @tool
        async def add(
            a: float,
            b: float,
            c: float | None = None,
            d: float | None = None,
            e: float | None = None,
        ) -> float:
            """Add two to five numbers."""
            await self._wait(ARITHMETIC_S)
            return number(sum(x for x in (a, b, c, d, e) if x is not None))

        @tool
        async def subtract(a: float, b: float) -> float:
            """Subtract b from a."""
            await self._wait(ARITHMETIC_S)
            return number(a - b)

        @tool
        async def multiply(a: float, b: float, c: float | None = None) -> float:
            """Multiply two or three numbers."""
            await self._wait(ARITHMETIC_S)
            return number(combine("product", [x for x in (a, b, c) if x is not None]))

        return [lookup, add, subtract, multiply]


def make_kb(rng: random.Random) -> dict[Fact, int]:
    """A fictional knowledge base: entities with four numeric attributes each."""
    names: set[str] = set()
    while len(names) < ENTITIES:
        parts = rng.choices(SYLLABLES, k=rng.randint(2, 3))
        names.add("".join(parts).capitalize())
    kb: dict[Fact, int] = {}
    for name in sorted(names):
        for attribute in rng.sample(ATTRIBUTES, 4):
            kb[(name, attribute)] = rng.randint(10, 999)
    return kb


def make_expr(depth: int, width: int, rng: random.Random, facts: list[Fact]) -> Expr:
    """An expression of exactly ``depth`` levels whose top has ``width`` children."""
    if depth == 0:
        return Expr("lookup", fact=facts.pop())
    op = (
        "sum"
        if width > 2
        else rng.choice(("sum", "difference", "product" if depth == 1 else "sum"))
    )
    kids = [make_expr(depth - 1, 2, rng, facts)]
    for _ in range(width - 1):
        kids.append(make_expr(depth - 1 if rng.random() < 0.35 else 0, 2, rng, facts))
    rng.shuffle(kids)
    return Expr(op, tuple(kids))


class ParallelQA(Suite):
    """ParallelQA-style questions: fan-out 2-5, depth 1-3, lookups that take time."""

    name = "parallel_qa"
    description = (
        "synthetic: ParallelQA-style lookups and arithmetic over a generated fictional KB, "
        "fan-out 2-5, depth 1-3; one integer answer, compared exactly"
    )

    def generate(self, count: int, seed: int = 0) -> list[BenchTask]:
        """``count`` questions over one knowledge base made from ``seed``."""
        rng = random.Random(f"parallel_qa:{seed}")
        kb = MappingProxyType(make_kb(rng))
        all_facts = sorted(kb)
        tasks = []
        for index in range(count):
            depth, width = rng.randint(1, 3), rng.randint(2, 5)
            facts = rng.sample(all_facts, 24)
            expr = make_expr(depth, width, rng, facts)
            gold = evaluate(expr, {f: float(v) for f, v in kb.items()})
            params = {
                "depth": depth,
                "fan_out": width,
                "lookups": len(expr.leaves()),
                "operations": len(expr.nodes()),
            }
            instance = QAInstance(expr, gold, kb)
            goal = question_text(expr)
            tasks.append(self.task(seed, index, goal, params, instance, critical_path_s(expr)))
        return tasks

    def environment(self, task: BenchTask, *, latency_scale: float = 1.0) -> TaskEnv:
        """Tools over the knowledge base; the verifier checks the final answer."""
        instance: QAInstance = task.data
        return TaskEnv(
            goal=task.goal,
            tools=QAEnv(instance.kb, latency_scale).tools(),
            verify=lambda answer: check_answer(answer, instance.answer),
        )

    def oracle(self) -> ParallelQAOracle:
        """The ParallelQA oracle."""
        return ParallelQAOracle()
