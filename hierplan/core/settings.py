"""The settings of a run (:class:`RunSettings`): its strategy, limits, retries, deadlines and
token caps, each with a default and a range."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hierplan.plans.plan import DEFAULT_MAX_DEPTH, DEFAULT_MAX_STEPS

StrategyName = Literal["react", "plan-execute", "replan", "dag", "hierarchical", "as-needed"]

STRATEGY_NAMES: tuple[str, ...] = (
    "react",
    "plan-execute",
    "replan",
    "dag",
    "hierarchical",
    "as-needed",
)

STRATEGY_ENTRY_POINTS = "hierplan.strategies"
"""The entry point group through which an installed package adds a strategy: the entry point's
name is the strategy's, its object a ``hierplan.hierarchy.strategies.Strategy`` subclass."""


def registered_strategies() -> dict[str, EntryPoint]:
    """The strategies installed packages register, by name (a built-in name stays built-in)."""
    found = entry_points(group=STRATEGY_ENTRY_POINTS)
    return {ep.name: ep for ep in found if ep.name not in STRATEGY_NAMES}


def strategy_names() -> tuple[str, ...]:
    """Every strategy a run may name: the built-in ones, then the registered ones."""
    return STRATEGY_NAMES + tuple(sorted(registered_strategies()))


# Upper bounds of the settings: past them a run waits or retries for so long that it looks
# hung (an infinite or NaN delay never ends), so such a value is refused as a mistake.
DAY_S = 86_400.0
"""The longest time setting (a delay, a deadline), in seconds: a day."""

MAX_RETRIES = 100
"""The most retries, replans, rejections or invalid plans a setting may allow."""

MAX_TURNS = 1_000
"""The most model turns of an executor step or a ReAct run."""

MAX_OUTPUT_TOKENS = 1_000_000
"""The largest ``planner_max_tokens``/``executor_max_tokens``: more than any model writes."""

MAX_SEED = 2**31 - 1
"""The largest simulator seed: the same range on the command line, in goal files and goal lines
(a goal's seed derived from the batch's is 31 bits, so any goal's seed fits)."""


class RunSettings(BaseModel):
    """Limits and knobs of one run. Every field has a default a user would expect.

    Times are finite seconds up to :data:`DAY_S` (a day); counts of retries, replans,
    rejections and invalid plans go up to :data:`MAX_RETRIES`, model turns up to
    :data:`MAX_TURNS`, output tokens up to :data:`MAX_OUTPUT_TOKENS`: beyond them a run would
    wait or retry for ever. On the command line a setting is ``--set name=value``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategy: str = Field(
        "hierarchical",
        description="How the goal is planned and run (see STRATEGY_NAMES, or a registered one).",
    )
    max_depth: int = Field(DEFAULT_MAX_DEPTH, ge=1, le=10, description="Deepest plan level.")
    concurrency: int = Field(8, ge=1, description="Executor steps running at once, run-wide.")
    plan_concurrency: int = Field(8, ge=1, description="Steps of one plan running at once.")
    max_steps: int = Field(DEFAULT_MAX_STEPS, ge=1, description="Steps allowed in one plan.")
    max_retries: int = Field(
        2, ge=0, le=MAX_RETRIES, description="Retries of a failed step before replanning."
    )
    retry_backoff_s: float = Field(
        0.2,
        ge=0,
        le=DAY_S,
        allow_inf_nan=False,
        description="First retry delay of a step or a model call; doubles each time, up to a cap.",
    )
    retry_max_delay_s: float = Field(
        60.0,
        ge=0,
        le=DAY_S,
        allow_inf_nan=False,
        description="Longest wait before a step retry: the doubling stops there.",
    )
    max_replans: int = Field(
        2, ge=0, le=MAX_RETRIES, description="Replans per node after failures."
    )
    max_rejections: int = Field(
        3, ge=0, le=MAX_RETRIES, description="Plans a node may have rejected."
    )
    max_invalid_plans: int = Field(
        2, ge=0, le=MAX_RETRIES, description="Invalid plans a node may propose."
    )
    step_timeout_s: float | None = Field(
        300.0, gt=0, le=DAY_S, allow_inf_nan=False, description="Deadline of one step."
    )
    executor_max_turns: int = Field(
        8, ge=1, le=MAX_TURNS, description="Model turns of an executor step."
    )
    react_max_turns: int = Field(30, ge=1, le=MAX_TURNS, description="Model turns of a ReAct run.")
    redecide_tool_calls: bool = Field(
        True,
        description=(
            "Decide a plan's tool call again, with one executor call that sees its error, when "
            "the tool refuses what it was given, before the planner replans."
        ),
    )
    stream_plans: bool = Field(
        True,
        description=(
            "Run a first plan's steps as its lines are written, each checked on its own, when "
            "no review, extra validator or budget asks to see the plan whole."
        ),
    )
    join: bool = Field(
        False,
        description=(
            "After a streamed plan's steps finish, ask the planner's model once whether their "
            "results answer the goal (its answer is the node's) or call for a replan."
        ),
    )
    planner_max_tokens: int = Field(
        4096,
        ge=16,
        le=MAX_OUTPUT_TOKENS,
        description="Output tokens a planning call may use (a budget reserves them).",
    )
    executor_max_tokens: int = Field(
        1024,
        ge=16,
        le=MAX_OUTPUT_TOKENS,
        description=(
            "Output tokens an executor call may use (a budget reserves them); a reasoning model "
            "spends part of them thinking."
        ),
    )
    model_retries: int = Field(
        3, ge=0, le=MAX_RETRIES, description="Retries of a retryable model error."
    )
    model_retry_max_delay_s: float = Field(
        60.0,
        ge=0,
        le=DAY_S,
        allow_inf_nan=False,
        description="Longest wait before a model retry; a provider asking for more fails the call.",
    )
    transient_retries: int = Field(
        1,
        ge=0,
        le=MAX_RETRIES,
        description=(
            "Rounds of retries more a node gets, after transient_pause_s, when one of its model "
            "calls spent model_retries on transient errors (rate limits, server errors, timeouts)."
        ),
    )
    transient_pause_s: float = Field(
        5.0,
        ge=0,
        le=DAY_S,
        allow_inf_nan=False,
        description=(
            "Pause before such a round; a provider's longer Retry-After wins (up to "
            "model_retry_max_delay_s)."
        ),
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="Seed of the simulator: the same seed, the same run."
    )

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        # Only a name that is not built in costs a look at the installed entry points.
        if value not in STRATEGY_NAMES and value not in registered_strategies():
            raise ValueError(
                f"unknown strategy {value!r}: choose one of {', '.join(strategy_names())}"
            )
        return value

    @classmethod
    def checked(cls, values: Mapping[str, Any], *, strict: bool = False) -> dict[str, Any]:
        """Some settings (a goal file's, ``--set``'s) checked as a run would check them, as
        plain data; :class:`pydantic.ValidationError` names each bad one. ``strict``: no
        conversions (``true`` is no count, ``"3"`` no number)."""
        given = dict(values)
        return cls.model_validate(given, strict=strict).model_dump(mode="json", include=set(given))
