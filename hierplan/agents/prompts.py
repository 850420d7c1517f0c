"""The prompts planners and executors send, and their parsers.

Prompts are plain text with labelled sections (``GOAL:``, ``STEP:``, fenced JSON blocks), written
for real models. The offline simulator reads the same text back with the ``parse_*`` functions
here, so it answers the request a real provider would get, and the two cannot drift apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from hierplan.models.base import Message, OutputSchema, ToolSpec
from hierplan.plans.compact import parse_compact, render_compact, tool_params
from hierplan.plans.plan import Plan
from hierplan.plans.revision import carried_over

PLAN_OUTPUT_NAME = "plan"
PLAN_SCHEMA: dict[str, Any] = Plan.model_json_schema()
"""The typed plan's JSON schema: what plan files, ``run.json`` and ``hierplan validate`` hold."""
PLAN_OUTPUT: OutputSchema | None = None
"""The structured output a planning call asks for: none, since a planner writes its plan as
text in the compact format (:mod:`hierplan.plans.compact`), one step a line, which is shorter
than the plan's JSON and can be read line by line as it streams."""
FAILED_PREFIX = "FAILED:"
REPAIR_PREFIX = "REPAIR:"
"""How a planner's follow-up message starts when its last answer was not a valid plan."""
ATTEMPT_FAILED = "A direct attempt at this goal failed"
RUNNING_RESULT = "still running: its result comes when it ends"
"""A step's entry in a revision prompt's PROGRESS while the step still runs (a repair is asked
for as soon as a streamed plan stops, without waiting for its dispatched steps)."""
PLAN_REJECTED = "The reviewer rejected your last plan"
PLAN_INVALID = "Your last plan was invalid"
FAILURE_FEEDBACK = (ATTEMPT_FAILED, PLAN_REJECTED, PLAN_INVALID)
"""How the feedback of a planning prompt starts when it reports a failure of earlier work
(the simulator reads it back: a prompt that reports a failure is answered as after an error)."""

PLANNER_SYSTEM = """\
You are the planner of a hierarchical planner-executor agent. Write a plan for the goal, one step
a line, and nothing else:
1. lookup("Oslo", "population")
2. lookup(entity="Bergen", attribute="population")
3. add($1, $2)
4. task: write a one-line summary of $3
5. goal: migrate the orders table
Each line is "ID. HEAD", then optionally " after ID, ID" and ": TEXT". The HEAD is a tool call
with JSON arguments (in the order of the tool's args, or name=value), which runs the tool
directly; "TOOL(?)" with a TEXT, for an executor that chooses the arguments; "task" with a TEXT,
for an executor with the tools; or "goal" with a TEXT, a part big enough to be planned on its
own by a sub-planner. "task(tools=[...])" and "goal(tools=[...])" restrict the tools; a goal may
carry usd= or tokens=, your guess of what it will cost. "$ID" in an argument or a TEXT is the
result of the earlier step ID and makes this step wait for it; "after ID" waits for a step whose
result is not used. Steps that do not wait for each other run in parallel, so add only real
dependencies. The results of the steps no other step waits for are the answer. Use only the
tools listed. If a BUDGET is given, the plan must fit it; when it cannot do the whole goal, plan
the part that matters most and add a last line "left_out: what is left out, and why"."""

EXECUTOR_SYSTEM = """\
You are an executor of one step of a plan. Use the tools to do the step; call several tools at
once when they are independent. When the step is done, answer with a short result and no tool
calls. If you cannot do the step, answer with "FAILED: <reason>"."""

REACT_SYSTEM = """\
You are an agent that reaches a goal by thinking and acting with tools, one observation at a time.
Call tools as needed; call several at once when they are independent. When the goal is reached,
answer with the result and no tool calls. If you cannot reach it, answer "FAILED: <reason>"."""


@dataclass(slots=True, frozen=True)
class PlanBudget:
    """What a planner's node may still spend and what a call costs at least, as its prompt
    states them (``None``: not limited, or not known). ``left_*`` is what is left once this
    planning call's input is paid; ``answer_tokens`` is the most the budget lets this call
    write, and ``answer_usd`` what each token of it costs."""

    left_usd: float | None
    left_tokens: int | None
    planning_usd: float | None
    planning_tokens: int | None
    executor_usd: float | None
    executor_tokens: int | None
    answer_tokens: int
    answer_usd: float | None = None

    def fits(self, planning_calls: int, executor_calls: int, answer_tokens: int = 0) -> bool:
        """Whether that many sub-goals' planning calls and executor calls, after an answer of
        ``answer_tokens``, fit what is left."""
        for left, plan, execute, answer in (
            (self.left_usd, self.planning_usd, self.executor_usd, self.answer_usd),
            (self.left_tokens, self.planning_tokens, self.executor_tokens, 1),
        ):
            if left is None:
                continue
            need = (
                planning_calls * (plan or 0)
                + executor_calls * (execute or 0)
                + answer_tokens * (answer or 0)
            )
            if need > left:
                return False
        return True


@dataclass(slots=True)
class PlanPrompt:
    """What a planner prompt says; :func:`parse_plan_prompt` recovers it from the text."""

    goal: str
    depth: int
    max_depth: int
    max_steps: int
    tools: tuple[str, ...] = ()
    inputs: dict[str, str] = field(default_factory=dict)
    current_plan: dict[str, Any] | None = None
    tool_params: dict[str, tuple[str, ...]] = field(default_factory=dict)
    progress: dict[str, str] = field(default_factory=dict)
    failure: str | None = None
    feedback: str | None = None
    budget: PlanBudget | None = None

    @property
    def allow_subgoals(self) -> bool:
        """Whether this plan may contain sub-goals."""
        return self.depth < self.max_depth

    def carried(self, plan: Plan) -> list[str]:
        """Ids of the steps of ``plan`` a replan asked for by this prompt does not write: done
        steps of its current plan whose results stand in ``plan`` (none without one)."""
        if self.current_plan is None:
            return []
        return carried_over(Plan.model_validate(self.current_plan), plan, self.progress)


@dataclass(slots=True)
class StepPrompt:
    """What an executor prompt says; :func:`parse_step_prompt` recovers it."""

    instruction: str
    context: str = ""
    inputs: dict[str, str] = field(default_factory=dict)
    react: bool = False


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(text.split())


def _block(label: str, data: object) -> str:
    return f"{label}:\n```json\n{indented_json(data)}\n```"


def indented_json(data: object) -> str:
    """``json.dumps(data, indent=1, default=str)``, the text of a prompt's JSON block.

    An executor's inputs (step id to output text, the block every dependent step's prompt
    has) are written item by item with the C encoder, which ``json.dumps`` uses only without
    ``indent``: the same text in about half the time.
    """
    if type(data) is dict and all(type(k) is str and type(v) is str for k, v in data.items()):
        if not data:
            return "{}"
        dumps = json.dumps
        return "{\n" + ",\n".join(f" {dumps(k)}: {dumps(v)}" for k, v in data.items()) + "\n}"
    return json.dumps(data, indent=1, default=str)


def render_plan_prompt(p: PlanPrompt, tools: Sequence[ToolSpec]) -> tuple[Message, ...]:
    """Messages for a planning (or replanning) call."""
    tool_lines = [f"- {t.name}: {t.description} args={json.dumps(t.parameters)}" for t in tools]
    sub = "yes" if p.allow_subgoals else "no (use tasks only)"
    parts = [
        f"GOAL: {one_line(p.goal)}",
        f"DEPTH: {p.depth} of {p.max_depth}; sub-goals allowed: {sub}; at most {p.max_steps} steps",
        "TOOLS:\n" + ("\n".join(tool_lines) if tool_lines else "(none)"),
    ]
    if p.inputs:
        parts.append(_block("INPUTS", p.inputs))
    if p.current_plan is not None:
        current = Plan.model_validate(p.current_plan)
        parts.append(f"CURRENT PLAN:\n```\n{render_compact(current, tool_params(tools))}\n```")
        parts.append(_block("PROGRESS", p.progress))
        parts.append(
            "Revise the plan: write only the steps still to do. Steps in PROGRESS are done (or "
            f"{RUNNING_RESULT}) and keep their results: do not write them again, refer to them "
            "($ID) as to lines above. To redo a done step, write it again."
        )
    if p.budget is not None:
        parts.append(render_budget(p.budget))
    if p.failure:
        parts.append(f"FAILURE: {one_line(p.failure)}")
    if p.feedback:
        parts.append(f"FEEDBACK: {p.feedback}")
    return (Message("system", PLANNER_SYSTEM), Message("user", "\n\n".join(parts)))


def _amount(usd: float | None, tokens: int | None) -> str:
    parts = []
    if usd is not None:
        parts.append(f"${usd:.6f}")
    if tokens is not None:
        parts.append(f"{tokens:,} tokens")
    return " / ".join(parts) or "no limit"


def render_budget(b: PlanBudget) -> str:
    """The ``BUDGET:`` line of a planner prompt."""
    price = "" if b.answer_usd is None else f" at ${b.answer_usd * 1e6:.4f} per million"
    return (
        f"BUDGET: left {_amount(b.left_usd, b.left_tokens)}; "
        f"a sub-goal's planning call at least {_amount(b.planning_usd, b.planning_tokens)}; "
        f"an executor call at least {_amount(b.executor_usd, b.executor_tokens)}; "
        "a direct tool step (a tool and its args) nothing; "
        f"this answer at most {b.answer_tokens:,} tokens{price}. A plan whose least cost is "
        "more than what is left after this answer is refused: fewer sub-goals, direct tool "
        "steps and less depth cost less."
    )


_BUDGET = re.compile(
    r"^BUDGET: left (?P<left>[^;]+); a sub-goal's planning call at least (?P<plan>[^;]+); "
    r"an executor call at least (?P<exec>[^;]+); .*?this answer at most (?P<answer>[\d,]+) "
    r"tokens(?: at \$(?P<price>[\d.]+) per million)?",
    re.M,
)
_USD = re.compile(r"\$(\d+(?:\.\d+)?)")
_TOKENS = re.compile(r"([\d,]+) tokens")


def _parse_amount(text: str) -> tuple[float | None, int | None]:
    usd = _USD.search(text)
    tokens = _TOKENS.search(text)
    return (
        None if usd is None else float(usd.group(1)),
        None if tokens is None else int(tokens.group(1).replace(",", "")),
    )


def parse_budget(text: str) -> PlanBudget | None:
    """The :class:`PlanBudget` of a planner prompt's text, or ``None`` when it states none."""
    match = _BUDGET.search(text)
    if match is None:
        return None
    left = _parse_amount(match.group("left"))
    plan = _parse_amount(match.group("plan"))
    execute = _parse_amount(match.group("exec"))
    return PlanBudget(
        left_usd=left[0],
        left_tokens=left[1],
        planning_usd=plan[0],
        planning_tokens=plan[1],
        executor_usd=execute[0],
        executor_tokens=execute[1],
        answer_tokens=int(match.group("answer").replace(",", "")),
        answer_usd=None if match.group("price") is None else float(match.group("price")) / 1e6,
    )


def render_step_prompt(p: StepPrompt) -> tuple[Message, ...]:
    """Messages that start an executor's (or a ReAct agent's) tool loop."""
    parts = [("GOAL: " if p.react else "STEP: ") + one_line(p.instruction)]
    if p.context:
        parts.append(f"CONTEXT: {one_line(p.context)}")
    if p.inputs:
        parts.append(_block("INPUTS", p.inputs))
    system_text = REACT_SYSTEM if p.react else EXECUTOR_SYSTEM
    return (Message("system", system_text), Message("user", "\n\n".join(parts)))


_LINE: Mapping[str, re.Pattern[str]] = {
    "GOAL": re.compile(r"^GOAL: (.*)$", re.M),
    "STEP": re.compile(r"^STEP: (.*)$", re.M),
    "CONTEXT": re.compile(r"^CONTEXT: (.*)$", re.M),
    "FAILURE": re.compile(r"^FAILURE: (.*)$", re.M),
    "FEEDBACK": re.compile(r"^FEEDBACK: (.*)", re.M | re.S),
}
_LINE = MappingProxyType(_LINE)  # read-only: shared by every run
_DEPTH = re.compile(r"^DEPTH: (\d+) of (\d+); .*at most (\d+) steps$", re.M)
_TOOL = re.compile(r"^- ([^:\s]+): ", re.M)


def _json_block(text: str, label: str) -> Any:
    match = re.search(rf"^{label}:\n```json\n(.*?)\n```", text, re.M | re.S)
    return None if match is None else json.loads(match.group(1))


def _line(text: str, key: str) -> str | None:
    match = _LINE[key].search(text)
    return None if match is None else match.group(1)


def _user_text(messages: Sequence[Message]) -> str:
    for m in messages:
        if m.role == "user":
            return m.content
    return ""


def parse_plan_prompt(messages: Sequence[Message]) -> PlanPrompt | None:
    """Recover a :class:`PlanPrompt` from planner messages, or ``None`` if they are not one."""
    text = _user_text(messages)
    goal = _line(text, "GOAL")
    depth = _DEPTH.search(text)
    if goal is None or depth is None:
        return None
    tools_section = text.split("TOOLS:\n", 1)[1] if "TOOLS:\n" in text else ""
    tools_section = tools_section.split("\n\n", 1)[0]
    params = _tool_params(tools_section)
    feedback = _line(text, "FEEDBACK")
    return PlanPrompt(
        goal=goal,
        depth=int(depth.group(1)),
        max_depth=int(depth.group(2)),
        max_steps=int(depth.group(3)),
        tools=tuple(params),
        tool_params=params,
        inputs=_json_block(text, "INPUTS") or {},
        current_plan=_current_plan(text, goal, params),
        progress=_json_block(text, "PROGRESS") or {},
        failure=_line(text, "FAILURE"),
        feedback=None if feedback is None else feedback.strip(),
        budget=parse_budget(text),
    )


def _tool_params(section: str) -> dict[str, tuple[str, ...]]:
    """Each tool's parameter names, in order, from the TOOLS section (a tool's entry ends
    with its JSON schema, ``args={...}``, on one line)."""
    starts = list(_TOOL.finditer(section))
    out: dict[str, tuple[str, ...]] = {}
    for match, after in zip(starts, [*starts[1:], None], strict=False):
        entry = section[match.end() : None if after is None else after.start()]
        schema = entry.rstrip("\n").rpartition(" args=")[2]
        try:
            props = json.loads(schema).get("properties")
        except (ValueError, AttributeError):
            props = None
        out[match.group(1)] = tuple(props) if isinstance(props, dict) else ()
    return out


def _current_plan(
    text: str, goal: str, params: Mapping[str, Sequence[str]]
) -> dict[str, Any] | None:
    """The CURRENT PLAN block of a replanning prompt, as the plan's data."""
    match = re.search(r"^CURRENT PLAN:\n```\n(.*?)\n```", text, re.M | re.S)
    if match is None:
        return None
    plan = parse_compact(match.group(1), goal=goal, params=params)
    return plan.model_dump(mode="json", exclude_none=True)


def parse_step_prompt(messages: Sequence[Message]) -> StepPrompt | None:
    """Recover a :class:`StepPrompt` from executor messages, or ``None``."""
    text = _user_text(messages)
    step = _line(text, "STEP")
    react = False
    if step is None:
        step = _line(text, "GOAL")
        react = step is not None
    if step is None:
        return None
    return StepPrompt(
        instruction=step,
        context=_line(text, "CONTEXT") or "",
        inputs=_json_block(text, "INPUTS") or {},
        react=react,
    )


def reports_failure(messages: Sequence[Message], prompt: PlanPrompt) -> bool:
    """Whether a planning call's messages report a failure of earlier work: a failed step
    (``FAILURE:``), an answer to repair (``REPAIR:``), or feedback that a direct attempt
    failed or the last plan was rejected or invalid."""
    if prompt.failure is not None:
        return True
    if prompt.feedback is not None and prompt.feedback.startswith(FAILURE_FEEDBACK):
        return True
    return any(m.role == "user" and m.content.startswith(REPAIR_PREFIX) for m in messages)


def progress_summary(outputs: Mapping[str, str], limit: int = 500) -> dict[str, str]:
    """Step outputs for a replan prompt, each cut to ``limit`` characters."""
    return {k: (v if len(v) <= limit else v[:limit] + "...") for k, v in outputs.items()}


JOIN_SYSTEM = """\
You are the joiner of a planner-executor agent. The steps of a plan for the GOAL have run; their
RESULTS are given, and the DRAFT ANSWER the results of the last steps make. Decide whether the
results answer the goal. Answer with exactly one of these, and nothing else:
ANSWER: <the final answer to the goal, which may go on over further lines>
REPLAN: <one line: what is missing or wrong, for a revised plan>"""

JOIN_ANSWER = "ANSWER:"
JOIN_REPLAN = "REPLAN:"


@dataclass(slots=True)
class JoinPrompt:
    """What a joiner prompt says; :func:`parse_join_prompt` recovers it from the text.
    ``results`` are the finished steps' outputs by step id, ``draft`` the answer they make as
    it would stand without a joiner."""

    goal: str
    results: dict[str, str] = field(default_factory=dict)
    draft: str = ""


@dataclass(slots=True, frozen=True)
class JoinDecision:
    """A joiner's decision: ``answer`` (the final answer) or ``replan`` (with ``reason``)."""

    kind: str
    text: str

    @property
    def answers(self) -> bool:
        """Whether the joiner answered (rather than asked for a replan)."""
        return self.kind == "answer"


def render_join_prompt(p: JoinPrompt) -> tuple[Message, ...]:
    """Messages for a joiner call."""
    parts = [
        f"GOAL: {one_line(p.goal)}",
        _block("RESULTS", p.results),
        f"DRAFT ANSWER:\n```\n{p.draft}\n```",
    ]
    return (Message("system", JOIN_SYSTEM), Message("user", "\n\n".join(parts)))


def parse_join_prompt(messages: Sequence[Message]) -> JoinPrompt | None:
    """Recover a :class:`JoinPrompt` from joiner messages, or ``None`` if they are not one."""
    if not any(m.role == "system" and m.content == JOIN_SYSTEM for m in messages):
        return None
    text = _user_text(messages)
    goal = _line(text, "GOAL")
    if goal is None:
        return None
    draft = re.search(r"^DRAFT ANSWER:\n```\n(.*)\n```", text, re.M | re.S)
    return JoinPrompt(
        goal=goal,
        results=_json_block(text, "RESULTS") or {},
        draft="" if draft is None else draft.group(1),
    )


class JoinParseError(ValueError):
    """A joiner's answer is neither ``ANSWER: ...`` nor ``REPLAN: ...``."""


def parse_join_output(text: str) -> JoinDecision:
    """The decision in a joiner's answer: its first non-blank line starts with ``ANSWER:``
    (the answer is the rest of the text, which may span lines) or ``REPLAN:`` (the reason is
    that one line, and nothing may follow). Anything else raises :class:`JoinParseError`."""
    body = text.strip()
    if not body:
        raise JoinParseError("the joiner's answer is empty")
    head, _, rest = body.partition("\n")
    if head.startswith(JOIN_ANSWER):
        answer = (head[len(JOIN_ANSWER) :] + "\n" + rest).strip()
        if not answer:
            raise JoinParseError("ANSWER: holds no answer")
        return JoinDecision("answer", answer)
    if head.startswith(JOIN_REPLAN):
        reason = head[len(JOIN_REPLAN) :].strip()
        if not reason:
            raise JoinParseError("REPLAN: gives no reason")
        if rest.strip():
            raise JoinParseError("REPLAN: must be one line, with nothing after it")
        return JoinDecision("replan", reason)
    raise JoinParseError(
        f"the answer must start with {JOIN_ANSWER!r} or {JOIN_REPLAN!r}, not {head[:80]!r}"
    )
