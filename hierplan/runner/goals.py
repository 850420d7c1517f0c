"""Goal files: a goal and the settings to run it with, as YAML or JSON.

.. code-block:: yaml

    goal: Migrate the sample shop database        # or leave it out and name a scenario
    scenario: data_migration
    strategy: hierarchical
    model: sim
    max_depth: 3
    concurrency: 8
    seed: 0
    executor_max_tokens: 4096    # any other RunSettings field, checked as RunSettings checks it
    tools:                       # toolsets (see hierplan.tools.config)
      - mcp: {command: npx, args: ["-y", "@modelcontextprotocol/server-everything"]}
      - python: mypackage.tools:toolset

A plain ``.txt`` file is a goal as free text. Every problem is reported with the field it
concerns; nothing runs until the whole file is valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from hierplan.core.settings import MAX_SEED, RunSettings, StrategyName
from hierplan.errors import UserInputError, field_problems
from hierplan.files import DataTextError, parse_data_text, parse_yaml_or_json, read_text_file
from hierplan.plans.plan import MAX_GOAL_CHARS
from hierplan.tools.config import ToolsetSpec, toolset_entries

# The goal's own keys that are also run settings; every other RunSettings field a goal file
# may set too (executor_max_tokens, step_timeout_s...), so that the command line, which has
# flags for a few of them, can set them all.
_SPEC_SETTINGS = ("strategy", "max_depth", "concurrency", "seed")
MORE_SETTINGS = tuple(name for name in RunSettings.model_fields if name not in _SPEC_SETTINGS)


class GoalSpec(BaseModel):
    """One goal and its optional per-goal settings."""

    # Strict: a goal file comes from anywhere; "seed": true or "seed": "3" is refused, not
    # read as 1 or 3 (as a batch's goal lines are).
    model_config = ConfigDict(extra="forbid", strict=True)

    # The run's own limit, so that a goal that runs given on the command line runs from a file.
    goal: str | None = Field(default=None, min_length=1, max_length=MAX_GOAL_CHARS)
    scenario: str | None = Field(default=None, min_length=1)
    strategy: StrategyName | None = None
    model: str | None = None
    max_depth: int | None = Field(default=None, ge=1, le=10)
    concurrency: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    # Checked by goal_from_data, which names each bad entry and its line.
    tools: tuple[ToolsetSpec, ...] = Field(default=(), strict=False)
    # Set by goal_from_data: the other run settings the file gives, already checked.
    _more: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _goal_or_scenario(self) -> GoalSpec:
        if self.goal is None and self.scenario is None:
            raise ValueError("give a 'goal' or a 'scenario'")
        if self.goal is not None and not self.goal.strip():
            # A goal of spaces is no goal: say so naming the file's field, not as a run without one.
            raise ValueError("'goal' is blank: write the goal, or name a 'scenario' instead")
        return self

    def overrides(self) -> dict[str, Any]:
        """The settings this goal sets (strategy, model, limits), without the unset ones."""
        keys = ("strategy", "model", "max_depth", "concurrency", "seed")
        given = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        return given | self._more


GOAL_FILE_KEYS = (*GoalSpec.model_fields, *MORE_SETTINGS)
"""Every key a goal file may have: the goal's own, then the other run settings."""


def unknown_keys_problem(data: Mapping[Any, Any], allowed: Sequence[str]) -> str | None:
    """The keys of ``data`` not among ``allowed``, and the allowed ones, as one problem (a
    misspelt key is fixed by seeing the right spelling); ``None`` when every key is known."""
    unknown = [repr(key) for key in data if key not in allowed]
    if not unknown:
        return None
    noun = "keys" if len(unknown) > 1 else "key"
    return f"unknown {noun} {', '.join(unknown)}: the keys allowed are {', '.join(allowed)}"


def goal_from_data(data: Any, *, source: str, tool_lines: Sequence[int] | None = None) -> GoalSpec:
    """Validate parsed data as a :class:`GoalSpec` and any other run settings it gives as
    :class:`RunSettings` fields; errors name each bad field (a ``tools`` entry by its line, when
    ``tool_lines`` gives each entry's)."""
    more: dict[str, Any] = {}
    problems: list[str] = []
    if isinstance(data, dict):
        unknown = unknown_keys_problem(data, GOAL_FILE_KEYS)
        if unknown is not None:
            problems.append(unknown)
            data = {k: v for k, v in data.items() if k in GOAL_FILE_KEYS}
        more = {k: v for k, v in data.items() if k in MORE_SETTINGS}
        data = {k: v for k, v in data.items() if k not in more}
        if "tools" in data:
            try:
                data["tools"] = toolset_entries(data["tools"], where=source, lines=tool_lines)
            except UserInputError as exc:
                problems.append(str(exc))
                data = {k: v for k, v in data.items() if k != "tools"}
    try:
        spec = GoalSpec.model_validate(data)
    except ValidationError as exc:
        problems.append(field_problems(exc, "goal"))
    try:
        checked = RunSettings.checked(more, strict=True)
    except ValidationError as exc:
        problems.append(field_problems(exc, "goal"))
    if problems:  # both parts' problems at once: nothing runs until the whole file is valid
        raise UserInputError(f"{source} is not a valid goal: {'; '.join(problems)}")
    spec._more = checked
    return spec


def load_goal_file(path: Path) -> GoalSpec:
    """Read a goal file (YAML, JSON, or plain text for ``.txt``)."""
    text = read_text_file(path, "goal file")
    if path.suffix.lower() == ".txt":
        return goal_from_data({"goal": text.strip() or None}, source=f"goal file {path}")
    data = parse_yaml_or_json(text, path, "goal file")
    if not isinstance(data, dict):
        raise UserInputError(
            f"goal file {path} must hold a mapping with a 'goal' or 'scenario' key, "
            f"not {type(data).__name__}"
        )
    lines = _tools_lines(text) if isinstance(data.get("tools"), list) else None
    return goal_from_data(data, source=f"goal file {path}", tool_lines=lines)


# libyaml's composer where PyYAML has it: the text is read a second time, for lines only.
_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _tools_lines(text: str) -> list[int] | None:
    """The line of each entry of the file's ``tools`` list (for messages), if it has one."""
    try:
        root = yaml.compose(text, Loader=_COMPOSER)
    # (OverflowError, ValueError: PyYAML's "\U" escape past any character; RecursionError: its
    # composer recurses in Python, where data nested some 500 deep exhausts the stack)
    except (yaml.YAMLError, OverflowError, ValueError, RecursionError):
        return None
    if not isinstance(root, yaml.MappingNode):
        return None
    for key, value in root.value:
        if getattr(key, "value", None) == "tools" and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return None


def settings_from_assignments(
    assignments: Sequence[str], *, flags: Mapping[str, str]
) -> dict[str, Any]:
    """Run settings from ``KEY=VALUE`` texts (``--set executor_max_tokens=4096``), each VALUE
    read as a YAML scalar (``null`` for none) and checked as :class:`RunSettings` checks it,
    without conversions (``true`` is no count, ``'3'`` no number), as a goal file's are.

    ``flags`` maps the settings that have a flag of their own to it: giving one of those here
    is refused, so that a setting has one place on a command line. Every problem is reported
    at once, naming the setting.
    """
    values: dict[str, Any] = {}
    problems: list[str] = []
    for text in assignments:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"--set {text!r}: write KEY=VALUE, e.g. executor_max_tokens=4096")
        elif key in flags:
            problems.append(f"--set {key}: use {flags[key]}")
        elif key not in RunSettings.model_fields:
            known = ", ".join(k for k in RunSettings.model_fields if k not in flags)
            problems.append(f"--set {key}: not a run setting (settings: {known})")
        elif key in values:
            problems.append(f"--set {key}: given twice, keep one")
        else:
            try:
                values[key] = parse_data_text(raw) if raw.strip() else raw
            except DataTextError as exc:
                problems.append(f"--set {key}: {exc}")
    if not problems:
        try:
            values = RunSettings.checked(values, strict=True)
        except ValidationError as exc:
            problems.extend(f"--set {err['loc'][0]}: {err['msg']}" for err in exc.errors())
    if problems:
        raise UserInputError("; ".join(problems))
    return values
