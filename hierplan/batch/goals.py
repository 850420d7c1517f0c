"""Goals files: one goal per line, as JSON (JSONL), validated whole before anything starts.

Each line is a JSON object naming one goal in one of these ways:

.. code-block:: json

    {"goal": "Summarise the Q3 incident reports", "model": "openai:gpt-5-mini"}
    {"scenario": "data_migration", "seed": 3}
    {"suite": "game24", "task": "game24-0-7"}

A ``suite`` line names a task of a benchmark suite (see ``hierplan bench``): ``task`` is its id
as the benchmark writes it (``<suite>-<task seed>-<index>``), or just its index (task seed 0).
It runs with the suite's tools and oracle, and the suite's verifier decides whether it
succeeded.

Optionally a line has its own settings: ``id`` (a name of letters, digits, ``.``, ``_``, ``-``;
by default ``line-N``), ``strategy``, ``model``, ``max_depth``, ``concurrency`` (steps at once
within the goal), ``seed``, ``allocation``, ``reservation``, a budget cap ``budget_usd`` /
``budget_tokens``, ``tools`` (toolsets, as a goal file names them: see
:mod:`hierplan.tools.config`), and any other run setting (``executor_max_tokens``,
``step_timeout_s``...: a
:class:`~hierplan.RunSettings` field), checked as strictly as the rest.
A goal without a ``seed`` gets its own, derived from the batch's seed and its id (see
:func:`goal_seed`). A key given twice on a line is refused (JSON readers would keep the
last). Blank lines are skipped. A goals file comes from anywhere, so every line is checked and
every problem is reported with its line number; nothing runs until the whole file is valid.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from hierplan.bench.base import MAX_TASK_INDEX, BenchTask
from hierplan.bench.suites import get_suite
from hierplan.budgets.budget import ALLOCATIONS, MAX_BUDGET_TOKENS, MAX_BUDGET_USD
from hierplan.core.settings import MAX_SEED, RunSettings, StrategyName
from hierplan.errors import HierplanError, UserInputError
from hierplan.files import MAX_TEXT_FILE_BYTES, open_regular_file
from hierplan.models.base import ToolSpec, parse_model_string
from hierplan.models.counting import Reservation
from hierplan.models.provider import RepeatedKeyError, json_problem, loads_json
from hierplan.plans.plan import MAX_GOAL_CHARS
from hierplan.runner.goals import unknown_keys_problem
from hierplan.scenarios import get_scenario
from hierplan.tools.config import ToolsetSpec, toolset_entries

MAX_ERRORS_SHOWN = 20
# Room for a goal as long as a run takes, written as JSON (escapes can double its length).
MAX_LINE_CHARS = 2 * MAX_GOAL_CHARS + 10_000
GOAL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

TASK_ID = re.compile(r"^([a-z0-9_]+)-(\d{1,9})-(\d{1,4})$")  # bench.base.MAX_TASK_SEED, _INDEX

GoalKind = Literal["text", "scenario", "suite"]


class GoalLine(BaseModel):
    """One line of a goals file: what to run, and its own settings."""

    # Strict: a goals file is untrusted input; "seed": true or "budget_usd": "0.1" is refused,
    # not read as 1 or 0.1.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    id: str | None = Field(default=None, pattern=GOAL_ID.pattern)
    goal: str | None = Field(default=None, min_length=1, max_length=MAX_GOAL_CHARS)
    scenario: str | None = Field(default=None, min_length=1, max_length=100)
    suite: str | None = Field(default=None, min_length=1, max_length=100)
    task: Annotated[StrictStr, Field(max_length=100)] | StrictInt | None = None
    strategy: StrategyName | None = None
    model: str | None = Field(default=None, min_length=1, max_length=200)
    max_depth: int | None = Field(default=None, ge=1, le=10)
    concurrency: int | None = Field(default=None, ge=1, le=1024)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    allocation: str | None = None
    reservation: Reservation | None = None
    budget_usd: float | None = Field(default=None, ge=0, le=MAX_BUDGET_USD, allow_inf_nan=False)
    budget_tokens: int | None = Field(default=None, ge=0, le=MAX_BUDGET_TOKENS)
    # Checked by _line_spec, which names each bad entry.
    tools: tuple[ToolsetSpec, ...] | None = Field(default=None, strict=False)
    # The other run settings of the line, written as keys of the line itself: parse_goals
    # gathers them here; the journal and Celery messages carry them as they are.
    settings: dict[str, Any] | None = None

    @field_validator("settings")
    @classmethod
    def _run_settings(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        unknown = sorted(set(value) - set(MORE_SETTINGS))
        if unknown:
            raise ValueError(f"not run settings a line's 'settings' holds: {', '.join(unknown)}")
        return RunSettings.checked(value, strict=True)

    @field_validator("task", mode="before")
    @classmethod
    def _task_name(cls, value: Any) -> Any:
        if value is None or isinstance(value, str) or type(value) is int:
            return value
        raise ValueError('must be a task id (e.g. "game24-0-3") or a task index (e.g. 3)')

    @model_validator(mode="after")
    def _one_goal(self) -> GoalLine:
        if (self.suite is None) != (self.task is None):
            raise ValueError("'suite' and 'task' go together: name a suite and one of its tasks")
        named = [k for k in ("goal", "scenario", "suite") if getattr(self, k) is not None]
        if not named:
            raise ValueError("give a 'goal' (free text), a 'scenario', or a 'suite' and a 'task'")
        if len(named) > 1:
            raise ValueError(
                f"give one of 'goal', 'scenario' or 'suite', not {' and '.join(named)}"
            )
        if self.goal is not None and not self.goal.strip():
            raise ValueError("'goal' is blank")
        if self.allocation is not None and self.allocation not in ALLOCATIONS:
            raise ValueError(f"'allocation' must be one of {', '.join(ALLOCATIONS)}")
        return self

    @property
    def kind(self) -> GoalKind:
        """What the line names: free text for a real model, a scenario, or a suite's task."""
        if self.scenario is not None:
            return "scenario"
        return "suite" if self.suite is not None else "text"

    def known_text(self) -> str:
        """The goal's text where it is known before the run starts (free text, or a suite
        task's), else ``""`` (a scenario's text comes from setting it up)."""
        if self.suite is not None and self.task is not None:
            return suite_task(self.suite, self.task).goal
        return self.goal or ""

    def known_tools(self) -> tuple[ToolSpec, ...]:
        """The specs of the tools the goal's run has, where they are known before it starts
        (a suite task's), else ``()`` (free text runs without tools; a scenario's come from
        setting it up)."""
        if self.suite is not None and self.task is not None:
            return _suite_tool_specs(self.suite, self.task)
        return ()

    def label(self) -> str:
        """A short description for displays."""
        if self.scenario is not None:
            return f"scenario {self.scenario}"
        if self.suite is not None:
            return f"{self.suite} task {self.task}"
        text = (self.goal or "").strip().replace("\n", " ")
        return text if len(text) <= 60 else text[:57] + "..."


@dataclass(slots=True, frozen=True)
class BatchGoal:
    """A validated goal of a batch: its id, its line number, and the line itself."""

    id: str
    line: int
    spec: GoalLine

    def to_json(self) -> str:
        """The goal as one JSON object (for the journal and for workers): its tools entries as
        written, ``${VAR}`` unread."""
        spec = self.spec.model_dump(exclude_none=True, exclude={"tools"})
        if self.spec.tools:
            spec["tools"] = [entry.saved() for entry in self.spec.tools]
        return json.dumps({"id": self.id, "line": self.line, "spec": spec})

    def tools(self, batch_tools: Sequence[ToolsetSpec] = ()) -> tuple[ToolsetSpec, ...]:
        """The goal's toolsets: the batch's (``--tools``, ``--mcp``), then its line's, each
        noted with the line for messages."""
        entries = (*batch_tools, *(self.spec.tools or ()))
        return tuple(e.model_copy(update={"where": f"line {self.line}"}) for e in entries)

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


def goal_seed(batch_seed: int, goal_id: str) -> int:
    """The simulator seed of a goal whose line sets none: the first 31 bits of
    ``sha256(f"{batch_seed}:{goal_id}")``.

    The simulator keys its draws by the asking node's path, which is the same in every goal;
    one seed for the whole batch would give every goal the same noise. Derived from the goal's
    id, a goal keeps its seed when the batch is resumed, rerun, or its lines are reordered.
    """
    digest = hashlib.sha256(f"{batch_seed}:{goal_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@lru_cache(maxsize=16)
def _suite_tasks(suite: str, task_seed: int, count: int) -> tuple[BenchTask, ...]:
    return tuple(get_suite(suite).generate(count, task_seed))


@lru_cache(maxsize=64)
def _suite_tool_specs(suite: str, task: str | int) -> tuple[ToolSpec, ...]:
    # A suite's environment is in memory and cheap to build; its tools are what the run gets.
    env = get_suite(suite).environment(suite_task(suite, task), latency_scale=0)
    return tuple(t.spec for t in env.tools)


def suite_task(suite: str, task: str | int) -> BenchTask:
    """The task of ``suite`` that a goals line names (an id ``<suite>-<seed>-<index>``, or an
    index of task seed 0); :class:`UserInputError` says what is wrong with a bad name."""
    get_suite(suite)  # a clear error naming the known suites
    if isinstance(task, int) and not isinstance(task, bool):
        task_seed, index = 0, task
    else:
        match = TASK_ID.match(str(task))
        if match is None or match.group(1) != suite:
            raise UserInputError(
                f"task {task!r} is not a task of {suite}: give its index, or its id as "
                f"'{suite}-<task seed>-<index>' (e.g. '{suite}-0-3')"
            )
        task_seed, index = int(match.group(2)), int(match.group(3))
    if not 0 <= index <= MAX_TASK_INDEX:
        raise UserInputError(f"task index {index} is out of range: 0 to {MAX_TASK_INDEX}")
    # Generate in blocks of 100 so that a file of many tasks generates each block once.
    count = (index // 100 + 1) * 100
    return _suite_tasks(suite, task_seed, count)[index]


# Run settings a line may give beside its own keys (strategy, max_depth, concurrency and
# seed are among those).
MORE_SETTINGS = tuple(
    name for name in RunSettings.model_fields if name not in GoalLine.model_fields
)


# Every key a line may have: its own, then the other run settings.
LINE_KEYS = (*(k for k in GoalLine.model_fields if k != "settings"), *MORE_SETTINGS)


def _problems(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        message = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def _line_spec(data: dict[str, Any]) -> tuple[GoalLine | None, str]:
    """The line as a :class:`GoalLine`, its run settings gathered into ``settings``; or
    ``None`` and every problem of the line's own keys and of its run settings."""
    if "settings" in data:
        return None, "'settings' is not a key of a line: write each run setting as a key"
    problems: list[str] = []
    unknown = unknown_keys_problem(data, LINE_KEYS)
    if unknown is not None:
        problems.append(unknown)
        data = {k: v for k, v in data.items() if k in LINE_KEYS}
    more = {k: v for k, v in data.items() if k in MORE_SETTINGS}
    if "tools" in data:
        try:
            data = {**data, "tools": toolset_entries(data["tools"])}
        except UserInputError as exc:
            problems.append(str(exc))
            data = {k: v for k, v in data.items() if k != "tools"}
    try:
        spec = GoalLine.model_validate({k: v for k, v in data.items() if k not in more})
    except ValidationError as exc:
        problems.append(_problems(exc))
    try:
        checked = RunSettings.checked(more, strict=True)
    except ValidationError as exc:
        problems.append(_problems(exc))
    if problems:
        return None, "; ".join(problems)
    return (spec.model_copy(update={"settings": checked}) if checked else spec), ""


def _check_line(spec: GoalLine, default_model: str) -> str | None:
    """Problems that need more than the schema: the model string, the scenario's or the
    suite task's name, and whether the simulator can answer the goal."""
    model = spec.model or default_model
    try:
        parsed = parse_model_string(model)
        if spec.scenario is not None:
            get_scenario(spec.scenario)
        if spec.suite is not None and spec.task is not None:
            suite_task(spec.suite, spec.task)
    except HierplanError as exc:
        return str(exc)
    if spec.kind == "text" and parsed.provider == "sim":
        return (
            "a free-text goal needs a real model (set 'model', e.g. \"openai:gpt-5-mini\", or "
            "--model): the offline simulator only answers scenarios and suite tasks"
        )
    return None


def parse_goals(
    text: str, *, source: str = "goals file", default_model: str = "sim"
) -> list[BatchGoal]:
    """Parse and validate a whole goals file; every problem is reported with its line number.

    Raises :class:`UserInputError` listing the problems (at most ``MAX_ERRORS_SHOWN`` of them,
    and how many more there are) if any line is invalid, or if there is no goal at all.
    """
    # Lines end at "\n" only: str.splitlines would also split at U+2028 and the like, which
    # JSON allows unescaped inside strings.
    lines = enumerate(text.split("\n"), 1)
    return _parse_lines(lines, source=source, default_model=default_model)


def _parse_lines(
    lines: Iterable[tuple[int, str | None]], *, source: str, default_model: str
) -> list[BatchGoal]:
    """:func:`parse_goals` of the numbered lines of a goals file (``None`` for a line too long
    to have been read whole)."""
    errors: list[str] = []
    goals: list[BatchGoal] = []
    seen: dict[str, int] = {}
    for number, raw in lines:
        line = None if raw is None else raw.strip()
        if line == "":
            continue
        if line is None or len(line) > MAX_LINE_CHARS:
            errors.append(f"line {number}: longer than {MAX_LINE_CHARS:,} characters")
            continue
        try:
            data: Any = loads_json(line)
        except RepeatedKeyError as exc:
            errors.append(f"line {number}: {exc}")
            continue
        except ValueError as exc:
            errors.append(f"line {number}: not valid JSON ({json_problem(exc)})")
            continue
        if not isinstance(data, dict):
            errors.append(
                f"line {number}: must be a JSON object with a 'goal', a 'scenario' or a 'suite', "
                f"not {_json_type(data)}"
            )
            continue
        spec, problems = _line_spec(data)
        if spec is None:
            errors.append(f"line {number}: {problems}")
            continue
        problem = _check_line(spec, default_model)
        if problem is not None:
            errors.append(f"line {number}: {problem}")
            continue
        goal_id = spec.id or f"line-{number}"
        if goal_id in seen:
            if spec.id is None:  # the line named no id: say where its default one came from
                errors.append(
                    f"line {number}: its default id {goal_id!r} is already used on line "
                    f"{seen[goal_id]}: give this line an 'id' of its own"
                )
            else:
                errors.append(
                    f"line {number}: id {goal_id!r} is already used on line {seen[goal_id]}"
                )
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


# The most bytes of one line read: a line of MAX_LINE_CHARS characters, each of up to four
# bytes in UTF-8, its line end and a byte-order mark. A longer line is refused unread.
MAX_LINE_BYTES = 4 * MAX_LINE_CHARS + 8


def _raw_lines(stream: BinaryIO, path: Path, digest: Any) -> Iterator[tuple[int, bytes | None]]:
    """The numbered lines of the goals file ``stream`` reads, as bytes, ``None`` for a line
    longer than :data:`MAX_LINE_BYTES` (its bytes are skipped, not kept); every byte read goes
    into ``digest``. A file larger than :data:`MAX_TEXT_FILE_BYTES` is refused on the way: a
    goals file is read a line at a time, never whole, and never past that size."""
    total = 0
    for number in itertools.count(1):
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        whole = raw.endswith(b"\n") or len(raw) <= MAX_LINE_BYTES
        while not raw.endswith(b"\n") and (more := stream.readline(MAX_LINE_BYTES)):
            # the rest of a line too long to keep: read on to its end, counting its bytes
            total += len(raw)
            digest.update(raw)
            raw = more
            _check_size(total, path)
        total += len(raw)
        digest.update(raw)
        _check_size(total, path)
        yield number, raw if whole else None


def _check_size(total: int, path: Path) -> None:
    if total > MAX_TEXT_FILE_BYTES:
        raise UserInputError(
            f"goals file {path} is larger than {MAX_TEXT_FILE_BYTES:,} bytes: split it into "
            "several batches, or check that it is the file you meant"
        )


def _decoded(
    lines: Iterable[tuple[int, bytes | None]], path: Path
) -> Iterator[tuple[int, str | None]]:
    """The lines as text (a byte-order mark some editors write before the first line is not
    part of a goal), or a :class:`UserInputError` naming the first line that is not UTF-8."""
    for number, raw in lines:
        if raw is None:
            yield number, None
            continue
        try:
            yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise UserInputError(
                f"goals file {path} is not UTF-8 text (line {number}, byte {exc.start + 1} of "
                "the line cannot be decoded)"
            ) from None


def goals_digest(path: Path) -> str:
    """The digest :func:`load_goals` gives the file at ``path`` (read, not validated)."""
    digest = hashlib.sha256()
    with open_regular_file(path, "goals file") as stream:
        for _ in _raw_lines(stream, path, digest):
            pass
    return digest.hexdigest()


def load_goals(path: Path, *, default_model: str = "sim") -> GoalsFile:
    """Read and validate a goals file (see :func:`parse_goals`), a line at a time: a file that
    is not a regular file, is larger than :data:`~hierplan.files.MAX_TEXT_FILE_BYTES` or is
    not UTF-8 is refused with a one-line error."""
    digest = hashlib.sha256()
    with open_regular_file(path, "goals file") as stream:
        lines = _decoded(_raw_lines(stream, path, digest), path)
        goals = _parse_lines(lines, source=f"goals file {path}", default_model=default_model)
    return GoalsFile(path, tuple(goals), digest.hexdigest())


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    return "a number"


def goal_ids(goals: Sequence[BatchGoal]) -> list[str]:
    """The ids of ``goals``, in order."""
    return [g.id for g in goals]
