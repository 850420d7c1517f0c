"""A small three-level world for the embedding tests: capitals of countries, and a sum.

The root plans one sub-goal per group of countries and one direct ``add`` step; each sub-goal
plans one executor step per country; an executor looks its country up with the ``lookup`` tool
(the simulator's model chooses the arguments). The tools are local (:func:`local_tools`) or an
MCP server's (``tests/mcp_server.py``), with the same names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import anyio

from hierplan import Step, tool
from hierplan.agents.prompts import PlanPrompt, StepPrompt, one_line
from hierplan.models.base import ToolCall
from hierplan.plans.plan import Plan
from hierplan.scenarios import Scenario, ScenarioEnv, Verification
from hierplan.simulator.oracle import Action
from hierplan.tools.base import Tool

CAPITALS = {"france": "Paris", "japan": "Tokyo", "peru": "Lima", "chile": "Santiago"}
_GROUP = re.compile(r"^Find the capitals of ([a-z, ]+)$")
_ONE = re.compile(r"^Find the capital of ([a-z]+)$")


def goal_for(groups: Sequence[Sequence[str]], a: int = 2, b: int = 3) -> str:
    """The root goal text for ``groups`` of countries and the sum ``a + b``."""
    names = "; ".join(", ".join(g) for g in groups)
    return f"Report the capitals of {names}, and the sum of {a} and {b}"


_ROOT = re.compile(r"^Report the capitals of (.+), and the sum of (\d+) and (\d+)$")


class CapitalsOracle:
    """What a competent model answers in the capitals world (an :class:`Oracle`)."""

    def __init__(self, *, lookup: str = "lookup", add: str = "add") -> None:
        self.lookup = lookup
        self.add = add
        self.plans: list[PlanPrompt] = []

    def plan(self, prompt: PlanPrompt) -> Plan | None:
        """The root plan (sub-goals and a sum) or a group's plan (one step per country)."""
        self.plans.append(prompt)
        goal = one_line(prompt.goal)
        root = _ROOT.match(goal)
        if root is not None:
            groups = [g.split(", ") for g in root.group(1).split("; ")]
            steps = [
                Step(
                    id=f"group{i}",
                    title=f"Capitals {i}",
                    instruction="Find the capitals of " + ", ".join(group),
                    kind="subgoal",
                )
                for i, group in enumerate(groups, 1)
            ]
            steps.append(
                Step(
                    id="sum",
                    title="Sum",
                    instruction="Add the two numbers",
                    tool=self.add,
                    args={"a": int(root.group(2)), "b": int(root.group(3))},
                )
            )
            return Plan(goal=goal, steps=steps)
        group = _GROUP.match(goal)
        if group is not None:
            countries = group.group(1).split(", ")
            return Plan(
                goal=goal,
                steps=[
                    Step(
                        id=c,
                        title=f"Capital of {c}",
                        instruction=f"Find the capital of {c}",
                        tool=self.lookup,
                    )
                    for c in countries
                ],
            )
        return None

    def act(self, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]) -> Action | None:
        """Look the country up, then answer with what the tool said."""
        one = _ONE.match(one_line(prompt.instruction))
        if one is None:
            return None
        country = one.group(1)
        if not done:
            call = ToolCall(f"call-{country}", self.lookup, {"country": country})
            return Action(tool_calls=(call,))
        return Action(text=f"The capital of {country} is {done[-1][1]}")


def local_tools(delay_s: float = 0.0) -> list[Tool]:
    """``lookup`` and ``add`` as local async tools, each taking ``delay_s``."""

    @tool
    async def lookup(country: str) -> str:
        """The capital of a country."""
        await anyio.sleep(delay_s)
        return CAPITALS[country]

    @tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        await anyio.sleep(delay_s)
        return a + b

    return [lookup, add]


class CapitalsScenario(Scenario):
    """The capitals world as a scenario: its workdir holds the answers the verifier checks."""

    name = "capitals"
    description = "look up the capitals of a few countries and add two numbers"

    def __init__(
        self,
        groups: Sequence[Sequence[str]] = (("france", "japan"), ("peru",)),
        *,
        delay_s: float = 0.0,
    ) -> None:
        self.groups = [list(g) for g in groups]
        self.delay_s = delay_s

    def setup(self, workdir: Path, *, seed: int = 0) -> ScenarioEnv:
        """Write the world's facts into ``workdir``; the verifier reads them back."""
        facts = workdir / "facts.txt"
        facts.write_text(f"seed {seed}\n")

        def verify() -> Verification:
            ok = facts.read_text() == f"seed {seed}\n"
            return Verification(ok=ok, summary="facts intact" if ok else "facts overwritten")

        return ScenarioEnv(
            goal=goal_for(self.groups),
            tools=local_tools(self.delay_s),
            oracle=CapitalsOracle(),
            verify=verify,
        )
