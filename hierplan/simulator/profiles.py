"""The simulator's noise profiles: how far it strays from its oracle, how slow it is, and
which real model its usage is priced as."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hierplan.errors import UserInputError


class NoiseProfile(BaseModel):
    """How far the simulator strays from its oracle. Rates are probabilities.

    Every mechanism applies to every request the same way, whatever the strategy that sent it,
    so that differences between strategies emerge from what they ask of the model. The same
    decision has the same error rate whoever makes it:

    - **Decisions.** A tool call with its arguments (chosen by an executor, or written as a
      direct tool step of a plan) and an executor's final answer are decisions. The decision
      made after ``k`` others in the same context (an executor loop's earlier tool calls; a
      plan's earlier steps, and those of the answers a repair follows) is wrong with
      probability ``executor_error_rate + executor_error_per_action * k``, or
      ``executor_error_after_error + executor_error_per_action * k`` once the context reports
      an error, capped at ``max_error_rate``. An executor's context reports an error once one
      of its tool calls failed; a planning call's when its prompt reports a failed step, an
      invalid answer to repair, a failed direct attempt or a rejected or invalid plan. A wrong
      decision gives up (an executor answers ``FAILED:``) with probability ``give_up_share``;
      otherwise it is wrong honestly: one argument of the tool call is wrong, or a final answer
      states a wrong value. A plan cannot give up one step, so the give-up share of a plan's
      wrong decisions is no error: a plan's tool step has a wrong argument exactly as often as
      an executor's tool call at the same horizon, ``(1 - give_up_share)`` times the decision's
      error rate. A replan writes only the steps still to do: the done steps whose results
      stand are not written, and are no decisions.
    - **Structural plan errors** (a dropped step, a missing dependency) only plans can make,
      since only plans state steps and their order. A plan of ``n`` steps written gets one with
      probability ``1 - (1 - plan_error_rate) * (1 - s) ** n``, ``s`` being
      ``plan_error_per_step``; each step can carry its own, so long plans may have several.
      After a failure ``s`` grows by what a decision's rate grows by
      (``executor_error_after_error - executor_error_rate``), capped at ``max_error_rate``.
    - **Parallel calls.** ``max_calls_per_turn`` (0: no limit) caps how many tool calls one turn
      may emit; the rest wait for later turns.
    - **Latency** of a call: a time to first token, ``latency_median_s`` times a log-normal
      factor (``latency_sigma``), plus ``latency_per_output_token_s`` per output token (hidden
      reasoning included).
    - **Verbosity**: hidden reasoning of ``verbosity`` times the answer length, counted as
      output (and reasoning) tokens.
    """

    # No inf or nan: an infinite latency waits forever, a nan one silently means none.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = "custom"
    plan_error_rate: float = Field(
        0.0, ge=0, le=1, description="Structural error chance of any plan."
    )
    plan_error_per_step: float = Field(
        0.0, ge=0, le=1, description="Structural error chance per plan step."
    )
    executor_error_rate: float = Field(
        0.0, ge=0, le=1, description="Error chance of a first decision (tool call or answer)."
    )
    executor_error_per_action: float = Field(
        0.0, ge=0, le=1, description="Added per decision already made in the same context."
    )
    executor_error_after_error: float = Field(
        0.0, ge=0, le=1, description="Error chance once the context reports an earlier error."
    )
    max_error_rate: float = Field(0.5, ge=0, le=1, description="Cap of a decision's error chance.")
    give_up_share: float = Field(
        0.3, ge=0, le=1, description="Share of an executor's wrong decisions that give up."
    )
    max_calls_per_turn: int = Field(0, ge=0, description="Tool calls one turn may emit (0: any).")
    latency_median_s: float = Field(0.0, ge=0, description="Median time to first token of a call.")
    latency_sigma: float = Field(0.0, ge=0, description="Log-normal spread of that latency.")
    latency_per_output_token_s: float = Field(
        0.0, ge=0, description="Generation time per output token."
    )
    verbosity: float = Field(0.0, ge=0, description="Extra reasoning text, x the answer length.")

    def decision_error_probability(self, horizon: int, had_error: bool) -> float:
        """Chance that a decision is wrong: an executor's next tool call or final answer, or a
        plan's direct tool step.

        ``horizon`` is how many decisions the same context made before it; ``had_error``
        whether the context reports an earlier error.
        """
        base = self.executor_error_after_error if had_error else self.executor_error_rate
        return min(self.max_error_rate, base + self.executor_error_per_action * horizon)

    def wrong_args_probability(self, horizon: int, had_error: bool) -> float:
        """Chance that a tool call decided at ``horizon`` has a wrong argument: the decision is
        wrong and does not give up. The same for an executor's call and a plan's tool step."""
        return self.decision_error_probability(horizon, had_error) * (1 - self.give_up_share)

    def plan_step_error_probability(self, after_failure: bool) -> float:
        """Chance of a structural error per plan step; after a failure it grows by what a
        decision's error chance grows by."""
        if not after_failure:
            return self.plan_error_per_step
        growth = max(0.0, self.executor_error_after_error - self.executor_error_rate)
        return min(
            max(self.max_error_rate, self.plan_error_per_step), self.plan_error_per_step + growth
        )

    def plan_error_probability(self, steps: int, after_failure: bool = False) -> float:
        """Chance that a plan of ``steps`` steps gets at least one structural error."""
        step = self.plan_step_error_probability(after_failure)
        return 1 - (1 - self.plan_error_rate) * (1 - step) ** steps


# Where the defaults come from (the simulator is calibrated, not fitted to any benchmark). Each
# value of "typical" and "weak", with its source, or "assumption" where no published figure
# was found (docs/simulator.md has the same list):
#
# - plan_error_rate 0.03 / 0.09, plan_error_per_step 0.02 / 0.06 (structural errors).
#   PlanBench (Valmeekam et al., arXiv:2206.10498, 2022) finds GPT-4 writes a correct
#   Blocksworld plan about a third of the time, worse as plans get longer; LLMCompiler (Kim et
#   al., arXiv:2312.04511, 2023) reports about 90% accuracy on ParallelQA with plans of a few
#   to ten calls. One profile serves every suite, so "typical" takes 2% per step plus 3% per
#   plan, which matches ParallelQA-sized plans and is optimistic for Blocksworld. "weak"
#   triples it (assumption).
# - executor_error_rate 0.03 / 0.09: a few percent of a GPT-4-class model's decisions are
#   wrong (assumption, of the same order as the plan errors above); "weak" triples it.
# - executor_error_per_action 0.004 / 0.012 and executor_error_after_error 0.10 / 0.30: per-step
#   accuracy falls as one context executes more steps, and faster once the context holds the
#   model's own earlier errors ("self-conditioning", Sinha et al., arXiv:2509.09677, 2025);
#   ADaPT (Prasad et al., arXiv:2311.05772, 2023) attributes ReAct's failures on TextCraft to
#   this loss of track over long trajectories. The direction is sourced, the values are an
#   assumption.
# - max_error_rate 0.5 / 0.8: assumption (a decision stays better than a coin flip for
#   "typical").
# - give_up_share 0.3: a third of wrong decisions give up, two thirds are wrong arguments or
#   answers (assumption).
# - max_calls_per_turn 0: no cap; the prompts ask for independent calls in one turn and current
#   function-calling models make them (a design choice). Set 1 for the one-call-per-thought
#   ReAct of the papers.
# - latency_median_s 0.8 (time to first token). The usage is priced as openai:gpt-5-mini by
#   default, used without (or with minimal) reasoning effort. Measured: a mean time to first
#   token of 0.78 s for gpt-5-mini at minimal reasoning effort over 32 requests (Fetch Rewards,
#   "Landing Page Agent Latency Optimization", 2025-12-08); Artificial Analysis's provider
#   pages (median of the past 72 hours, 10k input tokens; pages as stored, undated, after
#   GPT-5.1's release of November 2025) give 0.89 s for GPT-5 (minimal) and 0.93 s for
#   GPT-4.1 mini on OpenAI's API. "weak" 1.7: the slower provider of that class on the same
#   pages (GPT-5 (minimal) on Azure, 1.70 s).
# - latency_sigma 0.4 / 0.6: assumption (no published spread of the time to first token was
#   found); the Fetch Rewards measurement's total times (p95 1.5x the mean) fit a log-normal
#   spread of about 0.27, for whole responses rather than their first token.
# - latency_per_output_token_s 0.014: Artificial Analysis's median output speed of GPT-5 mini
#   (minimal), 71.2 tokens/s (as quoted from its data by shadabchow.com's page on the model,
#   undated, 2025), and 77.2 tokens/s for GPT-4.1 mini on OpenAI's API (Artificial Analysis,
#   as above). "weak" 0.02 (50 tokens/s): assumption, a slower endpoint.
# - verbosity 0.3 / 1.0: hidden reasoning of 0.3x the answer, as a reasoning model at low effort
#   spends (assumption; at minimal effort gpt-5-mini spends none, Fetch Rewards as above);
#   "weak" reasons at length (assumption).
#
# "ideal" is the oracle itself: no errors, no latency, no verbosity.
PROFILES: Mapping[str, NoiseProfile] = {
    "ideal": NoiseProfile(name="ideal", max_error_rate=0.0),
    "typical": NoiseProfile(
        name="typical",
        plan_error_rate=0.03,
        plan_error_per_step=0.02,
        executor_error_rate=0.03,
        executor_error_per_action=0.004,
        executor_error_after_error=0.10,
        max_error_rate=0.5,
        give_up_share=0.3,
        latency_median_s=0.8,
        latency_sigma=0.4,
        latency_per_output_token_s=0.014,
        verbosity=0.3,
    ),
    "weak": NoiseProfile(
        name="weak",
        plan_error_rate=0.09,
        plan_error_per_step=0.06,
        executor_error_rate=0.09,
        executor_error_per_action=0.012,
        executor_error_after_error=0.30,
        max_error_rate=0.8,
        give_up_share=0.3,
        latency_median_s=1.7,
        latency_sigma=0.6,
        latency_per_output_token_s=0.02,
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


def check_latency_scale(latency_scale: object) -> None:
    """Refuse a simulated latency scale that is not a finite number >= 0: ``inf`` would wait
    for ever on every call, ``nan`` would silently mean no latency."""
    if (
        isinstance(latency_scale, bool)
        or not isinstance(latency_scale, int | float)
        or not math.isfinite(latency_scale)
        or latency_scale < 0
    ):
        raise UserInputError(
            f"the simulated latency scale must be a finite number >= 0, not {latency_scale!r}"
        )


DEFAULT_SIMULATED_PRICED_AS = "openai:gpt-5-mini"


class Simulator(BaseModel):
    """The offline simulator as a run's model, with its own knobs.

    >>> fast = Simulator(latency_scale=0)
    >>> hierplan.run_sync(scenario="data_migration", model=fast)  # doctest: +SKIP

    ``profile`` is a noise profile (a name of :data:`PROFILES` or a :class:`NoiseProfile`);
    ``latency_scale`` multiplies its latency (0: none, CPU time only); ``priced_as`` is the
    real model whose prices its usage is charged at. ``oracle`` answers for the goal: by
    default the scenario's or benchmark suite's; the run's ``seed`` (a run setting) seeds its
    noise.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    profile: str | NoiseProfile = "typical"
    latency_scale: float = 1.0
    priced_as: str | None = None
    oracle: Any = Field(default=None, exclude=True, repr=False)

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str | NoiseProfile) -> str | NoiseProfile:
        if isinstance(value, str):
            get_profile(value)  # a clear error naming the profiles
        return value

    @field_validator("latency_scale", mode="before")
    @classmethod
    def _finite_scale(cls, value: object) -> object:
        check_latency_scale(value)
        return value

    @property
    def name(self) -> str:
        """The model string it stands for (``sim`` or ``sim:<priced-as>``)."""
        return "sim" if self.priced_as is None else f"sim:{self.priced_as}"
