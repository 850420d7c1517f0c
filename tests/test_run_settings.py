"""Run settings that would make a run hang (an infinite delay, a day-long backoff, a million
retries) are refused, naming the setting, in Python, in goal files and on the command line."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

import hierplan
from hierplan.cli import app
from hierplan.core.settings import DAY_S, MAX_OUTPUT_TOKENS, MAX_RETRIES, MAX_TURNS
from hierplan.errors import UserInputError
from hierplan.runner.goals import goal_from_data, settings_from_assignments

TIMES = (
    "retry_backoff_s",
    "retry_max_delay_s",
    "step_timeout_s",
    "model_retry_max_delay_s",
    "transient_pause_s",
)
COUNTS = {
    "max_retries": MAX_RETRIES,
    "max_replans": MAX_RETRIES,
    "max_rejections": MAX_RETRIES,
    "max_invalid_plans": MAX_RETRIES,
    "model_retries": MAX_RETRIES,
    "transient_retries": MAX_RETRIES,
    "executor_max_turns": MAX_TURNS,
    "react_max_turns": MAX_TURNS,
    "planner_max_tokens": MAX_OUTPUT_TOKENS,
    "executor_max_tokens": MAX_OUTPUT_TOKENS,
}
BAD_TIMES = st.one_of(
    st.sampled_from([math.inf, -math.inf, math.nan]),
    st.floats(min_value=DAY_S, exclude_min=True, allow_nan=False),
)


def _refused(name: str, value: object) -> None:
    with pytest.raises(ValidationError) as found:
        hierplan.RunSettings.model_validate({name: value})
    assert [e["loc"] for e in found.value.errors()] == [(name,)]
    with pytest.raises(UserInputError, match=f"^--set {name}: Input should be"):
        settings_from_assignments([f"{name}={value}"], flags={})
    with pytest.raises(UserInputError, match=f"not a valid goal: {name}: Input should be"):
        goal_from_data({"goal": "g", name: value}, source="goal file g.yaml")


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(TIMES), value=BAD_TIMES)
def test_a_time_setting_that_is_not_finite_or_longer_than_a_day_is_refused(
    name: str, value: float
) -> None:
    _refused(name, value)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(COUNTS)))
def test_a_count_past_its_bound_is_refused(data: st.DataObject, name: str) -> None:
    value = data.draw(st.integers(min_value=COUNTS[name] + 1), label="value")
    _refused(name, value)


def test_the_bounds_themselves_are_accepted() -> None:
    given_ = {**dict.fromkeys(TIMES, DAY_S), **COUNTS}
    assert hierplan.RunSettings.checked(given_) == given_


def test_a_python_override_says_how_to_set_it() -> None:
    saved = hierplan.RunSettings(retry_backoff_s=1.0)
    with pytest.raises(UserInputError, match=r"max_depth: .*--set NAME=VALUE"):
        hierplan.run_sync("g", settings={**saved.model_dump(), "max_depth": 99})


def test_settings_of_another_type_are_refused_saying_what_to_give() -> None:
    with pytest.raises(
        TypeError, match=r"settings must be a hierplan.RunSettings or a mapping of its fields"
    ):
        hierplan.run_sync(scenario="data_migration", settings=["seed"])  # type: ignore[arg-type]
    for scale in ("fast", True, None):
        with pytest.raises(UserInputError, match=r"latency scale must be a finite number >= 0"):
            hierplan.Simulator(latency_scale=scale)


def test_the_command_line_refuses_an_infinite_delay_on_one_line() -> None:
    result = CliRunner().invoke(
        app, ["run", "--scenario", "data_migration", "-y", "--set", "retry_backoff_s=.inf"]
    )
    assert result.exit_code == 2
    assert result.output.strip() == "error: --set retry_backoff_s: Input should be a finite number"
    result = CliRunner().invoke(
        app, ["run", "--scenario", "data_migration", "--model-retries", "101"]
    )
    assert result.exit_code == 2 and "Invalid value for '--model-retries'" in result.output
