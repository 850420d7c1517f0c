"""What a competent model would answer in the migration scenario.

The oracle reads the same prompt text a real model gets. It knows the root goal and the four
kinds of sub-goal it phrases itself ("Create the schema of tables ...", "Copy the rows of tables
...", "Create the indexes of tables ...", "Verify tables ..."), parsed from the text so that a
plan edited by a person still gets sensible answers. On a replan it reads the failure: a missing
target table gets a ``create_table`` step, a verification mismatch gets the copies or indexes
that fix it. When a reviewer rejects its root plan, it proposes its other sound layout (index and
verify each group of tables as soon as it is copied) instead of the same plan again; it does not
read the reason, which only a real model can act on.

Under a budget (the prompt's ``BUDGET:`` line) it writes a plan that fits what is left, as a
careful model would (:mod:`~hierplan.scenarios.data_migration.layouts`).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from hierplan.agents.prompts import PlanPrompt, StepPrompt, one_line
from hierplan.models.base import ToolCall
from hierplan.plans.plan import Plan, Step
from hierplan.scenarios.data_migration import layouts
from hierplan.simulator.oracle import Action

if TYPE_CHECKING:
    import networkx as nx

REJECTED_PREFIX = "The reviewer rejected"
ROOT_GOAL = (
    "Migrate every table of the sample shop database (source.db) into target.db: schema, rows "
    "and indexes; then verify that row counts, checksums and indexes match the source."
)

GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reference", ("regions", "countries", "categories", "suppliers", "warehouses")),
    ("customers", ("customers", "addresses")),
    ("catalog", ("products", "inventory")),
    ("orders", ("orders", "order_items", "payments", "shipments", "reviews")),
)

_KINDS: Mapping[str, str] = {
    "schema": "Create the schema of tables {t} in the target database",
    "copy": "Copy the rows of tables {t} into the target database, parents before children",
    "indexes": "Create the indexes of tables {t} in the target database",
    "verify": "Verify tables {t}: row counts, checksums and indexes match the source",
    "migrate": "Migrate tables {t}: schema, rows and indexes, then verify them against the source",
}
_KINDS = MappingProxyType(_KINDS)  # read-only: shared by every run
_PARSE = re.compile(
    r"^(?P<kind>Create the schema of|Copy the rows of|Create the indexes of|Verify|Migrate) tables "
    r"(?P<tables>[a-z0-9_]+(?:, [a-z0-9_]+)*)"
)
_KIND_OF: Mapping[str, str] = {
    "Create the schema of": "schema",
    "Copy the rows of": "copy",
    "Create the indexes of": "indexes",
    "Verify": "verify",
    "Migrate": "migrate",
}
_KIND_OF = MappingProxyType(_KIND_OF)  # read-only: shared by every run
_CALL = re.compile(
    r'^(?P<tool>create_table|copy_rows|create_indexes|verify_table)\("(?P<table>[a-z0-9_]+)"\)$'
)
_NO_TABLE = re.compile(r"has no table '([a-z0-9_]+)'")
_FK_FAILED = re.compile(r"copying '([a-z0-9_]+)' violated a foreign key")
_MISMATCH = re.compile(r"([a-z0-9_]+) \((missing table|[a-z ,]+)\)")


def instruction(kind: str, tables: Sequence[str]) -> str:
    """The sub-goal or step text for ``kind`` over ``tables``."""
    return _KINDS[kind].format(t=", ".join(tables))


def parse_instruction(text: str) -> tuple[str, list[str]] | None:
    """``(kind, tables)`` from a text made by :func:`instruction`, else ``None``."""
    match = _PARSE.match(one_line(text))
    if match is None:
        return None
    return _KIND_OF[match.group("kind")], match.group("tables").split(", ")


def parse_call(text: str, tables: Sequence[str]) -> tuple[str, list[str]] | None:
    """``(kind, [table])`` from a direct tool step's instruction as a compact plan line writes
    it (``copy_rows("orders")``), else ``None``. A table the source does not have is read as
    the closest one it has, as a model reads an error that lists them."""
    match = _CALL.match(one_line(text))
    if match is None:
        return None
    table = match.group("table")
    if table not in tables:
        close = difflib.get_close_matches(table, tables, n=1)
        if not close:
            return None
        table = close[0]
    return _KIND_OF_TOOL[match.group("tool")], [table]


class MigrationOracle:
    """The oracle for the data-migration scenario."""

    def __init__(self, tables: Sequence[str], parents: Mapping[str, Sequence[str]]) -> None:
        self.tables = list(tables)
        self.parents = {
            t: [p for p in parents.get(t, ()) if p != t and p in self.tables] for t in self.tables
        }
        grouped = {t for _, ts in GROUPS for t in ts}
        self.groups = [(name, [t for t in ts if t in self.tables]) for name, ts in GROUPS]
        other = [t for t in self.tables if t not in grouped]
        if other:
            self.groups.append(("other", other))
        self.groups = [(n, ts) for n, ts in self.groups if ts]

    # -- plans ---------------------------------------------------------------------------
    def plan(self, prompt: PlanPrompt) -> Plan | None:
        """The plan for the root goal or one of the oracle's sub-goals."""
        goal = one_line(prompt.goal)
        if goal == one_line(ROOT_GOAL):
            rejected = (prompt.feedback or "").startswith(REJECTED_PREFIX)
            if prompt.allow_subgoals:
                steps = self._per_group_steps() if rejected else self._root_steps()
            else:
                steps = self.flat_steps()
            left_out = ""
            if prompt.budget is not None:
                steps = layouts.root_within_budget(self, steps, prompt)
                left_out = layouts.left_out(self, self.tables, steps)
            rationale = (
                "Schema first, then data in foreign-key order; each group is indexed and "
                "verified as soon as it is copied."
                if rejected and prompt.allow_subgoals
                else "Schema first, then data in foreign-key order, then indexes, then "
                "verification."
            )
            return Plan(goal=goal, steps=steps, rationale=rationale, left_out=left_out)
        parsed = parse_instruction(goal)
        if parsed is None:
            return None
        kind, tables = parsed
        if any(t not in self.tables for t in tables):
            return None
        if prompt.failure:
            fixed = self._repair(kind, tables, prompt.failure)
            if fixed:
                return Plan(
                    goal=goal,
                    steps=fixed,
                    rationale="Fix what the failure reported, then check again.",
                )
        steps = self.sub_steps(kind, tables)
        if prompt.budget is None:
            return Plan(goal=goal, steps=steps)
        steps = layouts.sub_within_budget(self, kind, tables, steps, prompt)
        return Plan(goal=goal, steps=steps, left_out=layouts.left_out(self, tables, steps))

    def group_parents(self) -> dict[str, list[str]]:
        where = {t: name for name, ts in self.groups for t in ts}
        out: dict[str, list[str]] = {}
        for name, ts in self.groups:
            deps = {where[p] for t in ts for p in self.parents[t] if where[p] != name}
            out[name] = [n for n, _ in self.groups if n in deps]
        return out

    def _root_steps(self) -> list[Step]:
        steps = [
            Step(
                id="schema",
                title="Create the schema",
                instruction=instruction("schema", self.tables),
                kind="subgoal",
                estimate_tokens=4000,
            )
        ]
        group_parents = self.group_parents()
        for name, ts in self.groups:
            steps.append(
                Step(
                    id=f"copy_{name}",
                    title=f"Copy {name} data",
                    instruction=instruction("copy", ts),
                    kind="subgoal",
                    depends_on=["schema", *(f"copy_{p}" for p in group_parents[name])],
                    estimate_tokens=3000 + 500 * len(ts),
                )
            )
        copies = [f"copy_{n}" for n, _ in self.groups]
        steps.append(
            Step(
                id="indexes",
                title="Create the indexes",
                instruction=instruction("indexes", self.tables),
                kind="subgoal",
                depends_on=copies,
                estimate_tokens=4000,
            )
        )
        steps.append(
            Step(
                id="verify",
                title="Verify the migration",
                instruction=instruction("verify", self.tables),
                kind="subgoal",
                depends_on=["indexes"],
                estimate_tokens=8000,
            )
        )
        return steps

    def _per_group_steps(self) -> list[Step]:
        """The alternative root layout: each group is indexed and verified once copied."""
        steps = [s for s in self._root_steps() if s.id not in ("indexes", "verify")]
        for name, ts in self.groups:
            steps.append(
                Step(
                    id=f"indexes_{name}",
                    title=f"Index {name} data",
                    instruction=instruction("indexes", ts),
                    kind="subgoal",
                    depends_on=[f"copy_{name}"],
                    estimate_tokens=2000 + 300 * len(ts),
                )
            )
            steps.append(
                Step(
                    id=f"verify_{name}",
                    title=f"Verify {name} data",
                    instruction=instruction("verify", ts),
                    kind="subgoal",
                    depends_on=[f"indexes_{name}"],
                    estimate_tokens=2000 + 600 * len(ts),
                )
            )
        return steps

    @staticmethod
    def instruction(kind: str, tables: Sequence[str]) -> str:
        """The sub-goal or step text for ``kind`` over ``tables``."""
        return instruction(kind, tables)

    @staticmethod
    def verify_step(table: str) -> Step:
        """A step that verifies ``table`` with the tool."""
        return _task(f"verify_{table}", "verify_table", table)

    def direct_steps(self, tables: Sequence[str]) -> list[Step]:
        """Every tool called directly for ``tables``: create, copy (parents first), index and
        verify each table. No model call is needed to run it."""
        steps = [_task(f"create_{t}", "create_table", t) for t in tables]
        steps += self._copy_steps(tables, extra_deps=lambda t: [f"create_{t}"])
        steps += [_task(f"index_{t}", "create_indexes", t, [f"copy_{t}"]) for t in tables]
        steps += [_task(f"verify_{t}", "verify_table", t, [f"index_{t}"]) for t in tables]
        return steps

    def flat_steps(self) -> list[Step]:
        steps = [
            Step(
                id=f"create_{t}",
                title=f"Create {t}",
                instruction=f"Create table {t} in the target",
                tool="create_table",
                args={"table": t},
            )
            for t in self.tables
        ]
        steps += self._copy_steps(self.tables, extra_deps=lambda t: [f"create_{t}"])
        steps += [
            Step(
                id=f"index_{t}",
                title=f"Index {t}",
                instruction=f"Create the indexes of {t}",
                tool="create_indexes",
                args={"table": t},
                depends_on=[f"copy_{t}"],
            )
            for t in self.tables
        ]
        for name, ts in self.groups:
            steps.append(
                Step(
                    id=f"verify_{name}",
                    title=f"Verify {name}",
                    instruction=instruction("verify", ts),
                    depends_on=[f"index_{t}" for t in ts],
                )
            )
        return steps

    def _copy_steps(self, tables: Sequence[str], extra_deps: object = None) -> list[Step]:
        inside = set(tables)
        out = []
        for t in self.fk_order(tables):
            deps = [f"copy_{p}" for p in self.parents[t] if p in inside]
            if callable(extra_deps):
                deps = [*extra_deps(t), *deps]
            out.append(
                Step(
                    id=f"copy_{t}",
                    title=f"Copy {t}",
                    instruction=f"Copy the rows of {t} into the target",
                    tool="copy_rows",
                    args={"table": t},
                    depends_on=deps,
                )
            )
        return out

    def fk_order(self, tables: Sequence[str]) -> list[str]:
        import networkx as nx  # here, not on import: importing networkx alone takes ~0.1 s

        graph: nx.DiGraph[str] = nx.DiGraph()
        graph.add_nodes_from(tables)
        for t in tables:
            for p in self.parents[t]:
                if p in graph:
                    graph.add_edge(p, t)
        order = {t: i for i, t in enumerate(self.tables)}
        return list(nx.lexicographical_topological_sort(graph, key=order.__getitem__))

    def sub_steps(self, kind: str, tables: Sequence[str]) -> list[Step]:
        if kind == "schema":
            return [
                Step(
                    id=f"create_{t}",
                    title=f"Create {t}",
                    instruction=f"Create table {t} in the target",
                    tool="create_table",
                    args={"table": t},
                )
                for t in tables
            ]
        if kind == "copy":
            return self._copy_steps(tables)
        if kind == "indexes":
            return [
                Step(
                    id=f"index_{t}",
                    title=f"Index {t}",
                    instruction=f"Create the indexes of {t}",
                    tool="create_indexes",
                    args={"table": t},
                )
                for t in tables
            ]
        if kind == "migrate":
            return self.direct_steps(tables)
        chunks = [(n, [t for t in ts if t in tables]) for n, ts in self.groups]
        return [
            Step(id=f"verify_{n}", title=f"Verify {n}", instruction=instruction("verify", ts))
            for n, ts in chunks
            if ts
        ]

    def _repair(self, kind: str, tables: Sequence[str], failure: str) -> list[Step] | None:
        """A plan that fixes what ``failure`` reports, as a careful model would."""
        if kind in ("copy", "indexes"):
            missing = sorted(set(_NO_TABLE.findall(failure)) & set(self.tables))
            if missing:
                return self._repair_missing(kind, tables, missing)
        if kind == "copy":
            orphans = sorted(set(_FK_FAILED.findall(failure)) & set(self.tables))
            if orphans:
                return self._repair_parents(tables, orphans)
        if kind == "verify":
            problems = {t: why for t, why in _MISMATCH.findall(failure) if t in self.tables}
            if problems:
                return self._repair_verify(problems)
        return None

    def _repair_missing(self, kind: str, tables: Sequence[str], missing: list[str]) -> list[Step]:
        """Create the target tables a copy or index step found missing, then go on."""
        prefix = "copy" if kind == "copy" else "index"
        base = [
            _depend(s, f"create_{s.id.removeprefix(prefix + '_')}")
            if s.id.removeprefix(prefix + "_") in missing
            else s
            for s in self.sub_steps(kind, tables)
        ]
        return [*(_task(f"create_{t}", "create_table", t) for t in missing), *base]

    def _repair_parents(self, tables: Sequence[str], orphans: list[str]) -> list[Step]:
        """Copy again every ancestor of tables whose rows lost their parents (a copy is
        idempotent), then copy those tables."""
        ancestors: set[str] = set()
        stack = [p for t in orphans for p in self.parents[t]]
        while stack:
            table = stack.pop()
            if table not in ancestors:
                ancestors.add(table)
                stack.extend(self.parents[table])
        fixes = []
        for t in self.fk_order(sorted(ancestors)):
            deps = [f"fix_copy_{p}" for p in self.parents[t] if p in ancestors]
            fixes.append(_task(f"fix_copy_{t}", "copy_rows", t, deps))
        needed = [f"fix_copy_{p}" for t in orphans for p in self.parents[t]]
        base = [
            _depend(s, *needed) if s.id.removeprefix("copy_") in orphans else s
            for s in self.sub_steps("copy", tables)
        ]
        return [*fixes, *base]

    def _repair_verify(self, problems: Mapping[str, str]) -> list[Step]:
        """Copy, create or index what verification found wrong, then verify it again."""
        steps: list[Step] = []
        for t, why in problems.items():
            deps: list[str] = []
            if "missing table" in why:
                steps.append(_task(f"fix_create_{t}", "create_table", t))
                deps = [f"fix_create_{t}"]
            if "missing table" in why or "row count" in why or "checksum" in why:
                steps.append(_task(f"fix_copy_{t}", "copy_rows", t, deps))
                deps = [f"fix_copy_{t}"]
            steps.append(_task(f"fix_index_{t}", "create_indexes", t, deps))
        again = instruction("verify", sorted(problems))
        steps.append(
            Step(
                id="reverify",
                title="Verify again",
                instruction=again,
                depends_on=[s.id for s in steps],
            )
        )
        return steps

    # -- actions ---------------------------------------------------------------------------
    def act(self, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]) -> Action | None:
        """The next tool calls for a step (or the whole goal), or the final answer."""
        text = one_line(prompt.instruction)
        if text == one_line(ROOT_GOAL):
            return self._act_all(done)
        parsed = parse_instruction(text) or parse_call(text, self.tables)
        if parsed is None:
            return None
        kind, tables = parsed
        if any(t not in self.tables for t in tables):
            return None
        if kind == "verify":
            return self._act_verify(tables, done)
        if kind == "migrate":
            return self._act_all(done, tables)
        tool = {"schema": "create_table", "copy": "copy_rows", "indexes": "create_indexes"}[kind]
        return self._act_tool(tool, tables, done) or Action(
            text=f"{tool} done for {', '.join(tables)}"
        )

    def _act_tool(
        self, tool: str, tables: Sequence[str], done: Sequence[tuple[ToolCall, str]]
    ) -> Action | None:
        finished = {c.arguments.get("table") for c, _ in done if c.name == tool}
        todo = [t for t in tables if t not in finished]
        if tool == "copy_rows":
            todo = [
                t for t in todo if all(p in finished or p not in tables for p in self.parents[t])
            ]
        if not todo:
            return None
        base = len(done)
        return Action(
            tool_calls=tuple(
                ToolCall(f"call_{base + i}", tool, {"table": t}) for i, t in enumerate(todo)
            )
        )

    def _act_verify(self, tables: Sequence[str], done: Sequence[tuple[ToolCall, str]]) -> Action:
        results: dict[str, dict[str, object]] = {}
        for call, text in done:
            if call.name == "verify_table":
                try:
                    results[str(call.arguments.get("table"))] = json.loads(text)
                except json.JSONDecodeError:
                    continue
        todo = [t for t in tables if t not in results]
        if todo:
            base = len(done)
            return Action(
                tool_calls=tuple(
                    ToolCall(f"call_{base + i}", "verify_table", {"table": t})
                    for i, t in enumerate(todo)
                )
            )
        bad = [f"{t} ({results[t].get('problem')})" for t in tables if not results[t].get("match")]
        if bad:
            return Action(text=f"FAILED: mismatch in tables: {', '.join(bad)}")
        rows = sum(int(str(results[t].get("target_rows", 0))) for t in tables)
        count = f"{len(tables)} table" + ("" if len(tables) == 1 else "s")
        return Action(text=f"verified {count} ({rows:,} rows): counts, checksums and indexes match")

    def _act_all(
        self, done: Sequence[tuple[ToolCall, str]], tables: Sequence[str] | None = None
    ) -> Action:
        """Every table migrated by one executor (the whole goal, or a ``migrate`` step)."""
        if tables is None:
            if not any(c.name == "list_tables" for c, _ in done):
                return Action(tool_calls=(ToolCall("call_0", "list_tables", {}),))
            tables = self.tables
        for tool in ("create_table", "copy_rows", "create_indexes"):
            action = self._act_tool(tool, tables, done)
            if action is not None:
                return action
        return self._act_verify(tables, done)


_TOOL_TEXT: Mapping[str, tuple[str, str]] = {
    "create_table": ("Create {t}", "Create table {t} in the target"),
    "verify_table": ("Verify {t}", "Verify table {t} against the source"),
    "copy_rows": ("Copy {t}", "Copy the rows of {t} into the target"),
    "create_indexes": ("Index {t}", "Create the indexes of {t}"),
}
_TOOL_TEXT = MappingProxyType(_TOOL_TEXT)  # read-only: shared by every run
_KIND_OF_TOOL: Mapping[str, str] = {
    "create_table": "schema",
    "verify_table": "verify",
    "copy_rows": "copy",
    "create_indexes": "indexes",
}
_KIND_OF_TOOL = MappingProxyType(_KIND_OF_TOOL)  # read-only: shared by every run


def _task(step_id: str, tool: str, table: str, depends_on: Sequence[str] = ()) -> Step:
    title, text = _TOOL_TEXT[tool]
    return Step(
        id=step_id,
        title=title.format(t=table),
        instruction=text.format(t=table),
        tool=tool,
        args={"table": table},
        depends_on=list(depends_on),
    )


def _depend(step: Step, *ids: str) -> Step:
    extra = [i for i in ids if i not in step.depends_on]
    return step.model_copy(update={"depends_on": [*step.depends_on, *extra]})
