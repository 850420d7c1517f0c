"""What a run is, in one typed value: :class:`RunSpec`.

A spec names the goal (or a built-in scenario), the strategy and limits (:class:`RunSettings`),
the models, the budget and the prices. :func:`hierplan.run` takes one (or builds one from a goal
and a few keywords); the command line, goal files, batch lines and the benchmark build one too,
so that a run is checked in one place, once, before anything runs. What a run is given as
objects rather than described (tools, an approver, instruments, listeners) is passed beside it.

>>> spec = RunSpec(goal="Migrate the shop", strategy="dag", budget=BudgetSpec(usd=0.5))
>>> spec.settings.strategy
'dag'
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hierplan.budgets.budget import DEFAULT_ALLOCATION
from hierplan.core.settings import RunSettings
from hierplan.errors import UserInputError, field_problems
from hierplan.hierarchy.gate import Gate
from hierplan.hierarchy.strategies import get_strategy
from hierplan.models.base import Model, parse_model_string
from hierplan.models.counting import Reservation
from hierplan.plans.plan import MAX_GOAL_CHARS
from hierplan.pricing import PriceTable
from hierplan.redact import redact
from hierplan.scenarios import Scenario
from hierplan.simulator.profiles import Simulator
from hierplan.tools.config import ToolsetSpec, check_toolsets, toolset_entries


class ModelSpec(BaseModel):
    """A provider's model and how to reach it: ``name`` is ``openai:<model>`` or
    ``anthropic:<model>``; ``base_url`` an OpenAI-compatible server (vLLM, Ollama, llama.cpp,
    LiteLLM) or a gateway; ``api_key`` is read from the environment when not given (and never
    saved); ``priced_as`` the model whose prices apply; ``options`` further adapter options
    (``max_tokens_field``, ``strict_output``, ``organization``, ``force_output_tool``).

    >>> ModelSpec(name="openai:llama3", base_url="http://localhost:8000/v1")  # doctest: +SKIP
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    base_url: str | None = None
    api_key: str | None = Field(default=None, repr=False, exclude=True)
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    priced_as: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _a_provider(cls, value: str) -> str:
        if parse_model_string(value).provider == "sim":
            raise ValueError("the simulator is hierplan.Simulator(...), not a ModelSpec")
        return value

    @field_validator("base_url")
    @classmethod
    def _a_url(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value)

    def adapter_options(self) -> dict[str, Any]:
        """The keyword options of the provider's adapter."""
        given = {
            "base_url": self.base_url,
            "api_key": self.api_key,
            "timeout_s": self.timeout_s,
            "priced_as": self.priced_as,
        }
        return {k: v for k, v in given.items() if v is not None} | self.options


ModelChoice = str | Model | ModelSpec | Simulator
"""What a run's model may be: a model string (``sim``, ``openai:<model>``), a model object, a
provider's :class:`ModelSpec`, or the :class:`~hierplan.Simulator` with its knobs."""


class BudgetSpec(BaseModel):
    """A run's budget: at most ``usd`` dollars and ``tokens`` tokens (``None``: unlimited),
    split among sub-goals by ``allocation`` (``need``, the default, ``equal``, ``weighted``
    or ``on-demand``), each call's input reserved by ``reservation`` (``exact``, ``bound``
    or ``estimate``: see :mod:`hierplan.models.counting`). The
    amounts are checked when the run starts (finite, not negative, at most
    :data:`~hierplan.budgets.budget.MAX_BUDGET_USD` and ``MAX_BUDGET_TOKENS``), with a message
    that names the option that set them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    usd: float | None = None
    # A float too, so that 1.5 tokens is refused by the budget's own check, which says why.
    tokens: int | float | None = None
    allocation: str = DEFAULT_ALLOCATION
    reservation: Reservation = "exact"

    @property
    def limited(self) -> bool:
        """Whether it caps anything."""
        return self.usd is not None or self.tokens is not None


class RunSpec(BaseModel):
    """One run: what to do, how, on which models, for how much (see the module docstring).

    ``goal`` is free text (or ``None`` to run ``scenario``'s own goal); ``strategy`` given here
    sets ``settings.strategy``. ``model`` plans (and executes unless ``executor_model`` is
    given). ``price_in``/``price_out`` (USD per million tokens) price the run's models;
    ``pricing`` is the price table (the built-in one by default). ``gate`` checks plans before
    they run (validators, an approver). ``workdir`` is a scenario's working directory
    (default ``runs/scenarios/<name>/<run id>``). ``run_id`` names the run (default: random).
    ``extra`` is kept with the run's checkpoint when it pauses (JSON data: the command line
    keeps how plans are reviewed there) and given back on resume. ``tools`` are toolsets as
    configuration (:class:`~hierplan.ToolsetSpec`, or mappings as a goal file writes them:
    ``{"mcp": {"command": ...}}``, ``{"python": "module:attribute"}``), opened for the run
    beside the tool objects given to :func:`hierplan.run`; their ``${VAR}`` are read from the
    environment when the run starts.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    goal: str | None = None
    scenario: str | Scenario | None = None
    settings: RunSettings = Field(default_factory=RunSettings)
    model: ModelChoice = "sim"
    executor_model: ModelChoice | None = None
    budget: BudgetSpec | None = None
    price_in: float | None = None
    price_out: float | None = None
    pricing: PriceTable | None = None
    gate: Gate | None = None
    workdir: Path | None = None
    run_id: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    tools: tuple[ToolsetSpec, ...] = ()

    @field_validator("tools", mode="before")
    @classmethod
    def _entries(cls, value: Any) -> Any:
        # Entries as a goal file writes them, each bad one named (a UserInputError, which
        # pydantic lets through as it is).
        return toolset_entries(value)

    def __init__(self, *, strategy: str | None = None, **data: Any) -> None:
        if strategy is not None:
            data["settings"] = settings_with(data.get("settings"), {"strategy": strategy})
        super().__init__(**data)

    def checked(self) -> RunSpec:
        """This spec if it can run, else a :class:`UserInputError` saying what is wrong (the
        strategy is known, there is a goal or a scenario, the goal fits a plan, both prices
        are given or neither, the toolsets' variables are set and their commands and modules
        found)."""
        get_strategy(self.settings.strategy)  # a clear error naming the known strategies
        goal = None if self.goal is None else self.goal.strip()
        if goal is not None and len(goal) > MAX_GOAL_CHARS:
            raise UserInputError(
                f"the goal is {len(goal):,} characters long; at most {MAX_GOAL_CHARS:,} fit "
                "a plan: put the material in a file or tool the run can read, and name it in "
                "the goal"
            )
        if self.scenario is None and not goal:
            raise UserInputError("no goal given: pass a goal, or a scenario (--scenario NAME)")
        if (self.price_in is None) != (self.price_out is None):
            raise UserInputError("give both --price-in and --price-out (USD per million tokens)")
        # When the run starts: a variable set, a command installed, a module importable now.
        check_toolsets(self.tools, os.environ)
        return self

    @property
    def simulated(self) -> bool:
        """Whether the planner's model is the offline simulator."""
        return is_simulated(self.model)


def is_simulated(model: ModelChoice | None) -> bool:
    """Whether ``model`` is the offline simulator (``sim``, ``sim:<priced-as>``, a
    :class:`Simulator`, or a simulated model object)."""
    if isinstance(model, Simulator):
        return True
    if isinstance(model, str):
        return model.partition(":")[0].strip().lower() == "sim"
    if isinstance(model, ModelSpec) or model is None:
        return False
    return model.provider == "sim"


def settings_with(
    settings: RunSettings | Mapping[str, Any] | None, overrides: Mapping[str, Any]
) -> RunSettings:
    """``settings`` (a :class:`RunSettings`, a mapping of its fields, or the defaults) with
    ``overrides`` (``None`` values left out), checked as one; a bad value raises
    :class:`UserInputError` naming it."""
    if settings is not None and not isinstance(settings, RunSettings | Mapping):
        raise TypeError(
            f"settings must be a hierplan.RunSettings or a mapping of its fields, not "
            f"{type(settings).__name__}: e.g. settings=hierplan.RunSettings(seed=1)"
        )
    given = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(settings, RunSettings) and not given:
        return settings
    base = settings.model_dump() if isinstance(settings, RunSettings) else dict(settings or {})
    merged = {**base, **given}
    if isinstance(merged.get("strategy"), str):
        get_strategy(merged["strategy"])  # a clear error naming the known strategies
    try:
        return RunSettings.model_validate(merged)
    except ValidationError as exc:
        raise UserInputError(
            f"invalid run settings: {field_problems(exc, 'settings')}; give each a value in "
            "its range (hierplan.RunSettings describes them; on the command line: "
            "--set NAME=VALUE)"
        ) from None


def check_base_url(base_url: str) -> str:
    """``base_url`` if it is an http(s) URL with a host; else a :class:`UserInputError`."""
    try:
        parts = urlsplit(base_url)
        scheme, host = parts.scheme, parts.hostname
    except ValueError:  # a bracketed host that is not an IPv6 address...
        scheme, host = "", None
    if scheme not in ("http", "https") or not host:
        raise UserInputError(
            f"--base-url {redact(base_url)!r} is not a URL: give one like http://localhost:8000/v1"
        )
    return base_url


_SECRET = re.compile(r"key|token|secret|password|auth|header|cookie", re.I)


def saved_choice(choice: ModelChoice | None) -> Any:
    """``choice`` as a paused run's checkpoint keeps it: a model string as it is, the
    simulator's and a provider's settings (never a key or other secret: those come from the
    environment again), and only the name of a model object (which must be given again)."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, Simulator):
        return {"simulator": choice.model_dump(mode="json")}
    if isinstance(choice, ModelSpec):
        data = choice.model_dump(mode="json")
        data["options"] = {
            k: v
            for k, v in choice.options.items()
            if not _SECRET.search(k) and isinstance(v, str | int | float | bool)
        }
        return {"provider": data}
    return {"object": choice.name}


def loaded_choice(saved: Any) -> ModelChoice | None:
    """The model a checkpoint names (``None`` for a model object, which must be given
    again); a :class:`UserInputError` when it is not one."""
    if saved is None or isinstance(saved, str):
        return saved
    try:
        if isinstance(saved, dict) and set(saved) == {"simulator"}:
            return Simulator.model_validate(saved["simulator"])
        if isinstance(saved, dict) and set(saved) == {"provider"}:
            return ModelSpec.model_validate(saved["provider"])
    except ValidationError as exc:
        raise UserInputError(
            f"the checkpoint's model is invalid ({field_problems(exc, 'model')})"
        ) from None
    if isinstance(saved, dict) and set(saved) == {"object"}:
        return None
    raise UserInputError(f"the checkpoint names no model hierplan knows: {saved!r}")
