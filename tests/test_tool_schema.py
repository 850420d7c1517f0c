"""Tool arguments are checked against the JSON schema the model sees, not pydantic's lax rules."""

from __future__ import annotations

import enum
import threading
from typing import Any, Literal

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from tool_support import Declared

import hierplan
from hierplan import ScriptedModel, tool
from hierplan.errors import ToolArgsError
from hierplan.models.scripted import plan_response, text_response, tool_response
from hierplan.tools.schema import schema_problems

pytestmark = pytest.mark.anyio


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: int
    y: int


@tool
def draw(
    count: int,
    ratio: float,
    flag: bool,
    label: str,
    sizes: list[int],
    grid: list[list[int]] | None = None,
    limit: int | None = None,
    mode: Literal["fast", "slow"] = "fast",
    color: Color = Color.RED,
    at: Point | None = None,
    weights: dict[str, float] | None = None,
) -> str:
    """Draw something."""
    return f"{count} {ratio} {flag} {label} {sizes} {grid} {limit} {mode} {color} {at} {weights}"


GOOD: dict[str, Any] = {"count": 1, "ratio": 0.5, "flag": True, "label": "x", "sizes": [1, 2]}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"count": True}, "count: expected integer, got boolean True"),
        ({"count": "1"}, "count: expected integer, got string '1'"),
        ({"ratio": "0.5"}, "ratio: expected number, got string '0.5'"),
        ({"ratio": False}, "ratio: expected number, got boolean False"),
        ({"flag": 1}, "flag: expected boolean, got integer 1"),
        ({"flag": "true"}, "flag: expected boolean, got string 'true'"),
        ({"sizes": ["1"]}, "sizes.0: expected integer, got string '1'"),
        ({"sizes": [1, True]}, "sizes.1: expected integer, got boolean True"),
        ({"grid": [[1], [2, "3"]]}, "grid.1.1: expected integer, got string '3'"),
        ({"limit": "2"}, "limit: no choice matches (expected integer, got string '2' | "),
        ({"mode": "medium"}, "mode: expected one of 'fast', 'slow', got 'medium'"),
        ({"color": "green"}, "color: expected one of 'red', 'blue', got 'green'"),
        ({"at": {"x": "1", "y": 2}}, "at.x: expected integer, got string '1'"),
        ({"at": {"x": 1}}, "at.y: missing (it is required)"),
        ({"weights": {"a": "1.5"}}, "weights.a: expected number, got string '1.5'"),
        ({"extra": 1}, "extra: unexpected argument (the known ones: count, ratio"),
    ],
)
def test_arguments_the_schema_forbids_are_refused_by_path_and_type(
    change: dict[str, Any], problem: str
) -> None:
    args = {**GOOD, **change}
    assert not jsonschema.Draft202012Validator(draw.parameters).is_valid(args)
    with pytest.raises(ToolArgsError, match="invalid arguments for tool 'draw'") as caught:
        draw.validate(args)
    assert problem in str(caught.value)


def test_a_missing_argument_is_named() -> None:
    with pytest.raises(ToolArgsError, match="label: missing"):
        draw.validate({k: v for k, v in GOOD.items() if k != "label"})


def test_what_the_schema_allows_is_converted_for_the_function() -> None:
    args = {
        **GOOD,
        "ratio": 2,  # an integer is a number
        "count": 3.0,  # and an integer-valued number an integer, in JSON
        "limit": None,
        "color": "blue",
        "at": {"x": 1, "y": 2},
        "grid": [[1, 2], []],
        "weights": {"a": 1},
    }
    valid = draw.validate(args)
    assert valid["count"] == 3 and valid["color"] is Color.BLUE and valid["at"] == Point(x=1, y=2)


async def test_a_tool_class_is_held_to_its_declared_schema() -> None:
    assert await Declared().call({"n": 2}) == 2
    with pytest.raises(ToolArgsError, match="n: expected integer, got string 'two'"):
        await Declared().call({"n": "two"})
    with pytest.raises(ToolArgsError, match="takes an object of arguments, got list"):
        await Declared().call([1])  # type: ignore[arg-type]


async def test_the_model_hears_of_a_wrongly_typed_call_and_can_fix_it() -> None:
    @tool
    def double(n: int) -> int:
        """Double a number."""
        return 2 * n

    model = ScriptedModel(
        [
            plan_response({"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "x"}]}),
            tool_response(("double", {"n": "21"})),
            tool_response(("double", {"n": 21})),
            text_response("42"),
        ]
    )
    result = await hierplan.run("g", model=model, tools=[double], strategy="dag")
    model.assert_complete()
    assert result.answer == "42"
    reply = model.requests[2].messages[-1].content
    assert (
        reply == "ERROR: invalid arguments for tool 'double': n: expected integer, got string '21'"
    )
    assert model.requests[3].messages[-1].content == "42"


async def test_a_steps_text_referred_to_is_converted_as_before() -> None:
    @tool
    def double(n: int) -> int:
        """Double a number."""
        return 2 * n

    steps: list[dict[str, Any]] = [
        {"id": "a", "title": "A", "instruction": "count"},
        {"id": "b", "title": "B", "instruction": "double", "tool": "double"},
    ]
    steps[1] |= {"args": {"n": "$a"}, "depends_on": ["a"]}
    model = ScriptedModel([plan_response({"goal": "g", "steps": steps}), text_response("21")])
    result = await hierplan.run("g", model=model, tools=[double], strategy="plan-execute")
    model.assert_complete()
    assert result.status == "succeeded", result.error
    assert [n.output for n in result.tree.walk() if n.tool == "double"] == ["42"]


# The subset of JSON Schema the checker supports, built up recursively.
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from([0.0, 1.0, 1.5, -2.5]),
    st.sampled_from(["", "a", "ab", "abc"]),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abc"), inner, max_size=3)
    ),
    max_leaves=8,
)
_types = st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"])
_leaf_schemas = st.one_of(
    st.builds(lambda t: {"type": t}, _types),
    st.builds(lambda ts: {"type": ts}, st.lists(_types, min_size=1, max_size=3, unique=True)),
    st.builds(lambda e: {"enum": e}, st.lists(_scalars, min_size=1, max_size=3)),
    st.builds(lambda c: {"const": c}, _json),
    st.builds(lambda n: {"minimum": n}, st.integers(-3, 3)),
    st.builds(lambda n: {"exclusiveMaximum": n}, st.integers(-3, 3)),
    st.builds(lambda n: {"minLength": n, "maxLength": n + 1}, st.integers(0, 3)),
    st.just({}),
    st.booleans(),
)


def _compound(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    names = st.sampled_from("abc")
    return st.one_of(
        st.builds(
            lambda props, req, extra: {
                "type": "object",
                "properties": props,
                "required": req,
                "additionalProperties": extra,
            },
            st.dictionaries(names, inner, max_size=3),
            st.lists(names, max_size=2, unique=True),
            st.one_of(st.booleans(), inner),
        ),
        st.builds(
            lambda items, lo, unique: {
                "type": "array",
                "items": items,
                "minItems": lo,
                "uniqueItems": unique,
            },
            inner,
            st.integers(0, 2),
            st.booleans(),
        ),
        st.builds(
            lambda prefix, items: {"prefixItems": prefix, "items": items, "maxItems": 3},
            st.lists(inner, max_size=2),
            st.one_of(st.booleans(), inner),
        ),
        st.builds(lambda subs: {"anyOf": subs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda subs: {"oneOf": subs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda subs: {"allOf": subs}, st.lists(inner, min_size=1, max_size=2)),
        st.just({"$ref": "#/$defs/it"}),
    )


_schemas = st.recursive(_leaf_schemas, _compound, max_leaves=6)


@settings(max_examples=400, deadline=None)
@given(schema=_schemas, defined=_leaf_schemas, value=_json)
def test_the_checker_agrees_with_jsonschema_on_its_subset(
    schema: Any, defined: Any, value: Any
) -> None:
    # "$ref"s refer to a definition at the root, as in the schemas pydantic makes.
    root = {"allOf": [schema], "$defs": {"it": defined}}
    expected = jsonschema.Draft202012Validator(root).is_valid(value)
    assert (schema_problems(root, value) == []) == expected


@settings(max_examples=300, deadline=None)
@given(args=st.dictionaries(st.sampled_from([*GOOD, "grid", "at", "mode", "zz"]), _json))
def test_a_tool_refuses_exactly_what_its_schema_refuses(args: dict[str, Any]) -> None:
    valid = jsonschema.Draft202012Validator(draw.parameters).is_valid(args)
    try:
        draw.validate(args)
    except ToolArgsError:
        assert not valid
    else:
        assert valid


class _Handle:
    """An object with no JSON form, as a step's output a reference passes on."""


async def test_a_value_with_no_json_form_is_judged_by_the_schema_not_refused_by_a_crash() -> None:
    declared = Declared()
    with pytest.raises(ToolArgsError, match=r"n: expected integer, got _Handle <_Handle>"):
        await declared.call({"n": _Handle()})
    numbers = {
        "type": "object",
        "properties": {"n": {"type": "array", "items": {"type": "integer"}}},
    }
    assert schema_problems(numbers, {"n": [1, threading.Lock()]}) == [
        "n.1: expected integer, got lock <lock>"
    ]
    anything = {"type": "object", "properties": {"h": {}, "x": {"type": "array"}}}
    assert schema_problems(anything, {"h": _Handle(), "x": [(1, 2), {_Handle(): 1}]}) == []
    assert schema_problems(anything, {"x": _Handle()}) == [
        "x: expected array, got _Handle <_Handle>"
    ]
    # Objects as keys stay apart, each value checked, beside a key written as their text.
    integers = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert schema_problems(integers, {_Handle(): 1, _Handle(): "two", "<_Handle>": 3}) == [
        "<_Handle>#3: expected integer, got string 'two'"
    ]
    # What no JSON can carry at all is refused with a reason, as bad arguments are.
    looped: list[Any] = []
    looped.append(looped)
    for bad, reason in [(looped, "Circular reference"), (b"\xff", "utf-8")]:
        with pytest.raises(ToolArgsError, match=f"arguments: has no JSON form: .*{reason}"):
            await declared.call({"n": bad})
