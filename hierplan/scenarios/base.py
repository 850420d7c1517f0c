"""Scenarios: runnable worlds with real tools, an oracle for the simulator, and a verifier.

A :class:`Scenario` is set up in a working directory; its :class:`ScenarioEnv` gives the goal,
the tools, the oracle the simulator answers from, and a ``verify`` function that checks the
outcome against ground truth (not against what the agent says it did).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hierplan.errors import UserInputError
from hierplan.simulator.oracle import Oracle
from hierplan.tools.base import Tool


@dataclass(slots=True)
class Verification:
    """The verifier's verdict and its evidence (JSON-ready)."""

    ok: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """As a plain dict for the run record."""
        return {"ok": self.ok, "summary": self.summary, "details": self.details}


@dataclass(slots=True)
class ScenarioEnv:
    """A set-up scenario: goal, tools, oracle and verifier."""

    goal: str
    tools: Sequence[Tool]
    oracle: Oracle
    verify: Callable[[], Verification]
    info: dict[str, Any] = field(default_factory=dict)


class Scenario(ABC):
    """A named, runnable scenario."""

    name: str
    description: str
    default_strategy: str = "hierarchical"
    default_max_depth: int = 3

    @abstractmethod
    def setup(self, workdir: Path, *, seed: int = 0) -> ScenarioEnv:
        """Create the scenario's world in ``workdir`` (blocking; run it in a thread)."""

    def reopen(self, workdir: Path, *, seed: int = 0) -> ScenarioEnv:
        """The world a paused run left in ``workdir``, as it is (for ``hierplan resume``)."""
        raise UserInputError(f"scenario {self.name!r} cannot continue a paused run")

    def replaced_files(self, workdir: Path, *, seed: int = 0) -> list[Path]:
        """The files in ``workdir`` that :meth:`setup` would delete or replace (an earlier
        run's), so that ``hierplan run`` can refuse to lose them unless told to."""
        return []
