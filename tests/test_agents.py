"""Planner parsing and repair; executors: references, tool errors, limits, retries, deadlines."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hierplan
from hierplan import (
    FunctionModel,
    ModelRequest,
    ModelResponse,
    Plan,
    RunSettings,
    ScriptedModel,
    Step,
    ToolCall,
    tool,
)
from hierplan.agents.executor import resolve_refs
from hierplan.agents.planner import LLMPlanner, parse_plan_output
from hierplan.agents.prompts import (
    StepPrompt,
    indented_json,
    parse_step_prompt,
    render_step_prompt,
)
from hierplan.core.results import StepResult
from hierplan.errors import PlanParseError
from hierplan.models.provider import RepeatedKeyError, loads_json
from hierplan.models.scripted import plan_response, text_response, tool_response

pytestmark = pytest.mark.anyio

GOOD = {"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "do a"}]}


@tool
def echo(text: str) -> str:
    """Echo text."""
    return text


@tool
async def nap(seconds: float) -> str:
    """Sleep."""
    await anyio.sleep(seconds)
    return "rested"


def test_plans_parse_from_compact_lines_fenced_or_not() -> None:
    lines = '1. echo("hi")\n2. task: say $1 twice'
    for text in (lines, "```\n" + lines + "\n```", "```text\n" + lines + "\n```"):
        plan = parse_plan_output(ModelResponse(text=text), goal="greet", params={"echo": ("text",)})
        assert plan.goal == "greet"
        assert [(s.id, s.args, s.depends_on) for s in plan.steps] == [
            ("1", {"text": "hi"}, []),
            ("2", None, ["1"]),
        ]
    with pytest.raises(PlanParseError, match=r"plan line 2 \('2. echo\(\)x'\): unexpected"):
        parse_plan_output(ModelResponse(text='1. echo(text="a")\n2. echo()x'), goal="g")


def test_plans_parse_from_structured_output_or_text() -> None:
    assert parse_plan_output(ModelResponse(output=GOOD)).steps[0].id == "a"
    fenced = "Here you go:\n```json\n" + json.dumps(GOOD) + "\n```\nthanks"
    assert parse_plan_output(ModelResponse(text=fenced)).goal == "g"
    assert parse_plan_output(ModelResponse(text="plan: " + json.dumps(GOOD) + " end")).goal == "g"
    with pytest.raises(PlanParseError, match="empty output"):
        parse_plan_output(ModelResponse(text=" "))
    with pytest.raises(PlanParseError, match="not valid JSON"):
        parse_plan_output(ModelResponse(text="{nope"))
    with pytest.raises(PlanParseError, match="steps: Field required"):
        parse_plan_output(ModelResponse(output={"goal": "g"}))


def test_numbers_no_plan_can_hold_are_a_parse_error_not_a_crash() -> None:
    # A model looping on digits: an integer too long for Python to convert, or estimates
    # that budget arithmetic cannot take (inf; an integer too large for a float).
    step = {"id": "a", "title": "A", "instruction": "do a"}
    too_long = '{"goal": "g", "steps": [], "x": ' + "9" * 5000 + "}"
    with pytest.raises(PlanParseError, match="a number with too many digits"):
        parse_plan_output(ModelResponse(text=too_long))
    for estimate in ({"estimate_tokens": 10**400}, {"estimate_usd": 1e300}):
        with pytest.raises(PlanParseError, match=r"estimate_.*less than or equal"):
            parse_plan_output(ModelResponse(output={"goal": "g", "steps": [{**step, **estimate}]}))
    # inf and NaN are not numbers out of range but no numbers at all: said so, not "<= 1e9".
    for bad in (float("inf"), float("nan")):
        with pytest.raises(PlanParseError, match=r"estimate_usd: Input should be a finite number"):
            parse_plan_output(
                ModelResponse(output={"goal": "g", "steps": [{**step, "estimate_usd": bad}]})
            )


def test_a_plan_with_a_key_given_twice_is_refused_not_read_as_its_last_value() -> None:
    # json.loads keeps the last value: the step below would run as "b", not as written.
    text = '{"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "x", "id": "b"}]}'
    with pytest.raises(PlanParseError, match=r"'id' given more than once in one object: keep one"):
        parse_plan_output(ModelResponse(text=text))
    twice = '{"goal": "g", "goal": "h", "steps": [], "steps": []}'
    with pytest.raises(PlanParseError, match=r"'goal', 'steps' given more than once"):
        parse_plan_output(ModelResponse(text=twice))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=12,
)


def _with_a_repeated_key(value: Any) -> tuple[str, str] | None:
    """``value`` as JSON with the first key of its first non-empty object (in document order)
    written once more in front, and that key; ``None`` when it holds no such object. Built from
    the value, not found in the text: ``{"`` in the text may be inside a string (``["{", "a"]``)."""
    repeated: list[str] = []

    def dump(item: Any) -> str:
        if isinstance(item, dict) and item:
            first = not repeated
            if first:
                repeated.append(next(iter(item)))
            members = [f"{json.dumps(k)}: {dump(v)}" for k, v in item.items()]
            if first:
                members.insert(0, f"{json.dumps(repeated[0])}: 0")
            return "{" + ", ".join(members) + "}"
        if isinstance(item, list):
            return "[" + ", ".join(dump(v) for v in item) + "]"
        return json.dumps(item)

    text = dump(value)
    return (text, repeated[0]) if repeated else None


@settings(max_examples=200)
@given(json_values)
def test_loads_json_reads_what_json_writes_and_refuses_a_repeated_key(value: Any) -> None:
    assert loads_json(json.dumps(value)) == value
    # The same document with one object's first key written again: refused, naming the key.
    doubled = _with_a_repeated_key(value)
    if doubled is not None:
        text, key = doubled
        with pytest.raises(RepeatedKeyError) as caught:
            loads_json(text)
        assert caught.value.keys == [key]


@settings(max_examples=300)
@given(st.dictionaries(st.text(), st.text()) | json_values)
def test_a_prompt_json_block_is_what_json_dumps_writes(value: Any) -> None:
    # Inputs (text by step id) are written item by item; everything else by json.dumps.
    assert indented_json(value) == json.dumps(value, indent=1, default=str)
    assert json.loads(indented_json(value)) == value


def test_step_inputs_reach_the_executor_prompt_and_read_back() -> None:
    inputs = {"s1": 'a "quoted"\nline', "s2": "caf\u00e9 \U0001f600", "s-3": ""}
    rendered = render_step_prompt(StepPrompt("use them", inputs=inputs))
    assert '"s1": "a \\"quoted\\"\\nline"' in rendered[1].content
    parsed = parse_step_prompt(rendered)
    assert parsed is not None and parsed.inputs == inputs


def test_a_brace_and_quote_inside_a_string_is_not_taken_for_an_object() -> None:
    # The example that made the property test fail when it searched the text for '{"'.
    assert _with_a_repeated_key(["{", "a"]) is None
    assert loads_json(json.dumps(["{", "a"])) == ["{", "a"]
    assert _with_a_repeated_key({"x": {"{": 1}}) == ('{"x": 0, "x": {"{": 1}}', "x")


@settings(max_examples=200)
@given(st.text(max_size=300))
def test_any_model_text_parses_to_a_plan_or_a_clear_error(text: str) -> None:
    try:
        plan = parse_plan_output(ModelResponse(text=text))
    except PlanParseError as exc:
        assert str(exc)
    else:
        assert isinstance(plan, Plan)


async def test_an_invalid_plan_gets_one_repair_attempt() -> None:
    model = ScriptedModel(
        [ModelResponse(text="not json"), plan_response(GOOD), text_response("ok")]
    )
    result = await hierplan.run("g", model=model, strategy="dag")
    model.assert_complete()
    assert result.status == "succeeded"
    repair = model.requests[1].messages[-1].content
    assert repair.startswith("REPAIR: that plan was invalid: plan line 1 ('not json')")
    assert [c.purpose for c in result.tree.calls] == ["plan", "plan-repair"]


@pytest.mark.parametrize(
    "cut",
    [
        ModelResponse(text='{"goal": "g", "steps": [{"id": "a", "ti', finish_reason="length"),
        ModelResponse(text='{"goal": "g", "steps": [', finish_reason="max_tokens"),
        ModelResponse(text='{"goal": "g"', flags=["truncated"]),
    ],
)
async def test_a_plan_cut_at_max_tokens_fails_at_once_naming_the_setting(
    cut: ModelResponse,
) -> None:
    # No repair prompt: asked with the same limit, the model would be cut at the same place.
    model = ScriptedModel([cut])
    limits = RunSettings(planner_max_tokens=300)
    result = await hierplan.run("g", model=model, strategy="dag", settings=limits)
    model.assert_complete()
    assert result.status == "failed"
    error = result.error or ""
    assert "plan for node 1 was cut at the token limit (planner_max_tokens=300)" in error
    assert "--set planner_max_tokens=N" in error
    assert [c.purpose for c in result.tree.calls] == ["plan"]


async def test_a_cut_reply_that_still_holds_a_whole_plan_is_used() -> None:
    # Only the words after the plan were cut: the plan itself is complete.
    cut = ModelResponse(text=json.dumps(GOOD) + " I hope th", finish_reason="length")
    model = ScriptedModel([cut, text_response("ok")])
    result = await hierplan.run("g", model=model, strategy="dag")
    model.assert_complete()
    assert result.status == "succeeded"


def test_repair_attempts_cannot_be_negative() -> None:
    with pytest.raises(ValueError, match="repair_attempts must be 0 or more, not -1"):
        LLMPlanner(repair_attempts=-1)


async def test_a_plan_that_stays_invalid_fails_the_node_clearly() -> None:
    model = ScriptedModel([ModelResponse(text="nope"), ModelResponse(output={"goal": "g"})])
    result = await hierplan.run("g", model=model, strategy="dag")
    assert result.status == "failed"
    assert "plan for node 1 was invalid after 2 attempt(s)" in (result.error or "")
    assert result.tree.status == "failed"


def test_references_resolve_to_dependency_outputs() -> None:
    inputs = {"a": StepResult([1, 2], "[1, 2]"), "b": StepResult(7, "7")}
    assert resolve_refs({"x": "$a", "y": "sum of $a and $b", "z": "$c", "n": 3}, inputs) == {
        "x": [1, 2],
        "y": "sum of [1, 2] and 7",
        "z": "$c",
        "n": 3,
    }


def test_punctuation_after_a_reference_stays_and_dollar_amounts_are_text() -> None:
    inputs = {"a": StepResult([1, 2], "[1, 2]"), "a.b": StepResult(3, "3")}
    out = resolve_refs({"x": "Summary: $a.", "y": "pay $100 for $a.b-", "z": "$a-"}, inputs)
    assert out == {"x": "Summary: [1, 2].", "y": "pay $100 for 3-", "z": "[1, 2]-"}


async def test_tool_errors_go_back_to_the_executor_model() -> None:
    model = ScriptedModel(
        [
            plan_response(
                {"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "echo"}]}
            ),
            tool_response(("echo", {"txt": "typo"})),
            tool_response(("echo", {"text": "fixed"})),
            text_response("said fixed"),
        ]
    )
    result = await hierplan.run("g", model=model, tools=[echo], strategy="dag")
    model.assert_complete()
    assert result.answer == "said fixed"
    error_reply = model.requests[2].messages[-1].content
    assert error_reply.startswith("ERROR: invalid arguments for tool 'echo'")


async def test_executor_turns_are_bounded() -> None:
    model = ScriptedModel(
        [plan_response({"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "loop"}]})]
        + [tool_response(("echo", {"text": "again"}))] * 2
    )
    result = await hierplan.run(
        "g",
        model=model,
        tools=[echo],
        strategy="plan-execute",
        settings=hierplan.RunSettings(executor_max_turns=2, max_retries=0),
    )
    model.assert_complete()
    assert result.status == "failed" and "no answer after 2 model turns" in (result.error or "")


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (ModelResponse(text="Hello, dear us", finish_reason="length", flags=["truncated"]),
         "the answer was cut at the token limit (executor_max_tokens=1024"),
        (ModelResponse(text="", finish_reason="length", flags=["truncated"]),
         "the answer was cut at the token limit"),
        (ModelResponse(text="I can't help with that.", flags=["refusal"]),
         "the model refused the step: I can't help with that."),
        (ModelResponse(text="", finish_reason="content_filter", flags=["content_filter"]),
         "the provider's content filter stopped the answer"),
    ],
)  # fmt: skip
async def test_a_cut_refused_or_filtered_answer_fails_the_step_without_retrying_it(
    answer: ModelResponse, reason: str
) -> None:
    plan = {"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "greet"}]}
    model = ScriptedModel([plan_response(plan), answer])
    result = await hierplan.run(
        "g", model=model, strategy="plan-execute", settings=hierplan.RunSettings(max_retries=2)
    )
    model.assert_complete()  # one executor call: the same request would end the same way
    leaf = result.tree.children[0]
    assert leaf.status == "failed" and leaf.attempts == 1
    assert (leaf.error or "").startswith(reason)


async def test_step_deadline_then_retries_then_failure() -> None:
    steps: list[dict[str, Any]] = [
        {"id": "a", "title": "A", "instruction": "nap", "tool": "nap", "args": {"seconds": 5}}
    ]
    model = ScriptedModel([plan_response({"goal": "g", "steps": steps})])
    result = await hierplan.run(
        "g",
        model=model,
        tools=[nap],
        strategy="plan-execute",
        settings=hierplan.RunSettings(step_timeout_s=0.05, max_retries=1, retry_backoff_s=0),
    )
    leaf = result.tree.children[0]
    assert leaf.status == "failed" and leaf.attempts == 2
    assert leaf.error == "step timed out after 0.05 s"


async def test_step_retry_backoff_doubles_up_to_its_cap() -> None:
    steps: list[dict[str, Any]] = [
        {"id": "a", "title": "A", "instruction": "nap", "tool": "nap", "args": {"seconds": 5}}
    ]
    events: list[hierplan.Event] = []
    result = await hierplan.run(
        "g",
        model=ScriptedModel([plan_response({"goal": "g", "steps": steps})]),
        tools=[nap],
        strategy="plan-execute",
        listeners=[events.append],
        settings=hierplan.RunSettings(
            step_timeout_s=0.01, max_retries=5, retry_backoff_s=0.01, retry_max_delay_s=0.03
        ),
    )
    assert result.tree.children[0].attempts == 6
    delays = [e.delay_s for e in events if isinstance(e, hierplan.StepRetried)]
    assert delays == pytest.approx([0.01, 0.02, 0.03, 0.03, 0.03])


async def test_global_leaf_limit_holds_across_sub_plans() -> None:
    running = 0
    peak = 0

    @tool
    async def work(n: int) -> int:
        """Work a little."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.02)
        running -= 1
        return n

    def sub(req: Any) -> ModelResponse:
        return plan_response(
            {
                "goal": "sub",
                "steps": [
                    {
                        "id": f"w{i}",
                        "title": "w",
                        "instruction": "w",
                        "tool": "work",
                        "args": {"n": i},
                    }
                    for i in range(5)
                ],
            }
        )

    root = {
        "goal": "g",
        "steps": [
            {"id": f"s{i}", "title": "s", "instruction": f"sub {i}", "kind": "subgoal"}
            for i in range(4)
        ],
    }
    model = ScriptedModel([plan_response(root), sub, sub, sub, sub])
    result = await hierplan.run("g", model=model, tools=[work], settings={"concurrency": 3})
    assert result.status == "succeeded"
    assert peak == 3 and result.stats["peak_concurrent_leaves"] == 3


async def test_cancelling_a_run_stops_every_task_and_marks_nodes() -> None:
    steps = [
        {"id": f"n{i}", "title": "n", "instruction": "nap", "tool": "nap", "args": {"seconds": 30}}
        for i in range(4)
    ]
    model = ScriptedModel([plan_response({"goal": "g", "steps": steps})])
    started = time.perf_counter()
    with anyio.move_on_after(0.2) as scope:
        await hierplan.run("g", model=model, tools=[nap], strategy="dag")
    assert scope.cancelled_caught
    assert time.perf_counter() - started < 2  # every step (30 s naps) stopped promptly


def test_steps_are_frozen() -> None:
    step = Step(id="a", title="a", instruction="a")
    with pytest.raises(Exception, match="frozen"):
        step.id = "b"  # type: ignore[misc]


async def test_a_hierplan_error_from_a_tool_in_a_parallel_turn_fails_the_step_not_the_run() -> None:
    @tool
    def lookup(key: str) -> str:
        """Refuse every key."""
        raise hierplan.StepFailed(f"no record {key!r}; the step cannot go on")

    plan = {"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "look up"}]}
    model = ScriptedModel(
        [plan_response(plan), tool_response(("lookup", {"key": "k"}), ("nap", {"seconds": 30}))]
    )
    started = time.perf_counter()
    result = await hierplan.run(
        "g",
        model=model,
        tools=[lookup, nap],
        strategy="plan-execute",
        settings=hierplan.RunSettings(max_retries=0),
    )
    assert time.perf_counter() - started < 5  # the sibling call was cancelled, not waited for
    leaf = result.tree.children[0]
    assert leaf.status == "failed" and leaf.error == "no record 'k'; the step cannot go on"


async def test_a_tool_call_cut_by_the_step_deadline_is_reported_as_not_ok() -> None:
    steps = [{"id": "a", "title": "A", "instruction": "nap", "tool": "nap", "args": {"seconds": 5}}]
    events: list[Any] = []
    await hierplan.run(
        "g",
        model=ScriptedModel([plan_response({"goal": "g", "steps": steps})]),
        tools=[nap],
        strategy="plan-execute",
        listeners=[events.append],
        settings=hierplan.RunSettings(step_timeout_s=0.05, max_retries=0),
    )
    calls = [e for e in events if e.type == "tool_called"]
    assert [(e.tool, e.ok, e.error) for e in calls] == [
        ("nap", False, "cancelled before it finished")
    ]


async def test_tool_calls_of_the_last_allowed_turn_are_not_run() -> None:
    sent: list[str] = []

    @tool
    def send(text: str) -> str:
        """Send a message."""
        sent.append(text)
        return "sent"

    plan = {"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "send"}]}
    model = ScriptedModel(
        [
            plan_response(plan),
            tool_response(("send", {"text": "first"})),
            tool_response(("send", {"text": "again"})),
        ]
    )
    result = await hierplan.run(
        "g",
        model=model,
        tools=[send],
        strategy="plan-execute",
        settings=hierplan.RunSettings(executor_max_turns=2, max_retries=0),
    )
    model.assert_complete()
    assert "no answer after 2 model turns" in (result.error or "")
    assert sent == ["first"]  # the second turn's call had no turn left to read its result


async def test_parallel_calls_that_share_an_id_each_get_their_own_reply() -> None:
    seen: list[ModelRequest] = []

    def answer(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            return plan_response(
                {"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "x"}]}
            )
        seen.append(request)
        if len(seen) == 1:  # a server that gives every parallel call one id, or none
            calls = [ToolCall("dup", "echo", {"text": t}) for t in ("one", "two")]
            return ModelResponse(tool_calls=(*calls, ToolCall("", "echo", {"text": "three"})))
        return text_response("done")

    result = await hierplan.run("g", model=FunctionModel(answer), tools=[echo], strategy="dag")
    assert result.status == "succeeded", result.error
    assistant, *replies = seen[1].messages[-4:]
    ids = [c.id for c in assistant.tool_calls]
    assert ids[0] == "dup" and len(set(ids)) == 3 and all(ids)
    assert [(m.tool_call_id, m.content) for m in replies] == list(
        zip(ids, ["one", "two", "three"], strict=True)
    )


@pytest.mark.parametrize("step_timeout_s", [None, 30.0])
async def test_a_timeout_the_model_raises_is_not_the_step_deadline(
    step_timeout_s: float | None,
) -> None:
    def answer(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            return plan_response(
                {"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "x"}]}
            )
        raise TimeoutError("the model server did not answer within 2 s")

    settings = hierplan.RunSettings(step_timeout_s=step_timeout_s, max_retries=0)
    result = await hierplan.run(
        "g", model=FunctionModel(answer), strategy="plan-execute", settings=settings
    )
    leaf = result.tree.children[0]
    assert leaf.status == "failed"
    # The model's own timeout fails the call (as a ModelError naming the model), not the step's
    # deadline: the message is the model's, not "step timed out".
    assert leaf.error == (
        "model 'function' raised TimeoutError: the model server did not answer within 2 s"
    )


async def test_a_tool_calling_sys_exit_fails_its_step_not_the_run() -> None:
    @tool
    def cli(argv: list[str]) -> str:
        """Run a small command line."""
        parser = argparse.ArgumentParser(prog="cli")
        parser.add_argument("--n", type=int, required=True)
        return str(parser.parse_args(argv).n)  # exits with status 2 on bad arguments

    steps = [{"id": "c", "title": "c", "instruction": "run", "tool": "cli", "args": {"argv": []}}]
    model = ScriptedModel([plan_response({"goal": "g", "steps": steps})])
    result = await hierplan.run(
        "g",
        model=model,
        tools=[cli],
        strategy="plan-execute",
        settings=hierplan.RunSettings(max_retries=0),
    )
    leaf = result.tree.children[0]
    assert leaf.status == "failed" and leaf.error == "tool 'cli' failed: SystemExit: 2"


def test_references_inside_list_and_object_arguments_resolve_too() -> None:
    inputs = {"a": StepResult([1, 2], "[1, 2]"), "b": StepResult(7, "7")}
    args = {"xs": ["$a", "$b", 3], "opts": {"label": "b is $b", "deep": [["$a"]]}}
    assert resolve_refs(args, inputs) == {
        "xs": [[1, 2], 7, 3],
        "opts": {"label": "b is 7", "deep": [[[1, 2]]]},
    }


async def test_a_list_argument_of_references_gets_the_dependency_outputs() -> None:
    @tool
    def join(parts: list[str]) -> str:
        """Join texts."""
        return " + ".join(parts)

    steps: list[dict[str, Any]] = [
        {"id": "a", "title": "A", "instruction": "a", "tool": "echo", "args": {"text": "left"}},
        {"id": "b", "title": "B", "instruction": "b", "tool": "echo", "args": {"text": "right"}},
        {
            "id": "j",
            "title": "J",
            "instruction": "join",
            "tool": "join",
            "args": {"parts": ["$a", "$b"]},
            "depends_on": ["a", "b"],
        },
    ]
    model = ScriptedModel([plan_response({"goal": "g", "steps": steps})])
    result = await hierplan.run("g", model=model, tools=[echo, join], strategy="dag")
    assert result.status == "succeeded", result.error
    assert result.answer == "left + right"  # not "$a + $b"


def test_the_gate_sees_references_inside_list_arguments() -> None:
    from hierplan.plans.plan import step_refs

    step = Step(
        id="j", title="J", instruction="j", tool="join", args={"parts": ["$a", {"k": "$b."}]}
    )
    assert step_refs(step, {"a", "b", "j"}) == {"a", "b"}


async def test_a_reference_inside_text_gets_the_whole_output_not_the_cut_text() -> None:
    @tool
    def draft() -> dict[str, str]:
        """Write a long draft."""
        return {"body": "x" * 6000}

    @tool
    def save(content: str) -> int:
        """Save a document; answer its length."""
        return len(content)

    steps: list[dict[str, Any]] = [
        {"id": "d", "title": "D", "instruction": "draft", "tool": "draft", "args": {}},
        {
            "id": "s",
            "title": "S",
            "instruction": "save",
            "tool": "save",
            "args": {"content": "Report: $d"},
            "depends_on": ["d"],
        },
    ]
    model = ScriptedModel([plan_response({"goal": "g", "steps": steps})])
    result = await hierplan.run("g", model=model, tools=[draft, save], strategy="dag")
    assert result.status == "succeeded", result.error
    assert result.answer == str(len('Report: {"body": "' + "x" * 6000 + '"}'))


async def test_an_empty_final_answer_fails_the_attempt_and_is_retried() -> None:
    plan = {"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "greet"}]}
    model = ScriptedModel([plan_response(plan), text_response("  "), text_response("hello")])
    result = await hierplan.run(
        "g",
        model=model,
        strategy="plan-execute",
        settings=hierplan.RunSettings(max_retries=1, retry_backoff_s=0),
    )
    model.assert_complete()
    leaf = result.tree.children[0]
    assert leaf.status == "succeeded" and leaf.attempts == 2 and result.answer == "hello"
