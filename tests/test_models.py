"""Model strings, strict scripted models, and the offline simulator."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hierplan
from hierplan import FunctionModel, ModelRequest, ModelResponse, ScriptedModel
from hierplan.agents.prompts import PlanPrompt, render_plan_prompt
from hierplan.core.settings import RunSettings
from hierplan.errors import (
    ModelError,
    ModelNotAvailableError,
    SimulatorCoverageError,
    UnexpectedModelCall,
    UserInputError,
)
from hierplan.hierarchy.context import NodeContext, RunContext
from hierplan.models import tokens
from hierplan.models.base import Message, Model, ToolSpec, parse_model_string
from hierplan.models.tokens import estimate_request_tokens, estimate_text_tokens
from hierplan.pricing import PriceTable
from hierplan.records import NodeRecord
from hierplan.runner.models import resolve_model
from hierplan.scenarios.data_migration.oracle import ROOT_GOAL, MigrationOracle
from hierplan.simulator.model import SimulatedModel, perturb_plan
from hierplan.simulator.profiles import PROFILES, NoiseProfile
from hierplan.tools.base import Toolbox
from hierplan.units import Usage

pytestmark = pytest.mark.anyio

REQ = ModelRequest(messages=(Message("user", "hello"),))


def test_model_strings() -> None:
    assert parse_model_string("sim") == parse_model_string(" SIM ")
    assert str(parse_model_string("anthropic:claude-haiku-4-5")) == "anthropic:claude-haiku-4-5"
    with pytest.raises(ModelNotAvailableError, match="unknown model 'gpt4'"):
        parse_model_string("gpt4")
    with pytest.raises(ModelNotAvailableError, match="names no model"):
        parse_model_string("openai:")


async def test_scripted_model_is_strict() -> None:
    model = ScriptedModel([ModelResponse(text="one"), RuntimeError("boom")])
    assert (await model.request(REQ)).text == "one"
    with pytest.raises(AssertionError, match="used 1 of 2"):
        model.assert_complete()
    with pytest.raises(RuntimeError, match="boom"):
        await model.request(REQ)
    model.assert_complete()
    with pytest.raises(UnexpectedModelCall, match="received call 3"):
        await model.request(REQ)


async def test_scripted_usage_is_estimated_unless_turned_off() -> None:
    with_usage = await ScriptedModel([ModelResponse(text="abcd" * 10)]).request(REQ)
    assert with_usage.usage is not None and with_usage.usage.output_tokens == 10
    without = await ScriptedModel([ModelResponse(text="x")], report_usage=False).request(REQ)
    assert without.usage is None


async def test_function_model_accepts_sync_and_async_functions() -> None:
    async def answer(req: ModelRequest) -> ModelResponse:
        return ModelResponse(text=str(len(req.messages)))

    assert (await FunctionModel(answer).request(REQ)).text == "1"
    assert (await FunctionModel(lambda r: ModelResponse(text="s")).request(REQ)).text == "s"


def test_token_estimates() -> None:
    assert estimate_text_tokens("") == 0
    assert estimate_text_tokens("abcde") == 2
    assert estimate_text_tokens("abcde数据") == 4  # a token per character outside ASCII
    assert estimate_request_tokens(REQ) == 4 + 2


def _uncached_tool_tokens(spec: ToolSpec) -> int:
    schema = json.dumps(spec.parameters, separators=(",", ":"), sort_keys=True)
    return 8 + estimate_text_tokens(spec.name + spec.description) + estimate_text_tokens(schema)


schemas = st.dictionaries(st.text(max_size=8), st.text(max_size=20) | st.integers(), max_size=5)


@settings(max_examples=100)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=10), st.text(max_size=30), schemas)))
def test_tool_estimates_are_counted_once_per_spec_and_stay_what_they_were(
    specs: list[tuple[str, str, dict[str, object]]],
) -> None:
    tools = tuple(
        ToolSpec(name, text, {"type": "object", "properties": p}) for name, text, p in specs
    )
    request = ModelRequest(messages=REQ.messages, tools=tools)
    expected = 4 + 2 + sum(_uncached_tool_tokens(t) for t in tools)
    assert estimate_request_tokens(request) == expected
    assert estimate_request_tokens(request) == expected  # the second time from the cache
    # An equal spec that is another object is counted on its own, and counts the same.
    copies = tuple(ToolSpec(t.name, t.description, dict(t.parameters)) for t in tools)
    assert estimate_request_tokens(ModelRequest(messages=REQ.messages, tools=copies)) == expected


def test_an_estimate_is_kept_on_its_spec_and_goes_with_it() -> None:
    spec = ToolSpec("t", "d", {"type": "object"})
    assert spec.tokens_estimate is None
    first = estimate_request_tokens(ModelRequest(messages=(), tools=(spec,)))
    assert spec.tokens_estimate == first == _uncached_tool_tokens(spec)
    assert not hasattr(tokens, "_ESTIMATES")  # nothing kept beside the spec
    assert spec == ToolSpec("t", "d", {"type": "object"})  # the memo is not part of its value


def oracle() -> MigrationOracle:
    return MigrationOracle(["a", "b"], {"b": ["a"]})


def plan_request(goal: str, seed_text: str = "") -> ModelRequest:
    from hierplan.agents.planner import PLAN_SCHEMA
    from hierplan.models.base import OutputSchema

    messages = render_plan_prompt(
        PlanPrompt(goal=goal, depth=1, max_depth=1, max_steps=50, feedback=seed_text or None), []
    )
    return ModelRequest(messages=messages, output_schema=OutputSchema("plan", PLAN_SCHEMA))


async def test_simulator_refuses_what_no_oracle_covers() -> None:
    model = SimulatedModel(oracle(), profile="ideal")
    with pytest.raises(
        SimulatorCoverageError, match=r"no oracle knows the goal 'Write me a poem'.*openai"
    ):
        await model.request(plan_request("Write me a poem"))
    with pytest.raises(SimulatorCoverageError, match="not a hierplan executor prompt"):
        await model.request(REQ)
    with pytest.raises(SimulatorCoverageError):
        await SimulatedModel(None).request(REQ)


async def test_simulator_answers_from_the_oracle_and_labels_itself() -> None:
    model = SimulatedModel(oracle(), profile="ideal")
    response = await model.request(plan_request(ROOT_GOAL))
    assert response.simulated and response.model == "sim"
    assert [s["id"] for s in response.output["steps"]][:2] == ["create_a", "create_b"]
    assert response.usage is not None
    assert response.usage.input_tokens == estimate_request_tokens(plan_request(ROOT_GOAL))
    assert response.usage.output_tokens == estimate_text_tokens(response.text)


async def test_simulator_is_reproducible_and_noise_follows_the_profile() -> None:
    noisy = NoiseProfile(plan_error_rate=1.0)
    first = [
        (await SimulatedModel(oracle(), profile=noisy, seed=s).request(plan_request(ROOT_GOAL)))
        for s in range(5)
    ]
    again = [
        (await SimulatedModel(oracle(), profile=noisy, seed=s).request(plan_request(ROOT_GOAL)))
        for s in range(5)
    ]
    assert [r.output for r in first] == [r.output for r in again]
    assert all(any(f.startswith("sim_plan_error:") for f in r.flags) for r in first)
    clean = await SimulatedModel(oracle(), profile="ideal").request(plan_request(ROOT_GOAL))
    assert all(r.output != clean.output for r in first)


def test_perturbations_are_one_error_each() -> None:
    import random

    from hierplan.plans.plan import Plan, Step

    plan = Plan(
        goal="g",
        steps=[
            Step(id="a", title="a", instruction="a", tool="t", args={"x": "v"}),
            Step(id="b", title="b", instruction="b", depends_on=["a"]),
        ],
    )
    kinds = set()
    for seed in range(30):
        changed, kind = perturb_plan(plan, random.Random(seed))
        kinds.add(kind)
        assert changed != plan
        assert all(d in {s.id for s in changed.steps} for s in changed.steps for d in s.depends_on)
    # A wrong tool argument is a decision's error, drawn per step like an executor's
    # (test_simulator_noise.py): perturb_plan makes the structural ones only.
    assert kinds == {"dropped_step", "missing_dependency"}


def test_profiles() -> None:
    assert PROFILES["ideal"].plan_error_probability(40) == 0
    typical = PROFILES["typical"]
    assert typical.plan_error_probability(40) > typical.plan_error_probability(2) > 0


async def test_resolve_model_errors_are_clear() -> None:
    with pytest.raises(ModelNotAvailableError):
        resolve_model("mistral:large")
    assert isinstance(resolve_model("sim:openai:gpt-4.1"), SimulatedModel)
    assert resolve_model("sim:openai:gpt-4.1").priced_as == "openai:gpt-4.1"


async def test_free_text_goal_on_the_simulator_is_a_user_error() -> None:
    with pytest.raises(UserInputError, match=r"free text.*OPENAI_API_KEY"):
        await hierplan.run("plan my wedding")
    with pytest.raises(UserInputError, match="no goal"):
        await hierplan.run("   ")
    with pytest.raises(UserInputError, match="unknown strategy 'yolo'"):
        await hierplan.run("x", strategy="yolo")


def test_the_function_models_docstring_shows_a_run_that_works() -> None:
    import doctest

    from hierplan.models import scripted

    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(FunctionModel, globs=vars(scripted).copy()):
        runner.run(test)
    outcome = runner.summarize(verbose=False)
    assert outcome.attempted > 0 and outcome.failed == 0, outcome


def _node(model: Model) -> NodeContext:
    """A one-node run context calling ``model``, retrying at once (no pause either)."""
    ctx = RunContext(
        run_id="t",
        settings=RunSettings(model_retries=2, retry_backoff_s=0, transient_pause_s=0),
        toolbox=Toolbox(),
        planner_model=model,
        executor_model=model,
        pricing=PriceTable({}),
    )
    return NodeContext(ctx, NodeRecord("1", "executor", "g", 1), allowed_tools=frozenset())


async def test_a_model_raising_a_plain_exception_fails_the_call_with_a_model_error() -> None:
    def broken(request: ModelRequest) -> ModelResponse:
        raise ValueError("no answer for this")

    model = FunctionModel(broken, name="mine")
    node = _node(model)
    with pytest.raises(
        ModelError, match=r"model 'mine' raised ValueError: no answer for this"
    ) as e:
        await node.call_model(REQ)
    assert isinstance(e.value.__cause__, ValueError)
    assert not e.value.retryable
    assert model.calls == 1  # not retried: the same request would raise again
    assert [(c.ok, c.flags) for c in node.record.calls] == [(False, ["failed"])]


async def test_a_model_raising_oserror_is_retried_as_a_transient_failure() -> None:
    outcomes: list[ModelResponse | Exception] = [
        ConnectionResetError("reset by peer"),
        TimeoutError("timed out"),
        ModelResponse(text="ok"),
    ]
    model = ScriptedModel(outcomes)
    node = _node(model)
    assert (await node.call_model(REQ)).text == "ok"
    model.assert_complete()
    assert [c.ok for c in node.record.calls] == [False, False, True]

    always = FunctionModel(lambda r: (_ for _ in ()).throw(OSError("network is unreachable")))
    node = _node(always)
    with pytest.raises(ModelError, match="raised OSError: network is unreachable") as e:
        await node.call_model(REQ)
    assert e.value.retryable and isinstance(e.value.__cause__, OSError)
    # The first attempt and model_retries=2, then one more such round (transient_retries=1).
    assert always.calls == 6 and node.record.transient_retries == 1


async def test_a_run_whose_model_raises_ends_failed_with_the_models_message() -> None:
    def broken(request: ModelRequest) -> ModelResponse:
        raise KeyError("plan")

    result = await hierplan.run("greet", model=FunctionModel(broken), strategy="dag")
    assert result.status == "failed"
    assert result.error is not None and "model 'function' raised KeyError" in result.error


_ONE_STEP = {"goal": "g", "steps": [{"id": "a", "title": "a", "instruction": "do a"}]}


def _answering(bad: object) -> FunctionModel:
    from hierplan.models.scripted import plan_response

    def respond(request: ModelRequest) -> object:
        return plan_response(_ONE_STEP) if request.phase == "planning" else bad

    return FunctionModel(respond, priced_as="openai:gpt-5-mini")  # type: ignore[arg-type]


@pytest.mark.anyio
def _response(**fields: Any) -> ModelResponse:
    return ModelResponse(**fields)  # fields of any type: what the tests below are about


def _usage(**counts: Any) -> Usage:
    return Usage(**counts)


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (_response(text="x", usage={"input_tokens": 5}), "usage {'input_tokens': 5}: give Usage("),
        (
            _response(text="x", usage=_usage(input_tokens=5.0)),
            "usage input_tokens=5.0: token counts are whole",
        ),
        (_response(text="x", flags=None), "flags None: a response's flags are a list"),
        (_response(text=None), "text None: a response's text is a str"),
        ("just text", "str, not a ModelResponse: return text_response("),
    ],
)
@pytest.mark.parametrize("budget_usd", [None, 1.0])
async def test_a_malformed_answer_of_a_users_function_fails_the_step_saying_what_is_wrong(
    bad: object, said: str, budget_usd: float | None
) -> None:
    """It used to leave the run as an AttributeError, or under a budget as a LedgerError about
    an account still open (the call's reservation was never settled)."""
    result = await hierplan.run(
        "g",
        model=_answering(bad),
        strategy="dag",
        settings=RunSettings(max_retries=0, max_replans=0),
        budget={"usd": budget_usd},
    )
    assert result.status == "failed"
    step = result.tree.children[0]
    assert step.error is not None and said in step.error, step.error
    if budget_usd is not None:
        assert result.budget is not None
        assert result.budget["spent"]["tokens"] == sum(
            c.usage.total_tokens for n in result.nodes() for c in n.calls
        )


@pytest.mark.anyio
@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(Usage)])
async def test_every_usage_count_must_be_whole(name: str) -> None:
    usage = _usage(**{name: 1.5})
    model = FunctionModel(lambda request: ModelResponse(text="x", usage=usage))
    request = ModelRequest(messages=(Message("user", "hi"),), max_tokens=10, phase="execution")
    with pytest.raises(ModelError, match=f"usage {name}=1.5: token counts are whole numbers"):
        await model.request(request)
