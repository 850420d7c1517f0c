"""The compact plan format: a plan written one step a line, as a planner model writes it.

::

    1. lookup("Wenves", "rainfall")
    2. lookup(entity="Varnholt", attribute="rainfall")
    3. add($1, $2)
    4. task: summarise $3 for the report
    5. search(?) after 3: find the newest report on the figure
    6. goal(tools=["copy_rows"], tokens=4000): migrate the orders table
    left_out: the audit tables; the budget does not cover them

A line is ``ID. HEAD [after IDS][: TEXT]``. ``HEAD`` is a tool call with its arguments (JSON
values, positional in the order of the tool's parameters or ``name=value``), a tool with ``(?)``
(an executor chooses the arguments, following ``TEXT``), ``task`` (an executor does ``TEXT``
with the node's tools, or those of ``tools=[...]``) or ``goal`` (a sub-planner plans ``TEXT``;
``usd=`` and ``tokens=`` are its estimates). ``$ID`` in an argument or a text is the result of
an earlier step and makes the step depend on it (a bare ``$ID`` argument that names no step
above fails its line; text is quoted); ``after IDS`` adds dependencies that pass no result.
``left_out:`` and ``rationale:`` lines set those fields of the plan. Blank lines and Markdown
fences are skipped; anything else is an error naming its line.

The typed :class:`~hierplan.plans.plan.Plan` stays what the gate checks, a person reviews and
``run.json`` records: :func:`parse_compact` builds it (the goal is the node's, a direct call's
title and instruction are its line's head), :func:`render_compact` writes one back. The same
line parser reads a plan as it streams (:class:`CompactStream`).

>>> plan = parse_compact('1. lookup("A", "x")\\n2. add($1, 2)', goal="g",
...                      params={"lookup": ("entity", "attribute"), "add": ("a", "b")})
>>> [(s.id, s.tool, s.args, s.depends_on) for s in plan.steps]  # doctest: +NORMALIZE_WHITESPACE
[('1', 'lookup', {'entity': 'A', 'attribute': 'x'}, []),
 ('2', 'add', {'a': '$1', 'b': 2}, ['1'])]
>>> print(render_compact(plan, {"lookup": ("entity", "attribute"), "add": ("a", "b")}))
1. lookup("A", "x")
2. add($1, 2)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from hierplan.errors import PlanParseError, field_problems
from hierplan.plans.plan import REF_PATTERN, Plan, Step, ref_target, step_refs
from hierplan.plans.revision import DoneSteps

# The longest line read: a sub-goal's text may be long, a model looping on one line is cut here.
MAX_LINE_CHARS = 120_000
TITLE_CHARS = 80
KEYWORDS = ("task", "goal")
_STEP = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}?)\.\s+(\S.*)", re.S)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_PLAN_FIELD = re.compile(r"(left_out|left out|rationale)\s*:\s*(.*)", re.S | re.I)
_AFTER = re.compile(r"\s*after\s+([^:]*?)\s*(?::\s*|$)")
_OPTIONS = frozenset({"tools", "usd", "tokens"})
_DECODER = json.JSONDecoder(parse_constant=lambda name: _refuse(name))

Params = Mapping[str, Sequence[str]]


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def tool_params(specs: Sequence[Any]) -> dict[str, tuple[str, ...]]:
    """Each tool's parameter names in order, from specs with ``name`` and ``parameters`` (a
    JSON schema): what positional arguments are matched against."""
    out: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        props = spec.parameters.get("properties") if isinstance(spec.parameters, Mapping) else None
        out[spec.name] = tuple(props) if isinstance(props, Mapping) else ()
    return out


@dataclass(slots=True)
class _Cursor:
    """A position in one line's text, for the small recursive-descent reader below."""

    text: str
    pos: int = 0
    # The bare ``$ID`` arguments read (the ids as written): each must name a step above.
    refs: list[str] = field(default_factory=list)

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos : self.pos + 1]

    def take(self, char: str) -> bool:
        if self.peek() == char:
            self.pos += 1
            return True
        return False

    def name(self) -> str | None:
        self.skip()
        match = _NAME.match(self.text, self.pos)
        if match is None:
            return None
        self.pos = match.end()
        return match.group()


def _value(cur: _Cursor) -> Any:
    """One argument value: a bare ``$ID`` (kept as the string ``"$ID"``) or a JSON value."""
    cur.skip()
    if cur.text.startswith("$", cur.pos):
        match = REF_PATTERN.match(cur.text, cur.pos)
        if match is None:
            raise ValueError("a '$' must be followed by a step id")
        cur.pos = match.end()
        cur.refs.append(match.group(1))
        return match.group()
    try:
        value, cur.pos = _DECODER.raw_decode(cur.text, cur.pos)
    except json.JSONDecodeError as exc:
        raise ValueError(f"an argument is not a JSON value or $ref ({exc.msg})") from None
    except RecursionError:
        raise ValueError("an argument is nested too deeply to read") from None
    return value


def _arguments(cur: _Cursor) -> list[tuple[str | None, Any]]:
    """``name=value`` or ``value`` items up to the closing parenthesis (already past ``(``)."""
    items: list[tuple[str | None, Any]] = []
    if cur.take(")"):
        return items
    while True:
        start = cur.pos
        key = cur.name()
        if key is None or not cur.take("="):
            cur.pos, key = start, None
        items.append((key, _value(cur)))
        if cur.take(")"):
            return items
        if not cur.take(","):
            raise ValueError("arguments must be separated by ',' and end with ')'")


def _named(tool: str, items: list[tuple[str | None, Any]], params: Params | None) -> dict[str, Any]:
    """Arguments by name: positional ones take the tool's parameters in order."""
    out: dict[str, Any] = {}
    order = None if params is None else params.get(tool)
    for index, (key, value) in enumerate(items):
        if key is None:
            if order is None:
                raise ValueError(f"tool {tool!r} has no known parameters: write name=value")
            if index >= len(order):
                raise ValueError(f"tool {tool!r} takes at most {len(order)} argument(s)")
            key = order[index]
        if key in out:
            raise ValueError(f"argument {key!r} is given twice")
        out[key] = value
    return out


@dataclass(slots=True)
class _Head:
    """What a line's head says."""

    kind: str  # "call", "chosen" (tool(?)), "task", "goal"
    name: str
    args: dict[str, Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def _head(cur: _Cursor, params: Params | None) -> _Head:
    start = cur.pos
    name = cur.name()
    if name is None:
        raise ValueError("expected a tool call, 'task' or 'goal' after the step id")
    if not cur.take("("):
        if name in KEYWORDS:
            return _Head(name, name, source=name)
        raise ValueError(f"expected '(' after {name!r}: write {name}(arguments)")
    if name not in KEYWORDS and cur.take("?"):
        if not cur.take(")"):
            raise ValueError("expected ')' after '(?'")
        return _Head("chosen", name, source=cur.text[start : cur.pos])
    items = _arguments(cur)
    source = cur.text[start : cur.pos].strip()
    if name in KEYWORDS and cur.peek() in (":", "a"):
        options = _named(name, items, {name: ()})
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise ValueError(f"{name} takes tools=, usd= and tokens=, not {', '.join(unknown)}")
        return _Head(name, name, options=options, source=source)
    return _Head("call", name, args=_named(name, items, params), source=source)


@dataclass(slots=True)
class _Line:
    """One step line, read: its id, head, explicit dependencies and text."""

    step_id: str
    head: _Head
    after: list[str]
    text: str
    refs: list[str] = field(default_factory=list)


def _read_line(line: str, params: Params | None) -> _Line:
    match = _STEP.fullmatch(line)
    if match is None:
        raise ValueError("expected 'ID. tool(arguments)', 'ID. task: ...' or 'ID. goal: ...'")
    step_id, rest = match.groups()
    cur = _Cursor(rest)
    head = _head(cur, params)
    after: list[str] = []
    tail = _AFTER.match(rest, cur.pos)
    if tail is not None and rest[cur.pos :].lstrip().startswith("after "):
        after = [a for a in re.split(r"[\s,]+", tail.group(1)) if a]
        cur.pos = tail.end()
        text = rest[cur.pos :].strip()
    else:
        cur.skip()
        if cur.pos < len(rest) and not cur.take(":"):
            raise ValueError(f"unexpected {rest[cur.pos : cur.pos + 20]!r} after the step's head")
        text = rest[cur.pos :].strip()
    if head.kind != "call" and not text:
        raise ValueError(
            f"a {head.kind if head.kind != 'chosen' else 'tool(?)'} step needs ': text'"
        )
    return _Line(step_id, head, after, text, cur.refs)


def _text_refs(text: str, ids: Container[str]) -> list[str]:
    out: list[str] = []
    for token in REF_PATTERN.findall(text):
        target = ref_target(token, ids)
        if target is not None:
            out.append(target)
    return out


def _title(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= TITLE_CHARS else one[: TITLE_CHARS - 3] + "..."


def _step(line: _Line, earlier: Sequence[str]) -> Step:
    head = line.head
    order = {step_id: index for index, step_id in enumerate(earlier)}
    for token in line.refs:
        # A bare $ID is a reference, never text (text is quoted): one to no step above would
        # reach the tool as the string "$ID".
        if ref_target(token, order) is None:
            raise ValueError(
                f"${token} is no step above this line: write that step first, or quote the "
                "argument if it is text"
            )
    data: dict[str, Any] = {"id": line.step_id}
    if head.kind == "call":
        data.update(tool=head.name, args=head.args)
        data["instruction"] = line.text or head.source
        data["title"] = _title(head.source)
    else:
        data["instruction"] = line.text
        data["title"] = _title(line.text)
        if head.kind == "chosen":
            data["tool"] = head.name
        if "tools" in head.options:
            data["tools"] = head.options["tools"]
        if head.kind == "goal":
            data["kind"] = "subgoal"
            if "usd" in head.options:
                data["estimate_usd"] = head.options["usd"]
            if "tokens" in head.options:
                data["estimate_tokens"] = head.options["tokens"]
        elif set(head.options) - {"tools"}:
            raise ValueError("only a goal takes usd= and tokens=")
    probe = Step.model_construct(
        id=line.step_id, title="", instruction="", tool=data.get("tool"), args=data.get("args")
    )
    implied = sorted(step_refs(probe, order.keys()), key=order.__getitem__)
    implied += [r for r in _text_refs(line.text, order) if r not in implied]
    data["depends_on"] = list(dict.fromkeys([*implied, *line.after]))
    try:
        return Step.model_validate(data)
    except ValidationError as exc:
        raise ValueError(field_problems(exc, "step")) from None


def _clean(line: str) -> str | None:
    """The line to read, or ``None`` for one to skip (blank, a Markdown fence)."""
    stripped = line.strip()
    if not stripped or stripped.startswith("```"):
        return None
    return stripped


class CompactReader:
    """Reads compact plan lines one at a time: each step line becomes a :class:`Step` (its
    ``$ID`` references resolved against the steps before it), plan-level lines set the plan's
    fields. Raises :class:`PlanParseError` naming the line for anything it cannot read.

    ``done``: a revision's done steps, which its lines may refer to as steps above them and
    which the plan keeps (see :class:`~hierplan.plans.revision.DoneSteps`)."""

    def __init__(self, params: Params | None = None, done: DoneSteps | None = None) -> None:
        self.params = params
        self.done = done or DoneSteps()
        self.steps: list[Step] = []
        self.fields: dict[str, str] = {}
        self.lines = 0
        self._earlier = self.done.ids

    def read(self, line: str) -> Step | None:
        """Read one line; the step it holds, or ``None`` for a plan field or a skipped line."""
        self.lines += 1
        if len(line) > MAX_LINE_CHARS:
            raise PlanParseError(f"plan line {self.lines} is longer than {MAX_LINE_CHARS:,} chars")
        text = _clean(line)
        if text is None:
            return None
        plan_field = _PLAN_FIELD.fullmatch(text)
        if plan_field is not None:
            key = "rationale" if plan_field.group(1).lower() == "rationale" else "left_out"
            self.fields[key] = plan_field.group(2).strip()
            return None
        try:
            step = _step(_read_line(text, self.params), self._earlier)
        except (ValueError, RecursionError) as exc:
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise PlanParseError(f"plan line {self.lines} ({shown!r}): {exc}") from None
        self.steps.append(step)
        self._earlier.append(step.id)
        if self.done.steps:
            problem = self.done.redone_after_use(self.steps)
            if problem is not None:
                self.steps.pop()
                raise PlanParseError(f"plan line {self.lines}: {problem}")
        return step

    def plan(self, goal: str) -> Plan:
        """The plan read so far, for ``goal``."""
        if not self.steps:
            raise PlanParseError("the plan has no step lines ('1. tool(arguments)' ...)")
        try:
            return Plan(goal=goal, steps=self.done.merged(self.steps), **self.fields)
        except ValidationError as exc:
            raise PlanParseError(f"the plan does not fit: {field_problems(exc, 'plan')}") from None


def parse_compact(
    text: str, *, goal: str, params: Params | None = None, done: DoneSteps | None = None
) -> Plan:
    """The plan written in ``text`` (the compact format) for ``goal``; ``done``: a
    revision's done steps (see :class:`CompactReader`)."""
    reader = CompactReader(params, done)
    for line in text.split("\n"):  # as a stream splits it: only "\n" ends a line
        reader.read(line)
    return reader.plan(goal)


class CompactStream:
    """A compact plan read as its text arrives: :meth:`feed` returns the steps whose lines
    became complete, :meth:`close` reads a last line without a newline and returns the plan."""

    def __init__(
        self, goal: str, params: Params | None = None, done: DoneSteps | None = None
    ) -> None:
        self.goal = goal
        self.reader = CompactReader(params, done)
        self._pending = ""

    def feed(self, chunk: str) -> list[Step]:
        """Add ``chunk``; the steps of the lines it completes."""
        self._pending += chunk
        if len(self._pending) > MAX_LINE_CHARS and "\n" not in self._pending:
            raise PlanParseError(
                f"plan line {self.reader.lines + 1} is longer than {MAX_LINE_CHARS:,} chars"
            )
        *complete, self._pending = self._pending.split("\n")
        return [s for s in map(self.reader.read, complete) if s is not None]

    def close(self) -> tuple[list[Step], Plan]:
        """The steps of a last unterminated line, and the whole plan."""
        last = self.reader.read(self._pending) if self._pending.strip() else None
        self._pending = ""
        return ([] if last is None else [last]), self.reader.plan(self.goal)


def _json(value: Any, ids: Collection[str] = ()) -> str:
    if isinstance(value, str) and (match := REF_PATTERN.fullmatch(value)):
        if ref_target(match.group(1), ids) is not None:
            return value  # a reference, written bare
        return json.dumps(value, ensure_ascii=False)  # text that looks like one
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(str(value))  # not JSON: validation reports the step anyway
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _render_args(
    tool: str, args: Mapping[str, Any], params: Params | None, ids: Collection[str]
) -> str:
    order = tuple((params or {}).get(tool, ()))
    keys = tuple(args)
    if keys and order[: len(keys)] == keys:
        return ", ".join(_json(args[k], ids) for k in keys)
    return ", ".join(f"{k}={_json(v, ids)}" for k, v in args.items())


def render_step(
    step: Step, earlier: Sequence[str], params: Params | None = None, lost: Collection[str] = ()
) -> str:
    """One step as a compact line (``earlier``: the ids of the steps before it; ``lost``: see
    :func:`render_compact`)."""
    options: dict[str, Any] = {}
    if step.tools is not None:
        options["tools"] = step.tools
    above = set(earlier)
    direct = step.tool is not None and step.args is not None and step.kind == "task"
    if direct:
        assert step.tool is not None and step.args is not None
        refs = above.union(lost) if lost else above
        head = f"{step.tool}({_render_args(step.tool, step.args, params, refs)})"
        text = ""
    else:
        text = " ".join(step.instruction.split())
        if step.kind == "subgoal":
            options.update(usd=step.estimate_usd, tokens=step.estimate_tokens)
            name = "goal"
        else:
            name = "task" if step.tool is None else step.tool
        opts = ", ".join(f"{k}={_json(v)}" for k, v in options.items() if v is not None)
        head = f"{step.tool}(?)" if name == step.tool else f"{name}({opts})" if opts else name
    implied = step_refs(step, above) if direct else set()
    implied |= set(_text_refs(text, above))
    after = [d for d in step.depends_on if d not in implied]
    line = f"{step.id}. {head}"
    if after:
        line += " after " + ", ".join(after)
    return f"{line}: {text}" if text else line


def render_compact(
    plan: Plan,
    params: Params | None = None,
    *,
    skip: Collection[str] = (),
    lost: Collection[str] = (),
) -> str:
    """``plan`` in the compact format: what a planner writes for it (titles and the goal are
    not written; a direct call's instruction is not either). ``skip``: ids of steps not
    written (a revision's done steps, which the lines after them refer to). An argument
    ``"$ID"`` is written as a reference when ``ID`` is a step above, else quoted, as the text
    it is; ``lost``: ids of steps the plan lost, whose ``$ID`` is written as a reference all
    the same (what a planner that forgot to write a step writes)."""
    lines: list[str] = []
    ids: list[str] = []
    for step in plan.steps:
        if step.id not in skip:
            lines.append(render_step(step, ids, params, lost))
        ids.append(step.id)
    if plan.left_out:
        lines.append("left_out: " + " ".join(plan.left_out.split()))
    return "\n".join(lines)
