"""SimulatedModel: the embedded offline default, a seeded stand-in for an LLM.

It receives the same :class:`ModelRequest` a real provider would (the real prompts, tool schemas
and output schema), reads it back with :mod:`hierplan.agents.prompts`, and asks an
:class:`Oracle` (a scenario's or benchmark suite's) what a competent model would answer. It then
applies a seeded :class:`NoiseProfile`: plan errors (a dropped step, a missing dependency, a wrong
tool argument) more likely as plans grow; executor errors (a wrong tool argument, a give-up) more
likely after an earlier error in the same step; latency from a log-normal distribution; and
verbosity (hidden reasoning, counted as output and reasoning tokens as a reasoning model would).

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
    """How far the simulator strays from its oracle. Rates are probabilities per call.

    A plan with ``n`` steps has an error with probability
    ``1 - (1 - plan_error_rate) * (1 - plan_error_per_step) ** n``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    plan_error_rate: float = Field(0.0, ge=0, le=1)
    plan_error_per_step: float = Field(0.0, ge=0, le=1)
    executor_error_rate: float = Field(0.0, ge=0, le=1)
    executor_error_after_error: float = Field(0.0, ge=0, le=1)
    latency_median_s: float = Field(0.0, ge=0)
    latency_sigma: float = Field(0.0, ge=0)
    verbosity: float = Field(0.0, ge=0, description="Extra reasoning text, x the answer length.")

    def plan_error_probability(self, steps: int) -> float:
        """Chance that a plan of ``steps`` steps gets an error."""
        return 1 - (1 - self.plan_error_rate) * (1 - self.plan_error_per_step) ** steps


# Where the defaults come from: "typical" follows the error rates reported for GPT-4-class
# models as planners (PlanBench: roughly a third of longer Blocksworld plans are wrong, few short
# ones; LLMCompiler/ReWOO report a few percent of malformed tool calls), and latency around the
# median completion time of a small hosted model (about 0.5-1 s for a short answer). "weak"
# roughly triples the error rates, as for small open models. "ideal" is the oracle itself.
PROFILES: Mapping[str, NoiseProfile] = {
    "ideal": NoiseProfile(name="ideal"),
    "typical": NoiseProfile(
        name="typical",
        plan_error_rate=0.04,
        plan_error_per_step=0.01,
        executor_error_rate=0.04,
        executor_error_after_error=0.12,
        latency_median_s=0.6,
        latency_sigma=0.5,
        verbosity=0.3,
    ),
    "weak": NoiseProfile(
        name="weak",
        plan_error_rate=0.12,
        plan_error_per_step=0.03,
        executor_error_rate=0.12,
        executor_error_after_error=0.35,
        latency_median_s=1.0,
        latency_sigma=0.6,
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
        delay = self._latency(rng)
        if delay > 0:
            await anyio.sleep(delay)
        return response

    def _latency(self, rng: random.Random) -> float:
        p = self.profile
        if p.latency_median_s <= 0 or self.latency_scale <= 0:
            return 0.0
        return self.latency_scale * p.latency_median_s * math.exp(p.latency_sigma * rng.gauss())

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
        if not repair and rng.random() < self.profile.plan_error_probability(len(plan.steps)):
            plan, kind = perturb_plan(plan, rng)
            if kind:
                flags.append(f"sim_plan_error:{kind}")
        data: dict[str, Any] = plan.model_dump(mode="json", exclude_none=True)
        return ModelResponse(text=json.dumps(data), output=data, flags=flags)

    def _act(self, request: ModelRequest, rng: random.Random) -> ModelResponse:
        assert self.oracle is not None
        prompt = parse_step_prompt(request.messages)
        if prompt is None:
            raise SimulatorCoverageError(
                "the request is not a hierplan executor prompt. " + COVERAGE_HINT
            )
        done, had_error = _transcript(request.messages)
        action = self.oracle.act(prompt, done)
        if action is None:
            raise SimulatorCoverageError(
                f"no oracle knows the step {prompt.instruction[:200]!r}. {COVERAGE_HINT}"
            )
        rate = (
            self.profile.executor_error_after_error
            if had_error
            else self.profile.executor_error_rate
        )
        if rng.random() < rate:
            if action.tool_calls and rng.random() < 0.7:
                index = rng.randrange(len(action.tool_calls))
                calls = list(action.tool_calls)
                calls[index] = ToolCall(
                    calls[index].id, calls[index].name, corrupt_args(calls[index].arguments, rng)
                )
                return ModelResponse(
                    tool_calls=tuple(calls), flags=["sim_executor_error:wrong_args"]
                )
            return ModelResponse(
                text=f"{FAILED_PREFIX} (simulated executor error) lost track of the step",
                flags=["sim_executor_error:gave_up"],
            )
        return ModelResponse(text=action.text, tool_calls=action.tool_calls)


def _transcript(messages: Sequence[Message]) -> tuple[list[tuple[ToolCall, str]], bool]:
    """Tool calls that succeeded so far, and whether any failed."""
    results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    done: list[tuple[ToolCall, str]] = []
    had_error = False
    for m in messages:
        for call in m.tool_calls:
            text = results.get(call.id, "")
            if text.startswith("ERROR:"):
                had_error = True
            else:
                done.append((call, text))
    return done, had_error


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
