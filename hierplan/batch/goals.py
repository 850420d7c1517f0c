"""Goals files: one goal per line, as JSON (JSONL), validated whole before anything starts.

Each line is a JSON object naming one goal in one of these ways:

.. code-block:: json

    {"goal": "Summarise the Q3 incident reports", "model": "openai:gpt-5-mini"}
    {"scenario": "data_migration", "seed": 3}

and optionally its own settings: ``id`` (a name of letters, digits, ``.``, ``_``, ``-``; by
default ``line-N``), ``strategy``, ``model``, ``max_depth``, ``concurrency`` (steps at once
within the goal), ``seed``, ``allocation``, and a budget cap ``budget_usd`` / ``budget_tokens``.
Blank lines are skipped. A goals file comes from anywhere, so every line is checked and every
problem is reported with its line number; nothing runs until the whole file is valid.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hierplan.agents.models.base import parse_model_string
from hierplan.budgets.budget import ALLOCATIONS
from hierplan.errors import HierplanError, UserInputError
from hierplan.hierarchy.context import StrategyName
from hierplan.scenarios import get_scenario

MAX_ERRORS_SHOWN = 20
MAX_LINE_CHARS = 100_000
GOAL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

GoalKind = Literal["text", "scenario"]


class GoalLine(BaseModel):
    """One line of a goals file: what to run, and its own settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str | None = Field(default=None, pattern=GOAL_ID.pattern)
    goal: str | None = Field(default=None, min_length=1, max_length=20_000)
    scenario: str | None = Field(default=None, min_length=1, max_length=100)
    strategy: StrategyName | None = None
    model: str | None = Field(default=None, min_length=1, max_length=200)
    max_depth: int | None = Field(default=None, ge=1, le=10)
    concurrency: int | None = Field(default=None, ge=1, le=1024)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    allocation: str | None = None
    budget_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    budget_tokens: int | None = Field(default=None, ge=0, le=10**15)

    @model_validator(mode="after")
    def _one_goal(self) -> GoalLine:
        named = [k for k in ("goal", "scenario") if getattr(self, k) is not None]
        if not named:
            raise ValueError("give a 'goal' (free text) or a 'scenario'")
        if len(named) > 1:
            raise ValueError(f"give one of 'goal' or 'scenario', not {' and '.join(named)}")
        if self.goal is not None and not self.goal.strip():
            raise ValueError("'goal' is blank")
        if self.allocation is not None and self.allocation not in ALLOCATIONS:
            raise ValueError(f"'allocation' must be one of {', '.join(ALLOCATIONS)}")
        return self

    @property
    def kind(self) -> GoalKind:
        """What the line names: free text for a real model, or a scenario."""
        return "scenario" if self.scenario is not None else "text"

    def label(self) -> str:
        """A short description for displays."""
        if self.scenario is not None:
            return f"scenario {self.scenario}"
        text = (self.goal or "").strip().replace("\n", " ")
        return text if len(text) <= 60 else text[:57] + "..."


@dataclass(slots=True, frozen=True)
class BatchGoal:
    """A validated goal of a batch: its id, its line number, and the line itself."""

    id: str
    line: int
    spec: GoalLine

    def to_json(self) -> str:
        """The goal as one JSON object (for the journal and for workers)."""
        return json.dumps(
            {"id": self.id, "line": self.line, "spec": self.spec.model_dump(exclude_none=True)}
        )

    @classmethod
    def from_json(cls, text: str) -> BatchGoal:
        """The goal :meth:`to_json` wrote."""
        data = json.loads(text)
        return cls(data["id"], int(data["line"]), GoalLine.model_validate(data["spec"]))


@dataclass(slots=True, frozen=True)
class GoalsFile:
    """A validated goals file: its goals in file order and a digest of its content."""

    path: Path
    goals: tuple[BatchGoal, ...]
    digest: str


def _problems(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        message = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def _check_line(spec: GoalLine, default_model: str) -> str | None:
    """Problems that need more than the schema: the model string, the scenario's name, and
    whether the simulator can answer the goal."""
    model = spec.model or default_model
    try:
        parsed = parse_model_string(model)
        if spec.scenario is not None:
            get_scenario(spec.scenario)
    except HierplanError as exc:
        return str(exc)
    if spec.kind == "text" and parsed.provider == "sim":
        return (
            "a free-text goal needs a real model (set 'model', e.g. \"openai:gpt-5-mini\", or "
            "--model): the offline simulator only answers scenarios"
        )
    return None


def parse_goals(
    text: str, *, source: str = "goals file", default_model: str = "sim"
) -> list[BatchGoal]:
    """Parse and validate a whole goals file; every problem is reported with its line number.

    Raises :class:`UserInputError` listing the problems (at most ``MAX_ERRORS_SHOWN`` of them,
    and how many more there are) if any line is invalid, or if there is no goal at all.
    """
    errors: list[str] = []
    goals: list[BatchGoal] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if len(line) > MAX_LINE_CHARS:
            errors.append(f"line {number}: longer than {MAX_LINE_CHARS:,} characters")
            continue
        try:
            data: Any = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            errors.append(f"line {number}: not valid JSON ({reason})")
            continue
        if not isinstance(data, dict):
            errors.append(
                f"line {number}: must be a JSON object with a 'goal' or a 'scenario', "
                f"not {_json_type(data)}"
            )
            continue
        try:
            spec = GoalLine.model_validate(data)
        except ValidationError as exc:
            errors.append(f"line {number}: {_problems(exc)}")
            continue
        problem = _check_line(spec, default_model)
        if problem is not None:
            errors.append(f"line {number}: {problem}")
            continue
        goal_id = spec.id or f"line-{number}"
        if goal_id in seen:
            errors.append(f"line {number}: id {goal_id!r} is already used on line {seen[goal_id]}")
            continue
        seen[goal_id] = number
        goals.append(BatchGoal(goal_id, number, spec))
    if errors:
        shown = errors[:MAX_ERRORS_SHOWN]
        more = len(errors) - len(shown)
        tail = f"\n  ... and {more} more" if more else ""
        raise UserInputError(
            f"{source} has {len(errors)} invalid line(s); nothing was started:\n  "
            + "\n  ".join(shown)
            + tail
        )
    if not goals:
        raise UserInputError(f"{source} has no goals: write one JSON object per line")
    return goals


def load_goals(path: Path, *, default_model: str = "sim") -> GoalsFile:
    """Read and validate a goals file (see :func:`parse_goals`)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserInputError(f"cannot read goals file {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserInputError(
            f"goals file {path} is not UTF-8 text (byte {exc.start} cannot be decoded)"
        ) from None
    goals = parse_goals(text, source=f"goals file {path}", default_model=default_model)
    return GoalsFile(path, tuple(goals), hashlib.sha256(data).hexdigest())


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    return "a number"


def goal_ids(goals: Sequence[BatchGoal]) -> list[str]:
    """The ids of ``goals``, in order."""
    return [g.id for g in goals]
