"""STRIPS PDDL, as much as PlanBench's Blocksworld needs: domains, problems and a plan validator.

:func:`parse_domain` and :func:`parse_problem` read untyped STRIPS PDDL (``:requirements
:strips``): actions with parameters, a conjunction of positive preconditions and a conjunction
of effects, some negated. :func:`validate_plan` is the validator: it executes a plan from the
problem's initial state, checking every action's preconditions against the state before it and
applying its effects (deletes first, then adds, as PDDL has it), then checks the goal. It
answers what VAL answers for such domains, with the first precondition that fails.

>>> domain = parse_domain(
...     "(define (domain d) (:action go :parameters (?x) :precondition (at ?x)"
...     " :effect (and (done ?x) (not (at ?x)))))"
... )
>>> problem = parse_problem(
...     "(define (problem p) (:domain d) (:objects a) (:init (at a)) (:goal (and (done a))))"
... )
>>> validate_plan(domain, problem, [("go", ("a",))]).ok
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeAlias

from hierplan.bench.base import ActionFailed
from hierplan.scenarios.base import Verification

Atom = tuple[str, ...]
"""A ground or lifted atom: its predicate, then its arguments, e.g. ``("on", "a", "b")``."""

GroundAction = tuple[str, tuple[str, ...]]
"""An action of a plan: the operator's name and its arguments, e.g. ``("stack", ("a", "b"))``."""

SExpr: TypeAlias = "str | list[SExpr]"


class PDDLError(ValueError):
    """PDDL this reader does not understand (or that is malformed)."""


def tokens(text: str) -> list[str]:
    """Parentheses and words of ``text``, lower-cased (PDDL is case-insensitive), comments
    (``;`` to the end of the line) left out."""
    text = re.sub(r";[^\n]*", "", text).lower()
    return re.findall(r"[()]|[^\s()]+", text)


def parse_sexpr(text: str) -> SExpr:
    """The one s-expression of ``text``, as nested lists of words."""
    stack: list[list[SExpr]] = [[]]
    for token in tokens(text):
        if token == "(":
            stack.append([])
        elif token == ")":
            if len(stack) == 1:
                raise PDDLError("a ')' closes nothing")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(token)
    if len(stack) != 1:
        raise PDDLError(f"{len(stack) - 1} '(' left open")
    if len(stack[0]) != 1:
        raise PDDLError(f"expected one expression, found {len(stack[0])}")
    return stack[0][0]


def _atom(expr: SExpr) -> Atom:
    if not isinstance(expr, list) or not expr or not all(isinstance(w, str) for w in expr):
        raise PDDLError(f"not an atom: {render(expr)}")
    return tuple(str(w) for w in expr)


def _conjunction(expr: SExpr) -> list[SExpr]:
    """The parts of ``(and ...)``, or ``[expr]`` for a single literal."""
    if isinstance(expr, list) and expr and expr[0] == "and":
        return list(expr[1:])
    return [expr]


def _literals(expr: SExpr) -> tuple[tuple[Atom, ...], tuple[Atom, ...]]:
    """The positive and the negated atoms of a conjunction."""
    positive: list[Atom] = []
    negative: list[Atom] = []
    for part in _conjunction(expr):
        if isinstance(part, list) and part and part[0] == "not":
            if len(part) != 2:
                raise PDDLError(f"(not ...) takes one atom: {render(part)}")
            negative.append(_atom(part[1]))
        else:
            positive.append(_atom(part))
    return tuple(positive), tuple(negative)


def render(expr: SExpr | Atom) -> str:
    """An s-expression or an atom as PDDL text, e.g. ``(on a b)``."""
    if isinstance(expr, str):
        return expr
    return "(" + " ".join(render(e) for e in expr) + ")"


def _names(words: Sequence[SExpr]) -> tuple[str, ...]:
    """Object or parameter names, any ``- type`` annotations left out."""
    out: list[str] = []
    skip = False
    for word in words:
        if not isinstance(word, str):
            raise PDDLError(f"expected a name, found {render(word)}")
        if word == "-":
            skip = True
        elif skip:
            skip = False
        else:
            out.append(word)
    return tuple(out)


@dataclass(slots=True, frozen=True)
class Operator:
    """A STRIPS action schema: its parameters, preconditions, and the atoms it adds and deletes."""

    name: str
    parameters: tuple[str, ...]
    precondition: tuple[Atom, ...]
    add: tuple[Atom, ...]
    delete: tuple[Atom, ...]

    def bind(self, args: Sequence[str]) -> Mapping[str, str]:
        """Each parameter's argument (:class:`ActionFailed` if the count is wrong)."""
        if len(args) != len(self.parameters):
            raise ActionFailed(
                f"({self.name} {' '.join(args)}) takes {len(self.parameters)} argument(s), "
                f"got {len(args)}"
            )
        return dict(zip(self.parameters, args, strict=True))


def _ground(atom: Atom, binding: Mapping[str, str]) -> Atom:
    return (atom[0], *(binding.get(a, a) for a in atom[1:]))


@dataclass(slots=True, frozen=True)
class Domain:
    """A STRIPS domain: its name and its operators by name."""

    name: str
    operators: Mapping[str, Operator]


@dataclass(slots=True, frozen=True)
class Problem:
    """A STRIPS problem: its objects, initial state and goal (a conjunction of atoms)."""

    name: str
    domain: str
    objects: tuple[str, ...]
    init: frozenset[Atom]
    goal: tuple[Atom, ...]


def _sections(expr: SExpr, kind: str) -> tuple[str, list[list[SExpr]]]:
    """The name of a ``(define (<kind> name) ...)`` and its sections."""
    if not isinstance(expr, list) or len(expr) < 2 or expr[0] != "define":
        raise PDDLError(f"expected (define ({kind} ...) ...)")
    head = expr[1]
    if not isinstance(head, list) or len(head) != 2 or head[0] != kind:
        raise PDDLError(f"expected ({kind} <name>) after define")
    sections = [s for s in expr[2:] if isinstance(s, list) and s]
    return str(head[1]), sections


def _operator(section: list[SExpr]) -> Operator:
    name = section[1]
    if not isinstance(name, str):
        raise PDDLError(f"an action needs a name: {render(section)}")
    keys = dict(zip(section[2::2], section[3::2], strict=False))
    parameters = keys.get(":parameters", [])
    if not isinstance(parameters, list):
        raise PDDLError(f"(:action {name}): :parameters must be a list")
    pre, negated = _literals(keys.get(":precondition", ["and"]))
    if negated:
        raise PDDLError(f"(:action {name}): negative preconditions are not STRIPS")
    add, delete = _literals(keys.get(":effect", ["and"]))
    return Operator(name, _names(parameters), pre, add, delete)


def parse_domain(text: str) -> Domain:
    """The STRIPS domain ``text`` defines."""
    name, sections = _sections(parse_sexpr(text), "domain")
    operators = {}
    for section in sections:
        if section[0] == ":action":
            op = _operator(section)
            operators[op.name] = op
    if not operators:
        raise PDDLError(f"domain {name} defines no action")
    return Domain(name, MappingProxyType(operators))


def parse_problem(text: str) -> Problem:
    """The STRIPS problem ``text`` defines."""
    name, sections = _sections(parse_sexpr(text), "problem")
    found: dict[str, list[SExpr]] = {str(s[0]): s[1:] for s in sections}
    missing = [k for k in (":domain", ":init", ":goal") if k not in found]
    if missing:
        raise PDDLError(f"problem {name} has no {', '.join(missing)}")
    (goal_expr,) = found[":goal"] or [["and"]]
    goal, negated = _literals(goal_expr)
    if negated:
        raise PDDLError(f"problem {name}: negative goals are not supported")
    return Problem(
        name=name,
        domain=str(found[":domain"][0]),
        objects=_names(found.get(":objects", [])),
        init=frozenset(_atom(a) for a in found[":init"]),
        goal=goal,
    )


def apply(
    domain: Domain, objects: Iterable[str], state: frozenset[Atom], action: GroundAction
) -> frozenset[Atom]:
    """The state after ``action``; :class:`ActionFailed` names what does not hold."""
    name, args = action
    text = render((name, *args))
    op = domain.operators.get(name)
    if op is None:
        raise ActionFailed(f"{text}: no action {name!r} (actions: {', '.join(domain.operators)})")
    known = set(objects)
    for arg in args:
        if arg not in known:
            raise ActionFailed(f"{text}: no object {arg!r} (objects: {', '.join(sorted(known))})")
    binding = op.bind(args)
    for atom in op.precondition:
        ground = _ground(atom, binding)
        if ground not in state:
            raise ActionFailed(f"{text}: precondition {render(ground)} does not hold")
    deleted = state - {_ground(a, binding) for a in op.delete}
    return deleted | {_ground(a, binding) for a in op.add}


def validate_plan(domain: Domain, problem: Problem, plan: Sequence[GroundAction]) -> Verification:
    """Execute ``plan`` from the problem's initial state: every precondition, then the goal."""
    state = problem.init
    for i, action in enumerate(plan, 1):
        try:
            state = apply(domain, problem.objects, state, action)
        except ActionFailed as exc:
            return Verification(False, f"action {i} is invalid: {exc}")
    missing = [render(a) for a in problem.goal if a not in state]
    if missing:
        return Verification(
            False, f"goal not reached after {len(plan)} actions; missing: {', '.join(missing)}"
        )
    return Verification(True, f"goal reached in {len(plan)} valid actions")


def parse_plan(text: str) -> list[GroundAction]:
    """A plan written one action a line as PlanBench writes them: ``(unstack b c)``."""
    plan: list[GroundAction] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        expr = parse_sexpr(line)
        atom = _atom(expr)
        plan.append((atom[0], atom[1:]))
    return plan
