"""LLMPlanner: a prompt in, a structured :class:`Plan` out; and replanning.

The planner asks its node's model for a plan in the compact format (:mod:`hierplan.plans.compact`:
one step a line), and reads it into the typed :class:`Plan`; a plan written as JSON is read too.
Output that does not parse gets one repair attempt with the error (naming the line) in the
prompt; if that fails too, :class:`PlanParseError` says what was wrong. A plan cut at the
max-tokens limit gets no repair (it would be cut again): the error names the limit to raise.
Semantic problems (cycles, unknown tools) are the gate's job; the node sends them back here as
``feedback``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from hierplan.agents.costs import planning_request, prompt_budget
from hierplan.agents.prompts import PLAN_OUTPUT as PLAN_OUTPUT
from hierplan.agents.prompts import PLAN_SCHEMA as PLAN_SCHEMA  # re-exported: where tests look
from hierplan.agents.prompts import (
    REPAIR_PREFIX,
    JoinDecision,
    JoinParseError,
    JoinPrompt,
    PlanPrompt,
    parse_join_output,
    progress_summary,
    render_join_prompt,
)
from hierplan.errors import PlanParseError, field_problems
from hierplan.models.base import Message, ModelRequest, ModelResponse
from hierplan.models.provider import json_problem, loads_json
from hierplan.plans.compact import CompactStream, Params, parse_compact, tool_params
from hierplan.plans.plan import Plan, Step
from hierplan.plans.revision import DoneSteps

if TYPE_CHECKING:
    from hierplan.core.views import StepEnv

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def parse_plan_output(
    response: ModelResponse,
    *,
    goal: str = "",
    params: Params | None = None,
    done: DoneSteps | None = None,
) -> Plan:
    """The plan in a response: its text in the compact format (the goal is ``goal``, positional
    arguments take the tools' ``params`` in order), or a plan as JSON: a structured ``output``
    or a JSON object in its text, as models asked for JSON and test doubles answer. ``done``:
    the done steps of the plan a replan revises, which the plan keeps (see
    :class:`~hierplan.plans.revision.DoneSteps`)."""
    data: Any = response.output
    if data is None:
        text = response.text.strip()
        if not text:
            raise PlanParseError("the response holds no plan (empty output)")
        if not _is_json(text):
            return parse_compact(text, goal=goal, params=params, done=done)
        fenced = _FENCE.search(text)
        if fenced:
            text = fenced.group(1).strip()
        elif "{" in text and "}" in text[text.index("{") :]:
            text = text[text.index("{") : text.rindex("}") + 1]
        try:
            data = loads_json(text)
        except ValueError as exc:
            raise PlanParseError(f"the plan is not valid JSON: {json_problem(exc)}") from None
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        problems = field_problems(exc, "plan")
        raise PlanParseError(f"the plan does not match the schema: {problems}") from None
    if done is None or not done.steps:
        return plan
    problem = done.redone_after_use(plan.steps)
    if problem is not None:
        raise PlanParseError(problem)
    return plan.model_copy(update={"steps": done.merged(plan.steps)})


_STEP_LINE = re.compile(r"^\s*[A-Za-z0-9_][A-Za-z0-9_.\-]*\.\s", re.M)


def _is_json(text: str) -> bool:
    """Whether ``text`` holds a plan as JSON rather than compact lines: it has no step line
    and a ``{``, or starts with ``{`` (after a Markdown fence, which models add to either)."""
    if _STEP_LINE.search(text) is None:
        return "{" in text
    body = text.partition("\n")[2] if text.startswith("```") else text
    return body.lstrip().startswith("{")


def no_plan_reason(response: ModelResponse) -> str | None:
    """Why a response holds no plan to read, or repair, when the provider says so: the model
    refused, or the provider's content filter stopped the answer."""
    if "refusal" in response.flags:
        said = response.text.strip()[:200]
        return f"the model refused to plan: {said}" if said else "the model refused to plan"
    if "content_filter" in response.flags or response.finish_reason == "content_filter":
        return "the provider's content filter stopped the plan"
    return None


# The finish reasons that say a reply stopped at its max-tokens limit: OpenAI's and most
# OpenAI-compatible servers' "length", Anthropic's "max_tokens" (its adapter maps it to "length",
# a model of another provider may not).
CUT_FINISH_REASONS = frozenset({"length", "max_tokens"})


def was_cut(response: ModelResponse) -> bool:
    """Whether the reply stopped at its max-tokens limit rather than where the model ended it."""
    return "truncated" in response.flags or response.finish_reason in CUT_FINISH_REASONS


def _cut(node: StepEnv, request: ModelRequest) -> PlanParseError:
    """The error of a plan cut at the token limit, naming the limit to raise."""
    return PlanParseError(
        f"the model's plan for node {node.path} was cut at the token limit "
        f"(planner_max_tokens={request.max_tokens}) before it was "
        "complete: raise it with --set planner_max_tokens=N "
        "(RunSettings.planner_max_tokens), or the node's budget if it lowered it"
    )


def _repair_request(
    request: ModelRequest, said: str, exc: PlanParseError, purpose: str, path: str
) -> ModelRequest:
    """``request`` again, with what the model ``said`` and why it did not read."""
    return ModelRequest(
        messages=(
            *request.messages,
            Message("assistant", said),
            Message(
                "user",
                f"{REPAIR_PREFIX} that plan was invalid: {exc}. Answer again with the "
                "corrected plan only, one step a line.",
            ),
        ),
        output_schema=request.output_schema,
        max_tokens=request.max_tokens,
        phase="planning",
        node_path=path,
        purpose=f"{purpose}-repair",
    )


class _Reading:
    """A streamed plan as read so far: its text, its lines, whether it is JSON (told by its
    first non-blank character) and, once it ends, whether a repair may help (``readable``: a
    refusal or a cut is not repaired, a line that does not read is)."""

    def __init__(self, lines: CompactStream) -> None:
        self.lines = lines
        self.text = ""
        self.json: bool | None = None
        self.readable = True

    def feed(self, delta: str) -> Iterator[Step]:
        """The steps whose lines ``delta`` completes, one line at a time: a step is taken
        before a later line of the same delta is read (and perhaps refused)."""
        self.text += delta
        if self.json is None:
            if not self.text.strip():
                return
            self.json = self.text.lstrip().startswith("{")
            delta = self.text
        if self.json:
            return
        for line in delta.splitlines(keepends=True):
            yield from self.lines.feed(line)


@dataclass(frozen=True, slots=True)
class Revising:
    """What a replan revises: the running ``plan``, the results of its done steps
    (``progress``) and what failed."""

    plan: Plan
    progress: Mapping[str, str]
    failure: str | None = None
    whole: bool = True
    """Whether ``plan`` is whole: a plan cut short while it was written answers with none of
    its done steps."""

    @property
    def done(self) -> DoneSteps:
        """The done steps the revision keeps."""
        return DoneSteps.of(self.plan, self.progress, answers=self.whole)

    def ask(self, prompt: PlanPrompt) -> None:
        """Make ``prompt`` a replanning prompt: the current plan, progress and failure."""
        prompt.current_plan = self.plan.model_dump(mode="json", exclude_none=True)
        prompt.progress = progress_summary(self.progress)
        prompt.failure = self.failure


class LLMPlanner:
    """Plans and replans a node's goal with the node's model."""

    def __init__(self, *, repair_attempts: int = 1) -> None:
        # Fewer than none would ask the model nothing and fail with no reason at all.
        if repair_attempts < 0:
            raise ValueError(f"repair_attempts must be 0 or more, not {repair_attempts}")
        self.repair_attempts = repair_attempts

    async def plan(
        self,
        node: StepEnv,
        *,
        inputs: Mapping[str, str] | None = None,
        feedback: str | None = None,
        flat: bool = False,
    ) -> Plan:
        """A first plan for the node's goal. ``flat`` forbids sub-goals."""
        return await self._ask(node, self._prompt(node, inputs, feedback, flat), "plan")

    async def replan(
        self,
        node: StepEnv,
        plan: Plan,
        progress: Mapping[str, str],
        failure: str | None,
        *,
        inputs: Mapping[str, str] | None = None,
        feedback: str | None = None,
        flat: bool = False,
        whole: bool = True,
    ) -> Plan:
        """A revised plan given what is done (``progress``) and what failed (``failure``). The
        planner writes only what is left to do; the done steps it builds on are kept (see
        :class:`~hierplan.plans.revision.DoneSteps`), and so are those ``plan`` answered with
        when it is ``whole`` (not cut short while it was written)."""
        prompt = self._prompt(node, inputs, feedback, flat)
        revising = Revising(plan, progress, failure, whole)
        revising.ask(prompt)
        return await self._ask(node, prompt, "replan", revising.done)

    async def stream_plan(
        self,
        node: StepEnv,
        accept: Callable[[Step], None],
        *,
        inputs: Mapping[str, str] | None = None,
        flat: bool = False,
        revising: Revising | None = None,
    ) -> Plan:
        """A plan for the node's goal, read as the model writes it: ``accept`` gets each
        step as soon as its line is complete, and raises to refuse it. A refused step, or a
        line that does not read, closes the stream, which cancels the call (it counts for what
        it wrote). A line that does not read before any step was accepted gets the repair
        attempts :meth:`plan` gives; otherwise the error propagates. A plan written as JSON is
        read once it is whole, then its steps go to ``accept`` in order.

        ``revising``: a replan of that plan, as :meth:`replan` asks for it; ``accept`` gets the
        lines written (the steps still to do; for a plan written as JSON, the done steps kept
        too, which it knows as done) and the plan returned keeps the done steps."""
        tools = node.tool_specs()
        prompt = self._prompt(node, inputs, None, flat)
        done: DoneSteps | None = None
        purpose = "plan"
        if revising is not None:
            revising.ask(prompt)
            done, purpose = revising.done, "replan"
        await prompt_budget(node, prompt, tools)
        max_tokens = node.settings.planner_max_tokens
        request = planning_request(
            prompt, tools, PLAN_OUTPUT, max_tokens, path=node.path, purpose=purpose
        )
        params = tool_params(tools)
        accepted = 0

        def counted(step: Step) -> None:
            nonlocal accepted
            accept(step)
            accepted += 1

        for attempt in range(self.repair_attempts + 1):
            reading = _Reading(CompactStream(node.goal, params, done))
            try:
                return await self._stream_once(node, request, reading, counted)
            except PlanParseError as exc:
                if not reading.readable or accepted:
                    raise
                if attempt == self.repair_attempts:
                    raise PlanParseError(
                        f"the model's plan for node {node.path} was invalid after "
                        f"{attempt + 1} attempt(s): {exc}"
                    ) from None
                request = _repair_request(request, reading.text, exc, purpose, node.path)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _stream_once(
        self,
        node: StepEnv,
        request: ModelRequest,
        reading: _Reading,
        accept: Callable[[Step], None],
    ) -> Plan:
        """One streamed planning call read into ``reading`` (see :meth:`stream_plan`)."""
        response: ModelResponse | None = None
        async with aclosing(node.stream_model(request)) as items:
            async for item in items:
                if isinstance(item, ModelResponse):
                    response = item
                else:
                    for step in reading.feed(item):
                        accept(step)
        assert response is not None  # a stream with no answer raised ModelError
        stopped = no_plan_reason(response)
        if stopped is not None:
            reading.readable = False
            raise PlanParseError(f"no plan for node {node.path}: {stopped}")
        try:
            # JSON, or nothing written, or a structured output (which wins over text, as in a
            # whole call, unless its text already gave steps)
            whole = response.output is not None and not reading.lines.reader.steps
            if reading.json is not False or whole:
                reading.text = response.text
                reader = reading.lines.reader
                plan = parse_plan_output(
                    response, goal=node.goal, params=reader.params, done=reader.done
                )
                steps = plan.steps  # with the done steps kept: ``accept`` knows them
            else:
                steps, plan = reading.lines.close()
        except PlanParseError:
            if was_cut(response):
                # As in a whole call: a repair would be cut at the same place.
                reading.readable = False
                raise _cut(node, request) from None
            raise
        for step in steps:
            accept(step)
        return plan

    async def join(self, node: StepEnv, results: Mapping[str, str], draft: str) -> JoinDecision:
        """The joiner's decision on the node's finished steps: answer the goal, or replan.
        One planning-phase call (purpose ``join``); an answer that does not read gets the
        repair attempts a plan gets, then :class:`JoinParseError` says what was wrong. Budget
        refusals and model errors propagate, as for any call."""
        prompt = JoinPrompt(goal=node.goal, results=progress_summary(results), draft=draft)
        request = ModelRequest(
            messages=render_join_prompt(prompt),
            max_tokens=node.settings.planner_max_tokens,
            phase="planning",
            node_path=node.path,
            purpose="join",
        )
        for attempt in range(self.repair_attempts + 1):
            response = await node.call_model(request)
            try:
                return parse_join_output(response.text)
            except JoinParseError as exc:
                if attempt == self.repair_attempts or was_cut(response):
                    raise JoinParseError(
                        f"the joiner's answer for node {node.path} did not read after "
                        f"{attempt + 1} attempt(s): {exc}"
                    ) from None
                request = ModelRequest(
                    messages=(
                        *request.messages,
                        Message("assistant", response.text),
                        Message(
                            "user",
                            f"{REPAIR_PREFIX} that answer did not read: {exc}. Answer again "
                            "with one ANSWER: or REPLAN: only.",
                        ),
                    ),
                    max_tokens=request.max_tokens,
                    phase="planning",
                    node_path=node.path,
                    purpose="join-repair",
                )
        raise AssertionError("unreachable")  # pragma: no cover

    def _prompt(
        self,
        node: StepEnv,
        inputs: Mapping[str, str] | None,
        feedback: str | None,
        flat: bool,
    ) -> PlanPrompt:
        settings = node.settings
        return PlanPrompt(
            goal=node.goal,
            depth=node.depth,
            max_depth=node.depth if flat else settings.max_depth,
            max_steps=settings.max_steps,
            inputs=progress_summary(inputs or {}),
            feedback=feedback,
        )

    async def _ask(
        self, node: StepEnv, prompt: PlanPrompt, purpose: str, done: DoneSteps | None = None
    ) -> Plan:
        tools = node.tool_specs()
        await prompt_budget(node, prompt, tools)
        request = planning_request(
            prompt,
            tools,
            PLAN_OUTPUT,
            node.settings.planner_max_tokens,
            path=node.path,
            purpose=purpose,
        )
        for attempt in range(self.repair_attempts + 1):
            response = await node.call_model(request)
            stopped = no_plan_reason(response)
            if stopped is not None:
                # Asked again, the model refuses again: the node fails with the reason, where a
                # repair prompt would report the refusal as JSON that does not parse.
                raise PlanParseError(f"no plan for node {node.path}: {stopped}")
            try:
                params = tool_params(tools)
                return parse_plan_output(response, goal=node.goal, params=params, done=done)
            except PlanParseError as exc:
                if was_cut(response):
                    # A repair, asked with the same max_tokens, would be cut at the same place
                    # and paid in full: the node fails now, naming the limit to raise.
                    raise _cut(node, request) from None
                if attempt == self.repair_attempts:
                    raise PlanParseError(
                        f"the model's plan for node {node.path} was invalid after "
                        f"{attempt + 1} attempt(s): {exc}"
                    ) from None
                said = response.text or json.dumps(response.output, default=str)
                request = _repair_request(request, said, exc, purpose, node.path)
        raise AssertionError("unreachable")  # pragma: no cover
