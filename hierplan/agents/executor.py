"""Executors: :class:`ToolExecutor` calls a step's tool directly; :class:`LLMExecutor` runs a
bounded tool-calling loop with the node's model.

Both take the outputs of the step's dependencies as ``inputs``. A string argument (or a string in
a list or object argument) that is exactly ``$<id>`` becomes that dependency's raw output;
``$<id>`` inside a longer string becomes its text.
Tool failures inside an LLM loop go back to the model as the tool's result so that it can
recover; a final answer starting with ``FAILED:``, or an empty one, fails the step.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from hierplan.agents.prompts import FAILED_PREFIX, StepPrompt, render_step_prompt
from hierplan.core.results import StepResult
from hierplan.errors import (
    HierplanError,
    ModelAuthError,
    StepFailed,
    ToolBlocked,
    ToolError,
    ToolNotAllowedError,
    ToolServerGone,
    UnexpectedModelCall,
)
from hierplan.models.base import Message, ModelRequest, ModelResponse, ToolCall
from hierplan.plans.plan import REF_PATTERN, Step, ref_target
from hierplan.tools.base import result_text

if TYPE_CHECKING:
    from hierplan.core.views import StepEnv


def resolve_refs(args: Mapping[str, Any], inputs: Mapping[str, StepResult]) -> dict[str, Any]:
    """Replace ``$<id>`` references in string arguments by dependency outputs.

    An argument that is one reference and nothing else gets the dependency's output itself
    (a list stays a list); a reference inside text gets its text, all of it. Strings inside list and
    object arguments (``["$a", "$b"]``) are replaced the same way. ``$`` followed by anything
    but a dependency's id ("$100") is left as it is.
    """
    return {key: _resolve(value, inputs) for key, value in args.items()}


def uses_refs(value: Any, inputs: Mapping[str, StepResult]) -> bool:
    """Whether ``value`` (arguments, or one of them) refers to one of ``inputs`` anywhere."""
    if isinstance(value, str):
        return "$" in value and any(
            ref_target(token, inputs) is not None for token in REF_PATTERN.findall(value)
        )
    if isinstance(value, list | tuple):
        return any(uses_refs(item, inputs) for item in value)
    if isinstance(value, Mapping):
        return any(uses_refs(item, inputs) for item in value.values())
    return False


def _resolve(value: Any, inputs: Mapping[str, StepResult]) -> Any:
    if isinstance(value, str):
        if "$" not in value:
            return value
        whole = REF_PATTERN.fullmatch(value)
        if whole and whole.group(1) in inputs:
            return inputs[whole.group(1)].output
        return REF_PATTERN.sub(lambda m: _ref_text(m.group(1), inputs), value)
    if isinstance(value, list):
        return [_resolve(item, inputs) for item in value]
    if isinstance(value, dict):
        return {key: _resolve(item, inputs) for key, item in value.items()}
    return value


def _ref_text(token: str, inputs: Mapping[str, StepResult]) -> str:
    target = ref_target(token, inputs)
    if target is None:
        return "$" + token
    # The whole output, not the step's text, which is cut to what a model should read: a
    # tool given "Report:\n$draft" must get all of the draft.
    output = inputs[target].output
    text = output if isinstance(output, str) else result_text(output, limit=sys.maxsize)
    return text + token[len(target) :]  # the punctuation after the reference


def unusable_answer(response: ModelResponse, max_tokens: int) -> str | None:
    """Why an answer cannot be taken as the step's result, or ``None`` when it can: a refusal,
    an answer the provider's content filter stopped, or one cut at the token limit (an empty
    answer too, when a reasoning model spent the whole limit thinking). Not retried: the same
    request would end the same way; the planner gets the reason."""
    flags = response.flags
    if "refusal" in flags:
        return f"the model refused the step: {response.text.strip()[:200]}"
    if "content_filter" in flags or response.finish_reason == "content_filter":
        return "the provider's content filter stopped the answer"
    if "truncated" in flags or response.finish_reason == "length":
        return (
            f"the answer was cut at the token limit (executor_max_tokens={max_tokens}, or less "
            "where the node's budget lowered it): raise executor_max_tokens or the budget"
        )
    return None


def distinct_call_ids(calls: Sequence[ToolCall], turn: int) -> tuple[ToolCall, ...]:
    """``calls`` with an id of their own each: a call without an id, or with the id of an
    earlier call of the same turn (some OpenAI-compatible servers give parallel calls one id),
    gets ``call_<turn>_<index>``. Otherwise the replies could not say which result is whose."""
    given = {c.id for c in calls}  # a new id must not take one a later call holds
    seen: set[str] = set()
    out: list[ToolCall] = []
    for index, call in enumerate(calls):
        if not call.id or call.id in seen:
            new_id = f"call_{turn}_{index}"
            while new_id in seen or new_id in given:
                new_id += "_"
            call = ToolCall(new_id, call.name, call.arguments)
        seen.add(call.id)
        out.append(call)
    return tuple(out)


class ToolExecutor:
    """Runs a step's tool with the plan's arguments; no model call (a refused call is decided
    again by :class:`DecidedCall`)."""

    async def execute(
        self,
        node: StepEnv,
        tool_name: str,
        args: Mapping[str, Any],
        inputs: Mapping[str, StepResult],
    ) -> StepResult:
        """Call the tool; raise :class:`ToolError` subclasses on failure."""
        target = node.tool(tool_name)
        references = uses_refs(args, inputs)
        output = await node.call_tool(
            target,
            resolve_refs(args, inputs),
            f"{node.path}:1",
            references=references,
            planned=None if references else args,
        )
        return StepResult(output, result_text(output))


def may_decide_again(error: ToolError) -> bool:
    """Whether a plan's tool call that failed with ``error`` may be decided again: a failure
    that trying again would not cure, from a tool that is there and allowed (a server gone
    or a tool the node may not call would refuse any call), and not for want of work not done
    yet (:class:`~hierplan.errors.ToolBlocked`: the call is right, its turn is not)."""
    return not error.retryable and not isinstance(
        error, ToolServerGone | ToolNotAllowedError | ToolBlocked
    )


class DecidedCall:
    """A plan's tool call that the tool refused, decided again by one executor call.

    The executor's prompt is the step's, then the plan's call (its arguments as the plan
    wrote them) and the tool's error, as an executor's own loop would have them; it may call
    the step's tool only. Its first call to that tool is the step's from then on: the node
    keeps it (``NodeContext.decided_call``), so that the step's later attempts run it again
    (a failure of it that may pass is retried as any tool's) and ask no model again."""

    __slots__ = ("call", "error")

    def __init__(self, call: ToolCall, error: ToolError) -> None:
        self.call = call
        self.error = error

    @classmethod
    async def decide(
        cls, node: StepEnv, step: Step, inputs: Mapping[str, StepResult], error: ToolError
    ) -> DecidedCall:
        """Ask the node's model once; raise :class:`StepFailed` (the tool's error, and why)
        when it makes no call to the step's tool or cannot be asked."""
        assert step.tool is not None
        failed = ToolCall(f"{node.path}:1", step.tool, dict(step.args or {}))
        prompt = StepPrompt(step.instruction, node.context, {k: v.text for k, v in inputs.items()})
        messages = (
            *render_step_prompt(prompt),
            Message("assistant", "", (failed,)),
            Message("tool", f"ERROR: {error}", tool_call_id=failed.id),
        )
        request = ModelRequest(
            messages=messages,
            tools=node.tool_specs(frozenset({step.tool}) & node.allowed_tools),
            max_tokens=node.settings.executor_max_tokens,
            phase="execution",
            node_path=node.path,
            purpose="redecide",
        )
        try:
            response = await node.call_model(request)
        except (ModelAuthError, UnexpectedModelCall):
            raise  # the run's model cannot be used at all: as for any other call
        except HierplanError as exc:
            # No budget left for it, a provider that failed it, a model that cannot answer:
            # the step fails as the plan's call did, and its planner replans if it can. A
            # failure that may pass (an overloaded provider) is the attempt's, as for an
            # executor's own call: the step's next attempt, if it has one, asks again.
            retryable = bool(getattr(exc, "retryable", False))
            raise StepFailed(f"{error} (not decided again: {exc})", retryable=retryable) from exc
        call = next((c for c in response.tool_calls if c.name == step.tool), None)
        if call is None:
            raise StepFailed(f"{error} (decided again, no call to {step.tool} was made)")
        return cls(call, error)

    async def run(self, node: StepEnv) -> StepResult:
        """Run the call decided again: its output is the step's result, as the plan's call's
        would have been."""
        call = self.call
        target = node.tool(call.name, frozenset({call.name}) & node.allowed_tools)
        try:
            output = await node.call_tool(target, call.arguments, call.id or f"{node.path}:2")
        except ToolError as again:
            # Blocked stays blocked: the decided call may pass once the rest of the plan ran.
            kind = ToolBlocked if isinstance(again, ToolBlocked) else ToolError
            raise kind(
                f"{self.error}; decided again, the call failed too: {again}",
                retryable=again.retryable,
            ) from again
        return StepResult(output, result_text(output))


class LLMExecutor:
    """A bounded tool-calling loop: the model calls tools until it answers, at most
    ``max_turns`` model calls."""

    async def execute(
        self,
        node: StepEnv,
        instruction: str,
        inputs: Mapping[str, StepResult],
        *,
        context: str = "",
        only_tool: str | None = None,
        react: bool = False,
        max_turns: int | None = None,
    ) -> StepResult:
        """Run the loop; raise :class:`StepFailed` if the model gives up or runs out of turns."""
        settings = node.settings
        turns = max_turns or (settings.react_max_turns if react else settings.executor_max_turns)
        allowed = (
            node.allowed_tools if only_tool is None else frozenset({only_tool}) & node.allowed_tools
        )
        specs = node.tool_specs(allowed)
        prompt = StepPrompt(instruction, context, {k: v.text for k, v in inputs.items()}, react)
        messages: tuple[Message, ...] = render_step_prompt(prompt)
        for turn in range(turns):
            response = await node.call_model(
                ModelRequest(
                    messages=messages,
                    tools=specs,
                    max_tokens=settings.executor_max_tokens,
                    phase="execution",
                    node_path=node.path,
                    purpose="react" if react else "execute",
                )
            )
            if not response.tool_calls:
                unusable = unusable_answer(response, settings.executor_max_tokens)
                if unusable is not None:
                    raise StepFailed(unusable)
                text = response.text.strip()
                if not text:
                    # Nothing to pass on to the steps that depend on this one; another attempt
                    # may answer (local models sometimes stop at once).
                    raise StepFailed("the model gave an empty answer", retryable=True)
                if text.startswith(FAILED_PREFIX):
                    raise StepFailed(
                        text[len(FAILED_PREFIX) :].strip() or "the executor gave up", retryable=True
                    )
                return StepResult(text, text)
            if turn == turns - 1:
                # No model turn is left to read what these calls would return: running them
                # would only repeat their side effects when the step is retried.
                break
            calls = distinct_call_ids(response.tool_calls, turn)
            results = await self._run_calls(node, calls, allowed, turn)
            messages = (*messages, Message("assistant", response.text, calls), *results)
        raise StepFailed(f"no answer after {turns} model turns", retryable=True)

    async def _run_calls(
        self, node: StepEnv, calls: Sequence[ToolCall], allowed: frozenset[str], turn: int
    ) -> list[Message]:
        replies: list[Message] = [Message("tool", "", tool_call_id=c.id) for c in calls]
        # A hierplan error other than a tool's failure (a tool raising StepFailed itself, a
        # provider refusing the credentials inside an instrument) ends the step. It is kept
        # and raised as it is after the group, which would otherwise wrap it in an
        # ExceptionGroup that no handler of a step expects.
        fatal: list[HierplanError] = []

        async def one(index: int, call: ToolCall, scope: anyio.CancelScope) -> None:
            try:
                target = node.tool(call.name, allowed)
                output = await node.call_tool(
                    target, call.arguments, call.id or f"{node.path}:{turn}.{index}"
                )
                text = result_text(output)
            except ToolError as exc:
                text = f"ERROR: {exc}"
            except HierplanError as exc:
                fatal.append(exc)
                scope.cancel()  # the other calls of the turn are of no use any more
                return
            replies[index] = Message("tool", text, tool_call_id=call.id)

        async with anyio.create_task_group() as tg:
            for index, call in enumerate(calls):
                tg.start_soon(one, index, call, tg.cancel_scope)
        if fatal:
            raise fatal[0]
        return replies
