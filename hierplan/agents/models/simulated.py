"""SimulatedModel: the embedded offline default, a seeded stand-in for an LLM.

It receives the same :class:`ModelRequest` a real provider would (the real prompts, tool schemas
and output schema), reads it back with :mod:`hierplan.agents.prompts`, and asks an
:class:`Oracle` (a scenario's or benchmark suite's) what a competent model would answer. It then
applies a seeded :class:`NoiseProfile`: plan errors (a dropped step, a missing dependency, a wrong
tool argument) more likely as plans grow; executor errors (a wrong tool argument, a give-up) more
likely the more tool calls one executor loop has made, and more likely again after an earlier
error in that loop; a cap on the tool calls of one turn; latency (log-normal, plus time per
output token); and verbosity (hidden reasoning, counted as output and reasoning tokens as a
reasoning model would). How likely each error is depends on the request only (the plan's size,
the loop's calls and errors), never on the strategy that sent it, so that differences between
strategies emerge from what they ask of the model.

Usage is computed from the actual request and response text by the estimate in
:mod:`hierplan.agents.models.tokens`. Cost is that usage priced as if the model were a named real
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from hashlib import sha256
from types import MappingProxyType
from typing import Any, Protocol

import anyio
from pydantic import BaseModel, ConfigDict, Field

from hierplan.agents.models.base import Message, ModelRequest, ModelResponse, ToolCall, Usage
from hierplan.agents.models.tokens import estimate_request_tokens, estimate_text_tokens
from hierplan.agents.prompts import (
    FAILED_PREFIX,
    PLAN_OUTPUT_NAME,
    PlanPrompt,
    StepPrompt,
    parse_plan_prompt,
    parse_step_prompt,
)
from hierplan.budgets.pricing import DEFAULT_SIMULATED_PRICED_AS
from hierplan.errors import SimulatorCoverageError, UserInputError
from hierplan.hierarchy.plan import Plan

COVERAGE_HINT = (
    "The offline simulator only answers goals its oracles know: the built-in scenarios "
    "(hierplan run --scenario data_migration) and benchmark suites. For any other goal use a "
    "real model, e.g. --model openai:gpt-5-mini with OPENAI_API_KEY set, or "
    "--model anthropic:claude-haiku-4-5 with ANTHROPIC_API_KEY set."
)


@dataclass(slots=True, frozen=True)
class Action:
    """An executor's next move: tool calls, or a final ``text``."""

    tool_calls: tuple[ToolCall, ...] = ()
    text: str = ""


class Oracle(Protocol):
    """Knows what a competent model would answer for the goals of one scenario or suite."""

    def plan(self, prompt: PlanPrompt) -> Plan | None:
        """The plan for a planning (or replanning) prompt, or ``None`` if not covered."""
        ...

    def act(self, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]) -> Action | None:
        """The next action for a step, given the tool calls that succeeded so far."""
        ...


class NoiseProfile(BaseModel):
    """How far the simulator strays from its oracle. Rates are probabilities.

    Every mechanism applies to every request the same way, whatever the strategy that sent it,
    so that differences between strategies emerge from what they ask of the model:

    - **Plan errors grow with plan size.** A plan of ``n`` steps has an error with probability
      ``1 - (1 - plan_error_rate) * (1 - plan_error_per_step) ** n``; each step can carry its
      own error, so long plans may have several (a dropped step, a missing dependency, a wrong
      tool argument).
    - **Executor errors grow with the horizon and after an error.** The ``k``-th tool call of
      one executor loop (``k`` counts every call already made in that loop) is wrong with
      probability ``executor_error_rate + executor_error_per_action * k``, or
      ``executor_error_after_error + executor_error_per_action * k`` once the loop holds an
      earlier error, capped at ``max_error_rate``. A final answer is one more decision. A wrong
      decision is a wrong tool argument or, with probability ``give_up_share``, giving up.
    - **Parallel calls.** ``max_calls_per_turn`` (0: no limit) caps how many tool calls one turn
      may emit; the rest wait for later turns.
    - **Latency** of a call: ``latency_median_s`` times a log-normal factor
      (``latency_sigma``), plus ``latency_per_output_token_s`` per output token (hidden
      reasoning included).
    - **Verbosity**: hidden reasoning of ``verbosity`` times the answer length, counted as
      output (and reasoning) tokens.
    """

    # No inf or nan: an infinite latency waits forever, a nan one silently means none.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = "custom"
    plan_error_rate: float = Field(0.0, ge=0, le=1, description="Error chance of any plan.")
    plan_error_per_step: float = Field(0.0, ge=0, le=1, description="Error chance per plan step.")
    executor_error_rate: float = Field(
        0.0, ge=0, le=1, description="Error chance of an executor's first decision."
    )
    executor_error_per_action: float = Field(
        0.0, ge=0, le=1, description="Added per tool call already made in the same loop."
    )
    executor_error_after_error: float = Field(
        0.0, ge=0, le=1, description="Error chance once the loop holds an earlier error."
    )
    max_error_rate: float = Field(0.5, ge=0, le=1, description="Cap of an executor error chance.")
    give_up_share: float = Field(
        0.3, ge=0, le=1, description="Share of executor errors that give up the step."
    )
    max_calls_per_turn: int = Field(0, ge=0, description="Tool calls one turn may emit (0: any).")
    latency_median_s: float = Field(0.0, ge=0, description="Median fixed latency of a call.")
    latency_sigma: float = Field(0.0, ge=0, description="Log-normal spread of that latency.")
    latency_per_output_token_s: float = Field(
        0.0, ge=0, description="Generation time per output token."
    )
    verbosity: float = Field(0.0, ge=0, description="Extra reasoning text, x the answer length.")

    def plan_error_probability(self, steps: int) -> float:
        """Chance that a plan of ``steps`` steps gets at least one error."""
        return 1 - (1 - self.plan_error_rate) * (1 - self.plan_error_per_step) ** steps

    def executor_error_probability(self, calls_made: int, had_error: bool) -> float:
        """Chance that the next decision of an executor loop is wrong.

        ``calls_made`` is how many tool calls the loop has made so far; ``had_error`` whether
        one of them (or an earlier answer) failed.
        """
        base = self.executor_error_after_error if had_error else self.executor_error_rate
        return min(self.max_error_rate, base + self.executor_error_per_action * calls_made)


# Where the defaults come from (the simulator is calibrated, not fitted to any benchmark):
#
# - Plan errors. PlanBench (Valmeekam et al., arXiv:2206.10498) finds GPT-4 writes a correct
#   Blocksworld plan about a third of the time, worse as plans get longer; LLMCompiler
#   (Kim et al., arXiv:2312.04511) reports about 90% accuracy on ParallelQA with plans of a few
#   to ten calls. One profile serves every suite, so "typical" takes 2% per step plus 3% per
#   plan, which matches ParallelQA-sized plans and is optimistic for Blocksworld; "weak"
#   triples it.
# - Executor errors. A few percent of a GPT-4-class model's tool calls carry a wrong argument
#   (an assumption of the same order as the plan errors above). Per-step accuracy falls as a
#   single context executes more steps, and falls faster once the context holds the model's own
#   earlier errors ("self-conditioning", Sinha et al., arXiv:2509.09677): hence the growth per
#   action and the higher rate after an error. ADaPT (Prasad et al., arXiv:2311.05772) attributes
#   ReAct's failures on TextCraft to exactly this loss of track over long trajectories. A third
#   of errors are give-ups, two thirds wrong arguments (an assumption).
# - Latency. A hosted small model answers a short request in about half a second and generates
#   roughly 100 tokens per second (an order of magnitude, not a measurement): median 0.5 s,
#   log-normal sigma 0.4, 10 ms per output token. "weak" is a slower, larger-latency endpoint.
# - Verbosity: hidden reasoning of 0.3x the answer, as a reasoning model at low effort spends.
# - Parallel calls: no cap; the prompts ask for independent calls in one turn and current
#   function-calling models do so. Set max_calls_per_turn=1 for the one-call-per-thought ReAct
#   of the papers.
#
# "ideal" is the oracle itself: no errors, no latency, no verbosity.
PROFILES: Mapping[str, NoiseProfile] = {
    "ideal": NoiseProfile(name="ideal", max_error_rate=0.0),
    "typical": NoiseProfile(
        name="typical",
        plan_error_rate=0.03,
        plan_error_per_step=0.02,
        executor_error_rate=0.03,
        executor_error_per_action=0.004,
        executor_error_after_error=0.10,
        max_error_rate=0.5,
        give_up_share=0.3,
        latency_median_s=0.5,
        latency_sigma=0.4,
        latency_per_output_token_s=0.01,
        verbosity=0.3,
    ),
    "weak": NoiseProfile(
        name="weak",
        plan_error_rate=0.09,
        plan_error_per_step=0.06,
        executor_error_rate=0.09,
        executor_error_per_action=0.012,
        executor_error_after_error=0.30,
        max_error_rate=0.8,
        give_up_share=0.3,
        latency_median_s=0.8,
        latency_sigma=0.6,
        latency_per_output_token_s=0.02,
        verbosity=1.0,
    ),
}
PROFILES = MappingProxyType(PROFILES)  # read-only: shared by every run


def get_profile(name: str) -> NoiseProfile:
    """The named noise profile (``ideal``, ``typical``, ``weak``)."""
    try:
        return PROFILES[name]
    except KeyError:
        raise UserInputError(
            f"unknown simulator profile {name!r}: choose one of {', '.join(PROFILES)}"
        ) from None


_FILLER = (
    "Considering the dependencies and what each step needs, ",
    "the safest order keeps independent work parallel; ",
    "checking the inputs again before acting, ",
    "this follows from the previous results; ",
)


def check_latency_scale(latency_scale: object) -> None:
    """Refuse a simulated latency scale that is not a finite number >= 0: ``inf`` would wait
    for ever on every call, ``nan`` would silently mean no latency."""
    if (
        isinstance(latency_scale, bool)
        or not isinstance(latency_scale, int | float)
        or not math.isfinite(latency_scale)
        or latency_scale < 0
    ):
        raise UserInputError(
            f"the simulated latency scale must be a finite number >= 0, not {latency_scale!r}"
        )


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
        if self.oracle is None:
            raise SimulatorCoverageError(COVERAGE_HINT)
        rng = self._rng(request)
        if request.output_schema is not None and request.output_schema.name == PLAN_OUTPUT_NAME:
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
        delay = self._latency(rng, out)
        if delay > 0:
            await anyio.sleep(delay)
        return response

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
        flags: list[str] = []
        repair = any(m.role == "user" and m.content.startswith("REPAIR:") for m in request.messages)
        if not repair:
            for _ in range(self._plan_error_count(len(plan.steps), rng)):
                plan, kind = perturb_plan(plan, rng)
                if kind:
                    flags.append(f"sim_plan_error:{kind}")
        data: dict[str, Any] = plan.model_dump(mode="json", exclude_none=True)
        return ModelResponse(text=json.dumps(data), output=data, flags=flags)

    def _plan_error_count(self, steps: int, rng: random.Random) -> int:
        """How many errors a plan of ``steps`` steps gets: one per plan, one per step."""
        p = self.profile
        count = int(rng.random() < p.plan_error_rate)
        if p.plan_error_per_step > 0:
            count += sum(rng.random() < p.plan_error_per_step for _ in range(steps))
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
        wrong = self._wrong_decision(len(calls), transcript, rng)
        if wrong is None:
            return ModelResponse(text=action.text, tool_calls=tuple(calls))
        if calls and rng.random() >= self.profile.give_up_share:
            c = calls[wrong]
            calls[wrong] = ToolCall(c.id, c.name, corrupt_args(c.arguments, rng))
            return ModelResponse(tool_calls=tuple(calls), flags=["sim_executor_error:wrong_args"])
        return ModelResponse(
            text=f"{FAILED_PREFIX} (simulated executor error) lost track of the step",
            flags=["sim_executor_error:gave_up"],
        )

    def _wrong_decision(
        self, calls: int, transcript: _Transcript, rng: random.Random
    ) -> int | None:
        """Index of the first wrong decision of this turn (a final answer is one), or None."""
        for index in range(max(1, calls)):
            p = self.profile.executor_error_probability(
                transcript.calls + index, transcript.had_error
            )
            if p > 0 and rng.random() < p:
                return index
        return None


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
        out[key] = value + rng.choice((-3, -1, 1, 2, 7))
    else:
        out[key] = f"{value}_x"
    return out


def perturb_plan(plan: Plan, rng: random.Random) -> tuple[Plan, str | None]:
    """Introduce one plan error: drop a step, drop a dependency, or corrupt a tool argument."""
    kinds = []
    if len(plan.steps) > 1:
        kinds.append("dropped_step")
    if any(s.depends_on for s in plan.steps):
        kinds.append("missing_dependency")
    if any(s.args for s in plan.steps):
        kinds.append("wrong_args")
    if not kinds:
        return plan, None
    kind = rng.choice(kinds)
    steps = list(plan.steps)
    if kind == "dropped_step":
        victim = steps.pop(rng.randrange(len(steps)))
        steps = [
            s.model_copy(update={"depends_on": [d for d in s.depends_on if d != victim.id]})
            for s in steps
        ]
    elif kind == "missing_dependency":
        candidates = [i for i, s in enumerate(steps) if s.depends_on]
        i = rng.choice(candidates)
        deps = list(steps[i].depends_on)
        deps.pop(rng.randrange(len(deps)))
        steps[i] = steps[i].model_copy(update={"depends_on": deps})
    else:
        candidates = [i for i, s in enumerate(steps) if s.args]
        i = rng.choice(candidates)
        steps[i] = steps[i].model_copy(update={"args": corrupt_args(steps[i].args, rng)})
    return plan.model_copy(update={"steps": steps}), kind
