"""SimulatedModel: the embedded offline default, a seeded stand-in for an LLM.

It receives the same :class:`ModelRequest` a real provider would (the real prompts, tool schemas
and output schema), reads it back with :mod:`hierplan.agents.prompts`, and asks an
:class:`Oracle` (a scenario's or benchmark suite's) what a competent model would answer. It then
applies a seeded :class:`NoiseProfile`. The same decision has the same error rate whoever
makes it: a tool call with its arguments, whether an executor chose it or a plan wrote it as a
direct tool step, is wrong more likely the more decisions its context made before it, and more
likely again once the context reports an error (an executor's failed call; a planning prompt
reporting a failed step, an answer to repair, a failed attempt or a rejected plan). Plans also
get structural errors (a dropped step, a missing dependency), which only plans can make, more
likely as plans grow and after a failure. A wrong decision of an executor gives up with the
profile's give-up share, else is a wrong argument or a wrong final answer. There is also a cap
on the tool calls of one turn; latency (a log-normal time to first token, plus time per output
token); and verbosity (hidden reasoning, counted as output and reasoning tokens as a reasoning
model would). How likely each error is depends on the request only (the plan's size, the
context's decisions and errors), never on the strategy that sent it, so that differences
between strategies emerge from what they ask of the model.

Usage is computed from the actual request and response text by the estimate in
:mod:`hierplan.models.tokens`. Cost is that usage priced as if the model were a named real
one (``priced_as``). Every response is flagged ``simulated``.

The simulator never pretends to understand free text: a request no oracle covers raises
:class:`SimulatorCoverageError` pointing at the real providers.

Randomness is keyed by the node that asks (its path and phase) and how many times it asked
before, never by call order across nodes, so the noise of a seeded run does not depend on
concurrency. (Tool outcomes that depend on timing, such as a foreign-key race after a dropped
dependency, still can.)
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import AsyncGenerator, Collection, Sequence
from dataclasses import dataclass
from decimal import Decimal
from hashlib import sha256
from typing import Any

import anyio

from hierplan.agents.prompts import (
    FAILED_PREFIX,
    JOIN_ANSWER,
    JOIN_REPLAN,
    PLAN_OUTPUT_NAME,
    PLANNER_SYSTEM,
    REPAIR_PREFIX,
    JoinPrompt,
    parse_join_prompt,
    parse_plan_prompt,
    parse_step_prompt,
    reports_failure,
)
from hierplan.errors import SimulatorCoverageError
from hierplan.models.base import Message, ModelRequest, ModelResponse, StreamItem, ToolCall
from hierplan.models.tokens import estimate_request_tokens, estimate_text_tokens
from hierplan.plans.compact import render_compact
from hierplan.plans.plan import Plan, Step
from hierplan.simulator.oracle import COVERAGE_HINT, Oracle
from hierplan.simulator.profiles import (
    DEFAULT_SIMULATED_PRICED_AS,
    NoiseProfile,
    check_latency_scale,
    get_profile,
)
from hierplan.units import Usage

_FILLER = (
    "Considering the dependencies and what each step needs, ",
    "the safest order keeps independent work parallel; ",
    "checking the inputs again before acting, ",
    "this follows from the previous results; ",
)

_STREAM_CHUNK_CHARS = 16
"""A streamed answer's text comes in chunks of this many characters (about four tokens)."""


class SimulatedModel:
    """The offline stand-in for an LLM (see the module docstring)."""

    def __init__(
        self,
        oracle: Oracle | None,
        *,
        profile: NoiseProfile | str = "typical",
        seed: int = 0,
        priced_as: str = DEFAULT_SIMULATED_PRICED_AS,
        latency_scale: float = 1.0,
    ) -> None:
        check_latency_scale(latency_scale)
        self.oracle = oracle
        self.profile = get_profile(profile) if isinstance(profile, str) else profile
        self.seed = seed
        self._priced_as = priced_as
        self.latency_scale = latency_scale
        self._seen: dict[str, int] = {}

    @property
    def name(self) -> str:
        """``sim``."""
        return "sim"

    @property
    def provider(self) -> str:
        """``sim``."""
        return "sim"

    @property
    def priced_as(self) -> str:
        """The real model whose prices apply."""
        return self._priced_as

    @property
    def simulated(self) -> bool:
        """Always true."""
        return True

    def _rng(self, request: ModelRequest) -> random.Random:
        # Draws are keyed by the node that asks and how many times it asked before, not by the
        # prompt text: prompts carry results whose order and wording depend on timing (which
        # of two parallel steps finished first), and a seeded run must draw the same noise
        # whatever the concurrency. Requests from outside a run fall back to the text.
        if request.node_path:
            key = f"{request.node_path}|{request.phase}"
        else:
            digest = sha256()
            for m in request.messages:
                digest.update(m.role.encode())
                digest.update(m.content.encode())
            key = digest.hexdigest()
        count = self._seen.get(key, 0)
        self._seen[key] = count + 1
        return random.Random(f"{self.seed}:{key}:{count}")

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Answer from the oracle, with the profile's noise, latency and usage."""
        response, rng = self._respond(request)
        assert response.usage is not None
        delay = self._latency(rng, response.usage.output_tokens)
        if delay > 0:
            await anyio.sleep(delay)
        return response

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """The answer :meth:`request` gives (the same text, usage and draws), written as a
        stream: the fixed latency draw and the hidden reasoning's tokens pass before the first
        delta, then the text comes at ``latency_per_output_token_s`` a token, so the whole
        stream takes as long as :meth:`request` does."""
        response, rng = self._respond(request)
        assert response.usage is not None
        usage = response.usage
        fixed, per_token = self._latency_parts(rng)
        first = fixed + per_token * usage.reasoning_tokens
        if first > 0:
            await anyio.sleep(first)
        text = response.text
        # The visible output's time, spread over chunks of a few tokens each by their length;
        # each chunk is due at a time from the first, so that late wake-ups do not add up.
        visible_s = per_token * max(0, usage.output_tokens - usage.reasoning_tokens)
        began = anyio.current_time()
        for start in range(0, len(text), _STREAM_CHUNK_CHARS):
            end = min(len(text), start + _STREAM_CHUNK_CHARS)
            if visible_s > 0:
                await anyio.sleep_until(began + visible_s * end / len(text))
            yield text[start:end]
        yield response

    def _latency_parts(self, rng: random.Random) -> tuple[float, float]:
        """The fixed part of a call's latency and the time per output token, scaled: the same
        draw :meth:`_latency` makes."""
        p = self.profile
        if self.latency_scale <= 0:
            return 0.0, 0.0
        fixed = 0.0
        if p.latency_median_s > 0:
            fixed = p.latency_median_s * math.exp(p.latency_sigma * rng.gauss())
        return self.latency_scale * fixed, self.latency_scale * p.latency_per_output_token_s

    def _respond(self, request: ModelRequest) -> tuple[ModelResponse, random.Random]:
        """The answer to ``request`` with its usage, and the draws left for its latency."""
        if self.oracle is None:
            raise SimulatorCoverageError(COVERAGE_HINT)
        rng = self._rng(request)
        join = parse_join_prompt(request.messages) if request.phase == "planning" else None
        if join is not None:
            response = self._join(request, join, rng)
        elif _asks_for_plan(request):
            response = self._plan(request, rng)
        else:
            response = self._act(request, rng)
        visible = response.text + "".join(
            c.name + json.dumps(c.arguments, default=str) for c in response.tool_calls
        )
        # Verbosity is hidden reasoning, as a reasoning model spends it: counted as output
        # (and reasoning) tokens, not shown in the answer.
        reasoning = estimate_text_tokens(self._reasoning(visible, rng))
        response = _clip(response, request.max_tokens - reasoning)
        out = max(1, estimate_text_tokens(visible)) + reasoning
        if response.finish_reason == "length":
            out = request.max_tokens
        response.usage = Usage(
            estimate_request_tokens(request), out, reasoning_tokens=min(reasoning, out)
        )
        response.model = "sim"
        response.simulated = True
        return response, rng

    def _latency(self, rng: random.Random, output_tokens: int) -> float:
        p = self.profile
        if self.latency_scale <= 0:
            return 0.0
        fixed = 0.0
        if p.latency_median_s > 0:
            fixed = p.latency_median_s * math.exp(p.latency_sigma * rng.gauss())
        return self.latency_scale * (fixed + p.latency_per_output_token_s * output_tokens)

    def _reasoning(self, text: str, rng: random.Random) -> str:
        if self.profile.verbosity <= 0:
            return ""
        target = int(len(text) * self.profile.verbosity * rng.uniform(0.5, 1.5))
        parts: list[str] = []
        while sum(map(len, parts)) < target:
            parts.append(rng.choice(_FILLER))
        return "".join(parts).strip()

    def _plan(self, request: ModelRequest, rng: random.Random) -> ModelResponse:
        assert self.oracle is not None
        prompt = parse_plan_prompt(request.messages)
        if prompt is None:
            raise SimulatorCoverageError(
                "the request is not a hierplan planning prompt. " + COVERAGE_HINT
            )
        plan = self.oracle.plan(prompt)
        if plan is None:
            raise SimulatorCoverageError(
                f"no oracle knows the goal {prompt.goal[:200]!r}. {COVERAGE_HINT}"
            )
        # Repairs get noise too: a model asked to fix its answer can err again, and more
        # likely so, since the prompt reports a failure (as an executor's errors grow).
        after_failure = reports_failure(request.messages, prompt)
        # A replan writes only what is left: the done steps whose results stand are not
        # written, so they are no decisions and get no noise.
        kept = frozenset(prompt.carried(plan))
        plan, flags = self._plan_decisions(plan, kept, request.messages, after_failure, rng)
        written = len(plan.steps) - len(kept)
        planned = {s.id for s in plan.steps}
        for _ in range(self._plan_error_count(written, after_failure, rng)):
            plan, kind = perturb_plan(plan, rng, fixed=kept)
            if kind:
                flags.append(f"sim_plan_error:{kind}")
        if request.output_schema is not None:  # asked for JSON: answer JSON
            data: dict[str, Any] = plan.model_dump(mode="json", exclude_none=True)
            data["steps"] = [s for s in data["steps"] if s["id"] not in kept]
            return ModelResponse(text=json.dumps(data), output=data, flags=flags)
        # A dropped step's line is missing, and the lines that use it refer to it all the same.
        lost = planned - {s.id for s in plan.steps}
        text = render_compact(plan, prompt.tool_params, skip=kept, lost=lost)
        return ModelResponse(text=text, flags=flags)

    def _plan_decisions(
        self,
        plan: Plan,
        kept: frozenset[str],
        messages: Sequence[Message],
        after_failure: bool,
        rng: random.Random,
    ) -> tuple[Plan, list[str]]:
        """The plan with its direct tool steps' arguments wrong as often as an executor's tool
        calls at the same horizon: the step's place among the lines written in this context.

        One draw per written step whatever it is, so that a step's draw does not depend on the
        kinds of the steps before it; the ``kept`` steps a replan does not write draw none."""
        horizon = _earlier_plan_steps(messages)
        steps = list(plan.steps)
        flags: list[str] = []
        written = (i for i, s in enumerate(steps) if s.id not in kept)
        for line, i in enumerate(written):
            step = steps[i]
            p = self.profile.wrong_args_probability(horizon + line, after_failure)
            wrong = p > 0 and rng.random() < p
            if wrong and step.tool is not None and step.args:
                args = corrupt_step_args(step, rng)
                steps[i] = step.model_copy(update={"args": args})
                flags.append("sim_plan_error:wrong_args")
        if not flags:
            return plan, flags
        return plan.model_copy(update={"steps": steps}), flags

    def _plan_error_count(self, steps: int, after_failure: bool, rng: random.Random) -> int:
        """How many structural errors a plan of ``steps`` steps gets: one per plan, one per
        step."""
        p = self.profile
        count = int(rng.random() < p.plan_error_rate)
        per_step = p.plan_step_error_probability(after_failure)
        if per_step > 0:
            count += sum(rng.random() < per_step for _ in range(steps))
        return count

    def _act(self, request: ModelRequest, rng: random.Random) -> ModelResponse:
        assert self.oracle is not None
        prompt = parse_step_prompt(request.messages)
        if prompt is None:
            raise SimulatorCoverageError(
                "the request is not a hierplan executor prompt. " + COVERAGE_HINT
            )
        transcript = _transcript(request.messages)
        action = self.oracle.act(prompt, transcript.done)
        if action is None:
            raise SimulatorCoverageError(
                f"no oracle knows the step {prompt.instruction[:200]!r}. {COVERAGE_HINT}"
            )
        calls = list(action.tool_calls)
        cap = self.profile.max_calls_per_turn
        if cap and len(calls) > cap:
            calls = calls[:cap]
        # Ids the oracle chose may repeat those of failed calls: number them uniquely.
        calls = [
            ToolCall(f"call_{transcript.calls + i}", c.name, c.arguments)
            for i, c in enumerate(calls)
        ]
        if not calls:  # a final answer: one decision
            if not self._wrong(transcript.calls, transcript.had_error, rng):
                return ModelResponse(text=action.text)
            if rng.random() < self.profile.give_up_share:
                return _gave_up()
            return ModelResponse(
                text=corrupt_answer(action.text, rng), flags=["sim_executor_error:wrong_answer"]
            )
        flags: list[str] = []
        for index, c in enumerate(calls):
            # Each call is a decision; the turn's earlier wrong calls are not known to be
            # wrong yet (no result came back), so they do not raise the rate.
            if not self._wrong(transcript.calls + index, transcript.had_error, rng):
                continue
            if rng.random() < self.profile.give_up_share:
                return _gave_up()
            calls[index] = ToolCall(c.id, c.name, corrupt_args(c.arguments, rng))
            flags.append("sim_executor_error:wrong_args")
        return ModelResponse(text=action.text, tool_calls=tuple(calls), flags=flags)

    def _join(self, request: ModelRequest, prompt: JoinPrompt, rng: random.Random) -> ModelResponse:
        """The joiner's decision: the oracle's answer (an oracle without ``join``, or one
        that does not know the goal, answers with the draft the results make). One decision,
        wrong as often as any other at its horizon (the answers it gave before in this
        context, which a repair follows): a wrong one asks for a needless replan with the
        profile's give-up share, else answers wrongly."""
        join = getattr(self.oracle, "join", None)
        answer = join(prompt) if callable(join) else None
        if not isinstance(answer, str) or not answer.strip():
            answer = prompt.draft
        horizon = sum(1 for m in request.messages if m.role == "assistant")
        had_error = any(
            m.role == "user" and m.content.startswith(REPAIR_PREFIX) for m in request.messages
        )
        if not self._wrong(horizon, had_error, rng):
            return ModelResponse(text=f"{JOIN_ANSWER} {answer}")
        if rng.random() < self.profile.give_up_share:
            return ModelResponse(
                text=f"{JOIN_REPLAN} (simulated joiner error) the results may not answer the goal",
                flags=["sim_join_error:needless_replan"],
            )
        return ModelResponse(
            text=f"{JOIN_ANSWER} {corrupt_answer(answer, rng)}",
            flags=["sim_join_error:wrong_answer"],
        )

    def _wrong(self, horizon: int, had_error: bool, rng: random.Random) -> bool:
        """Whether the decision at ``horizon`` is wrong."""
        p = self.profile.decision_error_probability(horizon, had_error)
        return p > 0 and rng.random() < p


def _gave_up() -> ModelResponse:
    return ModelResponse(
        text=f"{FAILED_PREFIX} (simulated executor error) lost track of the step",
        flags=["sim_executor_error:gave_up"],
    )


_STEP_LINE = re.compile(r"^\s*[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}\. ", re.M)


def _earlier_plan_steps(messages: Sequence[Message]) -> int:
    """Steps the model wrote in earlier answers of this conversation (those a repair
    follows): decisions already made in the context."""
    count = 0
    for m in messages:
        if m.role != "assistant":
            continue
        try:
            data = json.loads(m.content)
        except ValueError:
            data = None
        steps = data.get("steps") if isinstance(data, dict) else None
        if isinstance(steps, list):
            count += len(steps)
        else:
            count += len(_STEP_LINE.findall(m.content))
    return count


def _asks_for_plan(request: ModelRequest) -> bool:
    """Whether ``request`` is a planning call: one asking for the plan's structured output,
    or a planning-phase call with the planner's prompt (which asks for compact lines)."""
    if request.output_schema is not None:
        return request.output_schema.name == PLAN_OUTPUT_NAME
    return request.phase == "planning" and any(
        m.role == "system" and m.content == PLANNER_SYSTEM for m in request.messages
    )


@dataclass(slots=True)
class _Transcript:
    """What an executor loop has done so far: successful calls, any error, all calls."""

    done: list[tuple[ToolCall, str]]
    had_error: bool
    calls: int


def _transcript(messages: Sequence[Message]) -> _Transcript:
    """Tool calls that succeeded so far, whether any failed, and how many were made."""
    results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    done: list[tuple[ToolCall, str]] = []
    had_error = False
    calls = 0
    for m in messages:
        for call in m.tool_calls:
            calls += 1
            text = results.get(call.id, "")
            if text.startswith("ERROR:"):
                had_error = True
            else:
                done.append((call, text))
    return _Transcript(done, had_error, calls)


def _clip(response: ModelResponse, max_tokens: int) -> ModelResponse:
    """Cut an answer longer than ``max_tokens``, as a real model does (finish_reason=length)."""
    limit = max(0, max_tokens) * 4
    if len(response.text) <= limit:
        return response
    return ModelResponse(
        text=response.text[:limit], finish_reason="length", flags=[*response.flags, "truncated"]
    )


_SHIFTS = (-3, -1, 1, 2, 7)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def corrupt_args(args: Any, rng: random.Random) -> dict[str, Any]:
    """One argument made wrong: a string gets a suffix, a number is shifted."""
    out = dict(args)
    keys = sorted(out)
    if not keys:
        return out
    key = rng.choice(keys)
    value = out[key]
    if isinstance(value, bool):
        out[key] = not value
    elif isinstance(value, int | float):
        out[key] = value + rng.choice(_SHIFTS)
    else:
        out[key] = f"{value}_x"
    return out


def corrupt_answer(text: str, rng: random.Random) -> str:
    """A final answer made wrong: its last number shifted (as a wrong numeric argument is),
    else its text with a suffix (as a wrong string argument is)."""
    numbers = list(_NUMBER.finditer(text))
    if not numbers:
        return f"{text}_x"
    last = numbers[-1]
    # Decimal keeps every digit: a float would round a long number back to itself.
    shifted = Decimal(last.group()) + rng.choice(_SHIFTS)
    return text[: last.start()] + str(shifted) + text[last.end() :]


def corrupt_step_args(step: Step, rng: random.Random) -> dict[str, Any]:
    """A plan step's arguments with one made wrong. An argument that is a reference to another
    step's result (``$id``) refers to another of the steps it depends on, when it has one, so
    that the wrong value runs as an executor's wrong number would; else it is changed as
    :func:`corrupt_args` changes any argument."""
    args = dict(step.args or {})
    key = rng.choice(sorted(args)) if args else None
    value = args.get(key) if key is not None else None
    if key is not None and value in {f"${d}" for d in step.depends_on}:
        others = [d for d in step.depends_on if f"${d}" != value]
        if others:
            args[key] = f"${rng.choice(others)}"
            return args
    return corrupt_args(args, rng)


def perturb_plan(
    plan: Plan, rng: random.Random, *, fixed: Collection[str] = ()
) -> tuple[Plan, str | None]:
    """Introduce one structural plan error: drop a step, or drop a dependency. (A wrong tool
    argument is a decision's error: see :meth:`SimulatedModel._plan_decisions`.) Steps in
    ``fixed`` (those a replan does not write) are left alone."""
    steps = list(plan.steps)
    open_ = [i for i, s in enumerate(steps) if s.id not in fixed]
    kinds = []
    if len(open_) > 1:  # a plan (or a replan's lines) does not lose its only step
        kinds.append("dropped_step")
    if any(steps[i].depends_on for i in open_):
        kinds.append("missing_dependency")
    if not kinds:
        return plan, None
    kind = rng.choice(kinds)
    if kind == "dropped_step":
        victim = steps.pop(rng.choice(open_))
        steps = [
            s.model_copy(update={"depends_on": [d for d in s.depends_on if d != victim.id]})
            for s in steps
        ]
    else:
        candidates = [i for i in open_ if steps[i].depends_on]
        i = rng.choice(candidates)
        deps = list(steps[i].depends_on)
        deps.pop(rng.randrange(len(deps)))
        steps[i] = steps[i].model_copy(update={"depends_on": deps})
    return plan.model_copy(update={"steps": steps}), kind
