"""@tool: signature to schema, validation, threads for sync tools, timeouts."""

from __future__ import annotations

import functools
import math
import pickle
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import date
from functools import partial
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import AfterValidator, BaseModel, Field, field_validator

import hierplan
from hierplan import Plan, ScriptedModel, Step, tool
from hierplan.errors import (
    ToolArgsError,
    ToolError,
    ToolNotAllowedError,
    ToolTimeoutError,
    UserInputError,
)
from hierplan.models.scripted import plan_response
from hierplan.tools.base import Toolbox, result_text

pytestmark = pytest.mark.anyio


@tool
def scale(
    values: list[float], factor: Annotated[float, Field(gt=0, description="multiplier")] = 2.0
) -> list[float]:
    """Scale numbers.

    Longer text that is not part of the description.
    """
    return [v * factor for v in values]


def test_signature_becomes_a_json_schema() -> None:
    assert scale.name == "scale" and scale.description == "Scale numbers."
    params = scale.parameters
    assert params["required"] == ["values"]
    assert params["properties"]["values"]["type"] == "array"
    assert params["properties"]["factor"]["exclusiveMinimum"] == 0
    assert params["additionalProperties"] is False


async def test_arguments_are_validated_and_every_bad_field_named() -> None:
    assert await scale.call({"values": [1, 2]}) == [2.0, 4.0]
    with pytest.raises(ToolArgsError) as info:
        await scale.call({"values": "x", "factor": -1, "oops": 1})
    message = str(info.value)
    assert "values" in message and "factor" in message and "oops" in message
    with pytest.raises(ToolArgsError, match="takes an object"):
        await scale.call([1, 2])  # type: ignore[arg-type]


async def test_sync_tools_run_in_a_worker_thread() -> None:
    main = threading.get_ident()

    @tool
    def where() -> int:
        """Report the thread."""
        return threading.get_ident()

    assert await where.call({}) != main


async def test_an_async_function_under_a_sync_decorator_is_awaited() -> None:
    def logged(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

        return wrapper

    @tool
    @logged
    async def double(n: int) -> int:
        """Double a number."""
        await anyio.lowlevel.checkpoint()
        return 2 * n

    assert await double.call({"n": 21}) == 42


async def test_timeouts_abandon_a_slow_tool() -> None:
    @tool(timeout_s=0.05)
    async def sleepy() -> str:
        """Sleep too long."""
        await anyio.sleep(5)
        return "late"

    @tool(timeout_s=0.05)
    def blocking() -> str:
        """Block too long."""
        time.sleep(0.3)
        return "late"

    start = time.perf_counter()
    with pytest.raises(ToolTimeoutError, match=r"within 0\.05 s"):
        await sleepy.call({})
    with pytest.raises(ToolTimeoutError):
        await blocking.call({})
    assert time.perf_counter() - start < 0.3


async def test_a_timeout_the_tool_raises_itself_keeps_its_message() -> None:
    @tool(timeout_s=30)
    def lookup() -> str:
        """Ask a slow upstream service."""
        raise TimeoutError("the upstream service did not answer within 2 s")

    with pytest.raises(TimeoutError, match="upstream service") as caught:
        await lookup.call({})
    assert not isinstance(caught.value, ToolTimeoutError)


@pytest.mark.parametrize("timeout_s", [0, -1.0, float("nan"), None, "30"])
def test_a_tool_deadline_that_is_not_a_positive_number_is_refused(timeout_s: Any) -> None:
    with pytest.raises(UserInputError, match=r"'quick': timeout_s must be a number of seconds"):

        @tool(timeout_s=timeout_s)
        def quick() -> str:
            """Answer at once."""
            return "done"


async def test_math_inf_means_no_deadline() -> None:
    @tool(timeout_s=math.inf)
    async def patient() -> str:
        """Take a moment."""
        await anyio.sleep(0.01)
        return "done"

    assert await patient.call({}) == "done"


def test_toolbox_allowlists_and_unknown_tools() -> None:
    box = Toolbox([scale])
    with pytest.raises(ValueError, match="two tools"):
        box.add(scale)
    with pytest.raises(ToolNotAllowedError, match="unknown tool 'nope'"):
        box.get("nope")
    with pytest.raises(ToolNotAllowedError, match="not allowed"):
        box.get("scale", frozenset())
    assert box.specs(frozenset()) == ()
    assert [s.name for s in box.specs()] == ["scale"]
    assert issubclass(ToolNotAllowedError, ToolError)


def test_result_text_is_bounded() -> None:
    assert result_text({"a": 1}) == '{"a": 1}'
    long = result_text("x" * 5000, limit=10)
    assert long.startswith("x" * 10) and long.endswith("[4990 more]")


class Reading(BaseModel):
    city: str
    celsius: float


def test_result_text_gives_json_for_any_value_and_never_raises() -> None:
    assert result_text(Reading(city="Lima", celsius=18.5)) == '{"city": "Lima", "celsius": 18.5}'
    assert result_text({"seen": {3}, "at": date(2026, 1, 2)}) == '{"seen": [3], "at": "2026-01-02"}'
    assert result_text({(0, 1): "b"}) == '{"0,1": "b"}'  # keys JSON cannot take
    looped: dict[str, Any] = {"n": 1}
    looped["self"] = looped
    assert result_text(looped) == "{'n': 1, 'self': {...}}"


async def test_a_tool_result_json_cannot_hold_still_ends_the_step() -> None:
    @tool
    def grid() -> dict[tuple[int, int], str]:
        """The cells of a grid."""
        return {(0, 0): "a", (0, 1): "b"}

    step = Step(id="g", title="grid", instruction="read the grid", tool="grid", args={})
    model = ScriptedModel([plan_response(Plan(goal="grid", steps=[step]))])
    result = await hierplan.run("grid", model=model, tools=[grid], strategy="dag")
    assert result.status == "succeeded", result.error
    assert result.answer == '{"0,0": "a", "0,1": "b"}'


def test_varargs_are_refused() -> None:
    def f(*args: int) -> None:
        """No."""

    with pytest.raises(TypeError, match="not supported"):
        tool(f)


def test_two_tools_of_one_name_are_bad_input_before_the_run_starts() -> None:
    import hierplan
    from hierplan import ScriptedModel

    renamed = tool(name="scale", description="Echo.")(lambda values: values)
    # An empty script: a model call would raise UnexpectedModelCall, not UserInputError.
    model = ScriptedModel([])
    with pytest.raises(hierplan.UserInputError, match="two tools are named 'scale'"):
        hierplan.run_sync("scale numbers", model=model, tools=[scale, renamed], strategy="dag")


def test_a_tool_needs_a_name_model_providers_accept() -> None:
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    for unnamed in (lambda a: a, partial(add, b=1)):
        with pytest.raises(ValueError, match=r"name=") as caught:
            tool(unnamed)
        assert "letters, digits" in str(caught.value)
    with pytest.raises(ValueError, match=r"'add numbers'"):
        tool(name="add numbers")(add)
    with pytest.raises(ValueError, match=r"at most 64"):
        tool(name="a" * 65)(add)
    add_one = tool(partial(add, b=1), name="add-one")
    assert add_one.name == "add-one"
    assert add_one.description == "Add."  # the function's, not functools.partial's docstring
    assert add_one.parameters["properties"]["a"]["type"] == "integer"
    assert tool(name="A_b-9")(add).name == "A_b-9"


async def test_positional_only_parameters_are_passed_by_position() -> None:
    def power(base: float, exponent: int = 2, /, *, rounded: bool = False) -> float:
        """Raise a number to a power."""
        value = base**exponent
        return round(value) if rounded else value

    async def offset(value: int, /) -> int:
        """Add one."""
        return value + 1

    assert await tool(power).call({"base": 1.5}) == 2.25
    assert await tool(power).call({"base": 2, "exponent": 3, "rounded": True}) == 8
    assert await tool(offset).call({"value": 41}) == 42


async def test_parameters_named_like_pydantic_internals_keep_their_names() -> None:
    @tool
    def tag(_id: int, model_config: str = "default", json: bool = False) -> str:
        """Tag a record."""
        return f"{_id}:{model_config}:{json}"

    assert sorted(tag.parameters["properties"]) == ["_id", "json", "model_config"]
    assert tag.parameters["required"] == ["_id"]
    assert await tag.call({"_id": 7, "model_config": "x"}) == "7:x:False"
    with pytest.raises(ToolArgsError, match=r"_id: expected integer, got string 'seven'") as info:
        await tag.call({"_id": "seven", "arg0": 1})
    assert "arg0: unexpected argument" in str(info.value)


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")

    __repr__ = __str__


def test_result_text_never_raises_on_values_without_text() -> None:
    huge = math.factorial(2000)  # 5736 digits: more than Python turns into decimal text
    assert result_text(huge).startswith("[a int with no text form: Exceeds the limit")
    assert result_text([Unprintable()]) == "[a list with no text form: no text]"
    assert result_text(Unprintable()) == "[a Unprintable with no text form: no text]"


async def test_a_tool_result_without_text_does_not_crash_the_run() -> None:
    @tool
    def factorial(n: int) -> int:
        """n!"""
        return math.factorial(n)

    step = Step(id="f", title="f", instruction="2000!", tool="factorial", args={"n": 2000})
    model = ScriptedModel([plan_response(Plan(goal="f", steps=[step]))])
    result = await hierplan.run("f", model=model, tools=[factorial], strategy="dag")
    assert result.status == "succeeded", result.error
    assert (result.answer or "").startswith("[a int with no text form")


class Query(BaseModel):
    table: str

    @field_validator("table")
    @classmethod
    def known(cls, table: str) -> str:
        return {"users": "users"}[table]  # a KeyError, which pydantic does not wrap


async def test_a_validator_raising_any_error_makes_the_arguments_invalid() -> None:
    @tool
    def count(query: Query) -> int:
        """Count the rows of a table."""
        return 3

    assert await count.call({"query": {"table": "users"}}) == 3
    with pytest.raises(ToolArgsError, match=r"tool 'count': KeyError: 'nope'"):
        await count.call({"query": {"table": "nope"}})
    step = Step(
        id="c", title="c", instruction="count", tool="count", args={"query": {"table": "nope"}}
    )
    plan = plan_response(Plan(goal="c", steps=[step]))
    model = ScriptedModel([plan])
    settings = hierplan.RunSettings(max_invalid_plans=0)  # no second proposal
    result = await hierplan.run("c", model=model, tools=[count], strategy="dag", settings=settings)
    model.assert_complete()
    assert result.status == "failed"  # the plan gate refused the plan: no crash
    assert "KeyError: 'nope'" in (result.error or "")


async def test_a_run_above_40_steps_at_once_runs_as_many_sync_tools_at_once() -> None:
    # Every step's sync tool waits until all of them are running: with the 40 worker threads
    # anyio allows by default, the last ten would never start and the barrier would break.
    concurrency = 50
    barrier = threading.Barrier(concurrency, timeout=5)

    @tool
    def meet(n: int) -> int:
        """Wait for every other step's call."""
        barrier.wait()
        return n

    steps = [
        Step(id=f"s{i}", title=f"meet {i}", instruction="meet", tool="meet", args={"n": i})
        for i in range(concurrency)
    ]
    model = ScriptedModel([plan_response(Plan(goal="meet", steps=steps))])
    result = await hierplan.run(
        "meet",
        model=model,
        tools=[meet],
        strategy="dag",
        settings=hierplan.RunSettings(
            concurrency=concurrency, plan_concurrency=concurrency, max_steps=concurrency
        ),
    )
    assert result.status == "succeeded", result.error
    assert result.stats["peak_concurrent_leaves"] == concurrency


def test_runs_of_40_steps_at_once_or_fewer_share_anyio_default_thread_limiter() -> None:
    from hierplan.tools.base import _tool_threads, tool_threads

    with tool_threads(40):
        assert _tool_threads.get() is None  # the default limiter, shared with the loop
    with tool_threads(41):
        limiter = _tool_threads.get()
        assert limiter is not None and limiter.total_tokens == 41
    assert _tool_threads.get() is None


def test_invalid_arguments_name_at_most_ten_problems() -> None:
    @tool
    def total(xs: list[int]) -> int:
        """Add numbers."""
        return sum(xs)

    with pytest.raises(ToolArgsError) as caught:
        total.validate({"xs": ["x"] * 500})
    message = str(caught.value)
    # the message goes back to the model: ten findings and a count, not five hundred
    assert message.count("expected integer, got string 'x'") == 10
    assert message.endswith("; and 490 more")


@pytest.mark.parametrize(("retryable", "attempts"), [(True, 3), (False, 1), (None, 3)])
async def test_a_tool_says_whether_its_failure_is_worth_a_retry(
    retryable: bool | None, attempts: int
) -> None:
    calls: list[int] = []

    @tool
    def fetch() -> str:
        """Fetch a page."""
        calls.append(1)
        if retryable is None:
            raise ToolError("down")  # the class's own: retried
        raise ToolError("down", retryable=retryable)

    step = {"id": "a", "title": "A", "instruction": "fetch", "tool": "fetch", "args": {}}
    model = ScriptedModel([plan_response({"goal": "g", "steps": [step]})])
    # Not decided again by a model call (tests/test_redecide.py): retries only.
    settings = hierplan.RunSettings(
        max_retries=2, retry_backoff_s=0, max_replans=0, redecide_tool_calls=False
    )
    result = await hierplan.run(
        "g", model=model, tools=[fetch], strategy="plan-execute", settings=settings
    )
    assert result.status == "failed" and "down" in (result.error or "")
    assert len(calls) == attempts
    assert [n.attempts for n in result.tree.walk() if n.tool == "fetch"] == [attempts]


def test_a_tool_error_keeps_its_retryable_flag_through_pickling() -> None:
    for error in (ToolError("x", retryable=False), ToolTimeoutError("t"), ToolArgsError("a")):
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), str(copy), copy.retryable) == (
            type(error),
            str(error),
            error.retryable,
        )
    assert pickle.loads(pickle.dumps(ToolError("x", retryable=False))).retryable is False


class Opaque:
    """A class pydantic has no schema for."""


def _annotated(annotation: Any) -> Callable[..., None]:
    def fetch(url: str, handle: Any) -> None:
        """Fetch a page."""

    fetch.__annotations__ = {"url": str, "handle": annotation}
    return fetch


@pytest.mark.parametrize(
    ("annotation", "shown"),
    [(Opaque, "Opaque"), (threading.Lock, "allocate_lock"), (Callable[[int], int], "Callable")],
)
def test_a_parameter_type_without_a_schema_is_refused_when_the_tool_is_made(
    annotation: Any, shown: str
) -> None:
    with pytest.raises(TypeError) as caught:
        tool(_annotated(annotation))
    message = str(caught.value)
    assert message.startswith("tool 'fetch': parameter 'handle' is annotated ")
    assert shown in message and "use str, int, float, bool" in message


def test_a_tool_without_a_description_is_warned_about_where_it_is_made() -> None:
    def bare(a: int) -> int:
        return a

    with pytest.warns(
        UserWarning, match="tool 'bare' has no description: give its function a"
    ) as w:
        tool(bare)
    assert w[0].filename == __file__
    with pytest.warns(UserWarning, match="tool 'other' has no description") as w:
        tool(name="other")(bare)
    assert w[0].filename == __file__
    assert tool(description="Pass a number on.")(bare).description == "Pass a number on."


async def test_a_generator_tool_returns_the_list_of_what_it_yields() -> None:
    @tool
    def countdown(n: int) -> Iterator[int]:
        """Count down to 1."""
        thread.append(threading.get_ident())
        yield from range(n, 0, -1)

    @tool
    async def pages(n: int) -> AsyncIterator[str]:
        """Fetch n pages."""
        for i in range(n):
            await anyio.lowlevel.checkpoint()
            yield f"page {i}"

    thread: list[int] = []
    assert await countdown.call({"n": 3}) == [3, 2, 1]
    assert thread != [threading.get_ident()]  # run to its end in a worker thread
    assert await pages.call({"n": 2}) == ["page 0", "page 1"]
    assert result_text(await pages.call({"n": 1})) == '["page 0"]'


async def test_a_generator_tool_that_fails_midway_fails_the_step() -> None:
    @tool
    def partly(n: int) -> Iterator[int]:
        """Yield, then fail."""
        yield n
        raise RuntimeError("source went away")

    step = {"id": "a", "title": "A", "instruction": "go", "tool": "partly", "args": {"n": 1}}
    model = ScriptedModel([plan_response({"goal": "g", "steps": [step]})])
    settings = hierplan.RunSettings(max_retries=0, max_replans=0)
    result = await hierplan.run(
        "g", model=model, tools=[partly], strategy="plan-execute", settings=settings
    )
    assert result.status == "failed" and "RuntimeError: source went away" in (result.error or "")


def test_the_toolbox_vouches_once_for_the_very_arguments_it_checked() -> None:
    box = Toolbox([scale])
    args = {"values": [1.0, 2.0]}
    box.check_planned("scale", args)
    assert not box.take_checked("scale", {"values": [1.0, 2.0]})  # equal, not the same
    assert not box.take_checked("other", args)  # the same arguments for another tool
    box.check_planned("scale", args)
    assert box.take_checked("scale", args)
    assert not box.take_checked("scale", args)  # once: a later attempt checks again
    with pytest.raises(ToolArgsError, match="values"):
        box.check_planned("scale", {"values": "many"})
    assert not box.take_checked("scale", {"values": "many"})


async def _run_steps(
    goal: str, steps: list[Step], target: hierplan.Tool, settings: hierplan.RunSettings
) -> hierplan.RunResult:
    """Run a plan of ``steps`` as it is written (dag), with ``target`` its only tool."""
    return await hierplan.run(
        goal,
        model=ScriptedModel([plan_response(Plan(goal=goal, steps=steps))]),
        tools=[target],
        strategy="dag",
        settings=settings,
    )


class _Stock(hierplan.Tool):
    """A tool whose check asks the world (what is in stock), not only the arguments."""

    def __init__(self, stock: set[str]) -> None:
        schema = {"type": "object", "properties": {"item": {"type": "string"}}}
        super().__init__("take", "Take an item from stock.", schema)
        self.stock = stock
        self.checks = 0

    def validate(self, arguments: Any) -> Any:
        self.checks += 1
        if arguments.get("item") not in self.stock:
            raise ToolArgsError(f"no {arguments.get('item')!r} in stock")
        return arguments

    async def invoke(self, arguments: Any) -> Any:
        self.stock.discard(arguments["item"])
        return arguments["item"]


_PANTRY: set[str] = set()


def _in_pantry(item: str) -> str:
    if item not in _PANTRY:
        raise ValueError(f"no {item!r} in the pantry")
    return item


@tool
def cook(item: Annotated[str, AfterValidator(_in_pantry)]) -> str:
    """Cook an item from the pantry."""
    _PANTRY.discard(item)
    return item


def _two_takes(tool_name: str) -> list[Step]:
    return [
        Step(id="a", title="a", instruction="take", tool=tool_name, args={"item": "apple"}),
        Step(
            id="b",
            title="b",
            instruction="take",
            tool=tool_name,
            args={"item": "apple"},
            depends_on=["a"],
        ),
    ]


@pytest.mark.parametrize("kind", ["validate", "signature"])
async def test_a_check_that_asks_the_world_runs_again_at_the_call(kind: str) -> None:
    # Two steps take the one apple: both pass the gate, and the second step's call, checked
    # again when it runs, finds none left and fails with the tool's own message. The check is
    # a Tool's validate, or a validator in a @tool's signature.
    _PANTRY.clear()
    _PANTRY.add("apple")
    take = _Stock({"apple"})
    target: hierplan.Tool = take if kind == "validate" else cook
    settings = hierplan.RunSettings(max_retries=0, max_replans=0, redecide_tool_calls=False)
    result = await _run_steps("take apples", _two_takes(target.name), target, settings)
    assert result.status == "partial", result.error
    (second,) = [n for n in result.tree.walk() if n.step_id == "b"]
    assert second.status == "failed"
    assert "in stock" in (second.error or "") or "in the pantry" in (second.error or "")
    if kind == "validate":
        assert take.checks == 4  # two at the gate, one at each call


class _Collect(hierplan.Tool):
    """A tool that adds to the list it is given, and fails (so as to be retried) at first."""

    def __init__(self) -> None:
        schema = {"type": "object", "properties": {"items": {"type": "array"}}}
        super().__init__("collect", "Collect items.", schema)
        self.seen: list[list[str]] = []

    async def invoke(self, arguments: Any) -> Any:
        self.seen.append(list(arguments["items"]))
        arguments["items"].append("added")
        if len(self.seen) == 1:
            raise ToolError("busy, try again", retryable=True)
        return len(arguments["items"])


async def test_what_a_tool_does_to_its_arguments_stays_its_own() -> None:
    # The tool changes the list it was given: the plan keeps its arguments, and the retry gets
    # them as the plan wrote them.
    collect = _Collect()
    step = Step(id="s1", title="c", instruction="collect", tool="collect", args={"items": ["a"]})
    result = await _run_steps("collect", [step], collect, hierplan.RunSettings(retry_backoff_s=0.0))
    assert result.status == "succeeded", result.error
    assert collect.seen == [["a"], ["a"]]
    assert result.tree.plan_versions[-1].plan.steps[0].args == {"items": ["a"]}
    (node,) = [n for n in result.tree.walk() if n.step_id == "s1"]
    assert [c.arguments for c in node.tool_calls] == ['{"items": ["a"]}'] * 2


async def test_a_planned_call_is_not_schema_checked_again_but_a_retry_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The gate checks a tool-only step's arguments against the tool's schema; its first call
    # does not check them again, but still converts them (the date arrives as a date). The
    # retry after a failure checks them again.
    from hierplan.tools.schema import schema_problems as real

    checks: list[Any] = []

    def counted(schema: Any, value: Any, *args: Any, **kwargs: Any) -> list[str]:
        checks.append(value)
        return real(schema, value, *args, **kwargs)

    monkeypatch.setattr("hierplan.tools.base.schema_problems", counted)
    seen: list[date] = []

    @tool
    def on(day: date) -> str:
        """Do something on a day; fails the first time."""
        seen.append(day)
        if len(seen) == 1:
            raise ToolError("busy, try again", retryable=True)
        return day.isoformat()

    step = Step(id="s1", title="on", instruction="on", tool="on", args={"day": "2026-01-02"})
    result = await _run_steps("on a day", [step], on, hierplan.RunSettings(retry_backoff_s=0.0))
    assert result.status == "succeeded", result.error
    assert seen == [date(2026, 1, 2)] * 2
    assert checks == [{"day": "2026-01-02"}] * 2  # the gate's and the retry's, not the first call's
