"""Plan schemas rewritten for strict structured output, and the output read back.

The property: whatever plan a model means, writing it the way strict mode forces (every property
present, open objects as JSON strings) and decoding it gives the same plan.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wire import conform
from wire.openai_wire import check_strict

from hierplan.agents.planner import PLAN_SCHEMA
from hierplan.models.schema import decode_strict, strict_schema
from hierplan.plans.plan import Plan

STRICT_PLAN = strict_schema(PLAN_SCHEMA)

ident = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,10}", fullmatch=True)
text = st.text(min_size=1, max_size=20)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
steps = st.fixed_dictionaries(
    {"id": ident, "title": text, "instruction": text},
    optional={
        "depends_on": st.lists(ident, max_size=3),
        "kind": st.sampled_from(["task", "subgoal"]),
        "tool": st.none() | st.text(max_size=8),
        "args": st.none() | st.dictionaries(st.text(max_size=6), json_values, max_size=3),
        "tools": st.none() | st.lists(st.text(max_size=5), max_size=2),
        "estimate_usd": st.none() | st.floats(0, 100),
        "estimate_tokens": st.none() | st.integers(0, 10**6),
    },
)
plans = st.fixed_dictionaries(
    {"goal": text, "steps": st.lists(steps, max_size=4)},
    optional={"rationale": st.text(max_size=20)},
)


@settings(max_examples=200, deadline=None)
@given(plans)
def test_any_plan_survives_the_strict_round_trip(data: dict[str, Any]) -> None:
    written = json.loads(json.dumps(conform(STRICT_PLAN, data)))
    # strict mode writes every property, and open objects as strings
    assert all(set(s) == set(STRICT_PLAN["$defs"]["Step"]["properties"]) for s in written["steps"])
    assert all(s["args"] is None or isinstance(s["args"], str) for s in written["steps"])
    assert Plan.model_validate(decode_strict(PLAN_SCHEMA, written)) == Plan.model_validate(data)


def test_the_strict_plan_schema_is_strict() -> None:
    check_strict(STRICT_PLAN, "plan")  # raises on any object strict mode would refuse
    step = STRICT_PLAN["$defs"]["Step"]
    assert step["required"] == list(PLAN_SCHEMA["$defs"]["Step"]["properties"])
    assert "maxLength=200" in step["properties"]["title"]["description"]
    assert (
        step["properties"]["id"]["pattern"]
        == PLAN_SCHEMA["$defs"]["Step"]["properties"]["id"]["pattern"]
    )
    assert PLAN_SCHEMA["$defs"]["Step"]["required"] == ["id", "title", "instruction"]  # not mutated


def test_refs_with_siblings_unions_and_typed_open_objects() -> None:
    schema = {
        "type": "object",
        "$defs": {"Leaf": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        "properties": {
            "leaf": {"$ref": "#/$defs/Leaf", "description": "one leaf"},
            "choice": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        "required": ["leaf"],
    }
    strict = strict_schema(schema)
    check_strict(strict, "s")
    assert strict["properties"]["leaf"] == {
        "description": "one leaf",
        "anyOf": [{"$ref": "#/$defs/Leaf"}],
    }
    assert strict["properties"]["choice"]["anyOf"][:2] == [{"type": "string"}, {"type": "integer"}]
    assert strict["properties"]["counts"]["anyOf"][0]["type"] == "string"
    written = {"leaf": {"n": None}, "choice": 3, "counts": '{"a": 1}'}
    assert decode_strict(schema, written) == {"leaf": {}, "choice": 3, "counts": {"a": 1}}


def test_a_schema_without_an_object_root_is_refused() -> None:
    with pytest.raises(ValueError, match="object with properties at the root"):
        strict_schema({"type": "array", "items": {"type": "string"}})


def test_decoding_passes_what_it_does_not_expect_through_for_the_validator() -> None:
    assert decode_strict(PLAN_SCHEMA, {"goal": 3, "steps": "no"}) == {"goal": 3, "steps": "no"}
    bad_args = {"goal": "g", "steps": [{"id": "a", "title": "t", "instruction": "i", "args": "{x"}]}
    assert decode_strict(PLAN_SCHEMA, bad_args)["steps"][0]["args"] == "{x"
