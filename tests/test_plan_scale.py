"""Large plans: validation does work linear in the plan's size, the problems it lists are capped
(and the rest counted), what is printed of a plan is bounded, and a plan file too large for
its format is refused before it fills the memory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from display_support import render
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hierplan import files
from hierplan.cli import app
from hierplan.errors import UserInputError
from hierplan.plans.plan import Plan, Step, load_plan, validate_plan
from hierplan.view.tree import plan_tree

CAP = 100  # the problems listed at most, and one saying how many more


def big_plan(
    steps: int,
    deps: Callable[[int], list[str]],
    tools: Callable[[int], list[str]] | None = None,
) -> Plan:
    """A plan built without validation: ids ``s0``, ``s1``... with the dependencies ``deps``
    gives each; with ``tools``, each step names tool ``t`` and that tools list."""
    return Plan.model_construct(
        goal="g",
        steps=[
            Step.model_construct(
                id=f"s{i}",
                title="t",
                instruction="i",
                depends_on=deps(i),
                kind="task",
                tool=None if tools is None else "t",
                tools=None if tools is None else tools(i),
            )
            for i in range(steps)
        ],
        rationale="",
    )


def test_the_problems_listed_are_capped_and_the_rest_counted() -> None:
    plan = big_plan(1, lambda i: [f"missing-{j}" for j in range(50_000)])
    problems = validate_plan(plan)
    assert len(problems) == CAP + 1
    assert all(p.code == "dangling_dependency" for p in problems[:CAP])
    assert problems[-1].code == "more_problems"
    assert str(problems[-1]).startswith("and 49,900 more problems")


def test_a_dependency_listed_many_times_is_one_problem() -> None:
    plan = big_plan(1, lambda i: ["ghost"] * 100_000 + ["s0"] * 100_000)
    assert [p.code for p in validate_plan(plan)] == ["dangling_dependency", "self_dependency"]


def test_validate_prints_the_capped_problems_and_how_many_more(tmp_path: Path) -> None:
    step = {
        "id": "a",
        "title": "t",
        "instruction": "i",
        "depends_on": list(map(str, range(20_000))),
    }
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"goal": "g", "steps": [step]}))
    result = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert sum(line.startswith("problem: ") for line in lines) == CAP + 1
    assert "problem: and 19,900 more problems: fix these, then validate the plan again" in lines
    # the plan's own line names ten of its dependencies, not twenty thousand
    assert "after 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 19,990 more" in result.output


def test_a_large_plan_prints_a_bounded_tree() -> None:
    plan = big_plan(10_000, lambda i: [f"s{i - 1}"] if i else [])
    shown = render(plan_tree(plan)).splitlines()
    assert len(shown) == 1 + 200 + 1  # the goal, the first 200 steps, how many more
    assert shown[-1].endswith("… 9,800 more steps")


def test_a_long_cycle_is_named_by_its_ends() -> None:
    plan = big_plan(5_000, lambda i: [f"s{(i - 1) % 5_000}"])
    (cycle,) = validate_plan(plan, max_steps=5_000)
    assert cycle.code == "cycle" and len(cycle.message) < 400
    assert "s0 -> s1 -> " in cycle.message and "(4,981 more)" in cycle.message


# -- linear work --------------------------------------------------------------------------

OPERATIONS = [0]


class CountedId(str):
    """A step id or a dependency that counts each time it is hashed or compared: the work of
    dictionaries, sets and searches in lists, which is where quadratic validation would be."""

    __slots__ = ()

    def __hash__(self) -> int:
        OPERATIONS[0] += 1
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        OPERATIONS[0] += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        OPERATIONS[0] += 1
        return str.__ne__(self, other)


def _ids(names: list[str]) -> list[str]:
    return [CountedId(name) for name in names]


SHAPES: dict[str, Callable[[int], Plan]] = {
    "chain": lambda n: big_plan(n, lambda i: _ids([f"s{i - 1}"] if i else [])),
    "fan-in": lambda n: big_plan(n, lambda i: _ids([f"s{j}" for j in range(max(0, i - 8), i)])),
    "dangling": lambda n: big_plan(n, lambda i: _ids([f"x{i}", f"y{i}"])),
    "one cycle": lambda n: big_plan(n, lambda i: _ids([f"s{(i - 1) % n}"])),
    "many cycles": lambda n: big_plan(n, lambda i: _ids([f"s{i ^ 1}"])),
    "unknown tools": lambda n: big_plan(n, lambda i: [], lambda i: _ids([f"u{i}", f"v{i}"])),
}


def _work(shape: str, steps: int) -> int:
    plan = SHAPES[shape](steps)
    for step in plan.steps:
        object.__setattr__(step, "id", CountedId(step.id))
    OPERATIONS[0] = 0
    validate_plan(plan, tools=["t"])
    return OPERATIONS[0]


@pytest.mark.parametrize("shape", SHAPES)
def test_validation_does_work_linear_in_the_plans_size(shape: str) -> None:
    """Four times the steps, about four times the work (sixteen, if it were quadratic); the
    sorting that names cycles in a stable order adds a logarithm's worth at most."""
    small, large = _work(shape, 500), _work(shape, 2_000)
    assert small > 0
    assert large <= 5 * small, (small, large)


# -- plan files too large for their format -------------------------------------------------


@pytest.fixture(params=["libyaml", "python"])
def yaml_reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each YAML reader: libyaml's (where PyYAML has it) and PyYAML's own."""
    if request.param == "python":
        monkeypatch.setattr(files, "_load_yaml", files._load_yaml_python)
    return str(request.param)


def test_a_yaml_plan_of_too_many_values_is_refused_before_it_is_read(
    tmp_path: Path, yaml_reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "MAX_YAML_VALUES", 1_000)
    path = tmp_path / "p.yaml"
    deps = ",".join(["b"] * 1_000)
    path.write_text(
        f"goal: g\nsteps:\n- {{id: a, title: t, instruction: i, depends_on: [{deps}]}}\n"
    )
    with pytest.raises(UserInputError, match="holds more than 1,000 values") as caught:
        load_plan(path)
    assert "write it as JSON" in str(caught.value)
    json_path = tmp_path / "p.json"  # JSON has no such limit
    step = {"id": "a", "title": "t", "instruction": "i", "depends_on": ["b"] * 1_000}
    json_path.write_text(json.dumps({"goal": "g", "steps": [step]}))
    assert len(load_plan(json_path).steps[0].depends_on) == 1_000


def test_both_yaml_readers_read_a_plan_alike(tmp_path: Path, yaml_reader: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "goal: g\nsteps:\n- id: a\n  title: t\n  instruction: 'i'\n  tool: x\n"
        "  args: {n: 010, d: 2024-05-01, f: 1e3, b: no, h: 0x1F, z: 1_000}\n"
    )
    step = load_plan(path).steps[0]
    assert step.args == {"n": 10, "d": "2024-05-01", "f": 1000.0, "b": "no", "h": 31, "z": "1_000"}


def test_a_deeply_nested_plan_is_validated_and_shown(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    args = "[" * 600 + "]" * 600
    path.write_text(
        '{"goal": "g", "steps": [{"id": "a", "title": "t", "instruction": "i", "tool": "x", '
        f'"args": {{"v": {args}}}}}]}}'
    )
    plan = load_plan(path)
    assert validate_plan(plan, tools=["x"]) == []
    assert "a [task] t  tool=x" in render(plan_tree(plan))


# -- fuzzing: huge and deep plans ----------------------------------------------------------


@st.composite
def large_plans(draw: st.DrawFn) -> Plan:
    """Plans of up to a few thousand steps with any dependencies (repeated, dangling, self,
    cyclic), tool lists, and arguments nested up to 200 deep."""
    steps = draw(st.integers(1, 3_000))
    fan = draw(st.integers(0, 6))
    seed = draw(st.integers(0, 2**16))
    depth = draw(st.integers(0, 200))
    ids = [f"s{(i * seed) % (steps + 3)}" for i in range(steps)]  # repeats some ids
    args: Any = 1.0
    for _ in range(depth):
        args = [args]

    def deps(i: int) -> list[str]:
        return [ids[(i * 7 + k * seed) % steps] for k in range(fan)] + [f"x{i % 5}"] * (i % 2)

    return Plan.model_construct(
        goal="g",
        steps=[
            Step.model_construct(
                id=ids[i],
                title="t",
                instruction="i",
                depends_on=deps(i),
                kind="task",
                tool="t" if i % 3 else None,
                args={"a": args} if i % 3 else None,
                tools=["t", f"u{i % 4}"] if i % 5 == 0 else None,
            )
            for i in range(steps)
        ],
        rationale="",
    )


def _bounded(plan: Plan) -> None:
    problems = validate_plan(plan, tools=["t"])
    assert len(problems) <= CAP + 1
    assert all(p.code != "more_problems" for p in problems[:-1])
    assert len(render(plan_tree(plan)).splitlines()) <= 202


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(large_plans())
def test_any_large_plan_is_validated_and_shown_within_bounds(plan: Plan) -> None:
    _bounded(plan)


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(large_plans())
def test_any_large_plan_is_validated_and_shown_within_bounds_long(plan: Plan) -> None:
    _bounded(plan)
