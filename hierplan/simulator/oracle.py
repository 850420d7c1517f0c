"""The oracle protocol: what a scenario or benchmark suite tells the simulator a competent model
would answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from hierplan.agents.prompts import (
    JoinPrompt,
    PlanPrompt,
    StepPrompt,
)
from hierplan.models.base import ToolCall
from hierplan.plans.plan import Plan

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
    """Knows what a competent model would answer for the goals of one scenario or suite.

    An oracle may also have a ``join`` method (:class:`Joins`): the final answer a competent
    joiner gives on a finished plan's results. Without one, the simulator's joiner answers
    with the draft the results make, as a node without a joiner would.
    """

    def plan(self, prompt: PlanPrompt) -> Plan | None:
        """The plan for a planning (or replanning) prompt, or ``None`` if not covered."""
        ...

    def act(self, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]) -> Action | None:
        """The next action for a step, given the tool calls that succeeded so far."""
        ...


class Joins(Protocol):
    """The optional part of an :class:`Oracle`: what a competent joiner answers."""

    def join(self, prompt: JoinPrompt) -> str | None:
        """The final answer to the goal of a joiner prompt, given the steps' results and the
        draft they make; ``None`` to answer with the draft."""
        ...
